// Control connections: framed messages (with file descriptors on Unix
// sockets) over kernel stream sockets, and the listeners that accept them.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "core.h"
#include "parse.h"

namespace vmmc::core::detail {

namespace {
constexpr std::size_t max_fds_per_frame = 4;

int remaining_ms(clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(std::min<std::int64_t>(left.count(), 1 << 30));
}

void set_nonblocking(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

sockaddr_un abstract_address(const std::string& name, socklen_t& length) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::size_t n = std::min(name.size(), sizeof(a.sun_path) - 2);
  std::memcpy(a.sun_path + 1, name.data(), n);  // sun_path[0] = 0: abstract namespace
  length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return a;
}

bool split_ip_port(const std::string& ip_port, sockaddr_in& out) {
  auto colon = ip_port.rfind(':');
  if (colon == std::string::npos) return false;
  out = {};
  out.sin_family = AF_INET;
  int port = std::atoi(ip_port.c_str() + colon + 1);
  if (port <= 0 || port > 65535) return false;
  out.sin_port = htons(static_cast<std::uint16_t>(port));
  return ::inet_pton(AF_INET, ip_port.substr(0, colon).c_str(), &out.sin_addr) == 1;
}

// Non-blocking connect finished by poll, so a dead address cannot hang us.
result<unique_fd> connect_with_deadline(int domain, const sockaddr* address, socklen_t length,
                                        clock::time_point deadline) {
  unique_fd fd(::socket(domain, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return errc::system_error;
  while (::connect(fd.get(), address, length) != 0) {
    // A Unix listener's full backlog: there is no connect in progress to
    // wait for (the socket stays unconnected), so try again shortly.
    if (errno == EAGAIN && domain == AF_UNIX) {
      if (clock::now() >= deadline) return errc::timed_out;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    // Refused: nobody listens there any more, the process is gone. Any other
    // failure (no route, host down): the address does not reach it.
    auto failed = [&](int error) {
      return domain == AF_UNIX || error == ECONNREFUSED ? errc::peer_gone : errc::unreachable;
    };
    if (errno != EINPROGRESS) return failed(errno);
    pollfd p{fd.get(), POLLOUT, 0};
    if (::poll(&p, 1, remaining_ms(deadline)) <= 0) return errc::timed_out;
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return failed(err);
    break;
  }
  if (domain == AF_INET) {
    int one = 1;
    ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}
}  // namespace

connection::connection(unique_fd fd, bool is_unix) : fd_(std::move(fd)), is_unix_(is_unix) {
  set_nonblocking(fd_.get());
  last_sent_ns_ = now_ns();
}

void connection::give_up_unacknowledged_after(std::chrono::milliseconds timeout) {
  if (is_unix_ || timeout.count() <= 0) return;
  unsigned ms = static_cast<unsigned>(timeout.count());
  (void)::setsockopt(fd_.get(), IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof ms);
}

status connection::write_frame(wire::frame_type type, const void* body, std::size_t length,
                               std::span<const int> fds) {
  wire::frame_header h{wire::control_magic, wire::control_version, static_cast<std::uint16_t>(type),
                       static_cast<std::uint32_t>(length)};
  pending_frame f;
  f.bytes.resize(sizeof h + length);
  std::memcpy(f.bytes.data(), &h, sizeof h);
  if (length) std::memcpy(f.bytes.data() + sizeof h, body, length);

  std::lock_guard lock(write_mutex_);
  if (output_bytes_ + f.bytes.size() > max_backlog) return errc::peer_gone;
  // The caller's descriptors are borrowed: duplicated only if the frame has
  // to wait (which it rarely does: then the queue is empty and the socket
  // takes the frame whole).
  if (output_.empty()) {
    ssize_t n = send_some(f.bytes, 0, fds);
    if (n < 0 && errno != EAGAIN) return errc::peer_gone;
    f.sent = n > 0 ? static_cast<std::size_t>(n) : 0;
    if (f.sent == f.bytes.size()) {
      last_sent_ns_.store(now_ns(), std::memory_order_relaxed);
      return {};
    }
  }
  if (f.sent == 0)
    for (int fd : fds) {
      f.fds.emplace_back(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
      if (!f.fds.back()) return errc::resource_exhausted;
    }
  output_bytes_ += f.bytes.size() - f.sent;
  output_.push_back(std::move(f));
  backlogged_.store(true, std::memory_order_release);
  if (on_backlog) on_backlog();
  return {};
}

status connection::flush() {
  std::lock_guard lock(write_mutex_);
  return send_queued_locked();
}

ssize_t connection::send_some(const std::vector<std::uint8_t>& bytes, std::size_t from,
                              std::span<const int> fds) {
  iovec iov{const_cast<std::uint8_t*>(bytes.data()) + from, bytes.size() - from};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * max_fds_per_frame)];
  if (from == 0 && !fds.empty()) {  // descriptors travel with the frame's first byte
    m.msg_control = control;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do n = ::sendmsg(fd_.get(), &m, MSG_NOSIGNAL | MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  return n;
}

status connection::send_queued_locked() {
  bool sent_some = false;
  while (!output_.empty()) {
    pending_frame& f = output_.front();
    std::vector<int> fds;
    for (const unique_fd& fd : f.fds) fds.push_back(fd.get());
    ssize_t n = send_some(f.bytes, f.sent, fds);
    if (n < 0 && errno == EAGAIN) break;
    if (n <= 0) return errc::peer_gone;
    sent_some = true;
    f.sent += static_cast<std::size_t>(n);
    output_bytes_ -= static_cast<std::size_t>(n);
    f.fds.clear();  // the kernel holds them now
    if (f.sent == f.bytes.size()) output_.pop_front();
  }
  backlogged_.store(!output_.empty(), std::memory_order_release);
  if (sent_some) last_sent_ns_.store(now_ns(), std::memory_order_relaxed);
  return {};
}

bool connection::closed_by_peer(std::chrono::milliseconds grace) const {
  pollfd p{fd_.get(), POLLRDHUP, 0};
  return ::poll(&p, 1, static_cast<int>(grace.count())) == 1 &&
         (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

status connection::read_available(std::vector<frame>& out) {
  for (;;) {
    std::uint8_t buffer[16384];
    iovec iov{buffer, sizeof buffer};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * max_fds_per_frame)];
    if (is_unix_) {
      m.msg_control = control;
      m.msg_controllen = sizeof control;
    }
    ssize_t n = ::recvmsg(fd_.get(), &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n == 0) return errc::peer_gone;
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) break;
      return errc::peer_gone;
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        input_fds_.emplace_back(fd);
      }
    }
    if (m.msg_flags & MSG_CTRUNC) return errc::protocol_error;
    input_.insert(input_.end(), buffer, buffer + n);
  }
  return parse(out);
}

status connection::parse(std::vector<frame>& out) {
  std::size_t at = 0;
  for (;;) {
    auto v = scan_frame(std::span(input_).subspan(at));
    if (v.is(errc::would_block)) break;
    if (!v) return v.error();
    frame f;
    f.type = v->type;
    auto body = input_.begin() + static_cast<std::ptrdiff_t>(at + v->body_offset);
    f.body.assign(body, body + static_cast<std::ptrdiff_t>(v->body_length));
    if (input_fds_.size() < v->descriptors) return errc::protocol_error;
    for (std::size_t i = 0; i < v->descriptors; ++i) {
      f.fds.push_back(std::move(input_fds_.front()));
      input_fds_.pop_front();
    }
    at += v->body_offset + v->body_length;
    out.push_back(std::move(f));
  }
  input_.erase(input_.begin(), input_.begin() + static_cast<std::ptrdiff_t>(at));
  if (!input_fds_.empty() && input_.empty()) input_fds_.clear();  // unsolicited descriptors
  return {};
}

result<frame> connection::read_one(clock::time_point deadline) {
  std::vector<frame> frames;
  for (;;) {
    if (auto s = read_available(frames); !s) return s.error();
    if (!frames.empty()) {
      if (frames.size() > 1) return errc::protocol_error;  // handshake answers come alone
      return std::move(frames.front());
    }
    pollfd p{fd_.get(), POLLIN, 0};
    int left = remaining_ms(deadline);
    if (left == 0) return errc::timed_out;
    ::poll(&p, 1, left);
  }
}

result<unique_fd> listen_unix(const std::string& abstract_name) {
  unique_fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return errc::system_error;
  socklen_t length;
  sockaddr_un a = abstract_address(abstract_name, length);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), length) != 0 ||
      ::listen(fd.get(), 128) != 0)
    return errc::system_error;
  return fd;
}

result<unique_fd> listen_tcp(const std::string& ip, std::string& bound_ip_port) {
  sockaddr_in a{};
  if (!split_ip_port(ip + ":1", a)) return errc::invalid_argument;
  a.sin_port = 0;
  unique_fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return errc::system_error;
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(fd.get(), 128) != 0)
    return errc::system_error;
  socklen_t length = sizeof a;
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &length);
  bound_ip_port = ip + ":" + std::to_string(ntohs(a.sin_port));
  return fd;
}

result<unique_fd> connect_unix(const std::string& abstract_name, clock::time_point deadline) {
  socklen_t length;
  sockaddr_un a = abstract_address(abstract_name, length);
  return connect_with_deadline(AF_UNIX, reinterpret_cast<sockaddr*>(&a), length, deadline);
}

result<unique_fd> connect_tcp(const std::string& ip_port, clock::time_point deadline) {
  sockaddr_in a{};
  if (!split_ip_port(ip_port, a)) return errc::invalid_argument;
  return connect_with_deadline(AF_INET, reinterpret_cast<sockaddr*>(&a), sizeof a, deadline);
}

}  // namespace vmmc::core::detail
