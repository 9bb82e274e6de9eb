// tests/support/fault.h: fault injection for tests (issue 16, item 3).
//
// A test that runs a stream between two ends uses these to break things
// while the stream runs, then checks that every byte arrived once, in order
// and intact, or that the failure surfaced as the error the reference stack
// (kernel TCP, libtirpc, NX) gives in the same situation:
//   - process faults on a child the test started: kill, stop and continue;
//   - a TCP relay between two endpoints that delays, re-segments, stalls,
//     reorders, drops, closes or resets the bytes it forwards;
//   - shutting down a process's control connection (core's Unix socket);
//   - descriptor exhaustion;
//   - a gate that stalls a reader loop so the writer fills the ring;
//   - a seeded byte pattern with a position-by-position verifier that tells
//     lost, duplicated and corrupted bytes apart.
// Nothing here knows vmmc: the same faults apply to the kernel oracle.
//
// Faults on a byte stream come in two kinds. Delay, re-segmentation and
// stalls are invisible to a correct stack: the stream must arrive identical,
// only later. Drop, reorder, close and reset damage the stream: a correct
// stack reports an error or the receiver's verifier detects the damage at
// the exact offset; it never hangs or crashes.
//
// Every call returns errors as values (0 or an errno value); nothing throws.
#pragma once

#include <netinet/in.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace vmmc::test::fault {

// ---- Process faults. `pid` must be a child (or descendant) the test
// started; the calls refuse pid <= 1 and the calling process (EINVAL), so a
// wrong value cannot stop the test itself or signal a process group.

// Sends `signal` to `pid`. Returns 0 or errno (ESRCH: already gone).
int kill_peer(pid_t pid, int signal = 9 /* SIGKILL */);
// SIGSTOP, then waits (up to 2 s) until the kernel shows every thread of the
// process stopped (/proc/<pid>/stat state T), so the caller knows the peer
// runs no more instruction from now on. Returns 0, or errno (ETIMEDOUT when
// it did not stop, ESRCH when it is gone). The caller must resume_peer().
int pause_peer(pid_t pid);
// SIGCONT. Returns 0 or errno.
int resume_peer(pid_t pid);
// True when /proc/<pid>/stat shows the process stopped.
bool is_stopped(pid_t pid);

// Stops `pid` now and continues it after `duration` (from a thread of its
// own, so the caller goes on meanwhile) or at destruction, whichever comes
// first. ok() tells whether the stop took effect. Not copyable or movable.
class paused_for {
 public:
  paused_for(pid_t pid, std::chrono::milliseconds duration);
  ~paused_for();
  paused_for(const paused_for&) = delete;
  paused_for& operator=(const paused_for&) = delete;
  bool ok() const { return error_ == 0; }
  int error() const { return error_; }
  // Blocks until the process has been continued.
  void wait();

 private:
  pid_t pid_;
  int error_ = 0;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool resumed_ = false;
  std::thread resumer_;
};

// ---- TCP relay.

inline constexpr std::uint64_t never = ~std::uint64_t{0};

// The faults of one direction of every connection through a relay. Offsets
// count the bytes the relay received from the sending end in that direction
// (urgent bytes included), from 0 at the connection's start.
struct fault_plan {
  std::uint64_t seed = 1;  // for the random choices (per connection: seed + index)
  // Each chunk is held for a random time in [0, max_delay] before it is
  // forwarded; order is kept (a chunk never overtakes an earlier one).
  std::chrono::microseconds max_delay{0};
  // > 0: forward in random pieces of 1 .. max_chunk bytes, each its own
  // send(), so the receiver sees other segment boundaries than were sent.
  std::size_t max_chunk = 0;
  // Forwarding stops for `stall_for` when it reaches offset `stall_at`.
  std::uint64_t stall_at = never;
  std::chrono::milliseconds stall_for{0};
  // Bytes [reorder_at, +reorder_length) and the next reorder_length bytes are
  // forwarded in swapped order (both complete, or in order at end of stream).
  std::uint64_t reorder_at = never;
  std::size_t reorder_length = 0;
  // Bytes [drop_at, +drop_length) are not forwarded.
  std::uint64_t drop_at = never;
  std::size_t drop_length = 0;
  // After forwarding the bytes before `close_at`: both ends get end of file
  // (shutdown(SHUT_WR) on both sockets) as if the other end had half-closed;
  // what they send from then on is read and discarded.
  std::uint64_t close_at = never;
  // After forwarding the bytes before `reset_at`: both sockets are closed
  // with SO_LINGER {1, 0}, so both ends get a reset (ECONNRESET / EPIPE).
  std::uint64_t reset_at = never;
};

