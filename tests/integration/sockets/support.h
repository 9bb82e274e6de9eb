// What the sockets integration tests share: peer processes, a per-test
// watchdog, loopback connection set-up, the offset-derived data pattern with a
// running checksum, and I/O loops written once over `api`.
//
// Peers are this test binary started again (fork + exec of /proc/self/exe) in
// a role registered with `peer_role`: a fresh process, as a real peer would
// be, that inherits no library state and no descriptor but its pipe to us.
// A peer dies with its parent, exits after its lifetime (alarm), and is killed
// by the parent if it outstays a deadline, so no test waits on a hung peer.
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/types.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "integration/sockets/api.h"
#include "support/fault.h"

namespace vmmc::test {

using namespace std::chrono_literals;

// ---- Peer processes.

// What a peer's body gets: its api, its arguments, and a pipe to the parent
// (lines of text).
class peer_context {
 public:
  peer_context(const api& a, std::vector<std::string> args, int to_parent)
      : api_(a), args_(std::move(args)), to_parent_(to_parent) {}
  const api& io() const { return api_; }
  const std::string& arg(std::size_t i) const { return args_.at(i); }
  long long arg_int(std::size_t i) const { return std::stoll(args_.at(i)); }
  void say(const std::string& line) const;
  // Reports a failure to the parent, which turns it into a test failure.
  void fail(const std::string& message) const;
  // Reports `problem` unless it is empty; returns whether it was empty.
  bool expect(const std::string& problem) const;
  // Connects to the loopback port given as argument 0 (the parent's
  // listener); -1, reported to the parent, when it cannot.
  int connect_to_parent() const;

 private:
  const api& api_;
  std::vector<std::string> args_;
  int to_parent_;
};

using peer_body = std::function<int(peer_context&)>;

// Registers a peer body under a name at static-initialisation time:
//   const peer_role echo_role("echo", [](peer_context& p) { ... return 0; });
class peer_role {
 public:
  peer_role(const char* name, peer_body body);
};

class peer {
 public:
  // Starts role `role` with api `a` and `args`; it exits after `lifetime`.
  peer(const std::string& role, const api& a, const std::vector<std::string>& args = {},
       std::chrono::seconds lifetime = 30s);
  ~peer();
  peer(const peer&) = delete;
  peer& operator=(const peer&) = delete;

  // Next line from the peer; "" (and a test failure) on EOF or after
  // `timeout`. Lines "fail <message>" become test failures and are skipped.
  std::string read_line(std::chrono::milliseconds timeout = 10s);
  // read_line() as an integer after the given prefix ("port 1234" -> 1234).
  long long read_value(const std::string& prefix, std::chrono::milliseconds timeout = 10s);
  // Exit code (128 + signal if killed); -1 with a test failure if it was
  // still running at `deadline` (then it is killed). Reports the peer's
  // remaining "fail" lines.
  int wait(std::chrono::milliseconds deadline = 10s);
  void kill_now();
  pid_t pid() const { return pid_; }

