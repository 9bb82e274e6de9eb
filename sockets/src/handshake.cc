// The in-band upgrade (wire.h): offer and accept bytes, the server's hello
// frame, channel set-up, and the doorbell on the TCP connection.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "parse.h"
#include "sockets.h"
#include "vmmc/core/progress.h"
#include "wire.h"

namespace vmmc::sockets::detail {

namespace {
using clock = std::chrono::steady_clock;
std::atomic<int> awaiting_client{0};  // server channels holding an awaiting slot
}  // namespace

int max_awaiting_client() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 64;
  return static_cast<int>(std::clamp<rlim_t>(limit.rlim_cur / 8, 32, 1 << 20));
}

void release_awaiting_slot(stream& s) {
  if (s.awaiting_slot.exchange(false)) awaiting_client.fetch_sub(1);
}

namespace {
// Waits, bounded by 2 s, while `move` (one non-blocking call: bytes moved,
// or -1 with errno) moves the rest of `length` bytes, sleeping in the
// kernel until the descriptor is ready for `events` again. These are the
// handshake's few bytes: nothing to busy-poll.
template <class Move>
bool move_all(int fd, std::size_t length, short events, Move move) {
  bool failed = false;
  auto moved_all = [&] {
    while (length > 0) {
      ssize_t n = move(length);
      if (n > 0) {
        length -= static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      failed = n == 0 || errno != EAGAIN;
      return failed;
    }
    return true;
  };
  auto sleep = [&](std::chrono::nanoseconds most) {
    pollfd pfd{fd, events, 0};
    ::poll(&pfd, 1,
           static_cast<int>(std::min<std::int64_t>(
               10, std::chrono::ceil<std::chrono::milliseconds>(most).count())));
    return true;
  };
  return core::wait_until(moved_all, clock::now() + std::chrono::seconds(2),
                          core::sleep_step(sleep), {.spin = false}) == core::waited::done &&
         !failed;
}
}  // namespace

bool send_all(int fd, const void* data, std::size_t length, int flags) {
  auto* p = static_cast<const char*>(data);
  return move_all(fd, length, POLLOUT, [&](std::size_t left) {
    ssize_t n = ::send(fd, p, left, flags | MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) p += n;
    return n;
  });
}

void mark_plain(stream& s, fallback why) {
  s.fallback_reason.store(why);
  s.state.store(phase::plain);
  log(3, "fd %d: plain TCP (%s)", s.fd.load(), fallback_text(why).data());
}

namespace {
// Reads exactly `length` bytes (the server's hello frame follows its accept
// byte at once, so this waits a round trip at most; bounded anyway).
bool receive_exactly(int fd, void* data, std::size_t length) {
  auto* p = static_cast<char*>(data);
  return move_all(fd, length, POLLIN, [&](std::size_t left) {
    ssize_t n = ::recv(fd, p, left, MSG_DONTWAIT);
    if (n > 0) p += n;
    return n;
  });
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
  o.await_doorbell = [self](const std::function<bool()>& arm, int timeout_ms) {
    sleep_on_doorbell(*self, arm, timeout_ms);
  };
  // The kernel's verdict on the peer's host (keepalive, TCP_USER_TIMEOUT as
  // the application set them) is the stream's, as with kernel TCP.
  o.connection_broken = [self] { return tcp_failed(*self); };
  if (learn_ends(s)) o.reached_over = s.peer_end;
  // A peer on this host wakes our sleepers (ours: blocking calls, poll,
  // epoll) through an eventfd: on one CPU a round trip of doorbells took
  // 15.5 us as TCP segments, 5.3 us as eventfd writes.
  o.wait_fd = s.peer_here;
  return o;
}

void become_plain(stream& s, fallback why) {
  mark_plain(s, why);
  stat_publish(s);
}

// The peer broke the upgrade protocol: nothing more it sent can be told
// from our bytes, so none of it reaches the application. The next call
// reports EPROTO, then reads see the end and writes EPIPE, as after a reset.
// (Gone plain, the stream would hand the rest of a bad hello over as data.)
void fail_connection(stream& s, const char* why) {
  report_next(s, EPROTO);
  (void)s.in.shut_down();
  (void)s.out.shut_down();
  (void)::shutdown(s.fd, SHUT_RDWR);
  s.fallback_reason.store(fallback::protocol_error);
  s.state.store(phase::upgraded);  // without a channel: kept out of the kernel fast path
  epoll_members_from_now(s);
  stat_publish(s);
  log(1, "fd %d: connection failed (%s)", s.fd.load(), why);
}

// The process's context, with its fabric open when this connection's peer is
// on another host (same-host peers take the mapped path: no provider needed).
// Its peer reaches our fabric where it reached this connection: at the
// connection's local address (no setting needed on any host).
core::context* context_for(stream& s) {
  core::context* ctx = process_context();
  if (ctx && learn_ends(s) && !s.peer_here) {
    const std::string local = ipv4_text(reinterpret_cast<const sockaddr*>(&s.local_end));
    if (auto opened = ctx->open_remote_paths(local); !opened)
      log(1, "fd %d: no fabric for a peer on another host: %s", s.fd.load(),
          opened.error().message().c_str());
  }
  return ctx;
}

// The server's channel for a client that offered or asked, holding an
// awaiting slot; nullopt (and why) if it cannot make one. The limit is asked
// of the kernel (the program may raise its descriptor limit) only when the
// count nears the last answer.
std::optional<redirect::channel> server_channel(stream& s, fallback& why) {
  static std::atomic<int> limit{32};
  if (const int awaiting = awaiting_client.fetch_add(1);
      awaiting >= limit.load(std::memory_order_relaxed) &&
      awaiting >= (limit = max_awaiting_client())) {
    awaiting_client.fetch_sub(1);
    why = fallback::refused;
    return std::nullopt;
  }
  s.awaiting_slot.store(true);
  core::context* ctx = context_for(s);
  if (!ctx) {
    release_awaiting_slot(s);
    why = fallback::no_context;
    return std::nullopt;
  }
  auto chan = redirect::channel::create(*ctx, channel_options_for(s));
  if (!chan) {
    release_awaiting_slot(s);
    log(1, "fd %d: channel: %s", s.fd.load(), chan.error().message().c_str());
    why = fallback::setup_failed;
    return std::nullopt;
  }
  return std::move(*chan);
}

std::string hello_message(const std::string& descriptor) {
  wire::hello_frame frame{wire::hello_magic, wire::version,
                          static_cast<std::uint16_t>(descriptor.size())};
  return std::string(reinterpret_cast<const char*>(&frame), sizeof frame) + descriptor;
}

// Server: a client on another host offered; answer at once (nothing of the
// application's is on the connection yet) with accept + hello frame.
void accept_offer(stream& s) {
  fallback why = fallback::none;
  auto chan = server_channel(s, why);
  if (!chan) return become_plain(s, why);
  std::string message = hello_message(chan->descriptor());
  unsigned char accept = wire::accept_byte;
  if (!send_all(s.fd, &accept, 1, MSG_OOB) || !send_all(s.fd, message.data(), message.size(), 0)) {
    // The connection is broken; kernel calls will report it.
    return become_plain(s, fallback::setup_failed);
  }
  s.chan = std::make_unique<redirect::channel>(std::move(*chan));
  s.state.store(phase::upgraded);
  log(3, "fd %d: client offered VMMC; hello sent", s.fd.load());
}

// Server, with setup_mutex held and no call in the kernel: a client on this
// host asked. The answer goes mid-stream, between the application's bytes:
// the accept byte only if the kernel takes it now (else at a later call),
// then the hello frame naming our channel, or an empty one if we cannot
// serve it (it stays kernel TCP). What of the frame the kernel does not
// take now is sent before any later byte of ours (answer_rest): the
// application's call never waits for the client here.
void answer_ask(stream& s) {
  unsigned char accept = wire::accept_byte;
  if (::send(s.fd, &accept, 1, MSG_OOB | MSG_NOSIGNAL | MSG_DONTWAIT) != 1) return;
  fallback why = fallback::none;
  auto chan = server_channel(s, why);
  std::string message = hello_message(chan ? chan->descriptor() : std::string());
  ssize_t sent = ::send(s.fd, message.data(), message.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  s.answer_rest = message.substr(static_cast<std::size_t>(std::max<ssize_t>(sent, 0)));
  if (!chan) {
    log(3, "fd %d: client asked for VMMC; declined", s.fd.load());
    if (!s.answer_rest.empty() && !send_all(s.fd, s.answer_rest.data(), s.answer_rest.size(), 0))
      return fail_connection(s, "the answer could not be sent");
    s.answer_rest.clear();
    return become_plain(s, why);
  }
  s.chan = std::make_unique<redirect::channel>(std::move(*chan));
  s.state.store(phase::upgraded);
  epoll_members_from_now(s);
  log(3, "fd %d: client asked for VMMC; hello sent (%llu bytes in, %llu out)", s.fd.load(),
      static_cast<unsigned long long>(s.tcp_in.load()),
      static_cast<unsigned long long>(s.tcp_out.load()));
}

// The hello frame that follows the server's accept byte; an empty
// descriptor if it declined (a server on this host that cannot serve us).
bool read_hello_frame(int fd, std::string& descriptor) {
  wire::hello_frame frame{};
  if (!receive_exactly(fd, &frame, sizeof frame)) return false;
  if (frame.length == 0) {
    descriptor.clear();
    return frame.magic == wire::hello_magic && frame.version == wire::version;
  }
  if (!hello_frame_ok(frame)) return false;
  descriptor.resize(frame.length);
  return receive_exactly(fd, descriptor.data(), descriptor.size());
}

// Client, with setup_mutex held: our channel, connected to the server's at
// our next write (or a reader's turn). Without one we never place our
// hello, and both directions stay on TCP (the server switches only after
// reading it): plain, with no look at the connection any more.
void make_channel(stream& s) {
  core::context* ctx = context_for(s);
  std::optional<redirect::channel> chan;
  if (ctx) {
    auto c = redirect::channel::create(*ctx, channel_options_for(s));
    if (c) chan.emplace(std::move(*c));
  }
  if (!chan) {
    log(1, "fd %d: no channel; staying on TCP", s.fd.load());
    return become_plain(s, fallback::setup_failed);
  }
  s.chan = std::make_unique<redirect::channel>(std::move(*chan));
  s.hello_pending.store(true);
  s.state.store(phase::upgraded);  // publishes the channel
  epoll_members_from_now(s);
  stat_publish(s);
}

// Client: the server accepted; read its hello frame. Our channel comes at
// once only if the setting says so; else once the connection earns it.
void take_accept(stream& s) {
  std::string descriptor;
  if (!read_hello_frame(s.fd, descriptor)) {
    // The peer sent an accept byte but no valid hello: it is not us after all,
    // and the bytes it sent cannot be given back. Fail the connection.
    return fail_connection(s, "malformed hello after the accept byte");
  }
  if (descriptor.empty()) return become_plain(s, fallback::refused);
  s.peer_descriptor = std::move(descriptor);
  log(3, "fd %d: server accepted VMMC", s.fd.load());
  if (upgrade_after() == 0) return make_channel(s);
  s.state.store(phase::deferred);
  stat_publish(s);
}

// Whether a deferred connection has carried enough that a channel pays: its
// set-up costs the client about 150 us (vmmc-bench startup, connect + one
// round trip: 312 us with the channel at once, 155 us deferred), the time of
// some 16 kernel TCP calls here or of 256 KiB through loopback. A
// connection that makes fewer calls and closes never pays it (issue 14,
// item 5); one that goes on pays at most about twice what it would have.
constexpr std::uint64_t earning_bytes = 256 << 10;

// The length of an address kept by learn_ends (IPv4 or IPv6).
socklen_t length_of(const sockaddr_storage& address) {
  return address.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}
bool earned(const stream& s) {
  return s.tcp_calls.load(std::memory_order_relaxed) >= upgrade_after() ||
         s.tcp_in.load(std::memory_order_relaxed) + s.tcp_out.load(std::memory_order_relaxed) >=
             earning_bytes;
}

// Client on this host, with setup_mutex held: asks for the upgrade of a
// connection that earned it, if the server runs vmmc: its listener is
// entered, or, where it has none any more, its own socket (entered by the
// server at its first look at ours). Else we would watch for an answer that
// never comes. The ask is a mark on our socket's entry in the presence
// table: no byte on the connection. The answer comes in-band, wherever the
// server is in its stream when it looks (watched_receive).
void ask_locked(stream& s) {
  auto stay = [&](fallback why) {
    presence::remove(s.presence_cookie.exchange(0));
    become_plain(s, why);
  };
  if (s.out.is_shut() || s.shared.load()) {
    // By our choice: the entry says so until close() takes it out.
    presence::decline(s.presence_cookie.load());
    return become_plain(s, s.out.is_shut() ? fallback::none : fallback::reverted);
  }
  if (s.presence_cookie.load() == 0) return stay(fallback::setup_failed);
  const std::uint32_t calls = s.tcp_calls.load();
  if (calls < s.next_look.load()) return;
  if (!learn_ends(s)) return stay(fallback::offer_failed);
  const auto* server = reinterpret_cast<const sockaddr*>(&s.peer_end);
  const auto* local = reinterpret_cast<const sockaddr*>(&s.local_end);
  const socklen_t length = length_of(s.peer_end);
  switch (presence::listener_at(server, length, /*fresh=*/true)) {
    case presence::listener::plain:
      return stay(fallback::peer_plain);
    case presence::listener::entered:
      break;
    case presence::listener::none: {
      auto theirs = presence::peer_socket(local, length, server, length);
      if (theirs && presence::entry_of(*theirs) != presence::entry::absent) break;
      // Not yet: looked for again after 1, 2, 4 ... 256 more calls, for
      // as long as the connection lasts. The server enters its socket at
      // its own first look (its 16th call), which a fast writer's hundreds
      // of calls can come before: a server busy with others, or not run
      // for a while (a TLS upload through unmodified socat, whose server
      // reads records in two calls, gave up so on every run on a busy
      // machine). A server without vmmc costs a look (one sock_diag query)
      // per 256 calls.
      const std::uint32_t gap = 1u << std::min(s.looks_made++, 8u);
      s.next_look.store(calls + gap);
      return;
    }
  }
  exit_takes_protocol_bytes();  // the answer, should the program exit without reading it
  presence::ask(s.presence_cookie.load());
  s.asked.store(true);
  stat_publish(s);
  log(3, "fd %d: asked the server for VMMC (%u calls, %llu bytes)", s.fd.load(), s.tcp_calls.load(),
      static_cast<unsigned long long>(s.tcp_in.load() + s.tcp_out.load()));
}

// Leaves the deferred phase if no call is in the kernel (else a later call
// does): for a channel, or for kernel TCP where a channel can never be used.
// A client on this host without the server's answer asks for it first
// (if `may_ask`: at the start of a call, see deferred_call).
void earn_channel(stream& s, bool may_ask) {
  std::unique_lock setup(s.setup_mutex, std::try_to_lock);
  if (!setup || s.state.load() != phase::deferred || !s.is_client.load()) return;
  if (s.peer_descriptor.empty()) {
    // Asked, the server's answer may come at any byte: a read already in
    // the kernel (another thread's) would take it for data. So only with
    // none there, as for the channel below.
    if (s.asked.load() || !may_ask) return;
    s.upgrade_claimed.store(true);
    if (s.in_kernel.load() == 0)
      ask_locked(s);
    else
      s.upgrade_due.store(true);
    s.upgrade_claimed.store(false);
    return;
  }
  s.upgrade_claimed.store(true);
  if (s.in_kernel.load() != 0) {
    s.upgrade_due.store(true);
  } else {
    log(3, "fd %d: earned a channel (%u calls, %llu bytes)", s.fd.load(), s.tcp_calls.load(),
        static_cast<unsigned long long>(s.tcp_in.load() + s.tcp_out.load()));
    if (s.out.is_shut() || s.shared.load())
      become_plain(s, s.out.is_shut() ? fallback::none : fallback::reverted);
    else
      make_channel(s);
  }
  s.upgrade_claimed.store(false);
}

// Server on this host: whether the client asked. The first look, once the
// connection made VMMC_SOCKETS_UPGRADE_AFTER calls (or moved 256 KiB),
// finds the client's socket (sock_diag): not entered, it runs no vmmc and
// the connection stays kernel TCP for good. Entered, every later call looks
// at its entry (a load) until it asks. A connection that ends sooner costs
// nothing. The answer goes between two calls of ours, with none in the
// kernel, and only while the client has not closed (it would get a reset).
void look_for_ask(stream& s) {
  std::unique_lock setup(s.setup_mutex, std::try_to_lock);
  if (!setup || s.state.load() != phase::deferred || s.is_client.load()) return;
  const std::uint32_t calls = s.tcp_calls.load();
  if (calls < s.next_look.load()) return;
  s.next_look.store(calls + 1);
  const bool first = !s.client_socket;
  if (first) {
    if (!learn_ends(s)) return become_plain(s, fallback::offer_failed);
    const auto* local = reinterpret_cast<const sockaddr*>(&s.local_end);
    const auto* peer = reinterpret_cast<const sockaddr*>(&s.peer_end);
    const socklen_t length = length_of(s.peer_end);
    s.client_socket = presence::peer_socket(local, length, peer, length);
    if (!s.client_socket) return become_plain(s, fallback::peer_plain);
  }
  const presence::entry e = presence::entry_of(*s.client_socket);
  // Absent at a later look: the client let its entry go (it closed), not a
  // plain peer (a two-thread Python client's connections said so, 1 in 40).
  if (e == presence::entry::absent)
    return become_plain(s, first ? fallback::peer_plain : fallback::none);
  // A vmmc client that keeps the connection on TCP (it shut its writes down
  // before asking): kernel TCP for good, but not a plain peer.
  if (e == presence::entry::declined) return become_plain(s, fallback::none);
  // A client whose listener is gone when it asks finds us by this socket.
  if (first) s.presence_cookie.store(presence::enter(s.fd));
  if (e != presence::entry::asking) return;
  // A client that closed would answer our bytes with a reset.
  pollfd closed{s.fd, POLLRDHUP, 0};
  if (::poll(&closed, 1, 0) != 0) return;
  s.upgrade_claimed.store(true);
  if (s.in_kernel.load() != 0) {
    s.upgrade_due.store(true);
  } else {
    s.client_vouched.store(true);
    s.inherited.store(false);  // a fork() child serving it: the channel is its own
    answer_ask(s);
  }
  s.upgrade_claimed.store(false);
}

// Client on this host, after its ask, at the urgent mark: takes the
// server's answer (its accept byte, urgent or inline where the program
// reads urgent bytes inline, then its hello frame), without waiting: a
// frame not all there yet is left whole for a later call (the server sends
// its rest before any later byte of its own). not_ours if the byte at the
// mark is the server program's own urgent byte: left to the program.
enum class answer { taken, not_ours, incomplete };
answer take_answer(stream& s) {
  std::unique_lock setup(s.setup_mutex);
  if (s.state.load() != phase::deferred || !s.asked.load()) return answer::not_ours;
  unsigned char urgent = 0;
  int oob = MSG_OOB;
  ssize_t got = ::recv(s.fd, &urgent, 1, MSG_OOB | MSG_PEEK | MSG_DONTWAIT);
  int urgent_inline = 0;
  socklen_t length = sizeof urgent_inline;
  if (got < 0 && errno == EINVAL &&
      ::getsockopt(s.fd, SOL_SOCKET, SO_OOBINLINE, &urgent_inline, &length) == 0 && urgent_inline) {
    oob = 0;
    got = ::recv(s.fd, &urgent, 1, MSG_PEEK | MSG_DONTWAIT);
  }
  if (got != 1 || urgent != wire::accept_byte) return answer::not_ours;
  // The frame behind the mark (a peek there steps over an urgent byte that
  // is not inline).
  const std::size_t skip = oob ? 0 : 1;
  char head[1 + sizeof(wire::hello_frame) + 4096];
  const ssize_t seen = ::recv(s.fd, head, sizeof head, MSG_PEEK | MSG_DONTWAIT);
  wire::hello_frame frame{};
  if (seen < static_cast<ssize_t>(skip + sizeof frame)) return answer::incomplete;
  std::memcpy(&frame, head + skip, sizeof frame);
  const bool whole = static_cast<std::size_t>(seen) >= skip + sizeof frame + frame.length;
  const bool well_formed = frame.magic == wire::hello_magic && frame.version == wire::version;
  if (well_formed && !whole) return answer::incomplete;
  (void)::recv(s.fd, &urgent, 1, oob | MSG_DONTWAIT);
  presence::remove(s.presence_cookie.exchange(0));
  if (!well_formed) {
    fail_connection(s, "malformed hello after the accept byte");
    s.asked.store(false);
    return answer::taken;
  }
  std::string descriptor(frame.length, '\0');
  if (::recv(s.fd, head, sizeof frame, MSG_DONTWAIT) != static_cast<ssize_t>(sizeof frame) ||
      (frame.length > 0 &&
       ::recv(s.fd, descriptor.data(), descriptor.size(), MSG_DONTWAIT) != frame.length)) {
    fail_connection(s, "the hello frame went missing");
    s.asked.store(false);
    return answer::taken;
  }
  if (descriptor.empty()) {
    log(3, "fd %d: the server declined VMMC", s.fd.load());
    become_plain(s, fallback::refused);
    s.asked.store(false);
    return answer::taken;
  }
  s.peer_descriptor = std::move(descriptor);
  s.asked.store(false);
  log(3, "fd %d: server accepted VMMC", s.fd.load());
  setup.unlock();
  earn_channel(s, /*may_ask=*/false);  // now, unless a call is in the kernel (then at its end)
  if (s.state.load() == phase::upgraded) advance_upgrade(s);
  return answer::taken;
}
// A client that asked, before a write: the answer, if it is at the head.
void answer_before_write(stream& s) {
  if (!s.asked.load()) return;
  std::unique_lock reading(s.read_mutex, std::try_to_lock);  // else the reader takes it
  int at_mark = 0;
  if (reading && s.asked.load() && ::ioctl(s.fd, SIOCATMARK, &at_mark) == 0 && at_mark)
    (void)take_answer(s);
}

}  // namespace

std::uint32_t upgrade_after() {
  static const auto calls = static_cast<std::uint32_t>(
      std::max<std::int64_t>(0, core::setting_integer(settings::upgrade_after)));
  return calls;
}

namespace {
// A read that would block, while an upgrade is due: waits for the kernel's
// bytes (or the end, an error, the urgent answer) outside the kernel call,
// looking every few milliseconds whether the stream left the phase (its
// next bytes then come through the channel, not TCP). False once the
// read's SO_RCVTIMEO passed.
bool await_kernel_bytes(stream& s) {
  constexpr int slice_ms = 5;
  const auto deadline = receive_deadline(s);
  while (s.state.load() == phase::deferred) {
    pollfd look{s.fd, POLLIN | POLLPRI | POLLRDHUP, 0};
    const auto now = clock::now();
    if (now >= deadline) return false;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
    if (::poll(&look, 1, static_cast<int>(std::min<long long>(left, slice_ms))) != 0) return true;
  }
  return true;
}
}  // namespace

bool deferred_call(stream& s, core::function_ref<ssize_t()> call,
                   std::atomic<std::uint64_t>* counter, ssize_t& result, kernel_call kind) {
  const bool server = !s.is_client.load(std::memory_order_relaxed);
  if (server &&
      s.tcp_calls.load(std::memory_order_relaxed) >= s.next_look.load(std::memory_order_relaxed)) {
    look_for_ask(s);
    if (s.state.load() != phase::deferred) return false;
  }
  // A client asks at the start of a call, not at the end of the one that
  // earned it. The server's answer comes in-band: a writer whose last call
  // earned the channel and that then exits would leave it unread, and its
  // kernel would reset the connection, dropping what its send queue still
  // held (64 MiB written in one call, then exit: up to 4 MB lost). A call
  // shows the process goes on (and an exit() takes the answer, see
  // exit_takes_protocol_bytes).
  if (!server && !s.asked.load(std::memory_order_relaxed) && earned(s)) {
    earn_channel(s, /*may_ask=*/true);
    // Asked: the caller's call goes again, watching for the answer (a read
    // straight into the kernel would take it for data).
    if (s.state.load() != phase::deferred || s.asked.load()) return false;
  }
  // A write (it counts into tcp_out) of a client that asked: the answer
  // first, if it is at the head (a client that only writes upgrades too).
  if (counter == &s.tcp_out && s.asked.load()) {
    answer_before_write(s);
    if (s.state.load() != phase::deferred) return false;
  }
  // The upgrade waits for a moment with no call of ours in the kernel: a
  // read blocked there for the peer's next bytes would hold it off that
  // long. A program that reads in one thread and writes in another, each
  // blocked in turn, moved 20-180 MB each way over TCP before it came.
  if (kind.blocking_read && s.upgrade_due.load(std::memory_order_relaxed)) {
    if (!await_kernel_bytes(s)) {
      result = -1;
      errno = EAGAIN;
      return true;
    }
    if (s.state.load() != phase::deferred) return false;
  }
  s.in_kernel.fetch_add(1);
  if (s.upgrade_claimed.load() || s.state.load() != phase::deferred) {
    s.in_kernel.fetch_sub(1);
    std::lock_guard wait(s.setup_mutex);  // held while the stream leaves the phase
    return false;
  }
  // Another thread asked since the caller chose this read (while it waited
  // above, say): the answer may be at the head, and a recv() there steps
  // over the urgent byte and hands out the hello frame as data. The caller
  // goes again, watching. An ask made after this look finds us in the
  // kernel (in_kernel) and waits.
  if (kind.unwatched_read && s.asked.load()) {
    s.in_kernel.fetch_sub(1);
    return false;
  }
  result = call();
  const int error = errno;
  if (result > 0 && counter) {
    const std::uint64_t before =
        s.tcp_in.load(std::memory_order_relaxed) + s.tcp_out.load(std::memory_order_relaxed);
    *counter += static_cast<std::uint64_t>(result);
    const std::uint32_t calls = s.tcp_calls.fetch_add(1, std::memory_order_relaxed) + 1;
    // A server looks at once when the bytes alone earned the channel.
    if (server && before < earning_bytes && before + result >= earning_bytes)
      s.next_look.store(std::min(s.next_look.load(), calls));
  }
  s.in_kernel.fetch_sub(1);
  if (result > 0 && counter && !server && earned(s)) {
    earn_channel(s, /*may_ask=*/false);  // the server's answer taken: our channel
    if (s.state.load() == phase::upgraded) advance_upgrade(s);  // our hello, if no writer is busy
  }
  errno = error;
  return true;
}

bool watched_receive(stream& s, void* buffer, size_t length, int flags,
                     std::chrono::steady_clock::time_point deadline, ssize_t& result) {
  std::unique_lock reading(s.read_mutex);
  if (!s.asked.load()) return false;
  // Peek, then look whether the kernel's head is the urgent mark: a recv()
  // that starts at the mark steps over the accept byte and hands out the
  // hello frame behind it as data; a peek shows what a recv() would take.
  ssize_t n = 0;
  auto peek = [&] { return ::recv(s.fd, buffer, length, (flags & ~MSG_WAITALL) | MSG_PEEK); };
  if (!deferred_call(s, peek, nullptr, n, {.blocking_read = !wants_no_wait(s, flags)}))
    return false;
  if (n < 0) {
    result = -1;
    return true;
  }
  int at_mark = 0;
  if (::ioctl(s.fd, SIOCATMARK, &at_mark) == 0 && at_mark) {
    switch (take_answer(s)) {
      case answer::taken:
        return false;
      case answer::incomplete:
        // The rest of the frame comes before the server's next byte: wait
        // for it as for data, within the call's time.
        if ((flags & MSG_DONTWAIT) || s.nonblocking.load() ||
            std::chrono::steady_clock::now() >= deadline) {
          errno = EAGAIN;
          result = -1;
          return true;
        }
        reading.unlock();
        ::poll(nullptr, 0, 1);
        return false;
      case answer::not_ours:
        break;
    }
  }
  if (n == 0 || (flags & MSG_PEEK)) {
    result = n;
    return true;
  }
  auto take = [&] { return ::recv(s.fd, buffer, static_cast<size_t>(n), MSG_DONTWAIT); };
  return deferred_call(s, take, &s.tcp_in, result);
}

bool flush_answer(stream& s, bool no_wait) {
  if (s.answer_rest.empty()) return true;
  ssize_t sent =
      ::send(s.fd, s.answer_rest.data(), s.answer_rest.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  if (sent > 0) s.answer_rest.erase(0, static_cast<std::size_t>(sent));
  if (s.answer_rest.empty()) return true;
  if (no_wait) {
    errno = EAGAIN;
    return false;
  }
  if (send_all(s.fd, s.answer_rest.data(), s.answer_rest.size(), 0)) {
    s.answer_rest.clear();
    return true;
  }
  s.answer_rest.clear();
  fail_connection(s, "the answer could not be sent");
  errno = EPROTO;
  return false;
}

void stay_on_tcp(stream& s) {
  // A server's connection stays as it is: the process that serves it after
  // fork() answers the client's ask. A client that asked keeps watching for
  // the answer (then stays on TCP, see earn_channel).
  if (s.state.load() != phase::deferred || !s.is_client.load() || s.asked.load()) return;
  std::lock_guard setup(s.setup_mutex);
  if (s.state.load() == phase::deferred && !s.asked.load()) become_plain(s, fallback::reverted);
}

// A doorbell does not say whether it is for the reader (data) or the writer
// (space), and either thread may take it. So only one thread sleeps on the
// descriptors (TCP for doorbell bytes, records and the end; the channel's
// wait descriptor); others wait for it on a condition variable, and every
// doorbell taken bumps a generation that wakes them all. A thread notes the
// generation before it arms: a doorbell taken after that is never missed.
void sleep_on_doorbell(stream& s, const std::function<bool()>& arm, int timeout_ms) {
  std::uint64_t seen = s.doorbell_generation.load();
  if (!arm()) return;
  if (s.tcp_eof.load()) {
    // Nothing more comes over TCP; the channel checks the peer's liveness.
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(timeout_ms, 1)));
    return;
  }
  std::unique_lock lock(s.sleep_mutex);
  if (s.doorbell_generation.load() != seen) return;
  if (!s.descriptor_sleeper) {
    s.descriptor_sleeper = true;
    lock.unlock();
    const int wait_fd = wait_fd_of(s);
    pollfd pfd[2] = {{s.fd, POLLIN, 0}, {wait_fd, POLLIN, 0}};
    ::poll(pfd, wait_fd >= 0 ? 2 : 1, timeout_ms);
    if (pfd[1].revents) s.chan->clear_wait_fd();
    if (pfd[1].revents == 0 || pfd[0].revents) drain_doorbells(s);
    lock.lock();
    s.doorbell_generation.fetch_add(1);
    s.descriptor_sleeper = false;
    s.sleep_cv.notify_all();  // another waiter takes over the descriptor
    return;
  }
  s.sleep_cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
    return s.doorbell_generation.load() != seen || !s.descriptor_sleeper;
  });
}

