// integration.sockets.fallback: a vmmc end talking to a plain kernel TCP
// peer, in both roles (vmmc client -> kernel server, kernel client -> vmmc
// server), with the kernel on both ends as the oracle. Conversations where
// the server speaks first, the client speaks first, or only one side writes;
// blocking and non-blocking connect. The kernel peer must receive exactly the
// bytes sent (no stray handshake bytes, EOF right after them), and the vmmc end
// must report that it fell back to plain TCP.
#include <signal.h>

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

INSTANTIATE_TEST_SUITE_P(pairings, Fallback, testing::ValuesIn(pairings),
                         [](const testing::TestParamInfo<pairing>& p) {
                           return std::string(p.param.name);
                         });

}  // namespace
}  // namespace vmmc::test
