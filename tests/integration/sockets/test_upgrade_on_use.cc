// integration.sockets.upgrade_on_use: connections on one host with the
// default VMMC_SOCKETS_UPGRADE_AFTER (16 calls or 256 KiB): until a
// connection has earned its channel, neither end puts a byte of ours on it
// nor makes a channel; once it has, it moves to the channel wherever the
// streams are (a download whose server keeps its socket buffer full, an
// upload that never reads), a plain end is known as one, and a peer stopped
// mid-upgrade holds up no call of the other end.
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/epoll.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <thread>
#include <vector>

#include "integration/sockets/support.h"
#include "support/fault.h"

namespace vmmc::test {
namespace {

// The bytes the kernel carried for the connection, each way: what the
// application wrote, plus whatever of ours went with it.
struct kernel_bytes {
  std::uint64_t sent = 0, received = 0;
};
kernel_bytes carried(int fd) {
  struct {
    tcp_info glibc;  // what <netinet/tcp.h> knows; the kernel's goes on:
    std::uint64_t pacing_rate, max_pacing_rate, bytes_acked, bytes_received;
  } info{};
  static_assert(offsetof(decltype(info), pacing_rate) == 104);  // linux/tcp.h
  socklen_t length = sizeof info;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0 || length < sizeof info)
    return {};
  return {info.bytes_acked, info.bytes_received};
}

// A listener and one connection to it, closed at the end of the test.
struct connection {
  const api& server_api;
  const api& client_api;
  int listener = -1, client = -1, server = -1;
  connection(const api& server_side, const api& client_side)
      : server_api(server_side), client_api(client_side) {
    int port = 0;
    listener = listen_loopback(server_api, &port);
    if (listener >= 0) client = connect_loopback(client_api, port);
    if (client >= 0) server = accept_within(server_api, listener);
  }
  ~connection() {
    if (client >= 0) client_api.close(client);
    if (server >= 0) server_api.close(server);
    if (listener >= 0) server_api.close(listener);
  }
};

// Issue 14 (never slower): both ends preloaded, a connection per request
// (nginx + ab) ran at 0.45x kernel TCP. The server made a channel (memfd,
// mapping, export) and sent its accept byte and hello frame for every
// connection, and the client read them (and each end looked the other up
// with sock_diag), though none of these connections lived to use a channel.
TEST(UpgradeOnUse, AShortConnectionPutsNothingOfOursOnTheWire) {
  connection c(vmmc_api, vmmc_api);
  ASSERT_GE(c.server, 0) << std::strerror(errno);
  const int client = c.client, server = c.server;
  char request[100] = {}, reply[200] = {}, buffer[200];
  for (int round = 0; round < 3; ++round) {  // 6 calls each way: far from 16
    ASSERT_TRUE(write_all(vmmc_api, client, request, sizeof request));
    ASSERT_EQ(read_full(vmmc_api, server, buffer, sizeof request), 100);
    ASSERT_TRUE(write_all(vmmc_api, server, reply, sizeof reply));
    ASSERT_EQ(read_full(vmmc_api, client, buffer, sizeof reply), 200);
  }
  // What each end's kernel received: the other's application bytes alone.
  EXPECT_EQ(carried(client).received, 600u) << "server -> client: more than the application's";
  EXPECT_EQ(carried(server).received, 300u) << "client -> server: more than the application's";
  auto info = vmmc::sockets::describe(server);
  ASSERT_TRUE(info.has_value());
  EXPECT_FALSE(info->accelerated);
  EXPECT_EQ(info->path, "tcp") << "the server made a channel";
}

// A download: the server writes as fast as the kernel takes it, so its
// socket buffer is full whenever it looks for the client's ask. Its answer
// still goes (what the kernel does not take at once goes before its next
// bytes), and both directions end on the channel with every byte right.
TEST(UpgradeOnUse, ADownloadFromAServerWithAFullBufferMovesToTheChannel) {
  connection c(vmmc_api, vmmc_api);
  ASSERT_GE(c.server, 0) << std::strerror(errno);
  const int client = c.client, server = c.server;
  constexpr std::size_t total = std::size_t{64} << 20, piece = 1 << 20;
  std::string writer_error;
  std::thread writer([&] {
    std::vector<unsigned char> data(piece);
    for (std::size_t at = 0; at < total; at += piece) {
      fill_pattern(0x3C, at, data.data(), piece);
      if (!write_all(vmmc_api, server, data.data(), piece)) {
        writer_error = std::strerror(errno);
        return;
      }
    }
  });
  std::vector<unsigned char> in(256 << 10);
  std::size_t got = 0;
  std::string error;
  while (got < total && error.empty()) {
    ssize_t n = vmmc_api.read(client, in.data(), std::min(in.size(), total - got));
    if (n <= 0) {
      error = n == 0 ? "early end" : std::strerror(errno);
      break;
    }
    if (std::size_t bad = check_pattern(0x3C, got, in.data(), static_cast<std::size_t>(n));
        bad != static_cast<std::size_t>(n))
      error = "wrong byte at offset " + std::to_string(got + bad);
    got += static_cast<std::size_t>(n);
  }
  writer.join();
  EXPECT_EQ(error, "");
  EXPECT_EQ(writer_error, "");
  // The reading end has switched both ways (the server, which never reads,
  // has not seen our switch: nothing came for it).
  EXPECT_EQ(check_accelerated(vmmc_api, client), "");
  auto info = vmmc::sockets::describe(client);
  ASSERT_TRUE(info.has_value());
  EXPECT_GT(info->bytes_in, total / 2) << describe_text(info);
}

// An upload whose client never reads: it finds the server's answer before
// a write.
TEST(UpgradeOnUse, AnUploadThatNeverReadsMovesToTheChannel) {
  connection c(vmmc_api, vmmc_api);
  ASSERT_GE(c.server, 0) << std::strerror(errno);
  const int client = c.client, server = c.server;
  constexpr std::size_t total = std::size_t{64} << 20, piece = 64 << 10;
  std::thread reader([&] {
    std::vector<unsigned char> in(1 << 20);
    std::size_t got = 0;
    while (got < total) {
      ssize_t n = vmmc_api.read(server, in.data(), std::min(in.size(), total - got));
      if (n <= 0) return;
      got += static_cast<std::size_t>(n);
    }
  });
  std::vector<unsigned char> data(piece);
  for (std::size_t at = 0; at < total; at += piece)
    ASSERT_TRUE(write_all(vmmc_api, client, data.data(), piece));
  reader.join();
  EXPECT_EQ(check_accelerated(vmmc_api, server), "");
  auto info = vmmc::sockets::describe(server);
  ASSERT_TRUE(info.has_value());
  EXPECT_GT(info->bytes_in, total / 2) << describe_text(info);
}

// Connects to port arg 0 and makes one-byte echo rounds with the parent,
// saying before each echo which way its byte went ("wrote tcp", "wrote
// channel"). Right after its first byte over the channel (its hello placed
// just before it) it stops itself: the parent then meets the hello of a
// stopped process. Continued, it goes on until the parent ends the stream.
const peer_role stops_after_hello("stops_after_hello", [](peer_context& p) {
  int fd = p.connect_to_parent();
  if (fd < 0) return 1;
  bool stopped = false;
  for (unsigned char byte = 0;; ++byte) {
    if (!write_all(p.io(), fd, &byte, 1)) return p.fail(std::strerror(errno)), 1;
    auto info = vmmc::sockets::describe(fd);
    const bool channel = info && info->bytes_out > 0;
    p.say(channel ? "wrote channel" : "wrote tcp");
    if (channel && !stopped) {
      stopped = true;
      ::raise(SIGSTOP);
    }
    unsigned char echo = 0;
    ssize_t n = read_full(p.io(), fd, &echo, 1);
    if (n == 0) break;
    if (n != 1 || echo != byte) return p.fail("wrong echo"), 1;
  }
  p.io().close(fd);
  return 0;
});

// Issue 14 ("no stall of other peers"): the server's end imports the
// client's area when it meets the client's hello, which asks the client's
// process. Stopped (SIGSTOP), it did not answer, and the server's read and
// write waited 5 s: an event-driven server with it, and every other client.
// Kernel TCP does not wait for a stopped peer at all. The server's writes
// now stay on TCP a while, and switch once the client answers again.
TEST(UpgradeOnUse, AStoppedClientDoesNotHoldUpTheServer) {
  int port = 0;
  const int listener = listen_loopback(vmmc_api, &port);
  ASSERT_GE(listener, 0) << std::strerror(errno);
  peer client("stops_after_hello", vmmc_api, {std::to_string(port)});
  const int server = accept_within(vmmc_api, listener);
  ASSERT_GE(server, 0) << std::strerror(errno);
  using clock = std::chrono::steady_clock;
  std::optional<clock::duration> held;
  const auto deadline = clock::now() + 10s;
  unsigned char byte = 0;
  std::string path = "not accelerated yet";
  while (!path.empty() && clock::now() < deadline) {
    const std::string line = client.read_line();
    ASSERT_TRUE(line == "wrote tcp" || line == "wrote channel") << line;
    if (line == "wrote channel" && !held) {
      for (int i = 0; i < 500 && !fault::is_stopped(client.pid()); ++i)
        std::this_thread::sleep_for(10ms);
      ASSERT_TRUE(fault::is_stopped(client.pid())) << "the client did not stop";
      const auto start = clock::now();
      ASSERT_EQ(read_full(vmmc_api, server, &byte, 1), 1);
      ASSERT_TRUE(write_all(vmmc_api, server, &byte, 1));
      held = clock::now() - start;
      ::kill(client.pid(), SIGCONT);
      continue;
    }
    ASSERT_EQ(read_full(vmmc_api, server, &byte, 1), 1);
    if (held && (path = check_accelerated(vmmc_api, server)).empty()) break;
    ASSERT_TRUE(write_all(vmmc_api, server, &byte, 1));
  }
  ASSERT_TRUE(held.has_value());
  std::printf(
      "[ upgrade  ] a read and a write of one byte, client stopped: %lld ms\n",
      static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(*held).count()));
  EXPECT_LT(*held, 1s) << "the server's read and write of one byte took "
                       << std::chrono::duration_cast<std::chrono::milliseconds>(*held).count()
                       << " ms while the client was stopped";
  EXPECT_EQ(path, "") << "10 s after";
  vmmc_api.shutdown(server, SHUT_WR);
  std::string rest;
  EXPECT_EQ(read_to_eof(vmmc_api, server, rest), 0);
  EXPECT_EQ(client.wait(), 0);
  vmmc_api.close(server);
  vmmc_api.close(listener);
}

