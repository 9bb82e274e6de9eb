// integration.security.preloaded_server: another user against an unmodified
// redis-server running under libvmmc_preload.so (issue 13). A preloaded
// redis-cli stores a secret; the attacker connects to redis's port like any
// client, speaks the upgrade with raw sockets to learn its own connection's
// descriptor, and from that guesses the export names of other connections
// and imports them over the raw control protocol. Before the fix names were
// a per-process prefix plus a counter, exported to anyone: the attacker read
// the secret out of the victim connection's ring, and truncating the memfd
// it was lent crashed redis with SIGBUS.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "integration/security/other_user.h"
#include "integration/security/raw_control.h"
#include "presence.h"

namespace vmmc::test {
namespace {

int free_loopback_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &length);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Runs argv with the interposer preloaded; `stdin_fd` (if >= 0) is its
// input, `stdout_fd` (if >= 0) its output, `descriptors` (if > 0) its
// descriptor limit.
pid_t spawn_preloaded(std::vector<std::string> argv, int stdin_fd = -1, rlim_t descriptors = 0,
                      int stdout_fd = -1) {
  pid_t pid = ::fork();
  if (pid == 0) {
    if (descriptors) {
      rlimit limit{descriptors, descriptors};
      ::setrlimit(RLIMIT_NOFILE, &limit);
    }
    if (stdin_fd >= 0) ::dup2(stdin_fd, 0);
    ::dup2(stdout_fd >= 0 ? stdout_fd : ::open("/dev/null", O_WRONLY), 1);
    ::setenv("LD_PRELOAD", VMMC_PRELOAD, 1);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

// Waits (up to 20 s) until something accepts on the loopback port: a fixed
// pause was too short for a sanitizer-built redis to start.
bool wait_until_listening(int port) {
  for (int tries = 0; tries < 2000; ++tries) {
    int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool up = ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(s);
    if (up) return true;
    ::usleep(10 * 1000);
  }
  return false;
}

// Reads `fd` until it has seen `lines` newlines or `ms` passed; returns what
// it read.
std::string read_lines(int fd, int lines, int ms) {
  std::string got;
  char buffer[256];
  while (std::count(got.begin(), got.end(), '\n') < lines) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, ms) != 1) break;
    ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n <= 0) break;
    got.append(buffer, static_cast<std::size_t>(n));
  }
  return got;
}

// Any user may enter its own sockets in its presence table (it is vmmc's
// code, running as the attacker) and mark it asking: only then does the
// server answer (on this host a client asks without a byte).
void vouch_for(int fd) {
  vmmc::sockets::detail::presence::ask(vmmc::sockets::detail::presence::enter(fd));
}

// Attacker side: connects to redis like a client and asks for the upgrade;
// returns the server's channel descriptor ("name#ring#address"), or "".
std::string descriptor_of_own_connection(int port, int& s) {
  s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  vouch_for(s);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return {};
  // A request: the server answers the ask once it reads.
  if (::send(s, "PING\r\n", 6, 0) != 6) return {};
  pollfd p{s, POLLPRI, 0};
  unsigned char accept = 0;
  if (::poll(&p, 1, 5000) != 1 || ::recv(s, &accept, 1, MSG_OOB) != 1 || accept != 0xD7) return {};
  struct {
    std::uint32_t magic;
    std::uint16_t version, length;
  } hello{};
  if (::recv(s, &hello, sizeof hello, MSG_WAITALL) != sizeof hello || hello.magic != 0x53484d56)
    return {};
  std::string descriptor(hello.length, '\0');
  if (::recv(s, descriptor.data(), descriptor.size(), MSG_WAITALL) !=
      static_cast<ssize_t>(descriptor.size()))
    return {};
  return descriptor;
}

// Names an attacker who knows `own` would try: same prefix, nearby counters.
std::vector<std::string> guesses_from(const std::string& own) {
  std::vector<std::string> names;
  auto digits = own.find_last_not_of("0123456789") + 1;
  const std::string stem = own.substr(0, digits);
  const long mine = digits < own.size() ? std::atol(own.c_str() + digits) : 0;
  for (long n = std::max(1L, mine - 8); n <= mine + 8; ++n)
    if (n != mine) names.push_back(stem + std::to_string(n));
  return names;
}

