// integration.sockets.semantics: the POSIX/Linux behaviour of a connection,
// each case run on the kernel (the oracle) and on vmmc: blocking and
// non-blocking reads, MSG_PEEK / MSG_WAITALL / MSG_DONTWAIT / MSG_NOSIGNAL,
// SIGPIPE, FIONREAD, buffer sizes, TCP_NODELAY, SO_ERROR, addresses, poll /
// select / epoll readiness, half-close, orderly close, fcntl, vectored I/O,
// and threads sharing a socket. Most cases use a connected pair inside this
// process; half-close and close use a second process.
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/syscall.h>

#include <atomic>
#include <set>
#include <thread>

#include "integration/core/child_process.h"
#include "integration/sockets/support.h"

namespace vmmc::test {
namespace {

class Semantics : public api_test {
 protected:
  void SetUp() override {
    pair_ = connect_pair(io());
    ASSERT_GE(pair_.client, 0) << std::strerror(errno);
    ASSERT_GE(pair_.server, 0) << std::strerror(errno);
  }
  void TearDown() override {
    if (pair_.client >= 0) io().close(pair_.client);
    if (pair_.server >= 0) io().close(pair_.server);
  }
  // Closes one end now (TearDown skips it).
  void close_end(int& fd) {
    ASSERT_EQ(io().close(fd), 0);
    fd = -1;
  }
  std::string read_string(int fd, std::size_t length) {
    std::string s(length, '\0');
    ssize_t n = read_full(io(), fd, s.data(), length);
    s.resize(n < 0 ? 0 : static_cast<std::size_t>(n));
    return s;
  }
  bool write_string(int fd, const std::string& s) {
    return write_all(io(), fd, s.data(), s.size());
  }

