// nx/src/lane.cc: kernel TCP between nodes on hosts without an RDMA device.
#include "lane.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

namespace vmmc::nx::detail {
namespace {

// Small: a poll takes in a few small messages at once, while a large
// payload goes past it (only what came with its header is copied twice).
constexpr std::size_t input_bytes = 8 * 1024;
constexpr char hello_magic[8] = {'v', 'm', 'm', 'c', '-', 'n', 'x', '1'};
constexpr std::size_t key_chars = 32;
constexpr std::size_t max_waiting = 64;  // accepted, hello not yet complete

// What a connecting node sends first: who it is, and the key the accepting
// node published to the job only (through its launcher), so that a stranger
// on the network cannot pose as a node.
struct hello {
  char magic[sizeof hello_magic];
  std::uint32_t node;
  char key[key_chars];
};
static_assert(sizeof(hello) == 44);

int milliseconds_until(clock_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::clamp<long long>(left.count(), 0, 1000));
}

void no_delay(int fd) {
  int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

bool same_key(const char* a, std::string_view b) {
  if (b.size() != key_chars) return false;
  unsigned char differ = 0;  // every byte compared: no early exit to time
  for (std::size_t i = 0; i < key_chars; ++i) differ |= static_cast<unsigned char>(a[i] ^ b[i]);
  return differ == 0;
}

std::optional<sockaddr_in> parse_where(std::string_view where) {
  const std::size_t colon = where.rfind(':');
  if (colon == std::string_view::npos) return std::nullopt;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  const std::string ip(where.substr(0, colon));
  unsigned port = 0;
  auto tail = where.substr(colon + 1);
  auto [end, ec] = std::from_chars(tail.data(), tail.data() + tail.size(), port);
  if (ec != std::errc() || end != tail.data() + tail.size() || port == 0 || port > 65535 ||
      ::inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1)
    return std::nullopt;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  return a;
}

}  // namespace

// ---------------------------------------------------------------- the stream

tcp_stream::~tcp_stream() {
  if (fd_ >= 0) ::close(fd_);
}

bool tcp_stream::ready(short event) {
  pollfd f{fd_, event, 0};
  return ::poll(&f, 1, 0) != 0;  // an error or hang-up counts: the call reports it
}

result<std::size_t> tcp_stream::write(const void* data, std::size_t length) {
  return write(data, length, nullptr, 0);
}

result<std::size_t> tcp_stream::write(const void* first, std::size_t first_length,
                                      const void* second, std::size_t second_length) {
  iovec parts[2] = {{const_cast<void*>(first), first_length},
                    {const_cast<void*>(second), second_length}};
  msghdr m{};
  m.msg_iov = parts;
  m.msg_iovlen = second_length ? 2 : 1;
  if (blocked_ && !ready(POLLOUT)) return errc::would_block;
  for (;;) {
    ssize_t n = ::sendmsg(fd_, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    blocked_ = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    if (n >= 0) return static_cast<std::size_t>(n);
    if (errno == EINTR) continue;
    if (blocked_) return errc::would_block;
    return errc::peer_gone;
  }
}

bool tcp_stream::fill() {
  if (ended_ || (starved_ && !ready(POLLIN))) return false;
  if (in_.empty()) in_.resize(input_bytes);
  for (;;) {
    ssize_t n = ::recv(fd_, in_.data(), in_.size(), MSG_DONTWAIT);
    starved_ = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    if (n > 0) {
      begin_ = 0;
      end_ = static_cast<std::size_t>(n);
      received_ += end_;
      return true;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    ended_ = true;  // end of stream, or the connection failed
    return false;
  }
}

std::size_t tcp_stream::take_in(void* data, std::size_t length) {
  const std::size_t n = std::min(length, end_ - begin_);
  if (n) std::memcpy(data, in_.data() + begin_, n);
  begin_ += n;
  return n;
}

std::size_t tcp_stream::readable() {
  if (begin_ == end_) fill();
  return end_ - begin_;
}

std::size_t tcp_stream::read(void* data, std::size_t length, bool consume) {
  auto* to = static_cast<std::byte*>(data);
  if (!consume) {
    const std::size_t n = std::min(length, end_ - begin_);
    if (n) std::memcpy(to, in_.data() + begin_, n);
    return n;
  }
  std::size_t got = take_in(to, length);
  if (got == length || ended_) return got;
  if (length - got >= input_bytes / 2) {
    // A large payload goes from the kernel to its destination in one copy.
    if (starved_ && !ready(POLLIN)) return got;
    for (;;) {
      ssize_t n = ::recv(fd_, to + got, length - got, MSG_DONTWAIT);
      starved_ = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
      if (n > 0) {
        received_ += static_cast<std::size_t>(n);
        return got + static_cast<std::size_t>(n);
      }
      if (n < 0 && errno == EINTR) continue;
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) ended_ = true;
      return got;
    }
  }
  if (fill()) got += take_in(to + got, length - got);
  return got;
}

bool tcp_stream::gone() {
  if (begin_ == end_) fill();
  return ended_ && begin_ == end_;
}

void tcp_stream::close_write() {
  (void)::shutdown(fd_, SHUT_WR);
  // What the peer sent and nobody will read would make our kernel answer
  // its later segments, and our close, with a reset: take in what is there
  // now (bounded: a peer that keeps sending does not hold the exit).
  begin_ = end_;
  for (int i = 0; i < 256 && fill(); ++i) begin_ = end_;
}

// ---------------------------------------------------------------- set-up

std::string tcp_key() {
  unsigned char random[key_chars / 2];
  std::size_t have = 0;
  while (have < sizeof random) {
    ssize_t n = ::getrandom(random + have, sizeof random - have, 0);
    if (n > 0) have += static_cast<std::size_t>(n);
  }
  static const char digits[] = "0123456789abcdef";
  std::string key;
  for (unsigned char c : random) {
    key += digits[c >> 4];
    key += digits[c & 15];
  }
  return key;
}

result<tcp_listener> tcp_listener::open(const std::string& address) {
  auto where = parse_where(address + ":1");
  if (!where) return errc::invalid_argument;
  where->sin_port = 0;
  tcp_listener l;
  l.fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (l.fd_ < 0) return errc::system_error;
  socklen_t length = sizeof *where;
  if (::bind(l.fd_, reinterpret_cast<sockaddr*>(&*where), sizeof *where) != 0 ||
      ::listen(l.fd_, 128) != 0 ||
      ::getsockname(l.fd_, reinterpret_cast<sockaddr*>(&*where), &length) != 0)
    return errc::system_error;
  l.where_ = address + ":" + std::to_string(ntohs(where->sin_port));
  return l;
}

tcp_listener::~tcp_listener() {
  if (fd_ >= 0) ::close(fd_);
}

result<std::unique_ptr<tcp_stream>> tcp_connect(const std::string& where, long node,
                                                std::string_view key, clock_point deadline) {
  auto to = parse_where(where);
  if (!to || key.size() != key_chars) return errc::invalid_argument;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return errc::system_error;
  auto stream = std::make_unique<tcp_stream>(fd);
  no_delay(fd);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&*to), sizeof *to) != 0 && errno != EINPROGRESS)
    return errno == ECONNREFUSED ? errc::peer_gone : errc::unreachable;
  pollfd f{fd, POLLOUT, 0};
  while (::poll(&f, 1, milliseconds_until(deadline)) == 0)
    if (std::chrono::steady_clock::now() > deadline) return errc::timed_out;
  int error = 0;
  socklen_t length = sizeof error;
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0 || error != 0)
    return error == ECONNREFUSED ? errc::peer_gone : errc::unreachable;
  hello h{};
  std::memcpy(h.magic, hello_magic, sizeof h.magic);
  h.node = static_cast<std::uint32_t>(node);
  std::memcpy(h.key, key.data(), key_chars);
  // 44 bytes into an empty send buffer of a fresh connection go in one call.
  auto sent = stream->write(&h, sizeof h);
  if (!sent || *sent != sizeof h) return sent ? errc::system_error : sent.error();
  return stream;
}

