// tests/bench/startup_peer.cc: the processes `vmmc-bench startup` starts,
// with and without an interposer. Plain libc, like the programs the
// interposers are for (linking the stack would load it at start).
//
//   vmmc-bench-startup-peer server        listens on 127.0.0.1, prints its port,
//                                         echoes 64-byte requests until stdin closes
//   vmmc-bench-startup-peer client PORT N N connections, each: connect, 64 bytes
//                                         out and back, close; prints each one's
//                                         microseconds, one per line
//   vmmc-bench-startup-peer hold PORT K   K connections kept open after a round
//                                         trip each; prints the resident-set
//                                         growth in kB
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr std::size_t request = 64;

[[noreturn]] void die(const char* what) {
  std::perror(what);
  std::exit(1);
}

bool full(int fd, char* p, std::size_t n, bool out) {
  while (n > 0) {
    ssize_t r = out ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

int serve() {
  int l = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (l < 0 || ::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(l, 1024) != 0 || ::getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    die("listen");
  std::printf("%d\n", ntohs(a.sin_port));
  std::fflush(stdout);
  ::alarm(600);  // bounded even if the benchmark is killed
  std::vector<pollfd> fds{{0, POLLIN, 0}, {l, POLLIN, 0}};
  char buf[request];
  while (true) {
    if (::poll(fds.data(), fds.size(), -1) < 0) continue;
    if (fds[0].revents) return 0;  // stdin closed: the benchmark is done
    if (fds[1].revents & POLLIN) {
      int c = ::accept(l, nullptr, nullptr);
      if (c >= 0) fds.push_back({c, POLLIN, 0});
    }
    for (std::size_t i = 2; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      if (!full(fds[i].fd, buf, request, false) || !full(fds[i].fd, buf, request, true)) {
        ::close(fds[i].fd);
        fds.erase(fds.begin() + static_cast<long>(i--));
      }
    }
  }
}

int connect_to(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) die("connect");
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

void round_trip(int fd) {
  char buf[request] = "startup";
  if (!full(fd, buf, request, true) || !full(fd, buf, request, false)) die("round trip");
}

int clients(int port, int n) {
  for (int i = 0; i < n; ++i) {
    auto start = std::chrono::steady_clock::now();
    int fd = connect_to(port);
    round_trip(fd);
    auto us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start);
    ::close(fd);
    std::printf("%.1f\n", us.count());
  }
  return 0;
}

long rss_kb() {
  FILE* f = std::fopen("/proc/self/status", "r");
  long kb = -1;
  for (char line[256]; f && std::fgets(line, sizeof line, f);)
    if (std::strncmp(line, "VmRSS:", 6) == 0) kb = std::atol(line + 6);
  if (f) std::fclose(f);
  return kb;
}

int hold(int port, int k) {
  const long before = rss_kb();
  std::vector<int> open;
  for (int i = 0; i < k; ++i) {
    open.push_back(connect_to(port));
    round_trip(open.back());
  }
  std::printf("%ld\n", rss_kb() - before);
  for (int fd : open) ::close(fd);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "server") == 0) return serve();
  if (argc == 4 && std::strcmp(argv[1], "client") == 0)
    return clients(std::atoi(argv[2]), std::atoi(argv[3]));
  if (argc == 4 && std::strcmp(argv[1], "hold") == 0)
    return hold(std::atoi(argv[2]), std::atoi(argv[3]));
  std::fprintf(stderr, "usage: %s server | client PORT N | hold PORT K\n", argv[0]);
  return 2;
}
