// Shared machinery of the sockets integration tests (see support.h), and the
// main() of every test binary: with "--vmmc-peer" it runs a peer role instead
// of the tests.
#include "integration/sockets/support.h"

#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <thread>

namespace vmmc::test {
namespace {

constexpr int peer_to_parent_fd = 3;

std::map<std::string, peer_body>& roles() {
  static std::map<std::string, peer_body> r;
  return r;
}

void write_fully(int fd, const std::string& s) {
  std::size_t done = 0;
  while (done < s.size()) {
    ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

int run_peer(int argc, char** argv) {
  // argv: exe --vmmc-peer <role> <api> <lifetime s> <args...>
  sigset_t all;
  ::sigemptyset(&all);
  ::sigprocmask(SIG_SETMASK, &all, nullptr);
  ::signal(SIGPIPE, SIG_DFL);
  ::alarm(static_cast<unsigned>(std::stoul(argv[4])));
  auto role = roles().find(argv[2]);
  if (role == roles().end()) {
    write_fully(peer_to_parent_fd, std::string("fail unknown peer role ") + argv[2] + "\n");
    return 98;
  }
  peer_context context(api_named(argv[3]), std::vector<std::string>(argv + 5, argv + argc),
                       peer_to_parent_fd);
  try {
    return role->second(context);
  } catch (const std::exception& e) {
    context.fail(std::string("exception: ") + e.what());
    return 99;
  }
}

char watchdog_message[512];
std::size_t watchdog_length = 0;

void on_watchdog(int) {
  [[maybe_unused]] ssize_t n = ::write(2, watchdog_message, watchdog_length);
  ::_exit(124);
}

// 1 B .. 1 MiB, log-uniform: tiny pieces are as common as large ones.
std::size_t random_size(std::mt19937_64& rng) {
  unsigned exponent = static_cast<unsigned>(rng() % 21);
  return 1 + static_cast<std::size_t>(rng() % (std::uint64_t{1} << exponent));
}

// Cuts [0, length) into 1..4 pieces placed in `buffer` with gaps between
// them, for readv/writev.
std::vector<iovec> scatter(std::mt19937_64& rng, unsigned char* buffer, std::size_t length) {
  std::size_t pieces = 1 + rng() % 4;
  std::vector<iovec> iov;
  std::size_t at = 0, left = length;
  for (std::size_t i = 0; i < pieces && left > 0; ++i) {
    std::size_t piece = i + 1 == pieces ? left : 1 + rng() % left;
    iov.push_back({buffer + at, piece});
    at += piece + rng() % 64;
    left -= piece;
  }
  return iov;
}

}  // namespace

// ---- Peers.

void peer_context::say(const std::string& line) const {
  write_fully(to_parent_, line + "\n");
}

void peer_context::fail(const std::string& message) const {
  std::string one_line = message;
  std::replace(one_line.begin(), one_line.end(), '\n', ' ');
  say("fail " + one_line);
}

int peer_context::connect_to_parent() const {
  int fd = connect_loopback(io(), static_cast<int>(arg_int(0)));
  if (fd < 0) fail(std::string("connect: ") + std::strerror(errno));
  return fd;
}

bool peer_context::expect(const std::string& problem) const {
  if (!problem.empty()) fail(problem);
  return problem.empty();
}

peer_role::peer_role(const char* name, peer_body body) {
  roles()[name] = std::move(body);
}

peer::peer(const std::string& role, const api& a, const std::vector<std::string>& args,
           std::chrono::seconds lifetime)
    : role_(role) {
  std::vector<std::string> words = {"/proc/self/exe", "--vmmc-peer", role, a.name,
                                    std::to_string(lifetime.count())};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  int up[2];
  if (::pipe2(up, O_CLOEXEC) != 0) std::abort();
  pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ == 0) {
    // Only async-signal-safe calls from here to exec.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(97);
    if (up[1] == peer_to_parent_fd)
      ::fcntl(up[1], F_SETFD, 0);
    else
      ::dup2(up[1], peer_to_parent_fd);  // the copy is without O_CLOEXEC
    ::close_range(peer_to_parent_fd + 1, ~0u, 0);
    ::execv("/proc/self/exe", argv.data());
    ::_exit(96);
  }
  ::close(up[1]);
  from_peer_ = up[0];
}

peer::~peer() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  ::close(from_peer_);
}

std::string peer::read_line(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto end = pending_.find('\n');
    if (end != std::string::npos) {
      std::string line = pending_.substr(0, end);
      pending_.erase(0, end + 1);
      if (line.rfind("fail ", 0) == 0) {
        ADD_FAILURE() << role_ << " peer: " << line.substr(5);
        continue;
      }
      return line;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{from_peer_, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) == 0) {
      ADD_FAILURE() << role_ << " peer: no line within " << timeout.count() << " ms";
      return "";
    }
    char chunk[4096];
    ssize_t n = ::read(from_peer_, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ADD_FAILURE() << role_ << " peer: ended before sending the expected line";
      return "";
    }
    pending_.append(chunk, static_cast<std::size_t>(n));
  }
}