void nagle_off_for_doorbells(stream& s) {
  int on = 1;
  (void)::setsockopt(s.fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
}

void ring_doorbell(stream& s) {
  // Until our hello shows in the peer's area, the peer takes every TCP byte
  // for a raw one. Our reader rings (returning credit to a peer writer that
  // waits for space) as soon as the channel is attached, which is before the
  // hello is placed, and for good if placing it fails: that doorbell reached
  // the peer application as a data byte (0xDB). The ring is owed instead,
  // and placing the hello pays it.
  if (!s.out.switched()) {
    s.ring_owed.store(true);
    if (!s.out.switched()) return;  // else switched meanwhile: ring
  }
  s.ringers.fetch_add(1);
  if (!s.out.has(flow::records_closed)) {
    unsigned char b = wire::doorbell_byte;
    // A full socket buffer is no failure (the peer has doorbells to read);
    // an error is the TCP connection's end, which takes the stream with it.
    if (::send(s.fd, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 && errno != EAGAIN &&
        errno != EWOULDBLOCK && errno != EINTR)
      note_tcp_error(s, errno);
  }
  s.ringers.fetch_sub(1);
}

void close_records(stream& s) {
  s.out.close_records();
  // Doorbells already being sent finish first: a send() of one byte.
  (void)core::wait_until([&] { return s.ringers.load() == 0; }, clock::time_point::max(),
                         core::napping(std::chrono::nanoseconds::zero()));
}

void reopen_records(stream& s) {
  s.out.reopen_records();
}

// Bytes of our protocol left in the kernel's receive queue would make
// close() send a reset instead of a FIN (Linux resets when unread data is
// discarded), and the peer would lose the end of our stream. Application
// bytes still unread are left alone: for those the reset is the kernel's.
void discard_protocol_bytes(stream& s) {
  phase p = s.state.load();
  if (p == phase::deferred && s.is_client.load() && s.asked.load()) {
    // The server's answer to our ask, if it is at the head.
    int at_mark = 0;
    if (::ioctl(s.fd, SIOCATMARK, &at_mark) == 0 && at_mark) {
      unsigned char urgent = 0;
      std::string ignored;
      if (::recv(s.fd, &urgent, 1, MSG_OOB | MSG_DONTWAIT) == 1 && urgent == wire::accept_byte)
        (void)read_hello_frame(s.fd, ignored);
    }
    return;
  }
  if (p != phase::upgraded && p != phase::undecided) return;
  if (p == phase::upgraded && s.in.switched() && input_on_tcp(s)) return;  // all data again
  bool raw_done = p == phase::upgraded && raw_prefix_done(s);
  char scratch[4096];
  if (!raw_done) {
    // A client on this host asked without a byte, and its doorbells come
    // only after its switch (raw_done): nothing of ours can be unread here.
    if (!s.is_client && s.client_vouched.load()) return;
    // An urgent byte at the head: the peer's offer, or its accept and hello.
    int at_mark = 0;
    if (::ioctl(s.fd, SIOCATMARK, &at_mark) != 0 || !at_mark) return;
    unsigned char urgent = 0;
    if (s.is_client && ::recv(s.fd, &urgent, 1, MSG_OOB | MSG_DONTWAIT) == 1 &&
        urgent == wire::accept_byte) {
      std::string ignored;
      (void)read_hello_frame(s.fd, ignored);
      return;
    }
    if (::recv(s.fd, scratch, 1, MSG_PEEK | MSG_DONTWAIT) > 0) return;  // application bytes
  }
  for (int i = 0; i < 256; ++i) {  // bounded: doorbells are single bytes
    ssize_t n = ::recv(s.fd, scratch, sizeof scratch, MSG_DONTWAIT);
    if (n <= 0 && !(n < 0 && errno == EINTR)) return;
    if (!raw_done) return;
  }
}

void send_offer(stream& s) {
  if (!enabled()) return become_plain(s, fallback::disabled);
  // On this host we ask once the connection earned it (earn_channel),
  // without a byte; with VMMC_SOCKETS_UPGRADE_AFTER=0 we asked already.
  if (s.ask_later.load()) return s.state.store(phase::deferred);
  // No offer byte at all where we would not upgrade: a peer on another host
  // (or a middlebox) never sees one.
  if (!learn_ends(s)) return become_plain(s, fallback::offer_failed);
  // A peer on this host asks through the presence table, never with a byte
  // a plain one could read (SO_OOBINLINE); one reached without it (an
  // address connect() did not show as ours) stays on TCP.
  if (s.peer_here) return become_plain(s, fallback::offer_failed);
  if (auto why = keep_on_tcp_to(s.peer_here)) return become_plain(s, *why);
  unsigned char offer = wire::offer_byte;
  if (::send(s.fd, &offer, 1, MSG_OOB | MSG_NOSIGNAL | MSG_DONTWAIT) != 1)
    return become_plain(s, fallback::offer_failed);
  s.offer_sent.store(true);
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

namespace {
void decide_locked(stream& s, bool wait_for_first_byte) {
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
  if (got == 1) return become_plain(s, fallback::foreign_urgent);
  if (peeked >= 0 || (peek_error != EAGAIN && peek_error != EINTR))
    return become_plain(s, fallback::peer_plain);
  if (wait_for_first_byte) return become_plain(s, fallback::peer_plain);
}
}  // namespace

void try_decide(stream& s, bool wait_for_first_byte) {
  if (s.state.load() != phase::undecided) return;
  std::lock_guard lock(s.setup_mutex);
  if (s.state.load() != phase::undecided) return;
  // Still undecided when this process was forked (a server that forks per
  // connection): the parent never made it a channel, and the one made here
  // is this process's own.
  s.inherited.store(false);
  decide_locked(s, wait_for_first_byte);
}

bool learn_peer_raw(stream& s) {
  if (s.peer_raw) return true;
  if (!s.chan) return false;
  auto hello = s.chan->peer_hello();
  if (!hello) return false;
  auto n = parse_raw_count(*hello);
  if (!n) {
    report_next(s, EPROTO);
    return false;
  }
  s.peer_raw = *n;
  return true;
}

void place_hello_locked(stream& s, bool ring_now) {
  if (!s.hello_pending.load() || s.out.switched() || !s.chan) return;
  if (s.out.is_shut()) {
    // Our direction ended on TCP (shutdown before the switch): it stays
    // there, and the peer keeps reading it to its end of file.
    s.hello_pending.store(false);
    return;
  }
  // Either end's hello imports the other's area, which asks the peer's
  // process; it may be stopped. The call waits for it a little, then this
  // direction goes on over TCP, and the hello is placed at a later call,
  // a second later, then two, four ... at most a minute: a peer stopped for
  // good costs 0.7 s of waits in its first minute, then 0.1 s a minute
  // (kernel TCP would not wait for a stopped peer at all; an event-driven
  // server waited 5 s, with every other client of it).
  const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  if (now < s.next_hello_try) return;
  constexpr auto patience = std::chrono::milliseconds(100);
  std::string count = std::to_string(s.tcp_out);
  status placed;
  if (s.is_client) {
    placed = s.chan->connect(s.peer_descriptor, count, patience);
  } else {
    auto theirs = s.chan->accept_peer(count, patience);
    placed = theirs ? status{} : status(theirs.error());
  }
  if (!placed && placed.is(errc::timed_out)) {
    const auto rest = std::chrono::seconds(1 << std::min(s.hello_tries++, 6));
    s.next_hello_try = now + std::chrono::nanoseconds(rest).count();
    log(2, "fd %d: the peer did not answer our hello's import; writes stay on TCP a while",
        s.fd.load());
    return;
  }
  s.hello_pending.store(false);
  if (!placed) {
    log(1, "fd %d: channel set-up failed (%s); this direction stays on TCP", s.fd.load(),
        placed.error().message().c_str());
    return;
  }
  s.out.to_channel();
  nagle_off_for_doorbells(s);
  // A reader asleep on TCP must learn of the switch, but only once there is
  // something to read: placed by our reader, the doorbell waits for our next
  // write. Sent at once, it reached servers that had answered and closed
  // (HTTP/1.0 style), whose kernel reset the connection: the client got
  // ECONNRESET instead of the end of a complete answer (issue 14, item 8).
  // A ring the channel asked for before now is paid at once: its peer is
  // waiting (for space or data), so it has not closed.
  if (ring_now || s.ring_owed.exchange(false))
    ring_doorbell(s);
  else
    s.switch_doorbell_owed = true;
  log(3, "fd %d: writes switched to %s after %llu TCP bytes", s.fd.load(), s.chan->path().c_str(),
      static_cast<unsigned long long>(s.tcp_out));
}

bool peer_ready(stream& s) {
  if (s.state.load() != phase::upgraded || s.out.switched() || !s.chan) return false;
  // The client may place its hello as soon as it has the server's; the
  // server only once the client's hello is in its area.
  if (!s.is_client && !s.peer_hello_seen.load() && s.chan->peer_hello()) {
    s.peer_hello_seen.store(true);
    release_awaiting_slot(s);
    s.hello_pending.store(true);
  }
  return s.hello_pending.load();
}

void advance_upgrade(stream& s) {
  if (!peer_ready(s)) return;
  // The writer owns the byte count; if it is busy, it places the hello when
  // its current write returns.
  std::unique_lock lock(s.write_mutex, std::try_to_lock);
  if (lock) place_hello_locked(s, /*ring_now=*/false);
}

}  // namespace vmmc::sockets::detail
