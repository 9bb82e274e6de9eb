// tests/unit/nx/test_lane.cc: the kernel TCP lanes NX nodes on hosts
// without an RDMA device talk over (nx/src/lane.h). Start-up takes only the
// nodes of its job: strangers on the network (silent, garbage, a wrong key,
// a node that comes twice) are closed and stall nothing. The stream reads
// as a channel does: look without taking, partial and large reads, the
// peer's end seen only after its last byte.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "lane.h"

using namespace vmmc::nx::detail;
using namespace std::chrono_literals;

namespace {

clock_point in(std::chrono::milliseconds d) {
  return std::chrono::steady_clock::now() + d;
}

// A plain client socket connected to `where` ("ip:port").
int dial(const std::string& where) {
  const auto colon = where.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(std::stoi(where.substr(colon + 1))));
  ::inet_pton(AF_INET, where.substr(0, colon).c_str(), &a.sin_addr);
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  return fd;
}

// Whether the other end closed `fd` within a second.
bool closed_by_peer(int fd) {
  pollfd f{fd, POLLIN, 0};
  if (::poll(&f, 1, 1000) != 1) return false;
  char c;
  return ::recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

// Reads until `n` bytes came or a second passed.
std::string read_n(tcp_stream& s, std::size_t n) {
  std::string got(n, '\0');
  std::size_t have = 0;
  for (auto until = in(1000ms); have < n && std::chrono::steady_clock::now() < until;)
    have += s.read(got.data() + have, n - have);
  got.resize(have);
  return got;
}

TEST(nx_lane, start_up_takes_only_the_nodes_of_its_job) {
  auto listener = tcp_listener::open("127.0.0.1");
  ASSERT_TRUE(listener) << listener.error().message();
  const std::string key = tcp_key(), other_key = tcp_key();
  ASSERT_EQ(key.size(), 32u);
  ASSERT_NE(key, other_key);

  const int silent = dial(listener->where());
  const int garbage = dial(listener->where());
  ASSERT_EQ(::send(garbage, std::string(100, 'x').data(), 100, 0), 100);
  auto wrong_key = tcp_connect(listener->where(), 0, other_key, in(1000ms));
  ASSERT_TRUE(wrong_key);
  auto not_expected = tcp_connect(listener->where(), 2, key, in(1000ms));
  ASSERT_TRUE(not_expected);
  auto node0 = tcp_connect(listener->where(), 0, key, in(1000ms));
  ASSERT_TRUE(node0);
  auto node0_again = tcp_connect(listener->where(), 0, key, in(1000ms));
  ASSERT_TRUE(node0_again);
  auto node1 = tcp_connect(listener->where(), 1, key, in(1000ms));
  ASSERT_TRUE(node1);

  // Nodes 0 and 1 of 4 connect to node 3 (node 2 is on its host).
  const auto started = std::chrono::steady_clock::now();
  auto accepted = listener->accept_nodes(key, {true, true, false, false}, in(5000ms));
  ASSERT_TRUE(accepted) << accepted.error().message();
  EXPECT_LT(std::chrono::steady_clock::now() - started, 2s) << "a stranger stalled start-up";
  ASSERT_EQ(accepted->size(), 4u);
  ASSERT_TRUE((*accepted)[0] && (*accepted)[1]);
  EXPECT_FALSE((*accepted)[2] || (*accepted)[3]);

  EXPECT_TRUE(closed_by_peer(garbage));
  EXPECT_TRUE(closed_by_peer((*wrong_key)->fd()));
  EXPECT_TRUE(closed_by_peer((*not_expected)->fd()));
  // One of the two "node 0" connections was taken, the other closed; the
  // silent one is closed when start-up ends.
  EXPECT_NE(closed_by_peer((*node0)->fd()), closed_by_peer((*node0_again)->fd()));
  EXPECT_TRUE(closed_by_peer(silent));
  ::close(silent);
  ::close(garbage);

  // Node 1's bytes reach node 3's lane, and back.
  ASSERT_TRUE((*node1)->write("ping", 4));
  EXPECT_EQ(read_n(*(*accepted)[1], 4), "ping");
  ASSERT_TRUE((*accepted)[1]->write("pong", 4));
  EXPECT_EQ(read_n(**node1, 4), "pong");
}

TEST(nx_lane, start_up_without_its_nodes_ends_at_the_deadline) {
  auto listener = tcp_listener::open("127.0.0.1");
  ASSERT_TRUE(listener);
  const int silent = dial(listener->where());
  auto accepted = listener->accept_nodes(tcp_key(), {true}, in(300ms));
  ASSERT_FALSE(accepted);
  EXPECT_TRUE(accepted.is(vmmc::errc::timed_out));
  ::close(silent);
}

TEST(nx_lane, nobody_listening_is_a_clear_error) {
  auto listener = tcp_listener::open("127.0.0.1");
  ASSERT_TRUE(listener);
  const std::string where = listener->where();
  listener = tcp_listener{};  // closed: the port refuses
  auto s = tcp_connect(where, 0, tcp_key(), in(1000ms));
  ASSERT_FALSE(s);
  EXPECT_TRUE(s.is(vmmc::errc::peer_gone));
  EXPECT_FALSE(tcp_connect("not an address", 0, tcp_key(), in(100ms)));
}

// A connected pair of streams, as start-up leaves them.
struct pair_of_lanes {
  std::unique_ptr<tcp_stream> a, b;
  pair_of_lanes() {
    auto listener = tcp_listener::open("127.0.0.1");
    const std::string key = tcp_key();
    auto c = tcp_connect(listener->where(), 0, key, in(1000ms));
    auto accepted = listener->accept_nodes(key, {true}, in(1000ms));
    a = std::move(*c);
    b = std::move((*accepted)[0]);
  }
};

TEST(nx_lane, reads_as_a_channel_does) {
  pair_of_lanes p;
  EXPECT_EQ(p.b->readable(), 0u);
  ASSERT_TRUE(p.a->write("header+body", 11));
  std::size_t ready = 0;
  for (auto until = in(1000ms); ready < 11 && std::chrono::steady_clock::now() < until;)
    ready = p.b->readable();
  ASSERT_EQ(ready, 11u);
  char look[6] = {};
  EXPECT_EQ(p.b->read(look, 6, false), 6u);  // looking takes nothing
  EXPECT_EQ(std::string(look, 6), "header");
  EXPECT_EQ(p.b->readable(), 11u);
  EXPECT_EQ(read_n(*p.b, 6), "header");
  EXPECT_EQ(read_n(*p.b, 5), "+body");

  // A payload larger than the input buffer arrives whole and in order.
  std::vector<unsigned char> big(3 << 20), got(big.size());
  std::iota(big.begin(), big.end(), 0);
  std::thread writer([&] {
    std::size_t sent = 0;
    while (sent < big.size()) {
      auto n = p.a->write(big.data() + sent, big.size() - sent);
      if (n)
        sent += *n;
      else
        std::this_thread::sleep_for(100us);
    }
  });
  std::size_t have = 0;
  for (auto until = in(5000ms); have < got.size() && std::chrono::steady_clock::now() < until;)
    have += p.b->read(got.data() + have, got.size() - have);
  writer.join();
  ASSERT_EQ(have, got.size());
  EXPECT_EQ(got, big);
  EXPECT_EQ(p.b->received(), 11u + big.size());
}

TEST(nx_lane, the_peers_end_comes_after_its_last_byte) {
  pair_of_lanes p;
  ASSERT_TRUE(p.a->write("last", 4));
  p.a->close_write();
  p.a.reset();
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(p.b->gone()) << "gone before its last bytes were read";
  EXPECT_EQ(read_n(*p.b, 4), "last");
  EXPECT_TRUE(p.b->gone());
  // Writing toward a peer that is gone fails (no SIGPIPE), at once or once
  // its kernel answered.
  bool failed = false;
  for (int i = 0; i < 100 && !failed; ++i) {
    failed = !p.b->write("x", 1);
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_TRUE(failed);
}

}  // namespace