long long peer::read_value(const std::string& prefix, std::chrono::milliseconds timeout) {
  std::string line = read_line(timeout);
  if (line.rfind(prefix + " ", 0) != 0) {
    ADD_FAILURE() << role_ << " peer: expected \"" << prefix << " <n>\", got \"" << line << "\"";
    return -1;
  }
  return std::stoll(line.substr(prefix.size() + 1));
}

int peer::wait(std::chrono::milliseconds deadline) {
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  pollfd p{pidfd, POLLIN, 0};
  bool exited = pidfd >= 0 && ::poll(&p, 1, static_cast<int>(deadline.count())) == 1;
  if (pidfd >= 0) ::close(pidfd);
  int result = -1;
  if (!exited) {
    ADD_FAILURE() << role_ << " peer still running after " << deadline.count() << " ms: killed";
    ::kill(pid_, SIGKILL);
  }
  int status = 0;
  ::waitpid(pid_, &status, 0);
  reaped_ = true;
  if (exited) result = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  // Whatever it still had to say, "fail" lines included.
  char chunk[4096];
  ssize_t n;
  p = {from_peer_, POLLIN, 0};
  while (::poll(&p, 1, 1000) == 1 && (n = ::read(from_peer_, chunk, sizeof chunk)) > 0)
    pending_.append(chunk, static_cast<std::size_t>(n));
  std::size_t end;
  while ((end = pending_.find('\n')) != std::string::npos) {
    std::string line = pending_.substr(0, end);
    pending_.erase(0, end + 1);
    if (line.rfind("fail ", 0) == 0) ADD_FAILURE() << role_ << " peer: " << line.substr(5);
  }
  return result;
}

void peer::kill_now() {
  ::kill(pid_, SIGKILL);
}

// ---- Watchdog.

namespace {

void arm_watchdog(std::chrono::seconds budget) {
  auto* info = testing::UnitTest::GetInstance()->current_test_info();
  std::string m = std::string("\nwatchdog: ") + (info ? info->test_suite_name() : "?") + "." +
                  (info ? info->name() : "?") + " still running after " +
                  std::to_string(budget.count()) + " s (hung?): ending the test binary\n";
  watchdog_length = std::min(m.size(), sizeof watchdog_message);
  std::memcpy(watchdog_message, m.data(), watchdog_length);
  struct sigaction action {};
  action.sa_handler = on_watchdog;
  ::sigaction(SIGALRM, &action, nullptr);
  ::alarm(static_cast<unsigned>(budget.count()));
}

}  // namespace

watchdog::watchdog(std::chrono::seconds budget) {
  arm_watchdog(budget);
}
watchdog::~watchdog() {
  ::alarm(0);
}
void watchdog::rearm(std::chrono::seconds budget) {
  arm_watchdog(budget);
}

std::uint64_t raise_fd_limit() {
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &limit);
  ::getrlimit(RLIMIT_NOFILE, &limit);
  return limit.rlim_cur;
}

// ---- Loopback connections.

sockaddr_in loopback(int port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return address;
}

int listen_loopback(const api& a, int* port, int backlog) {
  int any = 0;
  int fd = listen_loopback_at(a, &any, backlog, false);
  if (fd >= 0) *port = any;
  return fd;
}

int listen_loopback_at(const api& a, int* port, int backlog, bool reuse_address) {
  int fd = a.socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in address = loopback(*port);
  socklen_t length = sizeof address;
  int on = 1;
  if ((reuse_address && a.setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) != 0) ||
      a.bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      a.listen(fd, backlog) != 0 ||
      a.getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    int saved = errno;
    a.close(fd);
    errno = saved;
    return -1;
  }
  *port = ntohs(address.sin_port);
  return fd;
}

int connect_loopback(const api& a, int port, bool nonblocking) {
  int fd = a.socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (nonblocking) set_nonblocking(a, fd, true);
  sockaddr_in address = loopback(port);
  if (a.connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 &&
      !(nonblocking && errno == EINPROGRESS)) {
    int saved = errno;
    a.close(fd);
    errno = saved;
    return -1;
  }
  return fd;
}

int accept_within(const api& a, int listener, std::chrono::milliseconds timeout) {
  if ((wait_ready(a, listener, POLLIN, timeout) & POLLIN) == 0) {
    errno = ETIMEDOUT;
    return -1;
  }
  return a.accept(listener, nullptr, nullptr);
}

