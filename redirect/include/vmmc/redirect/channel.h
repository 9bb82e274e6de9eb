// vmmc/redirect/channel.h: transfer redirection channels (VMMC-2) on core.
//
// A channel is one end of a pair of byte streams between two processes, one
// stream per direction. Each end owns a *receive area*, exported through core:
// a default buffer (a ring) that the peer's sends write into, plus the small
// state words of the protocol. Data sent by the peer appears in the ring
// without any action of the receiver; read() copies it out.
//
// Redirection: a receiver may *post* its final buffer for the next bytes
// (receive()). Bytes the sender issues after it has seen the post land in
// the posted buffer directly, with no receive-side copy; bytes it issued
// before are copied out of the ring. One transfer may be split between the
// two, and receive() reports exactly how many bytes went each way. The
// receiver posts only when that pays: on the fabric path, for large receives.
// On the same-host mapped path the copy out of the ring is faster than the
// kernel copy that direct placement would need (see the sockets benchmark),
// so receive() copies there.
//
// Flow control: the sender writes only into ring space the receiver has
// released (credits written back into the sender's area), so a fast sender
// never overruns the ring; write() accepts what fits and says how much.
//
// Sleeping without losing a wake-up: a receiver about to sleep calls
// prepare_sleep(); it tells the peer to ring the doorbell (a callback the
// user of the channel supplies, e.g. one byte on a TCP connection) on its next
// send, then checks that nothing is already on its way. The same holds for a
// sender waiting for ring space.
//
// Setting up: both ends create() a channel; one end (the *active* one)
// learns the other's descriptor in-band and calls connect(); the passive end
// completes with accept_peer() once the active end's hello has arrived in its
// area. Each hello carries a small user payload (sockets use it for the
// number of bytes that went over TCP before the switch).
//
// Thread safety: one thread may read (read/receive/peek/readable/
// prepare_sleep(for_data)) while another writes (write/close_write/
// prepare_sleep(for_space)); set-up and destruction need exclusive access.
#pragma once
#pragma GCC visibility push(default)  // the library's API (see cmake/layer.cmake)

#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "vmmc/core/context.h"
#include "vmmc/core/error.h"

namespace vmmc::redirect {

struct channel_options {
  // Bytes in this end's default buffer; 0 means the setting
  // VMMC_REDIRECT_RING_BYTES. Rounded up to a power of two.
  std::size_t ring_bytes = 0;
  // Smallest receive() that posts its buffer for redirection on the fabric
  // path; 0 means the setting VMMC_REDIRECT_POST_MIN.
  std::size_t post_min = 0;
  // Called (from whichever thread sends) when the peer sleeps and must be
  // woken. Must not block and must not call back into the channel.
  std::function<void()> ring_doorbell;
  // Blocking waits call it to sleep: it must call `arm` (prepare_sleep for
  // the wait's reason) and return at once when that returns false; else sleep
  // until this end's doorbell rang (and clear it) or `timeout_ms` passed.
  // Taking `arm` lets the user note its own wake-up state before arming.
  // Empty: blocking waits nap briefly instead (fine for tests, not for idle
  // processes).
  // It must watch wait_fd() too, when this end has one.
  std::function<void(const std::function<bool()>& arm, int timeout_ms)> await_doorbell;
  // Give this end a wait descriptor (wait_fd(), an eventfd): a peer on this
  // host that maps our area then wakes a sleeper that armed with
  // wake_by::wait_fd by writing it, instead of calling its ring_doorbell
  // (on a kernel connection: a TCP segment each way). Not given when the
  // process already uses half of its descriptor limit.
  bool wait_fd = false;
  // The other end (getpeername) of the kernel connection the peer's
  // descriptor travels over, when there is one. The peer's context address
  // must then point back at it (core::context::check_address_from): a peer
  // cannot steer this end to connect to a place of its choosing.
  std::optional<sockaddr_storage> reached_over;
  // True once the kernel connection the user keeps beside the channel has
  // failed for good (a keepalive or user timeout: the peer's host is out of
  // reach). The fabric itself waits for a silent peer as long as it takes;
  // this ends those waits: blocking calls then fail with peer_gone, and
  // reads of the peer's area in flight are given up. Empty: never.
  std::function<bool()> connection_broken;
};

// Where the bytes of one receive() came from.
struct receive_result {
  std::size_t copied = 0;      // copied out of the default buffer
  std::size_t redirected = 0;  // placed directly by the sender
  std::size_t total() const { return copied + redirected; }
};

// What a connected channel's path can do.
struct channel_capabilities {
  // The peer's ring is memory this process maps (same host): bytes move by
  // loads and stores, with no provider, no progress calls and no ordering
  // fetch.
  bool mapped = false;
  // Transfers move only while this process calls into the fabric (libfabric
  // providers progress manually): a waiter must drive them.
  bool needs_progress = false;
  // A large read can be placed straight into the caller's buffer (post()).
  bool zero_copy_receive = false;
};

struct channel_counters {
  std::uint64_t bytes_sent, bytes_received;
  std::uint64_t bytes_copied;      // delivered by a copy out of the ring
  std::uint64_t bytes_redirected;  // delivered straight into posted buffers
  std::uint64_t posts, doorbells_rung;
};

enum class sleep_reason { data, space };
// How a sleeper that arms will be woken: by the peer's ring_doorbell (it
// sleeps on the user's own descriptor, e.g. in a kernel poll the user does
// not control), or by a write to this end's wait_fd() when the peer can
// (else by ring_doorbell: a sleeper on wait_fd watches both).
enum class wake_by { doorbell, wait_fd };

class channel {
 public:
  // Allocates and exports this end's receive area.
  // Errors: invalid_argument (ring_bytes too large), resource_exhausted, and
  // those of context::allocate / export_buffer.
  static result<channel> create(core::context& ctx, channel_options options = {});