TEST(PreloadedServer, AnotherUserCannotReadOrCrashAPreloadedRedis) {
  if (!other_user_process::possible()) GTEST_SKIP() << "needs root to become another user";
  if (::access(REDIS_SERVER, X_OK) != 0) GTEST_SKIP() << REDIS_SERVER << " is not installed";
  const int port = free_loopback_port();
  const std::string secret = "s3cr3t-" + std::to_string(::getpid());
  pid_t server = spawn_preloaded({REDIS_SERVER, "--port", std::to_string(port), "--bind",
                                  "127.0.0.1", "--save", "", "--appendonly", "no"});
  ASSERT_TRUE(wait_until_listening(port)) << "redis-server did not start";
  // The victim: a preloaded redis-cli that stores the secret and stays
  // connected (its input stays open), several times over.
  int input[2], output[2];
  ASSERT_EQ(::pipe2(input, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe2(output, O_CLOEXEC), 0);
  pid_t victim = spawn_preloaded({REDIS_CLI, "-p", std::to_string(port)}, input[0], 0, output[1]);
  ::close(output[1]);
  for (int i = 0; i < 4; ++i) {
    const std::string command = "SET secret" + std::to_string(i) + " " + secret + "\n";
    ASSERT_EQ(::write(input[1], command.data(), command.size()),
              static_cast<ssize_t>(command.size()));
  }
  // Every secret is stored before the attack starts.
  ASSERT_EQ(read_lines(output[0], 4, 20000), "OK\nOK\nOK\nOK\n");

  other_user_process attacker([port, secret](line_channel& test) {
    std::string found;
    int s = -1;
    const std::string own = descriptor_of_own_connection(port, s);
    auto first = own.find('#'), last = own.rfind('#');
    if (own.empty() || first == std::string::npos || last == first)
      return std::string("redis did not offer the upgrade: the attack did not run");
    const std::string name = own.substr(0, first), address = own.substr(last + 1);
    int control = -1;
    raw::frame f;
    control = raw::connect_control(address);
    if (control < 0 || !raw::send_hello(control, raw::address_of("attacker", "5")) ||
        !raw::read_frame(control, f))
      return std::string("no control connection to redis");
    std::uint64_t id = 1;
    for (const std::string& guess : guesses_from(name)) {
      if (!raw::send_import_request(control, ++id, guess) || !raw::read_frame(control, f))
        return found + "redis stopped answering";
      auto r = f.as<raw::import_reply_body>();
      if (r.status != 0) continue;
      found += "imported another connection's " + guess + "; ";
      if (f.fds.size() == 1) {
        auto* p = static_cast<char*>(::mmap(nullptr, r.length, PROT_READ, MAP_SHARED, f.fds[0], 0));
        if (p != MAP_FAILED && memmem(p, r.length, secret.data(), secret.size()))
          found += "read the secret; ";
        (void)::ftruncate(f.fds[0], 0);  // would kill redis with SIGBUS
      }
    }
    // Its own connection's area: granted, but it cannot be shrunk.
    if (raw::send_import_request(control, ++id, name) && raw::read_frame(control, f) &&
        f.fds.size() == 1 && ::ftruncate(f.fds[0], 0) == 0)
      found += "truncated the memfd it was lent; ";
    test.send("done");
    test.receive();
    ::close(s);
    return found;
  });
  attacker.link().send("go");
  EXPECT_EQ(attacker.link().receive(), "done");

  // redis is unharmed and still serves: a new preloaded client reads the secret.
  int out[2];
  ASSERT_EQ(::pipe2(out, O_CLOEXEC), 0);
  pid_t reader = ::fork();
  if (reader == 0) {
    ::dup2(out[1], 1);
    ::setenv("LD_PRELOAD", VMMC_PRELOAD, 1);
    ::execlp(REDIS_CLI, REDIS_CLI, "-p", std::to_string(port).c_str(), "GET", "secret3",
             static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(out[1]);
  char reply[128] = {};
  pollfd p{out[0], POLLIN, 0};
  ssize_t n = ::poll(&p, 1, 10000) == 1 ? ::read(out[0], reply, sizeof reply - 1) : -1;
  EXPECT_GT(n, 0);
  EXPECT_EQ(std::string(reply).substr(0, secret.size()), secret) << reply;
  int status = 0;
  EXPECT_EQ(::waitpid(server, &status, WNOHANG), 0)
      << "redis-server died (status " << status << ")";
  attacker.link().send("over");
  EXPECT_EQ(attacker.finish(), "");

  ::close(input[1]);
  ::close(output[0]);
  ::waitpid(victim, nullptr, 0);
  ::waitpid(reader, nullptr, 0);
  ::kill(server, SIGTERM);
  ::waitpid(server, nullptr, 0);
}

int open_descriptors(pid_t pid) {
  int count = 0;
  if (DIR* d = ::opendir(("/proc/" + std::to_string(pid) + "/fd").c_str())) {
    while (::readdir(d)) ++count;
    ::closedir(d);
  }
  return count - 2;  // . and ..
}

// A preloaded redis-cli's answer to `command` (its first line), or "".
std::string ask_redis(int port, std::vector<std::string> command) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return {};
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::setenv("LD_PRELOAD", VMMC_PRELOAD, 1);
    std::vector<std::string> argv = {REDIS_CLI, "-p", std::to_string(port)};
    argv.insert(argv.end(), command.begin(), command.end());
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(out[1]);
  char reply[256] = {};
  pollfd p{out[0], POLLIN, 0};
  ssize_t n = ::poll(&p, 1, 10000) == 1 ? ::read(out[0], reply, sizeof reply - 1) : -1;
  ::close(out[0]);
  ::waitpid(pid, nullptr, 0);
  std::string line(reply, n > 0 ? static_cast<std::size_t>(n) : 0);
  return line.substr(0, line.find('\n'));
}

// Issue 13 item 7: one offer byte made a preloaded server build a channel
// (memfd, 2 MiB ring, export) for anyone, without bound. Channels whose
// client never says hello are now capped (an eighth of the descriptor
// limit, two descriptors each: redis runs with 512 here); later asks are
// declined (an accept byte with an empty hello frame: plain TCP).
TEST(PreloadedServer, AFloodOfOffersCostsBoundedState) {
  if (!other_user_process::possible()) GTEST_SKIP() << "needs root to become another user";
  if (::access(REDIS_SERVER, X_OK) != 0) GTEST_SKIP() << REDIS_SERVER << " is not installed";
  // cap: sockets/src/handshake.cc max_awaiting_client() for 512 descriptors
  constexpr int connections = 300, cap = 512 / 8;
  const int port = free_loopback_port();
  pid_t server = spawn_preloaded({REDIS_SERVER, "--port", std::to_string(port), "--bind",
                                  "127.0.0.1", "--save", "", "--appendonly", "no"},
                                 -1, 512);
  ASSERT_TRUE(wait_until_listening(port)) << "redis-server did not start";
  const int before = open_descriptors(server);
  other_user_process attacker([port](line_channel& test) {
    std::vector<int> held;
    int upgraded = 0;
    for (int i = 0; i < connections; ++i) {
      int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      vouch_for(s);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<std::uint16_t>(port));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
          ::send(s, "PING\r\n", 6, 0) != 6)
        return std::string("could not connect ") + std::to_string(i);
      held.push_back(s);
    }
    for (int s : held) {  // an accept byte and a hello frame naming a channel, or a decline
      pollfd p{s, POLLPRI, 0};
      unsigned char urgent = 0;
      struct {
        std::uint32_t magic;
        std::uint16_t version, length;
      } hello{};
      if (::poll(&p, 1, 5000) == 1 && ::recv(s, &urgent, 1, MSG_OOB) == 1 && urgent == 0xD7 &&
          ::recv(s, &hello, sizeof hello, MSG_WAITALL) == sizeof hello && hello.length != 0)
        ++upgraded;
    }
    test.send("upgraded " + std::to_string(upgraded));
    test.receive();  // held open while the victim looks
    for (int s : held) ::close(s);
    return upgraded > cap ? "the server made " + std::to_string(upgraded) + " channels" : "";
  });
  const std::string said = attacker.link().receive(30000);
  EXPECT_EQ(said.rfind("upgraded", 0), 0u) << said;
  const int during = open_descriptors(server);
  // A socket each, and a memfd and an eventfd per channel at most for the
  // capped ones.
  EXPECT_LE(during - before, connections + 2 * cap + 8)
      << "descriptors of redis: " << before << " -> " << during;
  // Others are served meanwhile (over plain TCP once the cap is reached).
  EXPECT_EQ(ask_redis(port, {"SET", "k", "v"}), "OK");
  attacker.link().send("done");
  EXPECT_EQ(attacker.finish(), "");
  ::usleep(300 * 1000);
  EXPECT_EQ(ask_redis(port, {"GET", "k"}), "v");
  int status = 0;
  EXPECT_EQ(::waitpid(server, &status, WNOHANG), 0) << "redis-server died";
  ::kill(server, SIGTERM);
  ::waitpid(server, nullptr, 0);
}

}  // namespace
}  // namespace vmmc::test