socket_pair connect_pair(const api& a) {
  socket_pair pair;
  int port = 0;
  int listener = listen_loopback(a, &port);
  if (listener < 0) return pair;
  pair.client = connect_loopback(a, port);
  if (pair.client >= 0) pair.server = accept_within(a, listener);
  a.close(listener);
  return pair;
}

bool set_nonblocking(const api& a, int fd, bool on) {
  int flags = a.fcntl(fd, F_GETFL, 0);
  if (flags < 0) return false;
  flags = on ? flags | O_NONBLOCK : flags & ~O_NONBLOCK;
  return a.fcntl(fd, F_SETFL, flags) == 0;
}

short wait_ready(const api& a, int fd, short events, std::chrono::milliseconds timeout) {
  pollfd p{fd, events, 0};
  int rc;
  while ((rc = a.poll(&p, 1, static_cast<int>(timeout.count()))) < 0 && errno == EINTR) {
  }
  return rc > 0 ? p.revents : 0;
}

int socket_error(const api& a, int fd) {
  int error = 0;
  socklen_t length = sizeof error;
  if (a.getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0) return -1;
  return error;
}

// ---- I/O loops.

bool write_all(const api& a, int fd, const void* data, std::size_t length, int flags,
               std::chrono::milliseconds timeout) {
  auto* p = static_cast<const unsigned char*>(data);
  while (length > 0) {
    ssize_t n = flags == 0 ? a.write(fd, p, length) : a.send(fd, p, length, flags);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      if (wait_ready(a, fd, POLLOUT, timeout) == 0) {
        errno = ETIMEDOUT;
        return false;
      }
      continue;
    }
    if (n < 0) return false;
    p += n;
    length -= static_cast<std::size_t>(n);
  }
  return true;
}

namespace {
// One read that waits (up to `timeout`) while a non-blocking descriptor has
// nothing: bytes read, 0 at EOF, or -1 (errno ETIMEDOUT after the wait).
ssize_t read_waiting(const api& a, int fd, void* data, std::size_t length,
                     std::chrono::milliseconds timeout) {
  for (;;) {
    ssize_t n = a.read(fd, data, length);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      if (wait_ready(a, fd, POLLIN, timeout) == 0) {
        errno = ETIMEDOUT;
        return -1;
      }
      continue;
    }
    return n;
  }
}
}  // namespace

ssize_t read_full(const api& a, int fd, void* data, std::size_t length,
                  std::chrono::milliseconds timeout) {
  auto* p = static_cast<unsigned char*>(data);
  std::size_t done = 0;
  while (done < length) {
    ssize_t n = read_waiting(a, fd, p + done, length - done, timeout);
    if (n < 0) return -1;
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  return static_cast<ssize_t>(done);
}

ssize_t read_to_eof(const api& a, int fd, std::string& out, std::size_t limit,
                    std::chrono::milliseconds timeout) {
  char chunk[65536];
  while (out.size() < limit) {
    ssize_t n = read_waiting(a, fd, chunk, std::min(sizeof chunk, limit - out.size()), timeout);
    if (n < 0) return -1;
    if (n == 0) break;
    out.append(chunk, static_cast<std::size_t>(n));
  }
  return static_cast<ssize_t>(out.size());
}

std::string check_eof(const api& a, int fd) {
  unsigned char buffer[16];
  ssize_t n;
  while ((n = a.read(fd, buffer, sizeof buffer)) < 0 && (errno == EINTR || errno == EAGAIN))
    if (errno == EAGAIN && wait_ready(a, fd, POLLIN, 10s) == 0) return "expected EOF, none in 10 s";
  if (n == 0) return "";
  if (n < 0) return std::string("expected EOF, read failed: ") + std::strerror(errno);
  std::string text = "expected EOF, read " + std::to_string(n) + " byte(s):";
  for (ssize_t i = 0; i < n; ++i) {
    char hex[4];
    std::snprintf(hex, sizeof hex, " %02x", buffer[i]);
    text += hex;
  }
  return text;
}

int send_until_broken(const api& a, int fd, bool nosignal, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    ssize_t n = nosignal ? a.send(fd, "x", 1, MSG_NOSIGNAL) : a.write(fd, "x", 1);
    if (n < 0 && errno != ECONNRESET && errno != EINTR && errno != EAGAIN) return errno;
    if (n == 1) wait_ready(a, fd, 0, 100ms);  // returns early on the peer's reset
  }
  return 0;
}

// ---- Full-duplex patterned stream.

