// The in-band upgrade (wire.h): offer and accept bytes, the server's hello
// frame, channel set-up, and the doorbell on the TCP connection.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <string>
#include <thread>

#include "sockets.h"
#include "wire.h"

namespace vmmc::sockets::detail {

namespace {
using clock = std::chrono::steady_clock;

// Sends all of a small control message, waiting for the socket if needed.
bool send_all(int fd, const void* data, std::size_t length, int flags) {
  auto* p = static_cast<const char*>(data);
  auto deadline = clock::now() + std::chrono::seconds(2);
  while (length > 0) {
    ssize_t n = ::send(fd, p, length, flags | MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      length -= static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN) return false;
    if (clock::now() > deadline) return false;
    pollfd pfd{fd, POLLOUT, 0};
    ::poll(&pfd, 1, 10);
  }
  return true;
}

// Reads exactly `length` bytes (the server's hello frame follows its accept
// byte at once, so this waits a round trip at most; bounded anyway).
bool receive_exactly(int fd, void* data, std::size_t length) {
  auto* p = static_cast<char*>(data);
  auto deadline = clock::now() + std::chrono::seconds(2);
  while (length > 0) {
    ssize_t n = ::recv(fd, p, length, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      length -= static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    if (errno != EAGAIN) return false;
    if (clock::now() > deadline) return false;
    pollfd pfd{fd, POLLIN, 0};
    ::poll(&pfd, 1, 10);
  }
  return true;
}

std::chrono::microseconds server_hold(int fd) {
  auto hold = std::chrono::microseconds(core::setting_integer(settings::hold_us));
  tcp_info info{};
  socklen_t len = sizeof info;
  // Across real networks the offer may trail the handshake by a round trip.
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0)
    hold = std::max(hold, std::chrono::microseconds(2 * info.tcpi_rtt));
  return hold;
}

redirect::channel_options channel_options_for(stream& s) {
  redirect::channel_options o;
  stream* self = &s;  // the channel lives inside the stream
  o.ring_doorbell = [self] { ring_doorbell(*self); };
  o.await_doorbell = [self](int timeout_ms) {
    if (self->tcp_eof.load()) {
      // Nothing more comes over TCP; the channel checks the peer's liveness.
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(timeout_ms, 1)));
      return;
    }
    pollfd pfd{self->fd, POLLIN, 0};
    ::poll(&pfd, 1, timeout_ms);
    drain_doorbells(*self);
  };
  return o;
}

void become_plain(stream& s, const char* why) {
  s.state.store(phase::plain);
  log(3, "fd %d: plain TCP (%s)", s.fd, why);
}

// Server: the client offered; answer with accept + hello frame.
void accept_offer(stream& s) {
  core::context* ctx = process_context();
  if (!ctx) return become_plain(s, "no VMMC context");
  auto chan = redirect::channel::create(*ctx, channel_options_for(s));
  if (!chan) {
    log(1, "fd %d: channel: %s", s.fd, chan.error().message().c_str());
    return become_plain(s, "channel set-up failed");
  }
  std::string descriptor = chan->descriptor();
  wire::hello_frame frame{wire::hello_magic, wire::version,
                          static_cast<std::uint16_t>(descriptor.size())};
  std::string message(reinterpret_cast<const char*>(&frame), sizeof frame);
  message += descriptor;
  unsigned char accept = wire::accept_byte;
  if (!send_all(s.fd, &accept, 1, MSG_OOB) ||
      !send_all(s.fd, message.data(), message.size(), 0)) {
    // The connection is broken; kernel calls will report it.
    return become_plain(s, "could not send the hello");
  }
  s.chan = std::make_unique<redirect::channel>(std::move(*chan));
  s.state.store(phase::upgraded);
  log(3, "fd %d: client offered VMMC; hello sent", s.fd);
}

// Client: the server accepted; read its hello frame and set up our channel.
void take_accept(stream& s) {
  wire::hello_frame frame{};
  std::string descriptor;
  bool ok = receive_exactly(s.fd, &frame, sizeof frame) && frame.magic == wire::hello_magic &&
            frame.version == wire::version && frame.length > 0;
  if (ok) {
    descriptor.resize(frame.length);
    ok = receive_exactly(s.fd, descriptor.data(), descriptor.size());
  }
  if (!ok) {
    // The peer sent an accept byte but no valid hello: it is not us after all,
    // and the bytes it sent cannot be given back. Fail the connection.
    s.pending_error.store(EPROTO);
    return become_plain(s, "malformed hello");
  }
  core::context* ctx = process_context();
  std::optional<redirect::channel> chan;
  if (ctx) {
    auto c = redirect::channel::create(*ctx, channel_options_for(s));
    if (c) chan.emplace(std::move(*c));
  }
  if (!chan) {
    // We will never place our hello: both directions stay raw TCP, which the
    // server handles (it only switches after reading our hello).
    s.state.store(phase::upgraded);
    log(1, "fd %d: no channel; staying on TCP", s.fd);
    return;
  }
  s.chan = std::make_unique<redirect::channel>(std::move(*chan));
  s.peer_descriptor = std::move(descriptor);
  s.state.store(phase::upgraded);
  s.hello_pending.store(true);
  log(3, "fd %d: server accepted VMMC", s.fd);
}
}  // namespace

