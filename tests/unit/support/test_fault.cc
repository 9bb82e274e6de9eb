// unit.support.fault: the fault-injection library does what it says, over
// plain kernel sockets and forked children: a relay that only delays,
// re-segments and stalls is invisible; drop, reorder, close and reset show up
// where the plan puts them; urgent bytes pass as urgent; process, descriptor
// and control-connection faults take effect and are undone.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "support/fault.h"

namespace vmmc::test::fault {
namespace {

using namespace std::chrono_literals;

// A kernel listener on 127.0.0.1:0.
struct listener {
  int fd = -1;
  sockaddr_in address{};
  listener() {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    EXPECT_EQ(::listen(fd, 16), 0);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  }
  ~listener() { ::close(fd); }
  int accept_within(std::chrono::milliseconds timeout = 5s) const {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return -1;
    return ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
  }
};

int connect_to(const sockaddr_in& a) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval limit{10, 0};  // nothing here may block for ever
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Sends `length` bytes of pattern `seed` in pieces; returns the errno that
// stopped it (0: all sent).
int send_pattern(int fd, std::uint64_t seed, std::size_t length) {
  std::vector<unsigned char> chunk(100000);
  for (std::size_t at = 0; at < length;) {
    std::size_t n = std::min(chunk.size(), length - at);
    fill_pattern(seed, at, chunk.data(), n);
    ssize_t w = ::send(fd, chunk.data(), n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno;
    at += static_cast<std::size_t>(w);
  }
  return 0;
}

// Reads until EOF or an error into the verifier; returns 0 at EOF or the
// errno. Stops feeding (but keeps reading) once the verifier failed.
int receive_into(int fd, stream_verifier& v, std::uint64_t* bytes = nullptr) {
  std::vector<unsigned char> buffer(65536);
  std::uint64_t total = 0;
  for (;;) {
    ssize_t n = ::recv(fd, buffer.data(), buffer.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (bytes) *bytes = total;
      return n == 0 ? 0 : errno;
    }
    total += static_cast<std::uint64_t>(n);
    v.feed(buffer.data(), static_cast<std::size_t>(n));
  }
}

// One-way transfer client -> relay -> server of `length` bytes; the server's
// verifier and what ended its reading (0: EOF).
struct one_way {
  stream_verifier server{5};
  int server_end = -1;
  std::uint64_t server_bytes = 0;
  int client_end = -1;
};
one_way transfer(const fault_plan& up, std::size_t length) {
  listener target;
  relay r(target.address, up);
  EXPECT_TRUE(r.ok());
  one_way out;
  int client = connect_to(r.address());
  EXPECT_GE(client, 0);
  int server = target.accept_within();
  EXPECT_GE(server, 0);
  std::thread writer([&] {
    out.client_end = send_pattern(client, 5, length);
    ::shutdown(client, SHUT_WR);
  });
  out.server_end = receive_into(server, out.server, &out.server_bytes);
  writer.join();
  ::close(client);
  ::close(server);
  return out;
}

TEST(Relay, DelayResegmentAndStallAreInvisible) {
  listener target;
  fault_plan plan;
  plan.max_delay = 300us;
  plan.max_chunk = 3000;
  plan.stall_at = 1 << 20;
  plan.stall_for = 300ms;
  fault_plan back = plan;
  back.seed = 2;
  relay r(target.address, plan, back);
  ASSERT_TRUE(r.ok());
  constexpr std::size_t length = 4 << 20;
  int client = connect_to(r.address());
  ASSERT_GE(client, 0);
  int server = target.accept_within();
  ASSERT_GE(server, 0);
  // The server echoes; the client checks the echo.
  std::thread echo([&] {
    std::vector<unsigned char> b(65536);
    ssize_t n;
    while ((n = ::recv(server, b.data(), b.size(), 0)) > 0)
      if (::send(server, b.data(), static_cast<std::size_t>(n), MSG_NOSIGNAL) != n) break;
    ::shutdown(server, SHUT_WR);
  });
  auto start = std::chrono::steady_clock::now();
  std::thread writer([&] {
    EXPECT_EQ(send_pattern(client, 5, length), 0);
    ::shutdown(client, SHUT_WR);
  });
  stream_verifier v(5);
  EXPECT_EQ(receive_into(client, v), 0);
  writer.join();
  echo.join();
  EXPECT_TRUE(v.ok()) << v.error();
  EXPECT_EQ(v.verified(), length);
  EXPECT_EQ(v.checksum(), pattern_checksum(5, length));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 600ms) << "the two stalls did not happen";
  relay_counters c = r.counters();
  EXPECT_EQ(c.connections, 1u);
  EXPECT_EQ(c.to_target, length);
  EXPECT_EQ(c.from_target, length);
  ::close(client);
  ::close(server);
}

TEST(Relay, ManualStallHoldsBothDirections) {
  listener target;
  relay r(target.address);
  int client = connect_to(r.address());
  int server = target.accept_within();
  ASSERT_GE(server, 0);
  r.stall(300ms);
  auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(::send(client, "x", 1, 0), 1);
  char c = 0;
  ASSERT_EQ(::recv(server, &c, 1, 0), 1);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 250ms);
  ::close(client);
  ::close(server);
}

TEST(Relay, UrgentBytesPassAsUrgent) {
  listener target;
  relay r(target.address);
  int client = connect_to(r.address());
  int server = target.accept_within();
  ASSERT_GE(server, 0);
  ASSERT_EQ(::send(client, "\xD6", 1, MSG_OOB), 1);
  ASSERT_EQ(::send(client, "data", 4, 0), 4);
  // The kernel forgets an urgent byte once ordinary reads pass its mark:
  // take it first, as vmmc's handshake does.
  pollfd p{server, POLLPRI, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1);
  unsigned char urgent = 0;
  EXPECT_EQ(::recv(server, &urgent, 1, MSG_OOB), 1) << std::strerror(errno);
  EXPECT_EQ(urgent, 0xD6);
  char plain[4];
  ASSERT_EQ(::recv(server, plain, 4, MSG_WAITALL), 4);
  EXPECT_EQ(std::string(plain, 4), "data");
  EXPECT_EQ(r.counters().urgent, 1u);
  ::close(client);
  ::close(server);
}

TEST(Relay, DroppedRangeIsSeenAsLostBytesAtItsOffset) {
  fault_plan plan;
  plan.drop_at = 100000;
  plan.drop_length = 10;
  one_way t = transfer(plan, 300000);
  EXPECT_EQ(t.server_end, 0);
  EXPECT_EQ(t.server_bytes, 300000u - 10);
  EXPECT_EQ(t.server.verified(), 100000u);
  EXPECT_NE(t.server.error().find("10 byte(s) lost"), std::string::npos) << t.server.error();
}

TEST(Relay, ReorderedChunksAreSeenAtTheirOffset) {
  fault_plan plan;
  plan.reorder_at = 5000;
  plan.reorder_length = 100;
  one_way t = transfer(plan, 20000);
  EXPECT_EQ(t.server_bytes, 20000u);
  EXPECT_EQ(t.server.verified(), 5000u);
  EXPECT_NE(t.server.error().find("100 byte(s) lost"), std::string::npos) << t.server.error();
}

TEST(Relay, CloseAfterNBytesGivesEndOfFileThere) {
  fault_plan plan;
  plan.close_at = 123456;
  one_way t = transfer(plan, 1 << 20);
  EXPECT_EQ(t.server_end, 0);
  EXPECT_EQ(t.server_bytes, 123456u);
  EXPECT_TRUE(t.server.ok()) << t.server.error();
  EXPECT_EQ(t.client_end, 0) << "the client's bytes after the close are discarded, not refused";
}

TEST(Relay, ResetAfterNBytesResetsBothEnds) {
  fault_plan plan;
  plan.reset_at = 200000;
  one_way t = transfer(plan, 16 << 20);
  EXPECT_EQ(t.server_end, ECONNRESET);
  EXPECT_LE(t.server_bytes, 200000u);
  EXPECT_TRUE(t.server.ok()) << t.server.error();
  EXPECT_TRUE(t.client_end == ECONNRESET || t.client_end == EPIPE) << std::strerror(t.client_end);
}

TEST(Relay, ResetBySenderIsPassedOn) {
  listener target;
  relay r(target.address);
  int client = connect_to(r.address());
  int server = target.accept_within();
  ASSERT_GE(server, 0);
  ASSERT_EQ(::send(client, "abc", 3, 0), 3);
  linger abort{1, 0};
  ::setsockopt(client, SOL_SOCKET, SO_LINGER, &abort, sizeof abort);
  ::close(client);
  char b[8];
  ssize_t n = ::recv(server, b, sizeof b, MSG_WAITALL);
  EXPECT_EQ(n, 3);
  EXPECT_EQ(::recv(server, b, sizeof b, 0), -1);
  EXPECT_EQ(errno, ECONNRESET);
  ::close(server);
}

TEST(Verifier, TellsLostDuplicatedAndCorruptedApart) {
  auto p = pattern(9, 10000);
  stream_verifier lost(9);
  EXPECT_TRUE(lost.feed(p.data(), 1000));
  EXPECT_FALSE(lost.feed(p.data() + 1007, 500));
  EXPECT_EQ(lost.verified(), 1000u);
  EXPECT_NE(lost.error().find("7 byte(s) lost"), std::string::npos) << lost.error();

  stream_verifier duplicated(9);
  EXPECT_TRUE(duplicated.feed(p.data(), 1000));
  EXPECT_FALSE(duplicated.feed(p.data() + 990, 500));
  EXPECT_NE(duplicated.error().find("10 byte(s) duplicated"), std::string::npos)
      << duplicated.error();

  auto bad = p;
  bad[4321] ^= 1;
  stream_verifier corrupted(9);
  EXPECT_FALSE(corrupted.feed(bad.data(), bad.size()));
  EXPECT_EQ(corrupted.verified(), 4321u);
  EXPECT_NE(corrupted.error().find("corrupted"), std::string::npos) << corrupted.error();

  stream_verifier whole(9);
  for (std::size_t at = 0; at < p.size(); at += 333)
    EXPECT_TRUE(whole.feed(p.data() + at, std::min<std::size_t>(333, p.size() - at)));
  EXPECT_EQ(whole.checksum(), pattern_checksum(9, p.size()));
}

TEST(Process, PauseResumePausedForAndKill) {
  pid_t child = ::fork();
  if (child == 0) {
    ::alarm(20);
    for (;;) ::pause();
  }
  ASSERT_GT(child, 0);
  EXPECT_EQ(pause_peer(child), 0);
  EXPECT_TRUE(is_stopped(child));
  EXPECT_EQ(resume_peer(child), 0);
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(is_stopped(child));
  {
    auto start = std::chrono::steady_clock::now();
    paused_for p(child, 200ms);
    EXPECT_TRUE(p.ok());
    EXPECT_TRUE(is_stopped(child));
    p.wait();
    EXPECT_GE(std::chrono::steady_clock::now() - start, 190ms);
  }
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(is_stopped(child));
  EXPECT_EQ(pause_peer(::getpid()), EINVAL);
  EXPECT_EQ(kill_peer(0), EINVAL);
  EXPECT_EQ(kill_peer(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_EQ(kill_peer(child, SIGKILL), ESRCH);
}

TEST(Descriptors, ExhaustionLeavesExactlyWhatWasAskedAndIsUndone) {
  {
    descriptor_exhaustion none;
    ASSERT_TRUE(none.ok());
    errno = 0;
    EXPECT_EQ(::open("/dev/null", O_RDONLY | O_CLOEXEC), -1);
    EXPECT_EQ(errno, EMFILE);
    int s = ::socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_EQ(s, -1);
    EXPECT_EQ(none.free_left(), 0);
  }
  {
    auto two = exhaust_descriptors(2);
    ASSERT_TRUE(two->ok());
    EXPECT_EQ(two->free_left(), 2);
  }
  int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0);
  ::close(fd);
}

TEST(Control, SocketsOpenedSinceTheSnapshotAreShutDown) {
  int before[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, before), 0);
  socket_snapshot snapshot;
  int after[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, after), 0);
  auto opened = snapshot.opened_since();
  EXPECT_EQ(opened, (std::vector<int>{std::min(after[0], after[1]), std::max(after[0], after[1])}));
  EXPECT_EQ(close_control_connection(snapshot), 2);
  char c;
  EXPECT_EQ(::read(after[0], &c, 1), 0);
  // The older pair is untouched.
  ASSERT_EQ(::write(before[0], "y", 1), 1);
  EXPECT_EQ(::read(before[1], &c, 1), 1);
  for (int fd : {before[0], before[1], after[0], after[1]}) ::close(fd);
}