stream_result stream_both_ways(const api& a, int fd, std::uint64_t bytes, std::uint64_t send_seed,
                               std::uint64_t recv_seed, std::uint64_t rng_seed,
                               const std::function<void(const stream_result&)>& at_end,
                               const std::function<void(std::uint64_t)>& on_read) {
  constexpr std::size_t buffer_size = (1u << 20) + 4 * 64;  // 1 MiB plus scatter gaps
  stream_result r;
  std::string write_error;
  auto start = std::chrono::steady_clock::now();

  std::thread writer([&] {
    std::mt19937_64 rng(rng_seed * 2 + 1);
    std::vector<unsigned char> buffer(buffer_size);
    stream_checksum sum;
    while (r.sent < bytes) {
      std::size_t want = std::min<std::uint64_t>(random_size(rng), bytes - r.sent);
      std::vector<iovec> iov = scatter(rng, buffer.data(), want);
      std::uint64_t at = r.sent;
      for (auto& v : iov) {
        fill_pattern(send_seed, at, static_cast<unsigned char*>(v.iov_base), v.iov_len);
        at += v.iov_len;
      }
      ssize_t n;
      switch (rng() % 3) {
        case 0:
          n = a.writev(fd, iov.data(), static_cast<int>(iov.size()));
          break;
        case 1:
          n = a.write(fd, iov[0].iov_base, iov[0].iov_len);
          break;
        default:
          n = a.send(fd, iov[0].iov_base, iov[0].iov_len, MSG_NOSIGNAL);
          break;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        write_error = "write at offset " + std::to_string(r.sent) + ": " +
                      (n == 0 ? "returned 0" : std::strerror(errno));
        a.shutdown(fd, SHUT_RDWR);  // so our reader stops too
        break;
      }
      std::size_t left = static_cast<std::size_t>(n);
      for (auto& v : iov) {
        std::size_t part = std::min(left, v.iov_len);
        sum.update(static_cast<unsigned char*>(v.iov_base), part);
        left -= part;
      }
      r.sent += static_cast<std::uint64_t>(n);
    }
    r.sent_checksum = sum.value();
  });

  std::mt19937_64 rng(rng_seed * 2);
  std::vector<unsigned char> buffer(buffer_size);
  stream_checksum sum;
  while (r.received < bytes && r.error.empty()) {
    std::size_t want = std::min<std::uint64_t>(random_size(rng), bytes - r.received);
    std::vector<iovec> iov = scatter(rng, buffer.data(), want);
    ssize_t n;
    switch (rng() % 3) {
      case 0:
        n = a.readv(fd, iov.data(), static_cast<int>(iov.size()));
        break;
      case 1:
        n = a.read(fd, iov[0].iov_base, iov[0].iov_len);
        break;
      default:
        n = a.recv(fd, iov[0].iov_base, iov[0].iov_len, 0);
        break;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      r.error = (n == 0 ? std::string("EOF") : std::string("read error: ") + std::strerror(errno)) +
                " after " + std::to_string(r.received) + " of " + std::to_string(bytes) + " bytes";
      break;
    }
    std::size_t left = static_cast<std::size_t>(n);
    for (auto& v : iov) {
      auto* p = static_cast<unsigned char*>(v.iov_base);
      std::size_t part = std::min(left, v.iov_len);
      std::size_t bad = check_pattern(recv_seed, r.received, p, part);
      if (bad != part) {
        char text[160];
        std::snprintf(text, sizeof text, "byte at offset %llu is 0x%02x, expected 0x%02x",
                      static_cast<unsigned long long>(r.received + bad), p[bad],
                      pattern_byte(recv_seed, r.received + bad));
        r.error = text;
        break;
      }
      sum.update(p, part);
      r.received += part;
      left -= part;
    }
    if (on_read && r.error.empty()) on_read(r.received);
  }
  r.received_checksum = sum.value();
  if (!r.error.empty()) a.shutdown(fd, SHUT_RDWR);  // so our writer stops too
  writer.join();
  // A failed write shuts the socket down, so the reader's error may be only
  // the consequence: the writer's comes first.
  if (!write_error.empty())
    r.error = r.error.empty() ? write_error : write_error + "; then the reader: " + r.error;
  if (r.error.empty() && at_end) at_end(r);
  if (r.error.empty()) {
    // Nothing may follow the stream: half-close, then the peer's EOF.
    char extra;
    a.shutdown(fd, SHUT_WR);
    ssize_t n = a.read(fd, &extra, 1);
    if (n != 0)
      r.error = n > 0 ? "a byte more than the stream arrived"
                      : std::string("expected EOF after the stream, got ") + std::strerror(errno);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

std::vector<unsigned char> random_bytes(std::size_t length, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> v(length);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

}  // namespace vmmc::test

int main(int argc, char** argv) {
  if (argc >= 5 && std::strcmp(argv[1], "--vmmc-peer") == 0)
    return vmmc::test::run_peer(argc, argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
