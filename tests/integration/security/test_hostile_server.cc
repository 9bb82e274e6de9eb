// integration.security.hostile_server: a server that speaks just enough of
// the upgrade protocol to be taken for a vmmc peer, written with raw kernel
// sockets (issue 13, item 8). The victim is a client on the vmmc sockets API.
// A bad hello after the accept byte must fail the connection, never turn
// into application data (before: its 101 bytes were read as data). A hello
// whose descriptor points somewhere else must not make the client connect
// there (before: it opened TCP to any ip:port and sent its address).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

#include "integration/security/other_user.h"
#include "presence.h"
#include "vmmc/sockets/socket.h"

namespace vmmc::test {
namespace {

namespace vs = vmmc::sockets;

// The sockets layer's urgent accept byte (sockets/src/wire.h): public
// protocol, as an attacker would read it.
constexpr unsigned char accept_byte = 0xD7;
struct hello_frame {
  std::uint32_t magic = 0x53484d56;
  std::uint16_t version = 2, length = 0;
};

// Any user may enter its own sockets in its presence table (it is vmmc's
// code, running as the attacker): only then does a vmmc client offer the
// upgrade to this server at all.
void vouch_for(int fd) {
  (void)vmmc::sockets::detail::presence::enter(fd);
}

int listen_loopback(int& port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(fd, 4) != 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &length) != 0)
    return -1;
  port = ntohs(a.sin_port);
  return fd;
}

// Answers the client's offer with the accept byte and then `hello` (not a
// valid hello frame); reads until the client goes away.
void hostile_server(int listener, std::string hello) {
  int c = ::accept(listener, nullptr, nullptr);
  if (c < 0) return;
  pollfd p{c, POLLPRI, 0};
  (void)::poll(&p, 1, 2000);  // the client's offer
  unsigned char offer = 0;
  (void)::recv(c, &offer, 1, MSG_OOB | MSG_DONTWAIT);
  (void)::send(c, &accept_byte, 1, MSG_OOB | MSG_NOSIGNAL);
  (void)::send(c, hello.data(), hello.size(), MSG_NOSIGNAL);
  char scratch[256];
  p = {c, POLLIN, 0};
  while (::poll(&p, 1, 3000) == 1 && ::recv(c, scratch, sizeof scratch, 0) > 0) {
  }
  ::close(c);
}

// The victim: a client on the vmmc sockets API, connected to `port`.
int connect_victim(int port) {
  int fd = vs::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && vs::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    vs::close(fd);
    return -1;
  }
  return fd;
}

TEST(HostileServer, ABadHelloFailsTheConnectionAndIsNeverData) {
  if (!other_user_process::possible()) GTEST_SKIP() << "needs root to become another user";
  other_user_process server([](line_channel& test) {
    int port = 0;
    int listener = listen_loopback(port);
    if (listener < 0) return std::string("could not listen");
    vouch_for(listener);
    test.send(std::to_string(port));
    // A frame with a bad magic, then 101 bytes an application must never see.
    std::string hello(8, '\x55');
    hello += std::string(101, 'X');
    hostile_server(listener, hello);
    return std::string();
  });
  const int port = std::stoi("0" + server.link().receive());

  int fd = connect_victim(port);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the answer is there

  char buffer[512];
  std::size_t delivered = 0;
  int first_error = 0;
  for (int i = 0; i < 8; ++i) {
    errno = 0;
    ssize_t n = vs::read(fd, buffer, sizeof buffer);
    if (n > 0) delivered += static_cast<std::size_t>(n);
    if (n < 0 && !first_error) first_error = errno;
    if (n == 0) break;
  }
  EXPECT_EQ(delivered, 0u) << "bytes of the bad hello were read as data";
  EXPECT_EQ(first_error, EPROTO) << std::strerror(first_error);
  errno = 0;
  EXPECT_EQ(vs::send(fd, "y", 1, MSG_NOSIGNAL), -1);
  EXPECT_EQ(errno, EPIPE) << std::strerror(errno);
  vs::close(fd);
  EXPECT_EQ(server.finish(), "");
}

TEST(HostileServer, ItsDescriptorCannotSteerTheClientElsewhere) {
  if (!other_user_process::possible()) GTEST_SKIP() << "needs root to become another user";
  other_user_process server([](line_channel& test) {
    int port = 0, trap_port = 0;
    int listener = listen_loopback(port), trap = listen_loopback(trap_port);
    if (listener < 0 || trap < 0) return std::string("could not listen");
    vouch_for(listener);
    test.send(std::to_string(port));
    // On loopback, yet it claims another host, whose control listener is the
    // trap: a local port of the server's choosing.
    const std::string descriptor =
        "area#65536#vmmc1;h=elsewhere;p=1;u=0;n=5;c=127.0.0.1:" + std::to_string(trap_port);
    hello_frame frame;
    frame.length = static_cast<std::uint16_t>(descriptor.size());
    std::string hello(reinterpret_cast<const char*>(&frame), sizeof frame);
    hostile_server(listener, hello + descriptor);  // until the client has gone
    pollfd p{trap, POLLIN, 0};
    return ::poll(&p, 1, 0) == 0 ? std::string()
                                 : std::string("the client connected where the descriptor said");
  });
  const int port = std::stoi("0" + server.link().receive());

  int fd = connect_victim(port);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the answer is there
  (void)vs::send(fd, "y", 1, MSG_NOSIGNAL);  // a write places our hello at the latest
  char buffer[64];
  (void)vs::recv(fd, buffer, sizeof buffer, MSG_DONTWAIT);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // time to go astray
  vs::close(fd);
  EXPECT_EQ(server.finish(), "");
}

// Issue 14, item 14: a user can vouch only for its own sockets. The attacker
// holds a descriptor of a plain server's listener (inherited) and enters it
// in its own presence table; a vmmc client looks in the table of the
// listener's owner, so it still offers nothing, and the plain server (urgent
// bytes inline) reads exactly what the client wrote.
TEST(HostileUser, CannotVouchForAnotherUsersListener) {
  if (!other_user_process::possible()) GTEST_SKIP() << "needs root to become another user";
  int port = 0;
  int listener = listen_loopback(port);
  ASSERT_GE(listener, 0);
  int on = 1;
  ::setsockopt(listener, SOL_SOCKET, SO_OOBINLINE, &on, sizeof on);
  other_user_process attacker([listener](line_channel& test) {
    std::uint64_t cookie = vmmc::sockets::detail::presence::enter(listener);
    test.send(cookie != 0 ? "entered" : "could not enter");
    test.receive();  // held while the victim connects
    return std::string();
  });
  ASSERT_EQ(attacker.link().receive(), "entered");

  int fd = connect_victim(port);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  int server = ::accept(listener, nullptr, nullptr);
  ASSERT_GE(server, 0);
  ::setsockopt(server, SOL_SOCKET, SO_OOBINLINE, &on, sizeof on);
  EXPECT_EQ(vs::send(fd, "hello", 5, MSG_NOSIGNAL), 5);
  vs::close(fd);
  std::string seen;
  char buffer[64];
  pollfd p{server, POLLIN, 0};
  while (::poll(&p, 1, 5000) == 1) {
    ssize_t n = ::recv(server, buffer, sizeof buffer, 0);
    if (n <= 0) break;
    seen.append(buffer, static_cast<std::size_t>(n));
  }
  EXPECT_EQ(seen, "hello");
  ::close(server);
  ::close(listener);
  attacker.link().send("done");
  EXPECT_EQ(attacker.finish(), "");
}

}  // namespace
}  // namespace vmmc::test