TEST(Control, AnotherProcessesSocketsAreReachedThroughPidfdGetfd) {
  int ready[2], go[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(go), 0);
  pid_t child = ::fork();
  if (child == 0) {
    ::alarm(10);
    char g;
    if (::read(go[0], &g, 1) != 1) ::_exit(2);  // after the parent's snapshot
    int pair[2];
    ::socketpair(AF_UNIX, SOCK_STREAM, 0, pair);
    char c = 'r';
    [[maybe_unused]] ssize_t w = ::write(ready[1], &c, 1);
    // Exits 0 once its socket saw end of file (the parent shut it down),
    // when the parent lets it (so both descriptors are there to reach).
    bool eof = ::read(pair[0], &c, 1) == 0;
    ::_exit(::read(go[0], &g, 1) == 1 && eof ? 0 : 1);
  }
  socket_snapshot snapshot(child);
  char c = 'g';
  ASSERT_EQ(::write(go[1], &c, 1), 1);
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  EXPECT_EQ(close_control_connection(snapshot), 2);
  ASSERT_EQ(::write(go[1], &c, 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  for (int fd : {ready[0], ready[1], go[0], go[1]}) ::close(fd);
}

TEST(Gate, ParksTheReaderUntilOpened) {
  reader_gate gate(5s);
  std::atomic<int> passes{0};
  gate.close();
  std::thread reader([&] {
    for (int i = 0; i < 3; ++i)
      if (gate.pass()) ++passes;
  });
  EXPECT_TRUE(gate.wait_parked(2s));
  EXPECT_EQ(passes.load(), 0);
  gate.open();
  reader.join();
  EXPECT_EQ(passes.load(), 3);
  std::atomic<std::uint64_t> counter{0};
  EXPECT_TRUE(wait_quiet([&] { return counter.load(); }, 20ms, 1s));
}

}  // namespace
}  // namespace vmmc::test::fault