 private:
  std::string role_;
  pid_t pid_ = -1;
  int from_peer_ = -1;
  bool reaped_ = false;
  std::string pending_;
};

// ---- Per-test watchdog: a test still running after its budget ends the test
// binary with a message naming it (a hang must fail, not block CTest).

class watchdog {
 public:
  explicit watchdog(std::chrono::seconds budget);
  ~watchdog();
  // Gives the running test `budget` from now.
  void rearm(std::chrono::seconds budget);
};

// Base of the parameterized suites: GetParam() is the api under test.
class api_test : public testing::TestWithParam<const api*> {
 protected:
  const api& io() const { return *GetParam(); }
  watchdog guard_{60s};
};

inline std::string api_name(const testing::TestParamInfo<const api*>& info) {
  return info.param->name;
}

#define VMMC_INSTANTIATE_FOR_APIS(suite) \
  INSTANTIATE_TEST_SUITE_P(apis, suite, testing::Values(&kernel_api, &vmmc_api), api_name)

// Raises RLIMIT_NOFILE's soft limit to the hard limit; returns the new limit.
std::uint64_t raise_fd_limit();

// ---- Loopback connections (127.0.0.1, ephemeral ports).

sockaddr_in loopback(int port);
// A listening socket on 127.0.0.1:0, its port in *port; -1 with errno on failure.
int listen_loopback(const api& a, int* port, int backlog = 128);
// The same on 127.0.0.1:*port (0: any), with SO_REUSEADDR when asked.
int listen_loopback_at(const api& a, int* port, int backlog, bool reuse_address);
// A connected socket (blocking unless `nonblocking`, then connect may still
// be in progress); -1 on failure with errno set.
int connect_loopback(const api& a, int port, bool nonblocking = false);
// accept() with a deadline: polls the listener first. -1 on timeout/failure.
int accept_within(const api& a, int listener, std::chrono::milliseconds timeout = 10s);

struct socket_pair {
  int client = -1, server = -1;
};
// A connected pair in this process, both ends through `a`.
socket_pair connect_pair(const api& a);

bool set_nonblocking(const api& a, int fd, bool on);
// Polls one descriptor through the api; returns revents (0 on timeout).
short wait_ready(const api& a, int fd, short events, std::chrono::milliseconds timeout);
int socket_error(const api& a, int fd);

// ---- I/O that works on blocking and non-blocking descriptors alike (EAGAIN
// waits in api.poll, bounded by `timeout` between progress).

// Writes everything; false with errno on error.
bool write_all(const api& a, int fd, const void* data, std::size_t length, int flags = 0,
               std::chrono::milliseconds timeout = 10s);
// Reads up to `length` bytes, stopping early only at EOF; returns the count,
// or -1 with errno on error (bytes read before the error are in `data`).
ssize_t read_full(const api& a, int fd, void* data, std::size_t length,
                  std::chrono::milliseconds timeout = 10s);
// Reads until EOF, at most `limit` bytes (then stops); -1 on error.
ssize_t read_to_eof(const api& a, int fd, std::string& out, std::size_t limit = 64u << 20,
                    std::chrono::milliseconds timeout = 10s);

// Counts SIGPIPEs while it lives.
class sigpipe_counter {
 public:
  sigpipe_counter() {
    count_ = 0;
    struct sigaction action {};
    action.sa_handler = [](int) { count_.fetch_add(1); };
    ::sigaction(SIGPIPE, &action, &old_);
  }
  ~sigpipe_counter() { ::sigaction(SIGPIPE, &old_, nullptr); }
  int count() const { return count_.load(); }

 private:
  static inline std::atomic<int> count_{0};
  struct sigaction old_ {};
};

// After the peer closed or died: sends one byte at a time (send with
// MSG_NOSIGNAL, or write) until an error other than ECONNRESET (which the
// kernel reports once, for the peer's reset); returns that errno, or 0 if
// sends still succeeded after `timeout`.
int send_until_broken(const api& a, int fd, bool nosignal, std::chrono::milliseconds timeout = 5s);

// One read that must see EOF (waiting up to 10 s on a non-blocking socket):
// "" or what it saw instead (bytes in hex, or the error).
std::string check_eof(const api& a, int fd);

// ---- The data pattern and checksum: fault.h's (byte i of a stream with seed
// s is a function of (s, i), so a receiver verifies every byte at its offset).

using fault::check_pattern;
using fault::fill_pattern;
using fault::pattern;
using fault::pattern_byte;
using fault::stream_checksum;

// One end of a full-duplex patterned stream: a writer thread sends `bytes`
// bytes of pattern `send_seed` in random pieces (1 B .. 1 MiB, write / writev /
// send) while the calling thread reads `bytes` bytes of pattern `recv_seed`
// (read / readv / recv), verifying every byte. Then it half-closes and expects
// EOF, so the peer must not send a byte more. `at_end` runs when all bytes
// went both ways, before the half-close (for checks on the open connection).
// `on_read`, if given, runs on the reading thread after each read with the
// bytes received so far (for faults injected mid-stream).
struct stream_result {
  std::uint64_t sent = 0, received = 0;
  std::uint64_t sent_checksum = 0, received_checksum = 0;
  double seconds = 0;
  std::string error;  // empty on success
};
stream_result stream_both_ways(const api& a, int fd, std::uint64_t bytes, std::uint64_t send_seed,
                               std::uint64_t recv_seed, std::uint64_t rng_seed,
                               const std::function<void(const stream_result&)>& at_end = {},
                               const std::function<void(std::uint64_t)>& on_read = {});

// Random bytes, for garbage.
std::vector<unsigned char> random_bytes(std::size_t length, std::uint64_t seed);

}  // namespace vmmc::test
