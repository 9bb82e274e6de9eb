// integration.sockets.fallback: a vmmc end talking to a plain kernel TCP
// peer, in both roles (vmmc client -> kernel server, kernel client -> vmmc
// server), with the kernel on both ends as the oracle. Conversations where
// the server speaks first, the client speaks first, or only one side writes;
// blocking and non-blocking connect. The kernel peer must receive exactly the
// bytes sent (no stray handshake bytes, EOF right after them), and the vmmc end
// must report that it fell back to plain TCP. And a client that changes its
// user: its connections stay kernel TCP for at most 64 sockets, then are
// accelerated again.
#include <grp.h>
#include <signal.h>
#include <unistd.h>

#include <thread>

#include "integration/sockets/support.h"

namespace vmmc::test {
namespace {

struct pairing {
  const char* name;
  const api* client;
  const api* server;
};

void PrintTo(const pairing& p, std::ostream* out) {
  *out << p.name;
}

const pairing pairings[] = {
    {"kernel_client_kernel_server", &kernel_api, &kernel_api},
    {"vmmc_client_kernel_server", &vmmc_api, &kernel_api},
    {"kernel_client_vmmc_server", &kernel_api, &vmmc_api},
};

// The conversation. Everything is checked byte for byte by its reader.
const std::string greeting = "220 fallback test server ready\r\n";
constexpr std::uint64_t request_seed = 21, reply_seed = 22;
constexpr std::size_t request_bytes = 1 << 20, reply_bytes = 2 << 20;

std::string request() {
  auto body = pattern(request_seed, request_bytes);
  return "HELO client\r\n" + std::string(body.begin(), body.end());
}
std::string reply() {
  auto body = pattern(reply_seed, reply_bytes);
  return std::string(body.begin(), body.end());
}

// Reads exactly `expected.size()` bytes and compares; "" or the problem.
std::string expect_bytes(const api& a, int fd, const std::string& expected, const char* what) {
  std::string got(expected.size(), '\0');
  ssize_t n = read_full(a, fd, got.data(), got.size());
  if (n < 0) return std::string(what) + ": read failed: " + std::strerror(errno);
  if (static_cast<std::size_t>(n) != expected.size())
    return std::string(what) + ": EOF after " + std::to_string(n) + " of " +
           std::to_string(expected.size()) + " bytes";
  if (got != expected) {
    std::size_t at = 0;
    while (got[at] == expected[at]) ++at;
    return std::string(what) + ": differs from byte " + std::to_string(at) +
           " (stray bytes in the stream?)";
  }
  return "";
}

// The server's part; "" or the first problem.
std::string serve(const api& a, int fd, const std::string& mode) {
  std::string problem;
  auto write_string = [&](const std::string& s) {
    return write_all(a, fd, s.data(), s.size(), MSG_NOSIGNAL)
               ? ""
               : std::string("server write: ") + std::strerror(errno);
  };
  if (mode == "server_first") {
    if (!(problem = write_string(greeting)).empty()) return problem;
    if (!(problem = expect_bytes(a, fd, request(), "server reading request")).empty())
      return problem;
    if (!(problem = write_string(reply())).empty()) return problem;
  } else if (mode == "client_first") {
    if (!(problem = expect_bytes(a, fd, request(), "server reading request")).empty())
      return problem;
    if (!(problem = write_string(greeting + reply())).empty()) return problem;
  } else if (mode == "client_only") {
    if (!(problem = expect_bytes(a, fd, request(), "server reading request")).empty())
      return problem;
  } else {  // server_only
    if (!(problem = write_string(reply())).empty()) return problem;
  }
  // The client half-closes when done; the server answers with its own close.
  problem = check_eof(a, fd);
  return problem.empty() ? "" : "server after the conversation: " + problem;
}

// The client's part; "" or the first problem.
std::string converse(const api& a, int fd, const std::string& mode) {
  std::string problem;
  auto write_string = [&](const std::string& s) {
    return write_all(a, fd, s.data(), s.size(), MSG_NOSIGNAL)
               ? ""
               : std::string("client write: ") + std::strerror(errno);
  };
  if (mode == "server_first") {
    if (!(problem = expect_bytes(a, fd, greeting, "client reading greeting")).empty())
      return problem;
    if (!(problem = write_string(request())).empty()) return problem;
    if (!(problem = expect_bytes(a, fd, reply(), "client reading reply")).empty()) return problem;
  } else if (mode == "client_first") {
    if (!(problem = write_string(request())).empty()) return problem;
    if (!(problem = expect_bytes(a, fd, greeting + reply(), "client reading reply")).empty())
      return problem;
  } else if (mode == "client_only") {
    if (!(problem = write_string(request())).empty()) return problem;
  } else {  // server_only
    if (!(problem = expect_bytes(a, fd, reply(), "client reading reply")).empty()) return problem;
  }
  if (a.shutdown(fd, SHUT_WR) != 0) return std::string("client shutdown: ") + std::strerror(errno);
  problem = check_eof(a, fd);
  return problem.empty() ? "" : "client after the conversation: " + problem;
}

// Server peer: listens, says its port, serves one connection in mode arg 0,
// then checks how its end classified the connection.
const peer_role fallback_server("fallback_server", [](peer_context& p) {
  ::signal(SIGPIPE, SIG_IGN);
  int port = 0;
  int listener = listen_loopback(p.io(), &port);
  if (listener < 0) return 1;
  p.say("port " + std::to_string(port));
  int fd = accept_within(p.io(), listener);
  if (fd < 0) {
    p.fail(std::string("accept: ") + std::strerror(errno));
    return 1;
  }
  p.expect(serve(p.io(), fd, p.arg(0)));
  p.expect(check_plain(p.io(), fd));
  if (!p.io().vmmc) p.expect(check_unmanaged(fd));
  p.io().close(fd);
  p.io().close(listener);
  return 0;
});

class Fallback : public testing::TestWithParam<pairing> {
 protected:
  // Runs one conversation: the server in a peer process, the client here.
  void run(const std::string& mode) {
    const api& client = *GetParam().client;
    for (bool nonblocking : {false, true}) {
      SCOPED_TRACE(nonblocking ? "non-blocking connect" : "blocking connect");
      peer server("fallback_server", *GetParam().server, {mode}, 15s);
      int port = static_cast<int>(server.read_value("port"));
      ASSERT_GT(port, 0);
      int fd = connect_loopback(client, port, nonblocking);
      ASSERT_GE(fd, 0) << std::strerror(errno);
      if (nonblocking) {
        EXPECT_TRUE(wait_ready(client, fd, POLLOUT, 5s) & POLLOUT);
        EXPECT_EQ(socket_error(client, fd), 0);
      }
      EXPECT_EQ(converse(client, fd, mode), "");
      EXPECT_EQ(check_plain(client, fd), "");
      if (!client.vmmc) {
        EXPECT_EQ(check_unmanaged(fd), "");
      }
      client.close(fd);
      EXPECT_EQ(server.wait(), 0);
    }
  }
  watchdog guard_{60s};
};

TEST_P(Fallback, ServerSpeaksFirst) {
  run("server_first");
}
TEST_P(Fallback, ClientSpeaksFirst) {
  run("client_first");
}
TEST_P(Fallback, OnlyTheClientWrites) {
  run("client_only");
}
TEST_P(Fallback, OnlyTheServerWrites) {
  run("server_only");
}

// A client that changes its user (a daemon that starts as root and drops to
// its own) enters its sockets in the table of the user it was until it looks
// again: geteuid() at its first socket and every 64th after it (a system call
// per socket would cost what a connection's set-up saves). The server looks
// for them in the new user's table, so until then they stay kernel TCP,
// correct but slow; after it every connection is accelerated again.
constexpr uid_t nobody = 65534;
// Some before, so that the change comes between two looks.
constexpr int connections_before_the_change = 10;
constexpr int connections_after_the_change = 80;
constexpr int rounds_per_connection = 20;  // a byte each way, until the channel is there

const peer_role user_changing_client("user_changing_client", [](peer_context& p) {
  const api& a = p.io();
  // Connects to the parent, trades a byte each way, and says whether the
  // connection is accelerated ("" when it is, else why not).
  auto converse_once = [&]() -> std::optional<std::string> {
    int fd = p.connect_to_parent();
    if (fd < 0) return std::nullopt;
    char byte = 'u';
    std::optional<std::string> verdict;
    bool traded = true;
    for (int round = 0; round < rounds_per_connection && traded; ++round)
      traded = write_all(a, fd, &byte, 1) && read_full(a, fd, &byte, 1) == 1;
    if (!traded)
      p.fail(std::string("conversation: ") + std::strerror(errno));
    else
      verdict = check_accelerated(a, fd);
    a.close(fd);
    return verdict;
  };
  for (int i = 0; i < connections_before_the_change; ++i) {
    auto as_root = converse_once();
    if (!as_root) return 1;
    if (!p.expect(as_root->empty() ? "" : "as root: " + *as_root)) return 1;
  }
  if (::setgroups(0, nullptr) != 0 || ::setresgid(nobody, nobody, nobody) != 0 ||
      ::setresuid(nobody, nobody, nobody) != 0) {
    p.fail("could not become nobody");
    return 1;
  }
  int first_accelerated = -1;
  for (int i = 1; i <= connections_after_the_change; ++i) {
    auto verdict = converse_once();
    if (!verdict) return 1;
    if (verdict->empty() && first_accelerated < 0) first_accelerated = i;
    if (!verdict->empty() && first_accelerated >= 0)
      p.fail("connection " + std::to_string(i) + " after the change: " + *verdict);
  }
  p.say("first_accelerated " + std::to_string(first_accelerated));
  return 0;
});

TEST(ChangeOfUser, AClientThatDropsRootIsAcceleratedAgainWithinSixtyFourSockets) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to become another user";
  const api& a = vmmc_api;
  int port = 0;
  int listener = listen_loopback(a, &port);
  ASSERT_GE(listener, 0) << std::strerror(errno);
  peer client("user_changing_client", a, {std::to_string(port)}, 30s);
  int served = 0;
  for (; served < connections_before_the_change + connections_after_the_change; ++served) {
    int fd = accept_within(a, listener);
    if (fd < 0) break;
    char byte = 0;
    for (int round = 0; round < rounds_per_connection; ++round) {
      EXPECT_EQ(read_full(a, fd, &byte, 1), 1) << "connection " << served;
      EXPECT_TRUE(write_all(a, fd, &byte, 1)) << "connection " << served;
    }
    std::string rest;
    EXPECT_EQ(read_to_eof(a, fd, rest), 0) << "connection " << served;
    a.close(fd);
  }
  a.close(listener);
  EXPECT_EQ(served, connections_before_the_change + connections_after_the_change)
      << std::strerror(errno);
  if (served == connections_before_the_change + connections_after_the_change) {
    // One socket per connection: the 64th entered after the change at the
    // latest finds the new user.
    const long long first = client.read_value("first_accelerated");
    std::cout << "first accelerated connection after the change: " << first << "\n";
    EXPECT_GE(first, 1);
    EXPECT_LE(first, 64);
  }
  EXPECT_EQ(client.wait(), 0);
}

INSTANTIATE_TEST_SUITE_P(pairings, Fallback, testing::ValuesIn(pairings),
                         [](const testing::TestParamInfo<pairing>& p) {
                           return std::string(p.param.name);
                         });

}  // namespace
}  // namespace vmmc::test
