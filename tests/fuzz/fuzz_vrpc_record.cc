// Fuzz target fuzz.vrpc.record: RPC record marking and call headers as a
// vRPC server reads them: the product's record_stream (record.cc) over a
// stand-in for the vmmc::sockets calls it makes, serving the input in reads
// of a size the input chooses. Each record is decoded as a call header
// (xdr_callmsg) and an opaque argument, or as a reply, then skipped, as the
// server does. What one record_stream writes another reads back the same.
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "vmmc/sockets/socket.h"
#include "vrpc_impl.h"

using namespace vmmc::vrpc::detail;
using vmmc::fuzz::check;

namespace {
// The stand-in's descriptors: 0 reads the input, 1 collects what is written
// and 2 reads that back.
constexpr int input_fd = 0, written_fd = 1, readback_fd = 2;
std::span<const std::uint8_t> source[3];
std::size_t chunk = 0;  // largest single read; 0: no limit
std::vector<std::uint8_t> written;

ssize_t take(int fd, void* buffer, std::size_t length) {
  auto& s = source[fd];
  std::size_t n = std::min(length, s.size());
  if (chunk) n = std::min(n, chunk);
  if (n) std::memcpy(buffer, s.data(), n);
  s = s.subspan(n);
  return static_cast<ssize_t>(n);
}
}  // namespace

// The vmmc::sockets calls record.cc makes, served from memory.
namespace vmmc::sockets {
ssize_t read(int fd, void* buffer, size_t length) {
  return take(fd, buffer, length);
}
ssize_t recv(int fd, void* buffer, size_t length, int flags) {
  if ((flags & MSG_DONTWAIT) && source[fd].empty()) return errno = EAGAIN, -1;
  if (!(flags & MSG_WAITALL)) return take(fd, buffer, length);
  std::size_t done = 0;
  while (done < length) {
    ssize_t n = take(fd, static_cast<char*>(buffer) + done, length - done);
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  return static_cast<ssize_t>(done);
}
ssize_t sendmsg(int, const msghdr* message, int) {
  std::size_t total = 0;
  for (std::size_t i = 0; i < message->msg_iovlen; ++i) {
    const auto* p = static_cast<const std::uint8_t*>(message->msg_iov[i].iov_base);
    written.insert(written.end(), p, p + message->msg_iov[i].iov_len);
    total += message->msg_iov[i].iov_len;
  }
  return static_cast<ssize_t>(total);
}
int setsockopt(int, int, int, const void*, socklen_t) {
  return 0;
}
std::optional<socket_info> describe(int) {
  return std::nullopt;
}
}  // namespace vmmc::sockets

namespace {

struct call {
  std::uint32_t xid = 0, prog = 0, vers = 0, proc = 0;
  std::string argument;
};

// One record as the server reads it: header, then the argument.
std::optional<call> read_call(record_stream& s) {
  // Room for the credentials, as svc_getreq gives its transports.
  char cred[MAX_AUTH_BYTES], verf[MAX_AUTH_BYTES];
  rpc_msg msg{};
  msg.rm_call.cb_cred.oa_base = cred;
  msg.rm_call.cb_verf.oa_base = verf;
  if (!xdr_callmsg(s.decoder(), &msg)) return std::nullopt;
  check(msg.rm_direction == CALL);
  check(msg.rm_call.cb_cred.oa_length <= MAX_AUTH_BYTES);
  check(msg.rm_call.cb_verf.oa_length <= MAX_AUTH_BYTES);
  call c{static_cast<std::uint32_t>(msg.rm_xid),
         static_cast<std::uint32_t>(msg.rm_call.cb_prog),
         static_cast<std::uint32_t>(msg.rm_call.cb_vers),
         static_cast<std::uint32_t>(msg.rm_call.cb_proc),
         {}};
  char* bytes = nullptr;
  u_int length = 0;
  const std::uint32_t before = s.position();
  const bool ok = xdr_bytes(s.decoder(), &bytes, &length, 1u << 20);
  if (!ok) {
    free(bytes);  // what a failed decode allocated
    return std::nullopt;
  }
  check(length <= 1u << 20 && s.position() >= before + length);
  c.argument.assign(bytes ? bytes : "", length);
  free(bytes);
  return c;
}

void read_reply(record_stream& s) {
  char verf[MAX_AUTH_BYTES];
  rpc_msg msg{};
  char* bytes = nullptr;
  u_int length = 0;
  msg.acpted_rply.ar_verf.oa_base = verf;
  msg.acpted_rply.ar_results.where = nullptr;
  msg.acpted_rply.ar_results.proc = reinterpret_cast<xdrproc_t>(xdr_void);
  if (xdr_replymsg(s.decoder(), &msg)) {
    check(msg.rm_direction == REPLY);
    if (xdr_bytes(s.decoder(), &bytes, &length, 1u << 20)) check(length <= 1u << 20);
    free(bytes);
  }
}

// Writes `c` as one record through the product's encoder, then reads it back.
void round_trip(const call& c) {
  written.clear();
  record_stream out(written_fd);
  rpc_msg msg{};
  msg.rm_xid = c.xid;
  msg.rm_direction = CALL;
  msg.rm_call.cb_rpcvers = RPC_MSG_VERSION;
  msg.rm_call.cb_prog = c.prog;
  msg.rm_call.cb_vers = c.vers;
  msg.rm_call.cb_proc = c.proc;
  msg.rm_call.cb_cred = _null_auth;
  msg.rm_call.cb_verf = _null_auth;
  char* bytes = const_cast<char*>(c.argument.data());
  auto length = static_cast<u_int>(c.argument.size());
  check(xdr_callmsg(out.encoder(), &msg) && xdr_bytes(out.encoder(), &bytes, &length, 1u << 20) &&
        out.end_record());
  source[readback_fd] = written;
  record_stream in(readback_fd);
  check(in.begin_record());
  auto back = read_call(in);
  check(back && back->xid == c.xid && back->prog == c.prog && back->vers == c.vers &&
        back->proc == c.proc && back->argument == c.argument);
  check(in.skip_record() && !in.in_record());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  vmmc::fuzz::input in(data, size);
  const auto control = in.take<std::uint8_t>();
  chunk = control & 0x3f;
  const bool replies = control & 0x40;
  source[input_fd] = in.rest();
  record_stream s(input_fd);
  // As the server: a record at a time until the framing or the stream ends.
  for (int records = 0; records < 64; ++records) {
    s.clear_failure();
    if (!s.begin_record()) break;
    if (replies) {
      read_reply(s);
    } else if (auto c = read_call(s)) {
      chunk = 0;  // the product's writes are whole
      round_trip(*c);
      chunk = control & 0x3f;
    }
    check(s.buffered() <= 64 * 1024);
    const failure f = s.last_failure();
    if (f != failure::none && f != failure::short_record) break;
    if (!s.skip_record()) break;
  }
  return 0;
}
