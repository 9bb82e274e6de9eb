// integration.sockets.faults: checksummed streams under injected faults
// (tests/support/fault.h), each run over kernel_api (the oracle) and
// vmmc_api with the same assertions:
//   - a relay that delays, re-segments and stalls the TCP connection: the
//     stream arrives identical. The vmmc upgrade runs through the relay (its
//     urgent offer/accept bytes pass as urgent bytes); after it, the data
//     goes over the mapped path and the relayed TCP connection carries only
//     the handshake and one-byte doorbells, so what is delayed and stalled
//     there is the wake-up of a sleeping reader or writer: it may make the
//     transfer slower, never lose, duplicate or hang it;
//   - the peer process stopped (SIGSTOP) for a second mid-stream, then
//     continued: the stream completes identical;
//   - the relayed connection reset mid-stream: the error kernel TCP gives
//     (ECONNRESET or EPIPE), a prefix of intact bytes before it, no hang;
//   - descriptors exhausted while a connection waits to be accepted: accept
//     fails with EMFILE, the open connection goes on intact, and the waiting
//     one is accepted and served once descriptors are free again.
#include <signal.h>

#include <optional>
#include <sstream>
#include <thread>

#include "integration/sockets/support.h"
#include "support/fault.h"
#include "time_scale.h"