void ring_doorbell(stream& s) {
  unsigned char b = wire::doorbell_byte;
  [[maybe_unused]] ssize_t n = ::send(s.fd, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

void drain_doorbells(stream& s) {
  if (!s.in_switched.load()) return;  // TCP bytes are still application data
  char scratch[256];
  while (true) {
    ssize_t n = ::recv(s.fd, scratch, sizeof scratch, MSG_DONTWAIT);
    if (n > 0) {
      s.doorbells_in.fetch_add(static_cast<std::uint64_t>(n));
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EINTR)) s.tcp_eof.store(true);
    if (n < 0 && errno == EINTR) continue;
    return;
  }
}

void send_offer(stream& s) {
  if (!enabled()) return become_plain(s, "disabled");
  unsigned char offer = wire::offer_byte;
  if (::send(s.fd, &offer, 1, MSG_OOB | MSG_NOSIGNAL | MSG_DONTWAIT) != 1)
    return become_plain(s, "offer not sent");
  s.state.store(phase::undecided);
}

bool check_connected(stream& s) {
  if (s.state.load() != phase::connecting) return true;
  std::lock_guard lock(s.setup_mutex);
  if (s.state.load() != phase::connecting) return true;
  sockaddr_storage peer{};
  socklen_t length = sizeof peer;
  if (::getpeername(s.fd, reinterpret_cast<sockaddr*>(&peer), &length) != 0) return false;
  send_offer(s);
  return true;
}

void try_decide(stream& s, bool wait_for_first_byte) {
  if (s.state.load() != phase::undecided) return;
  std::lock_guard lock(s.setup_mutex);
  if (s.state.load() != phase::undecided) return;
  if (wait_for_first_byte) {
    pollfd pfd{s.fd, POLLIN | POLLPRI, 0};
    auto hold = server_hold(s.fd);
    ::poll(&pfd, 1, static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(hold).count()));
  }
  // Peek first: once an ordinary byte (or the end) is visible, any urgent
  // byte sent before it has been registered by the kernel too.
  char c;
  ssize_t peeked = ::recv(s.fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  int peek_error = errno;
  unsigned char urgent = 0;
  ssize_t got = ::recv(s.fd, &urgent, 1, MSG_OOB | MSG_DONTWAIT);
  unsigned char expected = s.is_client ? wire::accept_byte : wire::offer_byte;
  if (got == 1 && urgent == expected) {
    if (s.is_client) {
      take_accept(s);
    } else {
      accept_offer(s);
    }
    return;
  }
  if (got == 1) return become_plain(s, "foreign urgent byte");
  if (peeked >= 0 || (peek_error != EAGAIN && peek_error != EINTR))
    return become_plain(s, "peer's first byte is ordinary");
  if (wait_for_first_byte) return become_plain(s, "no offer before our first byte");
}

bool learn_peer_raw(stream& s) {
  if (s.peer_raw) return true;
  if (!s.chan) return false;
  auto hello = s.chan->peer_hello();
  if (!hello) return false;
  std::uint64_t n = 0;
  auto [end, ec] = std::from_chars(hello->data(), hello->data() + hello->size(), n);
  if (ec != std::errc() || end != hello->data() + hello->size()) {
    s.pending_error.store(EPROTO);
    return false;
  }
  s.peer_raw = n;
  return true;
}

void place_hello_locked(stream& s) {
  if (!s.hello_pending.load() || s.out_switched.load() || !s.chan) return;
  std::string count = std::to_string(s.tcp_out);
  status placed;
  if (s.is_client) {
    placed = s.chan->connect(s.peer_descriptor, count);
  } else {
    auto theirs = s.chan->accept_peer(count);
    placed = theirs ? status{} : status(theirs.error());
  }
  s.hello_pending.store(false);
  if (!placed) {
    log(1, "fd %d: channel set-up failed (%s); this direction stays on TCP", s.fd,
        placed.error().message().c_str());
    return;
  }
  s.out_switched.store(true);
  ring_doorbell(s);  // a reader asleep on TCP must learn of the switch
  log(3, "fd %d: writes switched to %s after %llu TCP bytes", s.fd, s.chan->path().c_str(),
      static_cast<unsigned long long>(s.tcp_out));
}

bool peer_ready(stream& s) {
  if (s.state.load() != phase::upgraded || s.out_switched.load() || !s.chan) return false;
  // The client may place its hello as soon as it has the server's; the
  // server only once the client's hello is in its area.
  if (!s.is_client && !s.peer_hello_seen.load() && s.chan->peer_hello()) {
    s.peer_hello_seen.store(true);
    s.hello_pending.store(true);
  }
  return s.hello_pending.load();
}

void advance_upgrade(stream& s) {
  if (!peer_ready(s)) return;
  // The writer owns the byte count; if it is busy, it places the hello when
  // its current write returns.
  std::unique_lock lock(s.write_mutex, std::try_to_lock);
  if (lock) place_hello_locked(s);
}

}  // namespace vmmc::sockets::detail