// Counters of a relay, over all its connections.
struct relay_counters {
  std::uint64_t connections = 0;        // accepted and connected to the target
  std::uint64_t to_target = 0;          // bytes written toward the target
  std::uint64_t from_target = 0;        // bytes written back toward the client
  std::uint64_t urgent = 0;             // urgent bytes forwarded as urgent
  std::uint64_t dropped = 0;            // bytes removed by drop_at
  std::uint64_t closed = 0, reset = 0;  // connections ended by a fault
};

// Listens on 127.0.0.1 (ephemeral port) and forwards every accepted
// connection to `target` in both directions, applying `to_target` to the
// client's bytes and `from_target` to the target's, on one thread of its
// own. Transparent otherwise: an end of file is passed on as an end of file
// (shutdown(SHUT_WR)) once the bytes before it are delivered, a reset as a
// reset, and urgent bytes (MSG_OOB) as urgent bytes at the same position
// (SO_OOBINLINE + SIOCATMARK), so an in-band upgrade that signals with them
// works through it. A relay holds at most 1 MiB per direction; it stops
// reading a sender whose bytes the other end does not take.
//
// On one host a vmmc client offers the upgrade only to a listener that a
// vmmc process entered in the presence table, and a server answers only a
// client entered there (sockets/src/presence.h). A relay that passes
// upgrades enters its own sockets, and its socket to the target asks (or
// declines) once the client behind it does, as a relay across hosts (which
// nobody asks) would pass them: the tests then see the in-band upgrade cross
// it, whether the client asks at once or mid-stream.
//
// Bounded: a connection is closed once both directions ended; the
// destructor closes what is left (plain close) and joins the thread.
// Thread safety: every member may be called from any thread.
enum class upgrades { pass, plain };
class relay {
 public:
  explicit relay(const sockaddr_in& target, fault_plan to_target = {}, fault_plan from_target = {},
                 upgrades mode = upgrades::pass);
  ~relay();
  relay(const relay&) = delete;
  relay& operator=(const relay&) = delete;

  // False when the listener could not be set up (then port() is 0).
  bool ok() const { return port_ != 0; }
  int port() const { return port_; }
  sockaddr_in address() const;

  // Faults triggered by the test rather than by an offset, on every open
  // connection: stop forwarding both ways for `duration` from now; reset
  // (as fault_plan::reset_at); close (as fault_plan::close_at).
  void stall(std::chrono::milliseconds duration);
  void reset_all();
  void close_all();

  relay_counters counters() const;

  class impl;

 private:
  std::unique_ptr<impl> impl_;
  int port_ = 0;
};

// ---- Control connections.

// The Unix stream sockets a process holds at one moment (by socket inode).
// `pid` 0 means this process.
class socket_snapshot {
 public:
  explicit socket_snapshot(pid_t pid = 0);
  pid_t pid() const { return pid_; }
  // Descriptors of Unix stream sockets of the process that are not in the
  // snapshot (opened since it was taken), ascending.
  std::vector<int> opened_since() const;

 private:
  pid_t pid_;
  std::vector<unsigned long> inodes_;
};

// Shuts down (shutdown(SHUT_RDWR)) every Unix stream socket the process
// opened since `before`: for vmmc, the core control connections of the
// imports made meanwhile (context address lookups use no other Unix stream
// socket), so both contexts see their peer gone exactly as if it had died,
// while both processes go on. shutdown() acts on the socket, not the
// descriptor: for another process the socket is reached through a duplicate
// taken with pidfd_getfd(2) (Linux 5.6; needs ptrace rights over it, which a
// parent has). Returns how many sockets were shut down, or -errno.
int close_control_connection(const socket_snapshot& before);

// ---- Descriptor exhaustion.

// While it lives, this process can open only `leave_free` more descriptors:
// RLIMIT_NOFILE's soft limit is lowered to just above the highest descriptor
// in use and every free slot below it is filled with a duplicate of
// /dev/null. The destructor closes the fillers and restores the limit.
// Affects every thread of the process (vmmc's control thread included),
// which is the point. ok() is false if it could not be set up (then nothing
// changed).
class descriptor_exhaustion {
 public:
  explicit descriptor_exhaustion(int leave_free = 0);
  ~descriptor_exhaustion();
  descriptor_exhaustion(const descriptor_exhaustion&) = delete;
  descriptor_exhaustion& operator=(const descriptor_exhaustion&) = delete;
  bool ok() const { return ok_; }
  // Descriptors still free below the lowered limit (counted now).
  int free_left() const;