result<std::vector<std::unique_ptr<tcp_stream>>> tcp_listener::accept_nodes(
    std::string_view key, const std::vector<bool>& expected, clock_point deadline) {
  std::vector<std::unique_ptr<tcp_stream>> nodes(expected.size());
  long missing = std::count(expected.begin(), expected.end(), true);
  struct newcomer {
    int fd;
    hello h;
    std::size_t got;
  };
  std::vector<newcomer> waiting;
  auto drop = [&](std::size_t i) {
    ::close(waiting[i].fd);
    waiting.erase(waiting.begin() + static_cast<long>(i));
  };
  while (missing > 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      for (auto& w : waiting) ::close(w.fd);
      return errc::timed_out;
    }
    std::vector<pollfd> fds{{fd_, POLLIN, 0}};
    for (const newcomer& w : waiting) fds.push_back({w.fd, POLLIN, 0});
    ::poll(fds.data(), fds.size(), milliseconds_until(deadline));
    for (int fd; (fd = ::accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0;) {
      no_delay(fd);
      waiting.push_back({fd, {}, 0});
      if (waiting.size() > max_waiting) drop(0);  // a flood of silent strangers
    }
    for (std::size_t i = 0; i < waiting.size();) {
      newcomer& w = waiting[i];
      ssize_t n = ::recv(w.fd, reinterpret_cast<char*>(&w.h) + w.got, sizeof w.h - w.got, 0);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        ++i;
        continue;
      }
      if (n <= 0) {
        drop(i);
        continue;
      }
      w.got += static_cast<std::size_t>(n);
      if (w.got < sizeof w.h) {
        ++i;
        continue;
      }
      // Not a node of this job (a stranger, a wrong key), or one that came
      // twice: closed, and the wait goes on.
      const std::uint32_t j = w.h.node;
      if (std::memcmp(w.h.magic, hello_magic, sizeof hello_magic) != 0 || !same_key(w.h.key, key) ||
          j >= expected.size() || !expected[j] || nodes[j]) {
        drop(i);
        continue;
      }
      nodes[j] = std::make_unique<tcp_stream>(w.fd);
      waiting.erase(waiting.begin() + static_cast<long>(i));
      --missing;
    }
  }
  for (auto& w : waiting) ::close(w.fd);
  return nodes;
}

}  // namespace vmmc::nx::detail