// The client of the test below: as stops_after_hello, then reads to the end
// and says how many bytes came after its echo.
const peer_role stops_then_drains("stops_then_drains", [](peer_context& p) {
  int fd = p.connect_to_parent();
  if (fd < 0) return 1;
  for (unsigned char byte = 0;; ++byte) {
    if (!write_all(p.io(), fd, &byte, 1)) return p.fail(std::strerror(errno)), 1;
    auto info = vmmc::sockets::describe(fd);
    if (info && info->bytes_out > 0) break;
    p.say("wrote tcp");
    unsigned char echo = 0;
    if (read_full(p.io(), fd, &echo, 1) != 1 || echo != byte) return p.fail("wrong echo"), 1;
  }
  p.say("stopping");
  ::raise(SIGSTOP);
  std::string rest;
  if (read_to_eof(p.io(), fd, rest) < 0) return p.fail(std::strerror(errno)), 1;
  p.say("got " + std::to_string(rest.size()));
  p.io().close(fd);
  return 0;
});

// A client stopped for good after its hello: the server's writes, 20 ms
// apart for 7.5 s, try to place its own hello now and then, and each try
// waits 100 ms for the client's process. Tried every second, that was 0.7 s
// of waits in 7.5 s for an event-driven server and all its clients; the
// tries now back off (1, 2, 4 s ...): 0.3 s.
TEST(UpgradeOnUse, AClientStoppedForGoodCostsTheServerFewerAndFewerWaits) {
  int port = 0;
  const int listener = listen_loopback(vmmc_api, &port);
  ASSERT_GE(listener, 0) << std::strerror(errno);
  peer client("stops_then_drains", vmmc_api, {std::to_string(port)});
  const int server = accept_within(vmmc_api, listener);
  ASSERT_GE(server, 0) << std::strerror(errno);
  unsigned char byte = 0;
  while (client.read_line() == "wrote tcp") {
    ASSERT_EQ(read_full(vmmc_api, server, &byte, 1), 1);
    ASSERT_TRUE(write_all(vmmc_api, server, &byte, 1));
  }
  for (int i = 0; i < 500 && !fault::is_stopped(client.pid()); ++i)
    std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(fault::is_stopped(client.pid())) << "the client did not stop";
  ASSERT_EQ(read_full(vmmc_api, server, &byte, 1), 1);  // its hello is there
  using clock = std::chrono::steady_clock;
  clock::duration in_writes{};
  std::size_t written = 0;
  for (const auto end = clock::now() + 7500ms; clock::now() < end; ++written) {
    const auto start = clock::now();
    ASSERT_TRUE(write_all(vmmc_api, server, &byte, 1));
    in_writes += clock::now() - start;
    std::this_thread::sleep_for(20ms);
  }
  ::kill(client.pid(), SIGCONT);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(in_writes).count();
  std::printf("[ upgrade  ] %zu writes of one byte over 7.5 s, client stopped: %lld ms in them\n",
              written, static_cast<long long>(ms));
  EXPECT_LT(in_writes, 600ms) << ms << " ms in the server's writes";
  vmmc_api.shutdown(server, SHUT_WR);
  EXPECT_EQ(client.read_line(), "got " + std::to_string(written));
  EXPECT_EQ(client.wait(), 0);
  vmmc_api.close(server);
  vmmc_api.close(listener);
}

