// raw_control.h: vmmc's same-host control protocol as an outsider speaks it,
// read from core/src/wire.h and written with raw Unix sockets, so attacks in
// integration.security.* carry no vmmc code on the attacking side.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace vmmc::test::raw {

constexpr std::uint32_t control_magic = 0x434d4d56;
constexpr std::uint16_t control_version = 4;
enum frame_type : std::uint16_t {
  hello = 1,
  hello_reply = 2,
  import_request = 3,
  import_reply = 4,
  revoke = 6,
};
struct frame_header {
  std::uint32_t magic;
  std::uint16_t version, type;
  std::uint32_t length;
};
struct hello_body {
  std::uint32_t uid, pid, address_length;
};
struct hello_reply_body {
  std::uint32_t status, has_wake_fds;
};
struct import_request_body {
  std::uint64_t request_id;
  std::uint32_t want_mapped, name_length;
  char provider[32];
};
struct import_reply_body {
  std::uint64_t request_id;
  std::uint32_t status, export_id;
  std::uint64_t length;
  std::uint32_t rights, mapped;
  std::uint64_t segment_offset, remote_address, key, ring_address, ring_key;
  std::uint32_t link_id, ring_capacity;
  std::uint32_t has_wake_fd, reserved;
};
struct notify_record {
  std::uint32_t export_id, reserved;
  std::uint64_t offset, length, value;
};
// notify_ring: head and tail on their own cache lines, then the records.
constexpr std::size_t ring_tail_offset = 64, ring_records_offset = 128, ring_capacity = 1024;
constexpr std::size_t ring_size = ring_records_offset + ring_capacity * sizeof(notify_record);

// The value of `key` in a printable context address ("...;key=value;...").
inline std::string field(const std::string& address, const std::string& key) {
  auto at = address.find(";" + key + "=");
  if (at == std::string::npos) return {};
  at += key.size() + 2;
  return address.substr(at, address.find(';', at) - at);
}

// The abstract Unix socket a context with this pid and nonce listens on.
inline sockaddr_un control_socket(const std::string& pid, const std::string& nonce,
                                  socklen_t& length) {
  const std::string name = "vmmc." + pid + "." + nonce;
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

// A connected control socket to the context at `address`, or -1 (at once
// when `nonblocking` and the victim's backlog is full).
inline int connect_control(const std::string& address, bool nonblocking = false) {
  socklen_t length = 0;
  sockaddr_un a = control_socket(field(address, "p"), field(address, "n"), length);
  int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | (nonblocking ? SOCK_NONBLOCK : 0), 0);
  if (s >= 0 && ::connect(s, reinterpret_cast<sockaddr*>(&a), length) != 0) {
    ::close(s);
    return -1;
  }
  return s;
}

// An address blob for a context of ours that does not exist ("on host `host`").
inline std::string address_of(const std::string& host, const std::string& nonce) {
  return "vmmc1;h=" + host + ";p=" + std::to_string(::getpid()) +
         ";u=" + std::to_string(::getuid()) + ";n=" + nonce;
}

inline bool send_frame(int s, std::uint16_t type, const void* body, std::size_t length,
                       const std::vector<int>& fds = {}) {
  std::vector<char> bytes(sizeof(frame_header) + length);
  frame_header h{control_magic, control_version, type, static_cast<std::uint32_t>(length)};
  std::memcpy(bytes.data(), &h, sizeof h);
  if (length) std::memcpy(bytes.data() + sizeof h, body, length);
  iovec iov{bytes.data(), bytes.size()};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(fds.size() * sizeof(int)));
  if (!fds.empty()) {
    m.msg_control = control.data();
    m.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
  }
  return ::sendmsg(s, &m, MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

inline bool send_hello(int s, const std::string& my_address) {
  std::vector<char> body(sizeof(hello_body) + my_address.size());
  hello_body hb{static_cast<std::uint32_t>(::getuid()), static_cast<std::uint32_t>(::getpid()),
                static_cast<std::uint32_t>(my_address.size())};
  std::memcpy(body.data(), &hb, sizeof hb);
  std::memcpy(body.data() + sizeof hb, my_address.data(), my_address.size());
  return send_frame(s, hello, body.data(), body.size());
}

inline bool send_import_request(int s, std::uint64_t id, const std::string& name) {
  std::vector<char> body(sizeof(import_request_body) + name.size());
  import_request_body r{id, 1, static_cast<std::uint32_t>(name.size()), {}};
  std::memcpy(body.data(), &r, sizeof r);
  std::memcpy(body.data() + sizeof r, name.data(), name.size());
  return send_frame(s, import_request, body.data(), body.size());
}

struct frame;
bool read_frame(int s, frame& out, int timeout_ms = 5000);

// Poses as a same-host context (pid ours, `nonce` made up) in front of the
// victim at `victim_address`: listens where an importer looks for it, hands
// the test the address to import from (through `hand_over`), and returns the
// importer's connection once its hello has arrived; -1 with `why` set when
// the victim did not come.
template <class HandOver>
int pose_as_exporter(const std::string& victim_address, const std::string& nonce,
                     HandOver hand_over, std::string& why) {
  socklen_t length = 0;
  sockaddr_un a = control_socket(std::to_string(::getpid()), nonce, length);
  int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&a), length) != 0 ||
      ::listen(listener, 1) != 0) {
    why = "could not listen";
    return -1;
  }
  hand_over(address_of(field(victim_address, "h"), nonce));
  pollfd p{listener, POLLIN, 0};
  if (::poll(&p, 1, 10000) != 1) {
    why = "the victim never came";
    return -1;
  }
  int s = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  ::close(listener);
  if (s < 0) {
    why = "could not accept";
    return -1;
  }
  return s;
}

struct frame {
  frame_header header{};
  std::vector<char> body;
  std::vector<int> fds;  // ours to close
  template <class T>
  T as() const {
    T t{};
    std::memcpy(&t, body.data(), std::min(sizeof t, body.size()));
    return t;
  }
};

// Reads one frame (descriptors ride on its first bytes); false on EOF, error
// or nothing within `timeout_ms`.
inline bool read_frame(int s, frame& out, int timeout_ms) {
  auto read_exactly = [&](char* to, std::size_t n, bool with_fds) {
    for (std::size_t got = 0; got < n;) {
      pollfd p{s, POLLIN, 0};
      if (::poll(&p, 1, timeout_ms) != 1) return false;
      iovec iov{to + got, n - got};
      char control[CMSG_SPACE(8 * sizeof(int))];
      msghdr m{};
      m.msg_iov = &iov;
      m.msg_iovlen = 1;
      m.msg_control = control;
      m.msg_controllen = sizeof control;
      ssize_t r = ::recvmsg(s, &m, MSG_CMSG_CLOEXEC);
      if (r <= 0) return false;
      for (cmsghdr* c = CMSG_FIRSTHDR(&m); with_fds && c; c = CMSG_NXTHDR(&m, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
          for (std::size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); ++i) {
            int fd;
            std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            out.fds.push_back(fd);
          }
      got += static_cast<std::size_t>(r);
    }
    return true;
  };
  out = frame{};
  if (!read_exactly(reinterpret_cast<char*>(&out.header), sizeof out.header, true)) return false;
  out.body.resize(out.header.length);
  return out.header.magic == control_magic && read_exactly(out.body.data(), out.body.size(), false);
}

}  // namespace vmmc::test::raw