 private:
  bool ok_ = false;
  std::uint64_t saved_soft_ = 0;
  std::vector<int> fillers_;
};
inline std::unique_ptr<descriptor_exhaustion> exhaust_descriptors(int leave_free = 0) {
  return std::make_unique<descriptor_exhaustion>(leave_free);
}

// ---- Ring fill / stalled reader.

// A gate in a reader loop: pass() returns at once while the gate is open and
// blocks while it is closed (at most `limit` per call, so a forgotten open()
// cannot hang a test; it returns false then). close() stops the reader at
// its next pass(); open() lets it go on. passes() counts returns, so a test
// can tell the reader is parked: closed_and_parked().
// Thread safety: any thread may call any member.
class reader_gate {
 public:
  explicit reader_gate(std::chrono::milliseconds limit = std::chrono::seconds(30))
      : limit_(limit) {}
  bool pass();
  void close();
  void open();
  // True once the reader is blocked in pass() behind a closed gate.
  bool parked() const { return parked_.load(); }
  // Waits up to `timeout` until parked().
  bool wait_parked(std::chrono::milliseconds timeout);

 private:
  std::chrono::milliseconds limit_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool closed_ = false;
  std::atomic<bool> parked_{false};
};

// Waits until `progress()` (e.g. bytes written so far) has not changed for
// `quiet` (the writer is blocked: the ring is full), at most `timeout`.
// Returns true when it went quiet, with the value in *at (if given).
bool wait_quiet(const std::function<std::uint64_t()>& progress, std::chrono::milliseconds quiet,
                std::chrono::milliseconds timeout, std::uint64_t* at = nullptr);

// ---- The data pattern: byte `offset` of the stream with seed `seed` is a
// function of both (splitmix64 of the 8-byte word index), so a receiver
// checks every byte where it stands.

std::uint64_t pattern_word(std::uint64_t seed, std::uint64_t index);
unsigned char pattern_byte(std::uint64_t seed, std::uint64_t offset);
void fill_pattern(std::uint64_t seed, std::uint64_t offset, unsigned char* data,
                  std::size_t length);
std::vector<unsigned char> pattern(std::uint64_t seed, std::size_t length);
// Index of the first byte of `data` (at stream `offset`) that is not the
// pattern, or `length` if all are.
std::size_t check_pattern(std::uint64_t seed, std::uint64_t offset, const unsigned char* data,
                          std::size_t length);

// An order-sensitive 64-bit checksum (FNV-style over 8-byte words) of a byte
// stream that does not depend on how the stream was cut into pieces.
class stream_checksum {
 public:
  void update(const unsigned char* data, std::size_t length);
  std::uint64_t value() const;

 private:
  void mix(std::uint64_t word) { sum_ = (sum_ ^ word) * 0x100000001B3ull + 0x9E3779B97F4A7C15ull; }
  std::uint64_t sum_ = 0xCBF29CE484222325ull;
  std::uint64_t partial_ = 0;
  unsigned filled_ = 0;
};

// The receiving side of a patterned stream: feed() everything received, in
// order; it checks each byte at its offset. At the first wrong byte it stops
// (feed returns false from then on) and error() says where and what it looks
// like: bytes lost (what came is the pattern from a later offset), bytes
// duplicated (from an earlier offset), or corrupted (neither).
class stream_verifier {
 public:
  explicit stream_verifier(std::uint64_t seed) : seed_(seed) {}
  bool feed(const void* data, std::size_t length);
  bool ok() const { return error_.empty(); }
  // Bytes received intact and in order (up to the first bad one).
  std::uint64_t verified() const { return verified_; }
  std::uint64_t checksum() const { return checksum_.value(); }
  const std::string& error() const { return error_; }

 private:
  std::uint64_t seed_;
  std::uint64_t verified_ = 0;
  stream_checksum checksum_;
  std::string error_;
};

// The checksum of pattern(seed) bytes [0, length), for comparing with
// stream_verifier::checksum() or a peer's report.
std::uint64_t pattern_checksum(std::uint64_t seed, std::uint64_t length);

}  // namespace vmmc::test::fault