// A client that reads urgent bytes inline (SO_OOBINLINE) sees the server's
// answer, accept byte and hello frame, as ordinary bytes at the head of its
// queue: it must take them as the answer there, never hand them out as data,
// and move to the channel like any other client.
TEST(UpgradeOnUse, AClientReadingUrgentBytesInlineTakesTheAnswerNotData) {
  int port = 0;
  const int listener = listen_loopback(vmmc_api, &port);
  ASSERT_GE(listener, 0) << std::strerror(errno);
  const int client = vmmc_api.socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(client, 0);
  int one = 1;
  ASSERT_EQ(vmmc_api.setsockopt(client, SOL_SOCKET, SO_OOBINLINE, &one, sizeof one), 0);
  sockaddr_in address = loopback(port);
  ASSERT_EQ(vmmc_api.connect(client, reinterpret_cast<sockaddr*>(&address), sizeof address), 0)
      << std::strerror(errno);
  const int server = accept_within(vmmc_api, listener);
  ASSERT_GE(server, 0) << std::strerror(errno);
  std::vector<unsigned char> out(1000), in(1000);
  std::uint64_t at = 0;
  for (int round = 0; round < 60; ++round, at += out.size()) {
    fill_pattern(0x5A, at, out.data(), out.size());
    ASSERT_TRUE(write_all(vmmc_api, client, out.data(), out.size()));
    ASSERT_EQ(read_full(vmmc_api, server, in.data(), in.size()), 1000);
    ASSERT_EQ(check_pattern(0x5A, at, in.data(), in.size()), in.size()) << "round " << round;
    fill_pattern(0xA5, at, out.data(), out.size());
    ASSERT_TRUE(write_all(vmmc_api, server, out.data(), out.size()));
    ASSERT_EQ(read_full(vmmc_api, client, in.data(), in.size()), 1000);
    ASSERT_EQ(check_pattern(0xA5, at, in.data(), in.size()), in.size())
        << "the client read other bytes than the server's in round " << round;
  }
  EXPECT_EQ(check_accelerated(vmmc_api, client), "");
  EXPECT_EQ(check_accelerated(vmmc_api, server), "");
  vmmc_api.close(client);
  vmmc_api.close(server);
  vmmc_api.close(listener);
}

