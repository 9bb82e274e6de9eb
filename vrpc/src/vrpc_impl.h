// vrpc/src/vrpc_impl.h: the private header of the vrpc layer.
//
// `record_stream` is an XDR stream over one vmmc::sockets descriptor with RPC
// record marking (RFC 5531 section 11: a record is fragments, each behind a
// 4-byte header whose top bit marks the last). It is what xdrrec is to
// libtirpc's clnt_vc/svc_vc, with one difference that matters for large
// arguments and results: a large XDR_GETBYTES reads from the connection
// straight into the caller's memory (one copy out of the VMMC ring, or none
// when the sockets layer redirects the receive), and a large XDR_PUTBYTES is
// written from the caller's memory without staging.
#pragma once

#include <rpc/rpc.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "vmmc/core/settings.h"

namespace vmmc::vrpc::detail {

namespace settings {
extern const core::setting io_timeout_ms;
}  // namespace settings

// Why a record_stream operation failed.
enum class failure : std::uint8_t {
  none,
  end_of_stream,  // the peer closed (or died) between or inside records
  timed_out,      // SO_RCVTIMEO / SO_SNDTIMEO passed
  io,             // another socket error (errno in error_number())
  short_record,   // the record ended before the XDR decoder was done (framing intact)
  protocol,       // malformed framing: the stream cannot be followed any further
};

class record_stream {
 public:
  explicit record_stream(int fd);
  record_stream(const record_stream&) = delete;
  record_stream& operator=(const record_stream&) = delete;

  int fd() const { return fd_; }
  // The connection runs over VMMC: false while the sockets layer has not
  // decided, and for good once it is kernel TCP; true for good once on VMMC.
  bool on_vmmc() { return path() == path_kind::vmmc; }
  // The connection is kernel TCP for good (a peer without vmmc, another
  // host, or a decision not to upgrade): readable in the kernel exactly
  // when bytes are there, as for libtirpc's own transports.
  bool on_kernel_tcp() { return path() == path_kind::kernel_tcp; }
  XDR* encoder() { return &out_xdr_; }
  XDR* decoder() { return &in_xdr_; }

  // --- encoding: bytes put through encoder() form one record, sent (at the
  // latest) by end_record(). False on a write failure (see last_failure).
  bool end_record();

  // --- decoding
  // Starts reading the next record, first skipping what is left of the
  // current one. False on failure.
  bool begin_record();
  // Consumes the rest of the current record. False on failure.
  bool skip_record();
  bool in_record() const { return in_record_; }
  // Bytes received and not yet consumed.
  std::size_t buffered() const { return in_end_ - in_pos_; }
  // Reads whatever is there without waiting: > 0 bytes were buffered, 0 the
  // peer ended the stream, -1 nothing (errno EAGAIN: the descriptor is armed,
  // the peer's next write makes it readable in the kernel) or an error.
  long try_fill();

  failure last_failure() const { return failure_; }
  int error_number() const { return errno_; }
  void clear_failure() { failure_ = failure::none, errno_ = 0; }

  // XDR ops (record.cc) reach the internals through these.
  bool get(char* data, std::size_t length);
  bool put(const char* data, std::size_t length);
  std::int32_t* inline_get(std::size_t length);
  std::int32_t* inline_put(std::size_t length);
  std::uint32_t position() const { return position_; }

 private:
  bool fill();  // at least one more byte into the buffer (blocking)
  std::size_t read_limit();
  enum class path_kind : std::uint8_t { undecided, kernel_tcp, vmmc };
  path_kind path();  // asks the sockets layer until it has decided
  bool read_direct(char* data, std::size_t length);
  bool next_fragment();
  // Sends what is pending, in order: the fragment before the held value,
  // the held value, the current fragment; `last` marks the record's final
  // fragment, never an empty one.
  bool flush_fragment(bool last);
  bool write_all(struct iovec* iov, int count);
  bool fail(failure f, int error_number);

  const int fd_;
  XDR in_xdr_{}, out_xdr_{};
  std::uint32_t position_ = 0;

  std::vector<char> in_;
  std::size_t in_pos_ = 0, in_end_ = 0;
  std::size_t fragment_left_ = 0;  // bytes of the current fragment not consumed
  bool last_fragment_ = false;
  bool in_record_ = false;
  path_kind path_ = path_kind::undecided;

  // Pending bytes: [0, current_) a whole fragment that goes before held_,
  // then the current fragment (4 header bytes, then its data) up to out_len_.
  std::vector<char> out_;
  std::size_t current_ = 0, out_len_ = 4;
  // A large put waits here as a fragment of its own, between the two, until
  // more of the record or its end says whether it is the last fragment.
  const char* held_ = nullptr;
  std::size_t held_len_ = 0;

  failure failure_ = failure::none;
  int errno_ = 0;
};

// An XDR routine as libtirpc's variadic xdrproc_t.
template <class F>
xdrproc_t as_xdrproc(F* routine) {
  return reinterpret_cast<xdrproc_t>(reinterpret_cast<void*>(routine));
}
// Frees what XDR decoded into `where` (XDR_FREE through `proc`).
inline bool_t free_decoded(xdrproc_t proc, void* where) {
  XDR free_xdr{};
  free_xdr.x_op = XDR_FREE;
  return proc(&free_xdr, where);
}
// Sets SO_RCVTIMEO and SO_SNDTIMEO on a vmmc::sockets descriptor.
bool set_io_timeout(int fd, int milliseconds);
// The path of a vmmc::sockets descriptor, as svc_vmmc_path() reports it.
std::string path_of(int fd);

}  // namespace vmmc::vrpc::detail