  channel(channel&&) noexcept;
  channel& operator=(channel&&) noexcept;
  // Withdraws the area; a connected peer's later operations fail.
  ~channel();

  // Printable description of this end (context address, export name, ring
  // size), to be given to the peer in-band. No whitespace, < 4 KiB.
  std::string descriptor() const;

  // Active end: imports the peer's area and places this end's hello there
  // (descriptor + `user_hello`). Returns once the hello is visible to the
  // peer. The import waits at most `patience` for the peer (timed_out: the
  // channel stays as it was and connect may be called again). Errors:
  // invalid_argument (malformed descriptor or user_hello over 64 bytes), the
  // errors of context::import_buffer, protocol_error.
  status connect(std::string_view peer_descriptor, std::string_view user_hello,
                 std::chrono::milliseconds patience = std::chrono::seconds(5));
  // Passive end: returns would_block until the active end's hello is in this
  // end's area; then imports the peer's area, places its own hello there and
  // returns the peer's user payload. The import waits at most `patience` for
  // the peer, as connect's (timed_out: call again later).
  result<std::string> accept_peer(std::string_view user_hello,
                                  std::chrono::milliseconds patience = std::chrono::seconds(5));
  // After connect(): the passive end's user payload once it arrived, else
  // would_block.
  result<std::string> peer_hello();
  bool connected() const noexcept;

  // --- sending ----------------------------------------------------------
  // Sends up to `length` bytes; returns how many were accepted (> 0), or
  // would_block when the ring is full and no post is open. Bytes accepted are
  // on their way in order. Errors: not_connected, closed (this end called
  // close_write), peer_gone, and core's send errors.
  result<std::size_t> write(const void* data, std::size_t length);
  // Blocking form: waits up to `timeout` for ring space (or a post); returns
  // once `all` bytes (or, with all == false, at least one) are accepted.
  // Errors as write(), plus timed_out when no byte could be accepted.
  result<std::size_t> write(const void* data, std::size_t length, bool all,
                            std::chrono::milliseconds timeout);
  // End of stream: the peer reads the bytes sent so far, then end of file.
  status close_write();
  // From any thread: writes fail with closed from now on, and a write
  // blocked in another thread returns at its next turn (within 100 ms) with
  // what it placed so far, or closed. What a kernel socket's shutdown() does
  // to a blocked send; close_write() still places the end.
  void stop_writing() noexcept;