  socket_pair pair_;
};

TEST_P(Semantics, BlockingReadReturnsWhatIsThereWithoutWaitingForMore) {
  EXPECT_EQ(wait_ready(io(), pair_.server, POLLIN, 0ms), 0) << "readable before any data";
  auto data = pattern(1, 100);
  ASSERT_TRUE(write_all(io(), pair_.client, data.data(), data.size()));
  std::vector<unsigned char> got(4096);
  ssize_t n = io().read(pair_.server, got.data(), got.size());
  ASSERT_GT(n, 0) << std::strerror(errno);
  ASSERT_LE(n, 100);
  ASSERT_EQ(read_full(io(), pair_.server, got.data() + n, static_cast<std::size_t>(100 - n)),
            100 - n);
  got.resize(100);
  EXPECT_EQ(got, data);
}

// A reader blocked on an empty socket sleeps (it does not burn a core) and
// wakes with the data when the peer writes.
TEST_P(Semantics, BlockedReaderSleepsAndWakesWhenDataArrives) {
  std::atomic<pid_t> reader_tid{0};
  std::string got;
  std::thread reader([&] {
    reader_tid = ::gettid();
    got = read_string(pair_.server, 5);
  });
  while (reader_tid == 0) std::this_thread::yield();
  auto deadline = std::chrono::steady_clock::now() + 3s;
  while (thread_state(reader_tid) != 'S' && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  EXPECT_EQ(thread_state(reader_tid), 'S') << "the blocked reader should sleep within 3 s";
  ASSERT_TRUE(write_string(pair_.client, "wake!"));
  reader.join();
  EXPECT_EQ(got, "wake!");
}

TEST_P(Semantics, NonBlockingReadSaysEagainUntilDataArrives) {
  ASSERT_TRUE(set_nonblocking(io(), pair_.server, true));
  char buffer[64];
  iovec iov{buffer, sizeof buffer};
  EXPECT_EQ(io().read(pair_.server, buffer, sizeof buffer), -1);
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_EQ(io().recv(pair_.server, buffer, sizeof buffer, 0), -1);
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_EQ(io().readv(pair_.server, &iov, 1), -1);
  EXPECT_EQ(errno, EAGAIN);
  ASSERT_TRUE(write_string(pair_.client, "data"));
  EXPECT_TRUE(wait_ready(io(), pair_.server, POLLIN, 5s) & POLLIN);
  EXPECT_EQ(read_string(pair_.server, 4), "data");
  EXPECT_EQ(io().read(pair_.server, buffer, sizeof buffer), -1);
  EXPECT_EQ(errno, EAGAIN);
}

TEST_P(Semantics, PeekShowsTheBytesThatReadThenReturns) {
  const std::string message = "hello, peek";
  ASSERT_TRUE(write_string(pair_.client, message));
  char buffer[64] = {};
  ssize_t n = 0;
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (n < static_cast<ssize_t>(message.size()) && std::chrono::steady_clock::now() < deadline)
    if (wait_ready(io(), pair_.server, POLLIN, 1s) & POLLIN)
      n = io().recv(pair_.server, buffer, sizeof buffer, MSG_PEEK);
  ASSERT_EQ(n, static_cast<ssize_t>(message.size()));
  EXPECT_EQ(std::string(buffer, static_cast<std::size_t>(n)), message);
  EXPECT_EQ(io().recv(pair_.server, buffer, 5, MSG_PEEK), 5);
  EXPECT_EQ(std::string(buffer, 5), "hello");
  EXPECT_EQ(read_string(pair_.server, message.size()), message);
  EXPECT_EQ(io().recv(pair_.server, buffer, sizeof buffer, MSG_DONTWAIT), -1)
      << "peeked bytes were returned twice";
  EXPECT_EQ(errno, EAGAIN);
}

TEST_P(Semantics, WaitAllGathersPiecesIntoOneRead) {
  constexpr std::size_t total = 4 << 20;
  auto data = pattern(2, total);
  std::thread writer([&] {
    for (std::size_t at = 0; at < total; at += 4096)
      if (!write_all(io(), pair_.client, data.data() + at, 4096)) return;
    write_string(pair_.client, "0123456789");
    io().shutdown(pair_.client, SHUT_WR);
  });
  std::vector<unsigned char> got(total);
  ssize_t n = io().recv(pair_.server, got.data(), total, MSG_WAITALL);
  EXPECT_EQ(n, static_cast<ssize_t>(total));
  EXPECT_EQ(check_pattern(2, 0, got.data(), total), total);
  // At EOF, MSG_WAITALL returns what there was.
  char tail[100];
  EXPECT_EQ(io().recv(pair_.server, tail, sizeof tail, MSG_WAITALL), 10);
  EXPECT_EQ(std::string(tail, 10), "0123456789");
  writer.join();
}

TEST_P(Semantics, DontWaitOnABlockingSocket) {
  char buffer[16];
  EXPECT_EQ(io().recv(pair_.server, buffer, sizeof buffer, MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, EAGAIN);
  ASSERT_TRUE(write_string(pair_.client, "12345"));
  ASSERT_TRUE(wait_ready(io(), pair_.server, POLLIN, 5s) & POLLIN);
  EXPECT_EQ(io().recv(pair_.server, buffer, sizeof buffer, MSG_DONTWAIT), 5);

  // Sending with MSG_DONTWAIT to a peer that does not read ends in EAGAIN.
  std::vector<unsigned char> chunk(1 << 20, 7);
  std::uint64_t sent = 0;
  ssize_t n = 0;
  while (sent < (std::uint64_t{1} << 30) &&
         (n = io().send(pair_.client, chunk.data(), chunk.size(), MSG_DONTWAIT)) > 0)
    sent += static_cast<std::uint64_t>(n);
  EXPECT_EQ(n, -1) << "1 GiB went to a peer that reads nothing";
  EXPECT_EQ(errno, EAGAIN);
  // The flag did not make either socket non-blocking.
  EXPECT_EQ(io().fcntl(pair_.server, F_GETFL, 0) & O_NONBLOCK, 0);
  EXPECT_EQ(io().fcntl(pair_.client, F_GETFL, 0) & O_NONBLOCK, 0);
}

TEST_P(Semantics, NoSignalSendAfterPeerCloseGivesEpipe) {
  sigpipe_counter sigpipes;
  close_end(pair_.server);
  EXPECT_EQ(check_eof(io(), pair_.client), "") << "after the peer's close";
  EXPECT_EQ(send_until_broken(io(), pair_.client, true), EPIPE);
  EXPECT_EQ(sigpipes.count(), 0) << "MSG_NOSIGNAL must not raise SIGPIPE";
}

TEST_P(Semantics, WriteAfterPeerCloseRaisesSigpipe) {
  sigpipe_counter sigpipes;
  close_end(pair_.server);
  EXPECT_EQ(check_eof(io(), pair_.client), "") << "after the peer's close";
  EXPECT_EQ(send_until_broken(io(), pair_.client, false), EPIPE);
  EXPECT_GE(sigpipes.count(), 1) << "the SIGPIPE handler did not run";
}

// The writer never read the end of stream first (issue 14 item 12: vmmc
// said EIO): large sends into a closed peer fail as kernel TCP's do.
TEST_P(Semantics, SendingIntoAClosedPeerGivesEpipeOrEconnreset) {
  sigpipe_counter sigpipes;
  std::vector<char> chunk(1 << 16, 'z');
  ASSERT_EQ(io().send(pair_.client, chunk.data(), chunk.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(chunk.size()));
  close_end(pair_.server);  // with unread bytes: the kernel resets
  int error = 0;
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (error == 0 && std::chrono::steady_clock::now() < deadline) {
    if (io().send(pair_.client, chunk.data(), chunk.size(), MSG_NOSIGNAL) < 0 && errno != EAGAIN &&
        errno != EINTR)
      error = errno;
  }
  EXPECT_TRUE(error == EPIPE || error == ECONNRESET) << std::strerror(error);
  EXPECT_EQ(sigpipes.count(), 0);
}

TEST_P(Semantics, FionreadCountsUnreadBytes) {
  auto data = pattern(3, 1234);
  ASSERT_TRUE(write_all(io(), pair_.client, data.data(), data.size()));
  int unread = 0;
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (unread < 1234 && std::chrono::steady_clock::now() < deadline) {
    wait_ready(io(), pair_.server, POLLIN, 100ms);
    ASSERT_EQ(io().ioctl(pair_.server, FIONREAD, &unread), 0) << std::strerror(errno);
  }
  EXPECT_EQ(unread, 1234);
  std::vector<unsigned char> got(1234);
  ASSERT_EQ(read_full(io(), pair_.server, got.data(), 234), 234);
  ASSERT_EQ(io().ioctl(pair_.server, FIONREAD, &unread), 0);
  EXPECT_EQ(unread, 1000);
  ASSERT_EQ(read_full(io(), pair_.server, got.data() + 234, 1000), 1000);
  ASSERT_EQ(io().ioctl(pair_.server, FIONREAD, &unread), 0);
  EXPECT_EQ(unread, 0);
  EXPECT_EQ(got, data);
}

TEST_P(Semantics, BufferSizesReadBackAsTheKernelDoes) {
  for (int option : {SO_RCVBUF, SO_SNDBUF}) {
    for (int value : {4096, 65536, 1 << 20}) {
      int oracle_fd = ::socket(AF_INET, SOCK_STREAM, 0);
      ASSERT_GE(oracle_fd, 0);
      int oracle = 0, got = 0;
      socklen_t length = sizeof oracle;
      ASSERT_EQ(::setsockopt(oracle_fd, SOL_SOCKET, option, &value, sizeof value), 0);
      ASSERT_EQ(::getsockopt(oracle_fd, SOL_SOCKET, option, &oracle, &length), 0);
      ::close(oracle_fd);
      ASSERT_EQ(io().setsockopt(pair_.client, SOL_SOCKET, option, &value, sizeof value), 0)
          << std::strerror(errno);
      length = sizeof got;
      ASSERT_EQ(io().getsockopt(pair_.client, SOL_SOCKET, option, &got, &length), 0);
      EXPECT_EQ(length, sizeof got);
      EXPECT_EQ(got, oracle) << (option == SO_RCVBUF ? "SO_RCVBUF " : "SO_SNDBUF ") << value;
    }
  }
  // The connection still works after resizing.
  ASSERT_TRUE(write_string(pair_.client, "still fine"));
  EXPECT_EQ(read_string(pair_.server, 10), "still fine");
}

TEST_P(Semantics, TcpNodelayIsAcceptedAndReadBack) {
  for (int fd : {pair_.client, pair_.server}) {
    int on = 1, got = 0;
    socklen_t length = sizeof got;
    ASSERT_EQ(io().setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on), 0)
        << std::strerror(errno);
    ASSERT_EQ(io().getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &got, &length), 0);
    EXPECT_NE(got, 0);
  }
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(write_string(pair_.client, "p"));
    ASSERT_EQ(read_string(pair_.server, 1), "p");
    ASSERT_TRUE(write_string(pair_.server, "q"));
    ASSERT_EQ(read_string(pair_.client, 1), "q");
  }
  int off = 0, got = 1;
  socklen_t length = sizeof got;
  ASSERT_EQ(io().setsockopt(pair_.client, IPPROTO_TCP, TCP_NODELAY, &off, sizeof off), 0);
  ASSERT_EQ(io().getsockopt(pair_.client, IPPROTO_TCP, TCP_NODELAY, &got, &length), 0);
  EXPECT_EQ(got, 0);
}

// The library turns Nagle off on an accelerated connection for its own
// doorbells; the application still reads back what it set (or the default).
TEST_P(Semantics, TcpNodelayReadsBackTheApplicationsChoice) {
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(write_string(pair_.client, "p"));
    ASSERT_EQ(read_string(pair_.server, 1), "p");
    ASSERT_TRUE(write_string(pair_.server, "q"));
    ASSERT_EQ(read_string(pair_.client, 1), "q");
  }
  for (int fd : {pair_.client, pair_.server}) {
    int got = 1;
    socklen_t length = sizeof got;
    ASSERT_EQ(io().getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &got, &length), 0);
    EXPECT_EQ(got, 0);
    EXPECT_EQ(length, sizeof got);
  }
}

