// integration.sockets.wakeups: a peer on this host wakes a sleeper through
// the channel's wait descriptor (an eventfd), not with doorbell bytes on the
// TCP connection (one segment each, and the kernel's whole TCP path on both
// ends). Whatever the sleeper waits in (a blocking read, poll, select,
// epoll level- or edge-triggered), round trips with pauses, so that each side
// is asleep when the other writes (or between its EAGAIN and its wait), move
// every byte and send no TCP segment.
#include <linux/tcp.h>
#include <sys/epoll.h>
#include <sys/select.h>

#include <optional>
#include <thread>

#include "integration/sockets/support.h"

namespace vmmc::test {
namespace {

enum class style { blocking_read, poll, select, epoll_level, epoll_edge };

std::string style_name(const testing::TestParamInfo<style>& info) {
  switch (info.param) {
    case style::blocking_read:
      return "blocking_read";
    case style::poll:
      return "poll";
    case style::select:
      return "select";
    case style::epoll_level:
      return "epoll_level";
    case style::epoll_edge:
      return "epoll_edge";
  }
  return "unknown";
}

std::uint32_t segments_out(int fd) {
  tcp_info info{};
  socklen_t length = sizeof info;
  return ::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) == 0 ? info.tcpi_segs_out : 0;
}

constexpr int rounds = 100;
constexpr std::size_t message = 64;
constexpr auto pause = std::chrono::milliseconds(2);  // far beyond any spin

// The sleeping end: reads each message whole (a non-blocking one until
// EAGAIN, then it waits in `how`, as event loops do) and echoes it. In odd
// rounds it pauses before the echo, so that the client's blocking read
// sleeps too; in even rounds a non-blocking one pauses after its EAGAIN, so
// that the client writes before the wait arms again (a peer that rang the
// TCP doorbell for the EAGAIN's arm sent a segment each way). Serves at
// most `count` messages, until the client shuts its end. Returns "" or what
// went wrong.
std::string serve(const api& a, int fd, style how, int count) {
  const bool nonblocking = how != style::blocking_read;
  if (nonblocking && !set_nonblocking(a, fd, true)) return "fcntl failed";
  int ep = -1;
  if (how == style::epoll_level || how == style::epoll_edge) {
    ep = a.epoll_create1(EPOLL_CLOEXEC);
    epoll_event e{};
    e.events = how == style::epoll_edge ? EPOLLIN | EPOLLET : EPOLLIN;
    e.data.fd = fd;
    if (ep < 0 || a.epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e) != 0) return "epoll set-up failed";
  }
  auto wait = [&]() -> std::string {
    if (how == style::poll) {
      pollfd p{fd, POLLIN, 0};
      if (a.poll(&p, 1, 5000) != 1) return "poll found nothing for 5 s";
    } else if (how == style::select) {
      fd_set readable;
      FD_ZERO(&readable);
      FD_SET(fd, &readable);
      timeval limit{5, 0};
      if (a.select(fd + 1, &readable, nullptr, nullptr, &limit) != 1)
        return "select found nothing for 5 s";
    } else if (ep >= 0) {
      epoll_event e{};
      if (a.epoll_wait(ep, &e, 1, 5000) != 1) return "epoll_wait found nothing for 5 s";
    }
    return "";
  };
  std::string problem;
  bool finished = false;
  for (int i = 0; i < count && problem.empty() && !finished; ++i) {
    char buffer[message];
    std::size_t got = 0;
    bool paused = false;
    while (got < message && problem.empty()) {
      ssize_t n = a.read(fd, buffer + got, message - got);
      if (n > 0) {
        got += static_cast<std::size_t>(n);
      } else if (n < 0 && nonblocking && errno == EAGAIN) {
        if (i % 2 == 0 && !paused) {
          std::this_thread::sleep_for(2 * pause);
          paused = true;
        }
        problem = wait();
      } else if (n == 0 && got == 0) {
        finished = true;  // the client is done
        break;
      } else {
        problem = n == 0 ? "end of stream" : std::string("read: ") + std::strerror(errno);
      }
    }
    if (!problem.empty() || finished) break;
    if (i % 2) std::this_thread::sleep_for(pause);
    if (!write_all(a, fd, buffer, message)) problem = std::string("write: ") + std::strerror(errno);
  }
  if (ep >= 0) a.close(ep);
  return problem;
}

class Wakeups : public testing::TestWithParam<style> {
 protected:
  watchdog guard_{60s};
};

TEST_P(Wakeups, ASleeperOnThisHostIsWokenWithoutTcpSegments) {
  const api& a = vmmc_api;
  socket_pair pair = connect_pair(a);
  ASSERT_GE(pair.client, 0);
  ASSERT_GE(pair.server, 0);
  // The channel is set up on the first calls; each end switches its own
  // direction, the server's on its thread: segments are counted from the
  // round both ends are found switched (a loaded machine takes more rounds).
  constexpr int warm_up_least = 4, warm_up_most = 200;
  std::string served;
  std::thread server([&] { served = serve(a, pair.server, GetParam(), warm_up_most + rounds); });
  struct ends_the_server {  // also when an assertion returns early
    const api& a;
    int client;
    std::thread& server;
    ~ends_the_server() {
      (void)a.shutdown(client, SHUT_WR);
      server.join();
    }
  };
  std::optional<ends_the_server> ending{std::in_place, a, pair.client, server};
  std::vector<char> out(message), in(message);
  std::uint32_t before = 0;
  std::uint64_t moved = 0;
  int counted = 0, round = 0;
  std::string unswitched = "not yet looked at";
  auto round_trip = [&] {
    fill_pattern(7, static_cast<std::uint64_t>(round) * message,
                 reinterpret_cast<unsigned char*>(out.data()), out.size());
    ++round;
    if (!write_all(a, pair.client, out.data(), out.size())) return false;
    if (read_full(a, pair.client, in.data(), in.size()) != static_cast<ssize_t>(message))
      return false;
    moved += message;
    std::this_thread::sleep_for(pause);
    return in == out;
  };
  while (round < warm_up_most) {
    if (round >= warm_up_least &&
        (unswitched = check_accelerated(a, pair.client) + check_accelerated(a, pair.server))
            .empty())
      break;
    ASSERT_TRUE(round_trip()) << "warm-up round " << round << ": " << std::strerror(errno);
  }
  ASSERT_EQ(unswitched, "") << "after " << round << " round trips";
  before = segments_out(pair.client) + segments_out(pair.server);
  for (; counted < rounds; ++counted)
    ASSERT_TRUE(round_trip()) << "round " << counted << ": " << std::strerror(errno);
  const std::uint32_t segments = segments_out(pair.client) + segments_out(pair.server) - before;
  ending.reset();
  EXPECT_EQ(served, "");
  EXPECT_EQ(moved, static_cast<std::uint64_t>(round) * message);
  // Before: a doorbell segment per message each way that found its reader
  // asleep (here about 300 in 100 round trips).
  EXPECT_LE(segments, 5u) << "TCP segments sent during " << rounds << " round trips";
  EXPECT_EQ(check_accelerated(a, pair.server), "");
  a.close(pair.client);
  a.close(pair.server);
}

INSTANTIATE_TEST_SUITE_P(styles, Wakeups,
                         testing::Values(style::blocking_read, style::poll, style::select,
                                         style::epoll_level, style::epoll_edge),
                         style_name);

}  // namespace
}  // namespace vmmc::test