  // --- receiving --------------------------------------------------------
  // Bytes ready to be read without waiting (ring contents).
  std::size_t readable();
  // True once the peer closed its write side and every byte was read.
  bool at_end();
  // True once the peer closed its write side (bytes may still be unread).
  bool peer_closed();
  // Copies up to `length` ready bytes out of the ring; `consume` false peeks.
  // Returns 0 when nothing is ready (see at_end() for end of stream).
  std::size_t read(void* data, std::size_t length, bool consume = true);
  // Receives into `data`, waiting up to `timeout` for the first byte: posts
  // the buffer for redirection when that pays (see above), else waits and
  // copies. Returns as soon as some bytes are there (all `length` when
  // `wait_all`), or 0 bytes at end of stream. Works before this end is
  // connected too (the passive end may read before accept_peer), without
  // posting. Errors: timed_out (no byte came), peer_gone.
  result<receive_result> receive(void* data, std::size_t length, bool wait_all,
                                 std::chrono::milliseconds timeout);
  // Redirection for callers that drive their own progress loop (NX): posts
  // `data` for the next `length` bytes of the stream and returns at once.
  // Bytes already in the ring are copied into the start of `data` when the
  // post completes. True when posted; false when posting does not pay or
  // cannot be done (mapped path, fewer than post_min bytes still to come,
  // end of stream): then read as usual. While the post is open read()
  // returns 0.
  // Errors: already_exists (a post is open), and those of exporting.
  result<bool> post(void* data, std::size_t length);
  // The open post's outcome once it is complete: the bytes copied (ring bytes
  // the sender wrote before it saw the post) and redirected, together all
  // `length` posted unless the stream ended; would_block meanwhile. The
  // caller promises that `length` bytes are coming (a message body its
  // header announced): the post stays open until the sender takes it up,
  // unless the ring alone holds them all. Errors: invalid_argument (no post
  // open), peer_gone.
  result<receive_result> poll_post();
  // Takes the open post back, for a caller whose buffer must not be written
  // any more (NX after a failed wait). True when the sender had not taken
  // it up: the bytes stay in the stream and are read as usual. Otherwise
  // the buffer's export is revoked (once this returns no write of the
  // sender's lands there), the post is closed and the result is false: the
  // share of the stream the post took is unknown, so this end of the stream
  // cannot be read on. Errors: invalid_argument (no post open).
  result<bool> withdraw_post();
  // Drives progress and takes in what the peer wrote; cheap, no system call on
  // the mapped path. Returns true when something changed for this end
  // (bytes arrived, space freed, hello or end of stream).
  bool poll();

  // Call before sleeping on the doorbell. Returns false when sleeping would
  // lose a wake-up (data/space is there or on its way): poll instead.
  bool prepare_sleep(sleep_reason reason, wake_by how = wake_by::doorbell);
  // This end's wait descriptor (channel_options::wait_fd), or -1: readable
  // once the peer woke a sleeper that armed with wake_by::wait_fd. A
  // sleeper that saw it readable calls clear_wait_fd() (edge-triggered
  // waits need not).
  int wait_fd() const;
  void clear_wait_fd();
  // A number that changes whenever the peer wrote something this end may
  // care about (bytes, credit, end of stream); for edge-triggered readiness.
  std::uint64_t activity();
  // Space free in the peer's ring for write() without blocking.
  std::size_t writable();
  // The peer process is gone (its context's control connection broke, or
  // connect()/accept_peer() found it gone).
  bool peer_gone();

  channel_counters stats() const;
  // What the connected path can do (all false before); decide by these.
  channel_capabilities capabilities() const;
  // "mapped" or "fabric:<provider>" once connected; for benchmarks and logs.
  std::string path() const;

  class [[gnu::visibility("hidden")]] impl;  // internal, not exported

 private:
  [[gnu::visibility("hidden")]] explicit channel(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace vmmc::redirect

#pragma GCC visibility pop