namespace vmmc::test {
namespace {

constexpr std::uint64_t to_peer_seed = 0xFA0001;
constexpr std::uint64_t from_peer_seed = 0xFA0002;

// Connects to port arg 0, streams arg 1 bytes each way (pieces from seed
// arg 2) and says "result <error or ok> <sent> <received> <sent checksum>
// <received checksum>"; errors are the parent's to judge (some cases expect
// one), so they are reported, not failed.
const peer_role fault_stream("fault_stream", [](peer_context& p) {
  ::signal(SIGPIPE, SIG_IGN);
  int fd = p.connect_to_parent();
  if (fd < 0) return 1;
  stream_result r =
      stream_both_ways(p.io(), fd, static_cast<std::uint64_t>(p.arg_int(1)), from_peer_seed,
                       to_peer_seed, static_cast<std::uint64_t>(p.arg_int(2)));
  std::string error = r.error.empty() ? "ok" : r.error;
  std::replace(error.begin(), error.end(), ' ', '_');
  p.say("result " + error + " " + std::to_string(r.sent) + " " + std::to_string(r.received) + " " +
        std::to_string(r.sent_checksum) + " " + std::to_string(r.received_checksum));
  p.io().close(fd);
  return 0;
});

// Connects to port arg 0, says "connected", echoes until end of file.
const peer_role fault_echo("fault_echo", [](peer_context& p) {
  ::signal(SIGPIPE, SIG_IGN);
  int fd = p.connect_to_parent();
  if (fd < 0) return 1;
  p.say("connected");
  std::vector<unsigned char> buffer(1 << 20);
  ssize_t n;
  while ((n = p.io().read(fd, buffer.data(), buffer.size())) > 0)
    if (!write_all(p.io(), fd, buffer.data(), static_cast<std::size_t>(n), MSG_NOSIGNAL)) break;
  if (n < 0) p.fail(std::string("echo read: ") + std::strerror(errno));
  p.io().close(fd);
  return 0;
});

struct peer_result {
  std::string error;
  std::uint64_t sent = 0, received = 0, sent_checksum = 0, received_checksum = 0;
};
peer_result read_result(peer& child, std::chrono::seconds timeout) {
  std::istringstream line(child.read_line(timeout));
  std::string word;
  peer_result r;
  line >> word >> r.error >> r.sent >> r.received >> r.sent_checksum >> r.received_checksum;
  std::replace(r.error.begin(), r.error.end(), '_', ' ');
  if (word != "result") r.error = "no result line";
  return r;
}

// Both ends streamed `bytes` each way and their checksums agree.
void expect_identical(const stream_result& mine, const peer_result& theirs, std::uint64_t bytes) {
  EXPECT_EQ(mine.error, "") << "this end";
  EXPECT_EQ(theirs.error, "ok") << "the peer's end";
  EXPECT_EQ(mine.sent, bytes);
  EXPECT_EQ(mine.received, bytes);
  EXPECT_EQ(theirs.sent, bytes);
  EXPECT_EQ(theirs.received, bytes);
  EXPECT_EQ(mine.received_checksum, theirs.sent_checksum) << "peer -> us";
  EXPECT_EQ(mine.sent_checksum, theirs.received_checksum) << "us -> peer";
  EXPECT_EQ(mine.received_checksum, fault::pattern_checksum(from_peer_seed, bytes));
}

// Writes `length` bytes of pattern `seed` (from a thread) and reads the
// echo back, verifying it; "" or what went wrong.
std::string echo_checked(const api& a, int fd, std::uint64_t seed, std::size_t length) {
  std::string write_error;
  std::thread writer([&] {
    auto data = pattern(seed, length);
    if (!write_all(a, fd, data.data(), data.size(), MSG_NOSIGNAL))
      write_error = std::string("write: ") + std::strerror(errno);
  });
  fault::stream_verifier v(seed);
  std::vector<unsigned char> buffer(1 << 16);
  std::string error;
  while (v.verified() < length && v.ok()) {
    ssize_t n = read_full(a, fd, buffer.data(),
                          std::min<std::size_t>(buffer.size(), length - v.verified()));
    if (n <= 0) {
      error = n == 0 ? "EOF" : std::string("read: ") + std::strerror(errno);
      break;
    }
    v.feed(buffer.data(), static_cast<std::size_t>(n));
  }
  writer.join();
  if (!v.ok()) return v.error();
  return error.empty() ? write_error : error;
}

class Faults : public api_test {
 protected:
  void SetUp() override {
    old_sigpipe_ = ::signal(SIGPIPE, SIG_IGN);
    listener_ = listen_loopback(io(), &port_);
    ASSERT_GE(listener_, 0) << std::strerror(errno);
  }
  void TearDown() override {
    io().close(listener_);
    ::signal(SIGPIPE, old_sigpipe_);
  }
  int port_ = 0;
  int listener_ = -1;
  sighandler_t old_sigpipe_{};
};

TEST_P(Faults, RelayThatDelaysResegmentsAndStallsChangesNothing) {
  guard_.rearm(90s * time_scale());
  // The kernel's bytes all cross the relay in small pieces, which is slow;
  // vmmc's cross the mapped path.
  const std::uint64_t bytes = io().vmmc ? (256u << 20) : (32u << 20);
  fault::fault_plan up, down;
  up.seed = 1;
  down.seed = 2;
  for (fault::fault_plan* f : {&up, &down}) {
    f->max_delay = 200us;
    f->max_chunk = 4096;
    f->stall_at = 64 << 10;  // the kernel's data; past vmmc's handshake and doorbells
    f->stall_for = 300ms;
  }
  fault::relay relay(loopback(port_), up, down);
  ASSERT_TRUE(relay.ok());
  peer child("fault_stream", io(), {std::to_string(relay.port()), std::to_string(bytes), "3"},
             80s * time_scale());
  int fd = accept_within(io(), listener_);
  ASSERT_GE(fd, 0) << std::strerror(errno);

  // Stalls of 50 ms every 100 ms for the whole transfer, once the upgrade
  // had its chance (a stall during the handshake makes a server give up
  // waiting for the offer: plain TCP, by design).
  std::atomic<bool> done{false};
  std::thread staller([&] {
    std::this_thread::sleep_for(100ms);
    while (!done.load()) {
      relay.stall(50ms);
      std::this_thread::sleep_for(100ms);
    }
  });
  auto start = std::chrono::steady_clock::now();
  stream_result r =
      stream_both_ways(io(), fd, bytes, to_peer_seed, from_peer_seed, 4,
                       [&](const stream_result&) { EXPECT_EQ(check_accelerated(io(), fd), ""); });
  done = true;
  staller.join();
  auto took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  expect_identical(r, read_result(child, 60s * time_scale()), bytes);
  EXPECT_EQ(child.wait(20s), 0);
  io().close(fd);

  fault::relay_counters c = relay.counters();
  std::printf(
      "[ faults   ] %s: %llu MiB each way in %.2f s through the relay; it forwarded "
      "%llu bytes up, %llu down, %llu urgent\n",
      io().name, static_cast<unsigned long long>(bytes >> 20), took,
      static_cast<unsigned long long>(c.to_target), static_cast<unsigned long long>(c.from_target),
      static_cast<unsigned long long>(c.urgent));
  EXPECT_EQ(c.connections, 1u);
  if (io().vmmc) {
    // The accept as the one urgent byte (a client on this host offers
    // nothing: the server knows it from the presence table); then the bytes
    // each end wrote before its switch (N_c, N_s: raw TCP, more while the
    // relay holds the handshake back), the hello frame and doorbells; the
    // rest went mapped.
    EXPECT_EQ(c.urgent, 1u);
    EXPECT_LT(c.to_target + c.from_target, bytes / 4) << "most data went over TCP";
  } else {
    EXPECT_EQ(c.to_target, bytes);
    EXPECT_EQ(c.from_target, bytes);
  }
}

TEST_P(Faults, PeerStoppedForASecondMidStreamCompletesIdentical) {
  guard_.rearm(90s * time_scale());
  // Enough that the stream is well under way at the pause (an eighth in)
  // and goes on long after it; a slow build streams a time-scale's share
  // (TSan: 62 s for the whole GiB, the most of any case).
  const std::uint64_t bytes =
      (io().vmmc ? (std::uint64_t{1} << 30) : (std::uint64_t{256} << 20)) / time_scale();
  peer child("fault_stream", io(), {std::to_string(port_), std::to_string(bytes), "5"},
             80s * time_scale());
  int fd = accept_within(io(), listener_);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  std::optional<fault::paused_for> pause;
  std::chrono::steady_clock::time_point paused_at;
  stream_result r = stream_both_ways(
      io(), fd, bytes, to_peer_seed, from_peer_seed, 6,
      [&](const stream_result&) { EXPECT_EQ(check_accelerated(io(), fd), ""); },
      [&](std::uint64_t received) {
        if (!pause && received >= bytes / 8) {
          paused_at = std::chrono::steady_clock::now();
          pause.emplace(child.pid(), 1000ms);
          EXPECT_TRUE(pause->ok()) << std::strerror(pause->error());
        }
      });
  if (!pause) {
    peer_result theirs = read_result(child, 10s * time_scale());
    FAIL() << "the stream ended before the pause: " << r.error << " (sent " << r.sent
           << ", received " << r.received << "); the peer's end: " << theirs.error << " (sent "
           << theirs.sent << ", received " << theirs.received << ")";
  }
  pause->wait();
  EXPECT_GE(std::chrono::steady_clock::now() - paused_at, 990ms);
  expect_identical(r, read_result(child, 60s * time_scale()), bytes);
  EXPECT_EQ(child.wait(20s), 0);
  io().close(fd);
}

TEST_P(Faults, ConnectionResetMidStreamGivesTheErrorKernelTcpGives) {
  guard_.rearm(60s);
  const std::uint64_t bytes = std::uint64_t{1} << 40;  // ends only by the reset
  fault::relay relay(loopback(port_));
  ASSERT_TRUE(relay.ok());
  peer child("fault_stream", io(), {std::to_string(relay.port()), std::to_string(bytes), "7"}, 50s);
  int fd = accept_within(io(), listener_);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  std::chrono::steady_clock::time_point reset_at;
  bool reset = false, forced = false;
  std::uint64_t received_after = 0;
  stream_result r = stream_both_ways(
      io(), fd, bytes, to_peer_seed, from_peer_seed, 8, {}, [&](std::uint64_t received) {
        if (!reset && received >= (16u << 20)) {
          reset = true;
          reset_at = std::chrono::steady_clock::now();
          received_after = received;
          relay.reset_all();
        }
        // Bounded: the reset must end the stream soon.
        if (reset && !forced && std::chrono::steady_clock::now() - reset_at > 5s) {
          forced = true;
          io().shutdown(fd, SHUT_RDWR);
        }
      });
  ASSERT_TRUE(reset) << "the stream ended before the reset: " << r.error;
  // Kernel TCP: what had arrived is read, then ECONNRESET (or the writer's
  // EPIPE / ECONNRESET first); never corrupt bytes, never a clean end.
  if (forced) {
    // The peer would go on too (nothing tells it either): it is killed.
    FAIL() << "this end still streaming 5 s after the reset (" << r.received - received_after
           << " bytes received since); we shut it down";
  }
  EXPECT_TRUE(r.error.find("Connection reset by peer") != std::string::npos ||
              r.error.find("Broken pipe") != std::string::npos)
      << "this end: " << r.error;
  peer_result theirs = read_result(child, 20s);
  EXPECT_TRUE(theirs.error.find("Connection reset by peer") != std::string::npos ||
              theirs.error.find("Broken pipe") != std::string::npos)
      << "the peer's end: " << theirs.error;
  EXPECT_EQ(child.wait(20s), 0);
  EXPECT_EQ(relay.counters().reset, 1u);
  io().close(fd);
}

TEST_P(Faults, DescriptorExhaustionDuringAcceptIsEmfileAndTheOpenConnectionGoesOn) {
  guard_.rearm(60s);
  peer first("fault_echo", io(), {std::to_string(port_)});
  int open_fd = accept_within(io(), listener_);
  ASSERT_GE(open_fd, 0) << std::strerror(errno);
  ASSERT_EQ(first.read_line(), "connected");
  ASSERT_EQ(echo_checked(io(), open_fd, 1, 1 << 20), "");
  EXPECT_EQ(check_accelerated(io(), open_fd), "");

  peer second("fault_echo", io(), {std::to_string(port_)});
  ASSERT_EQ(second.read_line(), "connected");  // in our listener's backlog
  {
    fault::descriptor_exhaustion exhausted;
    ASSERT_TRUE(exhausted.ok());
    ASSERT_EQ(wait_ready(io(), listener_, POLLIN, 5s) & POLLIN, POLLIN);
    errno = 0;
    int fd = io().accept(listener_, nullptr, nullptr);
    int error = errno;
    EXPECT_EQ(fd, -1);
    EXPECT_EQ(error, EMFILE) << std::strerror(error);
    if (fd >= 0) io().close(fd);
    // The open connection does not need a descriptor to go on.
    EXPECT_EQ(echo_checked(io(), open_fd, 2, 4 << 20), "");
  }
  int later = accept_within(io(), listener_);
  ASSERT_GE(later, 0) << std::strerror(errno);
  EXPECT_EQ(echo_checked(io(), later, 3, 1 << 20), "");
  EXPECT_EQ(check_accelerated(io(), later), "");
  EXPECT_EQ(echo_checked(io(), open_fd, 4, 1 << 20), "");
  io().close(later);
  io().close(open_fd);
  EXPECT_EQ(first.wait(), 0);
  EXPECT_EQ(second.wait(), 0);
}

// The reader stopped (SIGSTOP), the writer fills the buffers (the ring on
// the mapped path) and blocks in write(); another thread shuts the socket
// down: as over kernel TCP, the blocked write returns at once with EPIPE.
TEST_P(Faults, ShutdownWakesAWriterBlockedOnAStoppedReader) {
  guard_.rearm(60s);
  peer reader("fault_echo", io(), {std::to_string(port_)});
  int fd = accept_within(io(), listener_);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_EQ(reader.read_line(), "connected");
  ASSERT_EQ(echo_checked(io(), fd, 7, 1 << 20), "");  // upgraded, if vmmc
  std::optional<fault::paused_for> stopped;
  stopped.emplace(reader.pid(), 5s);  // bounds a shutdown() that waits for the writer
  ASSERT_TRUE(stopped->ok());
  std::atomic<std::uint64_t> written{0};
  std::atomic<int> write_error{0};
  std::chrono::steady_clock::time_point returned;
  std::thread writer([&] {
    std::vector<unsigned char> chunk(1 << 16);
    for (std::uint64_t at = 0;; at += chunk.size()) {
      fault::fill_pattern(8, at, chunk.data(), chunk.size());
      ssize_t n = io().send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL);
      if (n < 0) {
        write_error = errno;
        break;
      }
      written += static_cast<std::uint64_t>(n);
    }
    returned = std::chrono::steady_clock::now();
  });
  ASSERT_TRUE(fault::wait_quiet([&] { return written.load(); }, 300ms, 10s))
      << "the writer never blocked";
  auto shut = std::chrono::steady_clock::now();
  EXPECT_EQ(io().shutdown(fd, SHUT_RDWR), 0) << std::strerror(errno);
  auto shutdown_took = std::chrono::steady_clock::now() - shut;
  EXPECT_LT(shutdown_took, 1s) << "shutdown() blocked";
  // Bounded: if the write stays blocked, the reader's continuation (below)
  // ends it one way or another.
  bool woke = false;
  for (int i = 0; i < 200 && !woke; ++i) {
    std::this_thread::sleep_for(10ms);
    woke = write_error.load() != 0;
  }
  EXPECT_TRUE(woke) << "the blocked write did not return within 2 s of shutdown()";
  EXPECT_EQ(write_error.load(), woke ? EPIPE : 0) << std::strerror(write_error.load());
  stopped.reset();  // the reader goes on: it reads what was sent, then end of file
  writer.join();
  io().close(fd);
  EXPECT_EQ(reader.wait(), 0);
}

// One descriptor left: the kernel's accept takes it, so whatever the vmmc
// upgrade needs beyond it (a channel's memory, ...) is not there; the
// connection must still carry its bytes intact (falling back to TCP if it
// must), as it would over kernel TCP.
TEST_P(Faults, AcceptWithTheLastDescriptorStillServesTheConnection) {
  guard_.rearm(60s);
  peer client("fault_echo", io(), {std::to_string(port_)});
  ASSERT_EQ(client.read_line(), "connected");
  int fd = -1;
  {
    fault::descriptor_exhaustion exhausted(1);
    ASSERT_TRUE(exhausted.ok());
    ASSERT_EQ(wait_ready(io(), listener_, POLLIN, 5s) & POLLIN, POLLIN);
    fd = io().accept(listener_, nullptr, nullptr);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    EXPECT_EQ(echo_checked(io(), fd, 5, 4 << 20), "");
  }
  EXPECT_EQ(echo_checked(io(), fd, 6, 1 << 20), "");
  if (io().vmmc)
    std::printf("[ faults   ] accepted with one descriptor left: %s\n",
                describe_text(vs::describe(fd)).c_str());
  io().close(fd);
  EXPECT_EQ(client.wait(), 0);
}

VMMC_INSTANTIATE_FOR_APIS(Faults);

}  // namespace
}  // namespace vmmc::test