// A server that closed its listener (it served one connection, as socat
// without fork) is found by its connection's socket, which it enters at
// its own first look, its 16th call. A fast writer made hundreds of calls
// before that when the server was late to read (busy, or not run), gave
// up looking after 8 looks and stayed on kernel TCP for good (a TLS upload
// through unmodified socat on a busy machine, every run). Here the server
// reads only once the client has written 1000 pieces.
TEST(UpgradeOnUse, AWriterFasterThanAServerWithoutAListenerStillMovesToTheChannel) {
  connection c(vmmc_api, vmmc_api);
  ASSERT_GE(c.server, 0) << std::strerror(errno);
  vmmc_api.close(c.listener);
  c.listener = -1;
  const int client = c.client, server = c.server;
  constexpr std::size_t piece = 1024, early = 1000, total = std::size_t{64} << 20;
  std::atomic<bool> written_early{false};
  std::uint64_t got = 0;
  std::thread reader([&] {
    while (!written_early.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::vector<unsigned char> in(64 << 10);
    while (got < total) {
      ssize_t n = vmmc_api.read(server, in.data(), std::min<std::size_t>(in.size(), total - got));
      if (n <= 0) return;
      got += static_cast<std::size_t>(n);
    }
  });
  std::vector<unsigned char> data(16 << 10);
  std::size_t sent = 0;
  for (std::size_t i = 0; i < early; ++i, sent += piece)  // fits the socket buffers
    ASSERT_TRUE(write_all(vmmc_api, client, data.data(), piece)) << std::strerror(errno);
  written_early.store(true);
  while (sent < total) {
    const std::size_t n = std::min(data.size(), total - sent);
    ASSERT_TRUE(write_all(vmmc_api, client, data.data(), n)) << std::strerror(errno);
    sent += n;
  }
  reader.join();
  EXPECT_EQ(got, total);
  EXPECT_EQ(check_accelerated(vmmc_api, server), "");
  auto info = vmmc::sockets::describe(server);
  ASSERT_TRUE(info.has_value());
  EXPECT_GT(info->bytes_in, total / 2) << describe_text(info);
}

// A plain end is known as one once the connection earned a channel: the
// vmmc end stays kernel TCP for good and looks no more.
TEST(UpgradeOnUse, APlainPeerIsKnownOnceTheConnectionEarnedAChannel) {
  for (bool plain_client : {true, false}) {
    const api& server_api = plain_client ? vmmc_api : kernel_api;
    const api& client_api = plain_client ? kernel_api : vmmc_api;
    connection c(server_api, client_api);
    ASSERT_GE(c.server, 0) << std::strerror(errno);
    const int client = c.client, server = c.server;
    char byte = 'x';
    for (int round = 0; round < 40; ++round) {
      ASSERT_TRUE(write_all(client_api, client, &byte, 1));
      ASSERT_EQ(read_full(server_api, server, &byte, 1), 1);
      ASSERT_TRUE(write_all(server_api, server, &byte, 1));
      ASSERT_EQ(read_full(client_api, client, &byte, 1), 1);
    }
    auto info = vmmc::sockets::describe(plain_client ? server : client);
    ASSERT_TRUE(info.has_value());
    EXPECT_TRUE(info->plain) << (plain_client ? "server" : "client") << ": " << describe_text(info);
  }
}

// sockperf's default: a server listening on the unspecified address and a
// client connecting to it (Linux takes 0.0.0.0 for this host's loopback).
// The client took the peer for another host, sent an urgent offer byte that
// the server never reads (it looks for the client in the presence table), and
// both ends stayed on TCP ("peer does not run vmmc").
TEST(UpgradeOnUse, AClientConnectingToTheUnspecifiedAddressMovesToTheChannel) {
  const api& a = vmmc_api;
  int listener = a.socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in any{};
  any.sin_family = AF_INET;
  socklen_t length = sizeof any;
  ASSERT_EQ(a.bind(listener, reinterpret_cast<sockaddr*>(&any), sizeof any), 0);
  ASSERT_EQ(a.listen(listener, 8), 0);
  ASSERT_EQ(a.getsockname(listener, reinterpret_cast<sockaddr*>(&any), &length), 0);
  int client = a.socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_EQ(a.connect(client, reinterpret_cast<sockaddr*>(&any), sizeof any), 0)
      << std::strerror(errno);
  int server = accept_within(a, listener);
  ASSERT_GE(server, 0);
  char byte = 'x';
  for (int round = 0; round < 40; ++round) {
    ASSERT_TRUE(write_all(a, client, &byte, 1));
    ASSERT_EQ(read_full(a, server, &byte, 1), 1);
    ASSERT_TRUE(write_all(a, server, &byte, 1));
    ASSERT_EQ(read_full(a, client, &byte, 1), 1);
  }
  EXPECT_EQ(check_accelerated(a, client), "");
  EXPECT_EQ(check_accelerated(a, server), "");
  // No offer byte: the client's TCP bytes are its own (those before the
  // switch).
  EXPECT_LE(carried(client).sent, 40u);
  a.close(client);
  a.close(server);
  a.close(listener);
}

// A connection in an epoll set from its first byte: while it is on kernel
// TCP the set holds it with the caller's own event (a wait over such
// connections is the kernel's alone), and from its upgrade on translates
// it, so what then comes through its channel is reported as before.
TEST(UpgradeOnUse, AStreamInAnEpollSetBeforeItsUpgradeIsReportedFromItsChannelAfter) {
  connection c(vmmc_api, vmmc_api);
  ASSERT_GE(c.server, 0) << std::strerror(errno);
  const api& a = vmmc_api;
  int ep = a.epoll_create1(EPOLL_CLOEXEC);
  ASSERT_GE(ep, 0);
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.u64 = 77;
  ASSERT_EQ(a.epoll_ctl(ep, EPOLL_CTL_ADD, c.server, &event), 0) << std::strerror(errno);
  char buffer[4];
  auto round_trip = [&](int round) {
    ASSERT_EQ(a.write(c.client, "ping", 4), 4);
    epoll_event out[2];
    ASSERT_EQ(a.epoll_wait(ep, out, 2, 5000), 1) << "round " << round;
    EXPECT_EQ(out[0].data.u64, 77u);
    EXPECT_EQ(out[0].events, static_cast<std::uint32_t>(EPOLLIN));
    ASSERT_EQ(read_full(a, c.server, buffer, 4), 4);
    ASSERT_EQ(a.write(c.server, "pong", 4), 4);
    ASSERT_EQ(read_full(a, c.client, buffer, 4), 4);
  };
  std::string accelerated = "not yet";
  for (int round = 0; round < 200 && !accelerated.empty(); ++round) {
    round_trip(round);
    if (HasFatalFailure()) return;
    accelerated = check_accelerated(a, c.server) + check_accelerated(a, c.client);
  }
  ASSERT_EQ(accelerated, "");
  for (int round = 0; round < 20; ++round) {
    round_trip(round);
    if (HasFatalFailure()) return;
  }
  auto info = vmmc::sockets::describe(c.server);
  ASSERT_TRUE(info.has_value());
  EXPECT_GE(info->bytes_in, 20u * 4) << describe_text(info);
  a.close(ep);
}

}  // namespace
}  // namespace vmmc::test