TEST_P(Semantics, RefusedConnectReportsEconnrefused) {
  // A port that is bound but not listening: connecting to it is refused.
  int closed = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address = loopback(0);
  socklen_t length = sizeof address;
  ASSERT_EQ(::bind(closed, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(::getsockname(closed, reinterpret_cast<sockaddr*>(&address), &length), 0);
  int port = ntohs(address.sin_port);

  int fd = connect_loopback(io(), port, true);
  if (fd >= 0) {  // in progress: the error arrives through SO_ERROR
    EXPECT_NE(wait_ready(io(), fd, POLLOUT, 5s), 0) << "no readiness after a refused connect";
    EXPECT_EQ(socket_error(io(), fd), ECONNREFUSED);
    EXPECT_EQ(socket_error(io(), fd), 0) << "SO_ERROR is cleared by reading it";
    io().close(fd);
  } else {
    EXPECT_EQ(errno, ECONNREFUSED);
  }
  EXPECT_EQ(connect_loopback(io(), port, false), -1);
  EXPECT_EQ(errno, ECONNREFUSED) << "blocking connect";
  ::close(closed);
}

TEST_P(Semantics, AddressesOfBothEndsMatch) {
  int port = 0;
  int listener = listen_loopback(io(), &port);
  ASSERT_GE(listener, 0);
  int client = connect_loopback(io(), port);
  ASSERT_GE(client, 0);
  sockaddr_in from{}, client_local{}, client_peer{}, server_local{}, server_peer{};
  socklen_t length = sizeof from;
  ASSERT_TRUE(wait_ready(io(), listener, POLLIN, 5s) & POLLIN);
  int server = io().accept(listener, reinterpret_cast<sockaddr*>(&from), &length);
  ASSERT_GE(server, 0) << std::strerror(errno);
  EXPECT_EQ(length, sizeof from);
  auto get = [&](auto call, int fd, sockaddr_in& out) {
    socklen_t l = sizeof out;
    EXPECT_EQ(call(fd, reinterpret_cast<sockaddr*>(&out), &l), 0) << std::strerror(errno);
    EXPECT_EQ(l, sizeof out);
  };
  get(io().getsockname, client, client_local);
  get(io().getpeername, client, client_peer);
  get(io().getsockname, server, server_local);
  get(io().getpeername, server, server_peer);
  auto same = [](const sockaddr_in& a, const sockaddr_in& b) {
    return a.sin_family == b.sin_family && a.sin_port == b.sin_port &&
           a.sin_addr.s_addr == b.sin_addr.s_addr;
  };
  EXPECT_TRUE(same(client_peer, loopback(port)));
  EXPECT_TRUE(same(server_local, loopback(port)));
  EXPECT_TRUE(same(server_peer, client_local));
  EXPECT_TRUE(same(from, client_local));
  EXPECT_NE(client_local.sin_port, 0);
  // An unconnected socket has no peer.
  sockaddr_in none{};
  length = sizeof none;
  EXPECT_EQ(io().getpeername(listener, reinterpret_cast<sockaddr*>(&none), &length), -1);
  EXPECT_EQ(errno, ENOTCONN);
  io().close(server);
  io().close(client);
  io().close(listener);
}

// accept() writes the peer's address as the kernel does: cut to the buffer
// the program gave, with the full length returned; nothing without a buffer.
TEST_P(Semantics, AcceptFillsShortAndMissingAddressBuffersAsTheKernelDoes) {
  int port = 0;
  int listener = listen_loopback(io(), &port);
  ASSERT_GE(listener, 0);
  int clients[3];
  for (int& c : clients) {
    c = connect_loopback(io(), port);
    ASSERT_GE(c, 0);
  }
  // Short: 4 bytes (family and port), the rest of the buffer untouched.
  unsigned char buffer[sizeof(sockaddr_in)];
  std::memset(buffer, 0xA5, sizeof buffer);
  socklen_t length = 4;
  ASSERT_TRUE(wait_ready(io(), listener, POLLIN, 5s) & POLLIN);
  int short_one = io().accept(listener, reinterpret_cast<sockaddr*>(buffer), &length);
  ASSERT_GE(short_one, 0) << std::strerror(errno);
  EXPECT_EQ(length, sizeof(sockaddr_in));
  sa_family_t family;
  std::memcpy(&family, buffer, sizeof family);
  EXPECT_EQ(family, AF_INET);
  for (std::size_t i = 4; i < sizeof buffer; ++i) EXPECT_EQ(buffer[i], 0xA5) << "byte " << i;
  // None: neither buffer is touched.
  length = 77;
  ASSERT_TRUE(wait_ready(io(), listener, POLLIN, 5s) & POLLIN);
  int none = io().accept(listener, nullptr, &length);
  ASSERT_GE(none, 0) << std::strerror(errno);
  EXPECT_EQ(length, 77u);
  // Large: the whole address, its own length.
  sockaddr_storage large{};
  length = sizeof large;
  ASSERT_TRUE(wait_ready(io(), listener, POLLIN, 5s) & POLLIN);
  int third = io().accept(listener, reinterpret_cast<sockaddr*>(&large), &length);
  ASSERT_GE(third, 0) << std::strerror(errno);
  EXPECT_EQ(length, sizeof(sockaddr_in));
  EXPECT_EQ(large.ss_family, AF_INET);
  // Each accepted connection carries bytes both ways.
  for (int server : {short_one, none, third}) {
    int client = -1;
    sockaddr_in peer{}, local{};
    socklen_t l = sizeof peer;
    ASSERT_EQ(io().getpeername(server, reinterpret_cast<sockaddr*>(&peer), &l), 0);
    for (int c : clients) {
      l = sizeof local;
      ASSERT_EQ(io().getsockname(c, reinterpret_cast<sockaddr*>(&local), &l), 0);
      if (local.sin_port == peer.sin_port) client = c;
    }
    ASSERT_GE(client, 0) << "no client at the accepted connection's peer address";
    EXPECT_TRUE(write_string(client, "ping"));
    EXPECT_EQ(read_string(server, 4), "ping");
    EXPECT_TRUE(write_string(server, "pong"));
    EXPECT_EQ(read_string(client, 4), "pong");
    io().close(server);
  }
  for (int c : clients) io().close(c);
  io().close(listener);
}

TEST_P(Semantics, PollAndSelectReportReadinessOnlyWhenTrue) {
  int c = pair_.client, s = pair_.server;
  pollfd both[2] = {{c, POLLIN | POLLOUT, 0}, {s, POLLIN | POLLOUT, 0}};
  ASSERT_EQ(io().poll(both, 2, 0), 2);
  EXPECT_EQ(both[0].revents, POLLOUT);
  EXPECT_EQ(both[1].revents, POLLOUT);

  auto select_ready = [&](int fd, int timeout_ms, bool& readable, bool& writable) {
    fd_set r, w;
    FD_ZERO(&r);
    FD_ZERO(&w);
    FD_SET(fd, &r);
    FD_SET(fd, &w);
    timeval t{0, timeout_ms * 1000};
    int n = io().select(fd + 1, &r, &w, nullptr, &t);
    readable = FD_ISSET(fd, &r);
    writable = FD_ISSET(fd, &w);
    return n;
  };
  bool readable = true, writable = false;
  EXPECT_EQ(select_ready(c, 0, readable, writable), 1);
  EXPECT_FALSE(readable);
  EXPECT_TRUE(writable);

  ASSERT_TRUE(write_string(s, "0123456789"));
  EXPECT_EQ(wait_ready(io(), c, POLLIN, 5s), POLLIN);
  // select, read side only, with a timeout: readable now.
  fd_set r;
  FD_ZERO(&r);
  FD_SET(c, &r);
  timeval t{5, 0};
  EXPECT_EQ(io().select(c + 1, &r, nullptr, nullptr, &t), 1);
  EXPECT_TRUE(FD_ISSET(c, &r));

  EXPECT_EQ(read_string(c, 10), "0123456789");
  EXPECT_EQ(wait_ready(io(), c, POLLIN, 0ms), 0) << "readable after everything was read";
  EXPECT_EQ(select_ready(c, 0, readable, writable), 1);
  EXPECT_FALSE(readable);

  // The peer's half-close makes the socket readable (EOF) with POLLRDHUP.
  ASSERT_EQ(io().shutdown(s, SHUT_WR), 0);
  short events = wait_ready(io(), c, POLLIN | POLLRDHUP, 5s);
  EXPECT_TRUE(events & POLLIN);
  EXPECT_TRUE(events & POLLRDHUP);
  EXPECT_EQ(check_eof(io(), c), "");
}

// The peer's end while its bytes still come over TCP (it never switched:
// it wrote and shut down before our hello reached it) is the kernel's FIN,
// reported with POLLRDHUP on every look, not only the one that decided.
TEST_P(Semantics, APeerThatEndsBeforeItsSwitchIsReportedWithPollRdhup) {
  int c = pair_.client, s = pair_.server;
  ASSERT_TRUE(write_string(s, "abc"));
  ASSERT_EQ(io().shutdown(s, SHUT_WR), 0);
  EXPECT_TRUE(wait_ready(io(), c, POLLIN, 5s) & POLLIN);
  EXPECT_EQ(read_string(c, 1), "a");
  short events = wait_ready(io(), c, POLLIN | POLLRDHUP, 5s);
  EXPECT_TRUE(events & POLLIN);
  EXPECT_TRUE(events & POLLRDHUP);
  EXPECT_EQ(read_string(c, 2), "bc");
  EXPECT_EQ(check_eof(io(), c), "");
}

TEST_P(Semantics, EpollLevelTriggeredReportsUntilDrained) {
  int c = pair_.client, s = pair_.server;
  int ep = io().epoll_create1(EPOLL_CLOEXEC);
  ASSERT_GE(ep, 0);
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.u64 = 42;
  ASSERT_EQ(io().epoll_ctl(ep, EPOLL_CTL_ADD, c, &event), 0) << std::strerror(errno);
  epoll_event out[4];
  EXPECT_EQ(io().epoll_wait(ep, out, 4, 0), 0) << "ready before any data";

  ASSERT_TRUE(write_string(s, "0123456789"));
  ASSERT_EQ(io().epoll_wait(ep, out, 4, 5000), 1);
  EXPECT_EQ(out[0].events, static_cast<std::uint32_t>(EPOLLIN));
  EXPECT_EQ(out[0].data.u64, 42u);
  // Level-triggered: still reported while data is left.
  EXPECT_EQ(io().epoll_wait(ep, out, 4, 0), 1);
  EXPECT_EQ(read_string(c, 4), "0123");
  EXPECT_EQ(io().epoll_wait(ep, out, 4, 1000), 1);
  EXPECT_EQ(read_string(c, 6), "456789");
  EXPECT_EQ(io().epoll_wait(ep, out, 4, 0), 0) << "ready after everything was read";

  event.events = EPOLLOUT;
  ASSERT_EQ(io().epoll_ctl(ep, EPOLL_CTL_MOD, c, &event), 0);
  ASSERT_EQ(io().epoll_wait(ep, out, 4, 5000), 1);
  EXPECT_EQ(out[0].events, static_cast<std::uint32_t>(EPOLLOUT));
  ASSERT_EQ(io().epoll_ctl(ep, EPOLL_CTL_DEL, c, nullptr), 0);
  EXPECT_EQ(io().epoll_wait(ep, out, 4, 0), 0);
  io().close(ep);
}

// A set holding descriptors that are not streams of ours (pipes here) and
// streams: each event comes back with the caller's own data, even data
// that looks like what vmmc tags its own registrations with. For a set of
// such descriptors alone the kernel holds the caller's event as given, so a
// wait the interposer never sees (a raw system call, a library with its
// own syscall wrappers) gets it too.
TEST_P(Semantics, EpollGivesEveryMemberItsCallersOwnData) {
  int c = pair_.client, s = pair_.server;
  int one[2], two[2];
  ASSERT_EQ(::pipe2(one, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe2(two, O_CLOEXEC), 0);
  const std::uint64_t lookalike = (std::uint64_t{0x766d6d63} << 32) | static_cast<unsigned>(c);
  int ep = io().epoll_create1(EPOLL_CLOEXEC);
  ASSERT_GE(ep, 0);
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.u64 = lookalike;
  ASSERT_EQ(io().epoll_ctl(ep, EPOLL_CTL_ADD, one[0], &event), 0) << std::strerror(errno);
  event.data.u64 = 0x1234;
  ASSERT_EQ(io().epoll_ctl(ep, EPOLL_CTL_ADD, two[0], &event), 0);
  event.data.u64 = 42;
  ASSERT_EQ(io().epoll_ctl(ep, EPOLL_CTL_ADD, c, &event), 0);
  ASSERT_EQ(::write(one[1], "a", 1), 1);
  ASSERT_EQ(::write(two[1], "b", 1), 1);
  ASSERT_TRUE(write_string(s, "c"));
  std::set<std::uint64_t> seen;
  for (auto deadline = std::chrono::steady_clock::now() + 5s;
       seen.size() < 3 && std::chrono::steady_clock::now() < deadline;) {
    epoll_event out[8];
    const int n = io().epoll_wait(ep, out, 8, 1000);
    ASSERT_GE(n, 0) << std::strerror(errno);
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(out[i].events, static_cast<std::uint32_t>(EPOLLIN));
      seen.insert(out[i].data.u64);
    }
  }
  EXPECT_EQ(seen, (std::set<std::uint64_t>{lookalike, 0x1234, 42}));

  int pipes_only = io().epoll_create1(EPOLL_CLOEXEC);
  ASSERT_GE(pipes_only, 0);
  event.data.u64 = 0x5678;
  ASSERT_EQ(io().epoll_ctl(pipes_only, EPOLL_CTL_ADD, two[0], &event), 0);
  epoll_event raw[2];
  ASSERT_EQ(::syscall(SYS_epoll_wait, pipes_only, raw, 2, 1000), 1);
  EXPECT_EQ(raw[0].data.u64, 0x5678u) << "the kernel holds another event than the caller gave";
  for (int fd : {ep, pipes_only, one[0], one[1], two[0], two[1]}) io().close(fd);
}

// A member added while another thread already sleeps on a set that had
// none: what the kernel then reports for it reaches the sleeper as the
// caller's event (an unconnected socket is ready at once: EPOLLOUT|EPOLLHUP).
TEST_P(Semantics, EpollMemberAddedDuringAWaitComesBackWithTheCallersData) {
  int quiet[2];
  ASSERT_EQ(::pipe2(quiet, O_CLOEXEC), 0);
  int ep = io().epoll_create1(EPOLL_CLOEXEC);
  ASSERT_GE(ep, 0);
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.u64 = 7;
  ASSERT_EQ(io().epoll_ctl(ep, EPOLL_CTL_ADD, quiet[0], &event), 0);
  std::atomic<int> got{-2};
  epoll_event out[4]{};
  std::thread sleeper([&] { got = io().epoll_wait(ep, out, 4, 5000); });
  std::this_thread::sleep_for(100ms);
  int fresh = io().socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fresh, 0);
  event.events = EPOLLOUT;
  event.data.u64 = 99;
  ASSERT_EQ(io().epoll_ctl(ep, EPOLL_CTL_ADD, fresh, &event), 0);
  sleeper.join();
  ASSERT_EQ(got.load(), 1) << std::strerror(errno);
  EXPECT_EQ(out[0].data.u64, 99u);
  EXPECT_TRUE(out[0].events & EPOLLOUT);
  for (int fd : {ep, quiet[0], quiet[1]}) io().close(fd);
  io().close(fresh);
}

TEST_P(Semantics, FcntlTogglesNonBlocking) {
  int fd = pair_.server;
  int flags = io().fcntl(fd, F_GETFL, 0);
  ASSERT_GE(flags, 0);
  EXPECT_EQ(flags & O_NONBLOCK, 0);
  EXPECT_EQ(flags & O_ACCMODE, O_RDWR);
  ASSERT_EQ(io().fcntl(fd, F_SETFL, flags | O_NONBLOCK), 0);
  EXPECT_EQ(io().fcntl(fd, F_GETFL, 0) & O_NONBLOCK, O_NONBLOCK);
  char c;
  EXPECT_EQ(io().read(fd, &c, 1), -1);
  EXPECT_EQ(errno, EAGAIN);
  ASSERT_EQ(io().fcntl(fd, F_SETFL, flags), 0);
  EXPECT_EQ(io().fcntl(fd, F_GETFL, 0) & O_NONBLOCK, 0);
  ASSERT_TRUE(write_string(pair_.client, "b"));
  EXPECT_EQ(read_string(fd, 1), "b") << "blocking again";

  // SOCK_NONBLOCK / SOCK_CLOEXEC at creation, and accept4's flags.
  int port = 0;
  int listener = listen_loopback(io(), &port);
  ASSERT_GE(listener, 0);
  int made = io().socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  ASSERT_GE(made, 0);
  EXPECT_EQ(io().fcntl(made, F_GETFL, 0) & O_NONBLOCK, O_NONBLOCK);
  EXPECT_EQ(io().fcntl(made, F_GETFD, 0) & FD_CLOEXEC, FD_CLOEXEC);
  sockaddr_in to = loopback(port);
  int rc = io().connect(made, reinterpret_cast<sockaddr*>(&to), sizeof to);
  EXPECT_TRUE(rc == 0 || errno == EINPROGRESS) << std::strerror(errno);
  ASSERT_TRUE(wait_ready(io(), listener, POLLIN, 5s) & POLLIN);
  int accepted = io().accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  ASSERT_GE(accepted, 0) << std::strerror(errno);
  EXPECT_EQ(io().fcntl(accepted, F_GETFL, 0) & O_NONBLOCK, O_NONBLOCK);
  EXPECT_EQ(io().fcntl(accepted, F_GETFD, 0) & FD_CLOEXEC, FD_CLOEXEC);
  io().close(accepted);
  io().close(made);
  io().close(listener);
}

TEST_P(Semantics, VectoredIoKeepsOrderAcrossIovecs) {
  // writev from five pieces (one empty) and sendmsg from four; readv into
  // three and recvmsg into four, of other sizes.
  auto data = pattern(4, 300000);
  unsigned char* p = data.data();
  std::thread writer([&] {
    iovec out[5] = {{p, 1}, {p + 1, 0}, {p + 1, 7}, {p + 8, 4096}, {p + 4104, 145896}};
    ssize_t n = io().writev(pair_.client, out, 5);
    EXPECT_EQ(n, 150000);
    iovec more[4] = {{p + 150000, 3}, {p + 150003, 70000}, {p + 220003, 1}, {p + 220004, 79996}};
    msghdr message{};
    message.msg_iov = more;
    message.msg_iovlen = 4;
    n = io().sendmsg(pair_.client, &message, MSG_NOSIGNAL);
    EXPECT_EQ(n, 150000);
  });
  std::vector<unsigned char> got(300000);
  unsigned char* g = got.data();
  std::size_t done = 0;
  while (done < 150000) {
    std::size_t a = std::min<std::size_t>(10, 150000 - done);
    std::size_t b = std::min<std::size_t>(50000, 150000 - done - a);
    iovec in[3] = {{g + done, a}, {g + done + a, b}, {g + done + a + b, 150000 - done - a - b}};
    ssize_t n = io().readv(pair_.server, in, 3);
    ASSERT_GT(n, 0) << std::strerror(errno);
    done += static_cast<std::size_t>(n);
  }
  while (done < 300000) {
    std::size_t left = 300000 - done;
    std::size_t a = std::min<std::size_t>(1, left), b = std::min<std::size_t>(2, left - a),
                c = std::min<std::size_t>(100000, left - a - b);
    iovec in[4] = {{g + done, a},
                   {g + done + a, b},
                   {g + done + a + b, c},
                   {g + done + a + b + c, left - a - b - c}};
    msghdr message{};
    message.msg_iov = in;
    message.msg_iovlen = 4;
    ssize_t n = io().recvmsg(pair_.server, &message, 0);
    ASSERT_GT(n, 0) << std::strerror(errno);
    EXPECT_EQ(message.msg_flags, 0);
    done += static_cast<std::size_t>(n);
  }
  writer.join();
  EXPECT_EQ(check_pattern(4, 0, got.data(), got.size()), got.size());
}

// Each end has a reader thread and a writer thread (stream_both_ways) at
// once, in one process.
TEST_P(Semantics, ReaderAndWriterThreadsShareEachSocket) {
  constexpr std::uint64_t bytes = 64 << 20;
  stream_result client_end, server_end;
  auto at_end = [&](int fd) {
    return [&, fd](const stream_result& r) {
      EXPECT_EQ(check_accelerated(io(), fd), "");
      EXPECT_EQ(check_counters(io(), fd, r.received, r.sent), "");
    };
  };
  std::thread client([&] {
    client_end = stream_both_ways(io(), pair_.client, bytes, 5, 6, 1, at_end(pair_.client));
  });
  server_end = stream_both_ways(io(), pair_.server, bytes, 6, 5, 2, at_end(pair_.server));
  client.join();
  EXPECT_EQ(client_end.error, "");
  EXPECT_EQ(server_end.error, "");
  EXPECT_EQ(client_end.sent_checksum, server_end.received_checksum);
  EXPECT_EQ(server_end.sent_checksum, client_end.received_checksum);
}

// A client that reads in one thread and writes in another, as most
// full-duplex programs do; its upgrade comes mid-stream (semantics.deferred).
// The server reads nothing at first, so the client's writer blocks in the
// kernel's send once it has earned the channel; the server's first piece
// brings the reader out, and its next read, finding the writer in the
// kernel, waits outside the kernel for the upgrade. The server then drains:
// the writer's next call asks, and the server answers from its reading
// thread (an urgent byte and a hello frame, no data of its own near them).
// The answer must never reach the program as data. A reader that had
// decided on a plain read before the ask took the hello for data
// (faults.deferred, 7 of 40 runs: "byte at offset 246931 is 0x56", the
// server's hello sent after 246931 bytes).
TEST_P(Semantics, AnAskWhileTheReaderWaitsNeverDeliversTheAnswerAsData) {
  constexpr std::size_t piece = 2048, pieces = 10;
  constexpr std::uint64_t seed = 11;
  std::thread drain([&] {
    std::this_thread::sleep_for(300ms);
    std::vector<char> sink(1 << 16);
    while (io().read(pair_.server, sink.data(), sink.size()) > 0) {
    }
  });
  std::thread server([&] {
    std::vector<unsigned char> data(piece);
    for (std::size_t i = 0; i < pieces; ++i) {
      std::this_thread::sleep_for(i == 0 ? 150ms : i == 1 ? 300ms : 1ms);
      fill_pattern(seed, i * piece, data.data(), piece);
      if (!write_all(io(), pair_.server, data.data(), piece)) break;
    }
    io().shutdown(pair_.server, SHUT_WR);
  });
  std::atomic<bool> reading{true};
  std::thread writer([&] {
    std::vector<unsigned char> data(64 << 10, 'w');
    while (reading.load() && write_all(io(), pair_.client, data.data(), data.size())) {
    }
    io().shutdown(pair_.client, SHUT_WR);
  });
  std::vector<unsigned char> got(piece);
  std::uint64_t received = 0;
  ssize_t n = 0;
  while ((n = io().read(pair_.client, got.data(), got.size())) > 0) {
    const std::size_t bad = check_pattern(seed, received, got.data(), static_cast<std::size_t>(n));
    if (bad != static_cast<std::size_t>(n)) {
      ADD_FAILURE() << "byte at offset " << received + bad << " is not the server's (" << +got[bad]
                    << ")";
      break;
    }
    received += static_cast<std::uint64_t>(n);
  }
  if (!HasFailure()) {
    EXPECT_EQ(n, 0) << std::strerror(errno);
    EXPECT_EQ(received, piece * pieces);
    if (io().vmmc) {
      EXPECT_EQ(check_accelerated(io(), pair_.client), "");
    }
  }
  reading = false;
  io().shutdown(pair_.client, SHUT_RD);
  writer.join();
  server.join();
  drain.join();
}

TEST_P(Semantics, AcceptInOneThreadWhileOthersDoIo) {
  int port = 0;
  int listener = listen_loopback(io(), &port);
  ASSERT_GE(listener, 0);
  constexpr int clients = 3, rounds = 2000;
  std::atomic<int> echoed{0};
  std::thread acceptor([&] {
    for (int i = 0; i < clients; ++i) {
      int fd = io().accept(listener, nullptr, nullptr);  // blocking, while others do I/O
      if (fd < 0) return;
      char c;
      if (read_full(io(), fd, &c, 1) == 1 && write_all(io(), fd, &c, 1)) ++echoed;
      io().close(fd);
    }
  });
  std::thread pinger([&] {
    for (int i = 0; i < rounds; ++i) {
      std::uint64_t v = static_cast<std::uint64_t>(i), back = 0;
      if (!write_all(io(), pair_.client, &v, sizeof v) ||
          read_full(io(), pair_.client, &back, sizeof back) != sizeof back || back != v + 1) {
        ADD_FAILURE() << "ping " << i << " came back as " << back;
        return;
      }
    }
  });
  std::thread ponger([&] {
    for (int i = 0; i < rounds; ++i) {
      std::uint64_t v = 0;
      if (read_full(io(), pair_.server, &v, sizeof v) != sizeof v) return;
      ++v;
      if (!write_all(io(), pair_.server, &v, sizeof v)) return;
    }
  });
  for (int i = 0; i < clients; ++i) {
    int fd = connect_loopback(io(), port);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    char c = static_cast<char>('a' + i), back = 0;
    EXPECT_TRUE(write_all(io(), fd, &c, 1));
    EXPECT_EQ(read_full(io(), fd, &back, 1), 1);
    EXPECT_EQ(back, c);
    io().close(fd);
  }
  acceptor.join();
  pinger.join();
  ponger.join();
  EXPECT_EQ(echoed, clients);
  io().close(listener);
}

// ---- Two processes: half-close and orderly close.

// Reads until EOF (must be exactly arg 1 bytes of pattern arg 2), then
// answers arg 3 bytes of pattern arg 4 and closes.
const peer_role half_close_server("half_close_server", [](peer_context& p) {
  int port = 0;
  int listener = listen_loopback(p.io(), &port);
  p.say("port " + std::to_string(port));
  int fd = accept_within(p.io(), listener);
  if (fd < 0) return 1;
  auto expected = static_cast<std::size_t>(p.arg_int(0));
  std::string got;
  if (read_to_eof(p.io(), fd, got, expected + 1) < 0)
    p.fail("read: " + std::string(std::strerror(errno)));
  if (got.size() != expected)
    p.fail("read " + std::to_string(got.size()) + " bytes before EOF, expected " +
           std::to_string(expected));
  else if (check_pattern(static_cast<std::uint64_t>(p.arg_int(1)), 0,
                         reinterpret_cast<const unsigned char*>(got.data()),
                         got.size()) != got.size())
    p.fail("request bytes differ from what was sent");
  p.expect(check_not_plain(p.io(), fd));
  auto reply =
      pattern(static_cast<std::uint64_t>(p.arg_int(3)), static_cast<std::size_t>(p.arg_int(2)));
  if (!write_all(p.io(), fd, reply.data(), reply.size()))
    p.fail("writing after the peer's half-close: " + std::string(std::strerror(errno)));
  p.io().close(fd);
  p.io().close(listener);
  return 0;
});

TEST_P(Semantics, HalfCloseLetsThePeerReadEverythingAndReply) {
  peer server("half_close_server", io(), {"1000000", "7", "300000", "8"});
  int port = static_cast<int>(server.read_value("port"));
  int fd = connect_loopback(io(), port);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  auto request = pattern(7, 1000000);
  ASSERT_TRUE(write_all(io(), fd, request.data(), request.size()));
  ASSERT_EQ(io().shutdown(fd, SHUT_WR), 0);
  EXPECT_EQ(io().send(fd, "x", 1, MSG_NOSIGNAL), -1) << "write after our own SHUT_WR";
  EXPECT_EQ(errno, EPIPE);
  std::string reply;
  EXPECT_EQ(read_to_eof(io(), fd, reply, 1 << 20), 300000) << std::strerror(errno);
  EXPECT_EQ(check_pattern(8, 0, reinterpret_cast<const unsigned char*>(reply.data()), reply.size()),
            reply.size());
  // The server recognised us (it checks). On this host our writes may have
  // ended on TCP before its answer came (it answers at its first call, we
  // ask at connect): then this end stays kernel TCP, as it should.
  io().close(fd);
  EXPECT_EQ(server.wait(), 0);
}

// Connects to arg 0, writes arg 1 bytes of pattern 9, then "close" closes and
// exits at once (_exit: no library destructors), "exit" exits without close
// (_exit), "exit()" through libc's exit (atexit handlers run). "chunks, ..."
// writes 256 KiB a call.
const peer_role close_writer("close_writer", [](peer_context& p) {
  int fd = p.connect_to_parent();
  if (fd < 0) return 1;
  auto data = pattern(9, static_cast<std::size_t>(p.arg_int(1)));
  const std::string ending = p.arg(2);
  const std::size_t chunk = ending.starts_with("chunks") ? 256 << 10 : data.size();
  for (std::size_t at = 0; at < data.size(); at += chunk)
    if (!write_all(p.io(), fd, data.data() + at, std::min(chunk, data.size() - at), 0, 30s))
      return 2;
  if (ending == "close" && p.io().close(fd) != 0) return 3;
  if (ending.ends_with("exit()")) std::exit(0);
  ::_exit(0);
});

TEST_P(Semantics, OrderlyCloseDeliversEveryByteWrittenBeforeIt) {
  for (const char* ending : {"close", "exit", "exit()", "chunks, exit()", "chunks, exit"}) {
    SCOPED_TRACE(ending);
    constexpr std::size_t bytes = 64 << 20;
    int port = 0;
    int listener = listen_loopback(io(), &port);
    ASSERT_GE(listener, 0);
    peer writer("close_writer", io(), {std::to_string(port), std::to_string(bytes), ending});
    int fd = accept_within(io(), listener);
    ASSERT_GE(fd, 0);
    io().close(listener);
    std::string got;
    got.reserve(bytes + 1);
    EXPECT_EQ(read_to_eof(io(), fd, got, bytes + 1), static_cast<ssize_t>(bytes))
        << std::strerror(errno) << " after " << got.size() << " bytes";
    EXPECT_EQ(check_pattern(9, 0, reinterpret_cast<const unsigned char*>(got.data()), got.size()),
              got.size());
    EXPECT_EQ(writer.wait(), 0);
    io().close(fd);
  }
}

// A pre-forking server: the parent has used the library (its pair carried
// data both ways), then fork() without exec hands the listener to a worker
// that accepts and echoes, as nginx or a prefork Apache would.
TEST_P(Semantics, ForkedWorkerServesOnTheInheritedListener) {
  for (char c = 'a'; c < 'e'; ++c) {
    ASSERT_TRUE(write_all(io(), pair_.client, &c, 1));
    ASSERT_EQ(read_string(pair_.server, 1), std::string(1, c));
    ASSERT_TRUE(write_all(io(), pair_.server, &c, 1));
    ASSERT_EQ(read_string(pair_.client, 1), std::string(1, c));
  }
  int port = 0;
  int listener = listen_loopback(io(), &port);
  ASSERT_GE(listener, 0);
  child_process worker(
      [&](int) {
        ::signal(SIGALRM, SIG_DFL);  // not the parent's watchdog
        int fd = accept_within(io(), listener);
        if (fd < 0) return 1;
        std::vector<char> buffer(65536);
        ssize_t n;
        while ((n = io().read(fd, buffer.data(), buffer.size())) > 0)
          if (!write_all(io(), fd, buffer.data(), static_cast<std::size_t>(n), MSG_NOSIGNAL))
            return 2;
        return n == 0 && io().close(fd) == 0 ? 0 : 3;
      },
      10s);
  // Non-blocking, so a worker that hangs fails this test (poll timeouts)
  // instead of blocking it.
  int fd = connect_loopback(io(), port, true);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_TRUE(wait_ready(io(), fd, POLLOUT, 5s) & POLLOUT);
  auto data = pattern(10, 1 << 20);
  std::thread writer([&] {
    EXPECT_TRUE(write_all(io(), fd, data.data(), data.size())) << std::strerror(errno);
    io().shutdown(fd, SHUT_WR);
  });
  std::string echo;
  EXPECT_EQ(read_to_eof(io(), fd, echo, 2 << 20), static_cast<ssize_t>(data.size()))
      << std::strerror(errno);
  writer.join();
  EXPECT_TRUE(echo == std::string(data.begin(), data.end())) << "the worker's echo differs";
  EXPECT_EQ(worker.wait(), 0) << "worker: 1 accept, 2 write, 3 read/close failed; " << 128 + SIGALRM
                              << " hung";
  // The parent's own connection still works after the fork.
  ASSERT_TRUE(write_all(io(), pair_.client, "z", 1));
  EXPECT_EQ(read_string(pair_.server, 1), "z");
  io().close(fd);
  io().close(listener);
}

VMMC_INSTANTIATE_FOR_APIS(Semantics);

}  // namespace
}  // namespace vmmc::test
