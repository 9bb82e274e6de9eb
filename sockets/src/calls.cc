// The BSD calls: which descriptors we manage, connection set-up, close and
// shutdown, options, and the read/write family on top of io.cc.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "sockets.h"
#include "vmmc/sockets/socket.h"

namespace vmmc::sockets {

using namespace detail;

namespace {
bool is_tcp(int domain, int type, int protocol) {
  return (domain == AF_INET || domain == AF_INET6) && (type & 0xf) == SOCK_STREAM &&
         (protocol == 0 || protocol == IPPROTO_TCP);
}

std::chrono::milliseconds timeout_of(const void* value, socklen_t length) {
  if (length < static_cast<socklen_t>(sizeof(timeval))) return std::chrono::milliseconds::max();
  const auto* tv = static_cast<const timeval*>(value);
  auto ms = std::chrono::milliseconds(tv->tv_sec * 1000 + (tv->tv_usec + 999) / 1000);
  return ms.count() <= 0 ? std::chrono::milliseconds::max() : ms;
}

// Scatter reads fill one buffer after another; only the first may block
// (unless MSG_WAITALL), as for the kernel.
// `rw`: readv()/writev() (else recvmsg()/sendmsg()): the kernel's bytes go
// through the call the program made (sockets.h, receive).
ssize_t receive_vector(stream& s, const iovec* iov, int count, int flags, bool rw = false) {
  if (rw && flags == 0 && kernel_reads(s)) return ::readv(s.fd, iov, count);
  // Kernel TCP until the connection earns a channel: one kernel call, counted.
  for (ssize_t n = 0; s.state.load() == phase::deferred && !s.asked.load();) {
    msghdr m{};
    m.msg_iov = const_cast<iovec*>(iov);
    m.msg_iovlen = static_cast<size_t>(count);
    auto call = [&] {
      return rw && flags == 0 ? ::readv(s.fd, iov, count) : ::recvmsg(s.fd, &m, flags);
    };
    if (deferred_call(s, call, (flags & MSG_PEEK) ? nullptr : &s.tcp_in, n,
                      {.blocking_read = !wants_no_wait(s, flags), .unwatched_read = true}))
      return n;
  }
  ssize_t total = 0;
  for (int i = 0; i < count; ++i) {
    if (iov[i].iov_len == 0) continue;
    int f = flags;
    if (total > 0 && !(flags & MSG_WAITALL)) f |= MSG_DONTWAIT;
    ssize_t n = receive(s, iov[i].iov_base, iov[i].iov_len, f);
    if (n < 0) return total > 0 ? total : -1;
    total += n;
    if (static_cast<size_t>(n) < iov[i].iov_len || (flags & MSG_PEEK)) break;
  }
  return total;
}

// Gather writes go out as one transfer when small enough to copy cheaply.
ssize_t transmit_vector(stream& s, const iovec* iov, int count, int flags, bool rw = false) {
  if (rw && flags == 0 && kernel_writes(s)) return ::writev(s.fd, iov, count);
  // Kernel TCP until the connection earns a channel: one kernel call, counted.
  for (ssize_t n = 0; s.state.load() == phase::deferred;) {
    msghdr m{};
    m.msg_iov = const_cast<iovec*>(iov);
    m.msg_iovlen = static_cast<size_t>(count);
    auto call = [&] {
      return rw && flags == 0 ? ::writev(s.fd, iov, count) : ::sendmsg(s.fd, &m, flags);
    };
    if (deferred_call(s, call, &s.tcp_out, n)) return n;
  }
  size_t total = 0;
  for (int i = 0; i < count; ++i) total += iov[i].iov_len;
  if (total <= 256 * 1024) {
    thread_local std::vector<char> staging;
    staging.resize(total);
    size_t at = 0;
    for (int i = 0; i < count; ++i) {
      if (iov[i].iov_len) std::memcpy(staging.data() + at, iov[i].iov_base, iov[i].iov_len);
      at += iov[i].iov_len;
    }
    return transmit(s, staging.data(), total, flags);
  }
  ssize_t done = 0;
  for (int i = 0; i < count; ++i) {
    if (iov[i].iov_len == 0) continue;
    ssize_t n = transmit(s, iov[i].iov_base, iov[i].iov_len, flags);
    if (n < 0) return done > 0 ? done : -1;
    done += n;
    if (static_cast<size_t>(n) < iov[i].iov_len) break;
  }
  return done;
}

// A stream whose bytes all go through the kernel needs none of our logic.
stream_ptr managed(int fd) {
  stream_ptr s = find(fd);
  if (s && s->state.load(std::memory_order_relaxed) == phase::plain && !s->stash) return nullptr;
  return s;
}

// --- Which connections may be accelerated (settings ports / exclude).
int port_of(const sockaddr* a) {
  if (!a) return -1;
  if (a->sa_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(a)->sin_port);
  if (a->sa_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(a)->sin6_port);
  return -1;
}

std::string address_of(const sockaddr* a) {
  char text[INET6_ADDRSTRLEN] = "";
  if (a && a->sa_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a)->sin_addr, text, sizeof text);
  if (a && a->sa_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr, text, sizeof text);
  return text;
}

// A list like "22,8000-8080,10.1.2.3": does it name `port` or `address`?
bool listed(const std::string& list, int port, const std::string& address) {
  std::size_t at = 0;
  while (at < list.size()) {
    std::size_t comma = list.find(',', at);
    std::string item = list.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    at = comma == std::string::npos ? list.size() : comma + 1;
    if (item.empty()) continue;
    if (item.find_first_not_of("0123456789-") != std::string::npos) {
      if (item == address) return true;
      continue;
    }
    int low = 0, high = 0;
    int fields = std::sscanf(item.c_str(), "%d-%d", &low, &high);
    if (fields == 1) high = low;
    if (fields >= 1 && port >= low && port <= high) return true;
  }
  return false;
}

// Whether a connection between `local` and `peer` may be accelerated.
// VMMC_SOCKETS_PORTS and VMMC_SOCKETS_EXCLUDE, read once.
const std::string& only_ports() {
  static const std::string only = core::setting_string(settings::ports);
  return only;
}
const std::string& excluded() {
  static const std::string never = core::setting_string(settings::exclude);
  return never;
}

// Without rules, nothing to look at: the peer's address as text (inet_ntop)
// was a tenth of the user time of a preloaded connection per request.
bool allowed(const sockaddr* local, const sockaddr* peer) {
  const std::string& only = only_ports();
  const std::string& never = excluded();
  if (only.empty() && never.empty()) return true;
  int ports[2] = {port_of(local), port_of(peer)};
  if (!never.empty()) {
    const std::string peer_address = address_of(peer);
    for (int p : ports)
      if (listed(never, p, peer_address)) return false;
  }
  if (only.empty()) return true;
  for (int p : ports)
    if (p >= 0 && listed(only, p, "")) return true;
  return false;
}

bool allowed_local(int fd, const sockaddr* peer) {
  if (only_ports().empty() && excluded().empty()) return true;  // no rule to ask about
  sockaddr_storage local{};
  socklen_t length = sizeof local;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) != 0) return true;
  return allowed(reinterpret_cast<sockaddr*>(&local), peer);
}
}  // namespace

int socket(int domain, int type, int protocol) {
  detail::api_call entered;
  int fd = ::socket(domain, type, protocol);
  if (fd >= 0 && enabled() && is_tcp(domain, type, protocol)) {
    auto s = adopt(fd, false);
    s->nonblocking.store(type & SOCK_NONBLOCK);
  }
  return fd;
}

int take_over(int fd) {
  detail::api_call entered;
  int type = 0, domain = 0, listening = 0;
  socklen_t length = sizeof type;
  sockaddr_storage peer{};
  socklen_t peer_length = sizeof peer;
  if (!enabled() || ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &length) != 0 ||
      ::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &(length = sizeof domain)) != 0 ||
      ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &(length = sizeof listening)) != 0 ||
      !is_tcp(domain, type, 0) || listening ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_length) == 0 ||
      errno != ENOTCONN) {
    errno = EINVAL;
    return -1;
  }
  // A stream already here that has left the idle phase belonged to an earlier
  // socket of this number, closed behind our back (a program that closes a
  // clnt_vc_create descriptor with libc's close under libvrpc_preload): the
  // kernel socket is new, so is its stream.
  if (stream_ptr old = find(fd); old && old->state.load() != phase::idle) forget(fd);
  if (!find(fd)) {
    auto s = adopt(fd, false);
    s->nonblocking.store(::fcntl(fd, F_GETFL) & O_NONBLOCK);
  }
  return 0;
}

int bind(int fd, const sockaddr* address, socklen_t length) {
  detail::api_call entered;
  return ::bind(fd, address, length);
}
namespace {
// A listener is entered in the presence table when it starts listening, or
// at its first accept (one inherited across exec, listening already).
void enter_listener(stream& s) {
  if (s.presence_cookie.load() != 0 || !enabled()) return;
  s.presence_cookie.store(presence::enter(s.fd));
}

// A client whose connection stays on this host enters its socket in the
// presence table before it connects (so that the server can tell it from a
// plain client), unless the listener it reaches is plain (looked up at most
// once a second per address: a load generator against a plain server pays
// nothing per connection). It asks for the upgrade only once the
// connection has earned a channel (handshake.cc). With
// VMMC_SOCKETS_UPGRADE_AFTER=0 it asks at once, so the server answers at
// its first call.
void enter_client(stream& s, const sockaddr* address, socklen_t length) {
  bool sized = (address->sa_family == AF_INET && length >= sizeof(sockaddr_in)) ||
               (address->sa_family == AF_INET6 && length >= sizeof(sockaddr_in6));
  if (!sized || !enabled()) return;
  // A connect() to the unspecified address (sockperf's default) reaches this
  // host's loopback: look for the listener there.
  sockaddr_storage loopback{};
  if (wildcard(address)) {
    std::memcpy(&loopback, address,
                address->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    if (address->sa_family == AF_INET)
      reinterpret_cast<sockaddr_in*>(&loopback)->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    else
      reinterpret_cast<sockaddr_in6*>(&loopback)->sin6_addr = in6addr_loopback;
    address = reinterpret_cast<const sockaddr*>(&loopback);
  }
  if (!peer_on_this_host(address)) {
    // Another host: kernel TCP for good where no fabric there beats it
    // (route.cc), decided now: no offer byte, and no system call to learn
    // the ends it would go to (two per connection).
    if (auto why = keep_on_tcp_to(false)) mark_plain(s, *why);
    return;
  }
  const bool at_once = upgrade_after() == 0;
  const presence::listener server = presence::listener_at(address, length, at_once);
  if (server == presence::listener::plain || (at_once && server != presence::listener::entered)) {
    s.fallback_reason.store(fallback::peer_plain);
    s.state.store(phase::plain);
    return;
  }
  const std::uint64_t cookie = presence::enter(s.fd);
  s.presence_cookie.store(cookie);
  if (cookie == 0) {
    s.fallback_reason.store(fallback::setup_failed);
    s.state.store(phase::plain);
    return;
  }
  s.ask_later.store(true);
  if (at_once) {
    presence::ask(cookie);
    s.asked.store(true);
  }
}

}  // namespace

int listen(int fd, int backlog) {
  detail::api_call entered;
  int r = ::listen(fd, backlog);
  // An excluded port's connections are never ours: accept() leaves them to
  // the kernel (kept only to be listed by vmmc-stat, as excluded).
  stream_ptr s = r == 0 ? find(fd) : nullptr;
  if (s) s->listening.store(true);
  if (s && !allowed_local(fd, nullptr)) {
    s->fallback_reason.store(fallback::excluded);
    s->state.store(phase::plain);
  } else if (s) {
    enter_listener(*s);
  }
  return r;
}

// The local end of a connection `listener` accepted: the listener's own
// address when that is one address (asked of the kernel once), else the
// kernel's answer for the connection (a wildcard listener's connections
// each have their own).
bool local_end_of(stream& listener, int client, sockaddr_storage& local, socklen_t& length) {
  if (!listener.listen_address_asked.load(std::memory_order_acquire)) {
    std::lock_guard lock(listener.setup_mutex);
    if (!listener.listen_address_asked.load()) {
      sockaddr_storage bound{};
      socklen_t bound_length = sizeof bound;
      if (::getsockname(listener.fd, reinterpret_cast<sockaddr*>(&bound), &bound_length) == 0 &&
          !wildcard(reinterpret_cast<const sockaddr*>(&bound))) {
        listener.local_end = bound;
        listener.ends_known.store(true, std::memory_order_release);
      }
      listener.listen_address_asked.store(true, std::memory_order_release);
    }
  }
  if (listener.ends_known.load(std::memory_order_acquire)) {
    local = listener.local_end;
    return true;
  }
  return ::getsockname(client, reinterpret_cast<sockaddr*>(&local), &length) == 0;
}

int accept4(int fd, sockaddr* address, socklen_t* length, int flags) {
  detail::api_call entered;
  // The peer's address comes with the connection, into the program's buffer
  // (then copied, unless cut short) or ours: no getpeername() per connection.
  sockaddr_storage peer{}, local{};
  socklen_t peer_length = sizeof peer, local_length = sizeof local;
  const bool programs_buffer = address && length;
  const socklen_t offered = programs_buffer ? *length : 0;
  int client = programs_buffer
                   ? ::accept4(fd, address, length, flags)
                   : ::accept4(fd, reinterpret_cast<sockaddr*>(&peer), &peer_length, flags);
  stream_ptr listener = client < 0 ? nullptr : find(fd);
  if (!listener) return client;
  if (listener->state.load() != phase::plain) enter_listener(*listener);
  int saved = errno;
  bool peer_named = true;
  if (programs_buffer) {
    peer_length = *length;
    if (peer_length <= offered && peer_length <= sizeof peer)
      std::memcpy(&peer, address, peer_length);
    else
      peer_named = ::getpeername(client, reinterpret_cast<sockaddr*>(&peer), &peer_length) == 0;
  }
  const bool local_named = local_end_of(*listener, client, local, local_length);
  const auto* peer_address = reinterpret_cast<const sockaddr*>(&peer);
  const auto* local_address = reinterpret_cast<const sockaddr*>(&local);
  const bool peer_here =
      peer_named && local_named && peer_on_this_host(peer_address, local_address);
  auto s = adopt(client, false);
  if (peer_named && local_named) keep_ends(*s, local, peer, peer_here);
  s->nonblocking.store(flags & SOCK_NONBLOCK);
  if (listener->fallback_reason.load() == fallback::excluded ||
      (peer_named && !allowed(nullptr, peer_address))) {
    // An excluded port or peer address: the kernel's alone.
    s->fallback_reason.store(fallback::excluded);
    s->state.store(phase::plain);
  } else if (auto why = keep_on_tcp_to(peer_here)) {
    // A client on another host that VMMC would not serve better: plain at
    // once (a server that speaks first then never waits for an offer).
    mark_plain(*s, *why);
  } else if (peer_here) {
    // A client on this host asks once its connection has earned a channel;
    // until then neither end puts a byte of ours on the wire or makes a
    // system call for it. The first call to look for the ask (look_for_ask)
    // is made by the process that serves the connection: a server that
    // forks per connection (postgres, sshd) upgrades it in the child.
    s->next_look.store(upgrade_after());
    s->state.store(phase::deferred);
  } else {
    // A client on another host offers in-band: decided by the first call,
    // in the process that makes it (as above).
    s->state.store(phase::undecided);
  }
  stat_publish(*s, true);
  errno = saved;
  return client;
}
int accept(int fd, sockaddr* address, socklen_t* length) {
  detail::api_call entered;
  return vmmc::sockets::accept4(fd, address, length, 0);
}

int connect(int fd, const sockaddr* address, socklen_t length) {
  detail::api_call entered;
  stream_ptr s = find(fd);
  if (s && s->state.load() == phase::idle && !allowed_local(fd, address)) {
    // Left to the kernel (kept only to be listed by vmmc-stat, as excluded).
    s->fallback_reason.store(fallback::excluded);
    s->state.store(phase::plain);
  }
  if (s && s->state.load() == phase::idle) enter_client(*s, address, length);
  int r = ::connect(fd, address, length);
  if (!s) return r;
  int saved = errno;
  s->is_client = true;
  if (s->state.load() == phase::plain) {
    // Once: a second connect() (a non-blocking connect's check, as ab and
    // APR make) changes nothing vmmc-stat shows.
    if ((r == 0 || saved == EINPROGRESS) && !s->connect_listed.exchange(true))
      stat_publish(*s, true, address, length);
    errno = saved;
    return r;
  }
  // On this host nothing happens until the connection earns a channel: no
  // look at it while it connects either.
  if (r == 0 || (s->ask_later.load() && (saved == EINPROGRESS || saved == EINTR))) {
    send_offer(*s);
  } else if (saved == EINPROGRESS || saved == EINTR) {
    s->state.store(phase::connecting);
  }
  if ((r == 0 || saved == EINPROGRESS) && !s->connect_listed.exchange(true))
    stat_publish(*s, true, address, length);
  errno = saved;
  return r;
}

// The last descriptor of a stream of ours goes (close(), or the process
// exits with it open).
void detail::end_stream(stream& s) {
  if (s.inherited.load()) {
    // The channel belongs to the parent, which may still use this socket:
    // neither end it nor tear it down from here.
    abandon(s.chan);
    return;
  }
  // Our channel (made here, also on a socket shared since fork(), which
  // this process decided): its peer reads every byte sent so far, then the
  // end of the stream.
  if (s.state.load() == phase::upgraded && s.out.on_channel() && !s.out.is_shut()) {
    std::lock_guard lock(s.write_mutex);
    (void)s.chan->close_write();
  }
  // Our answer to a client's ask, whole, before the end of the stream.
  if (s.state.load() == phase::upgraded && !s.is_client.load()) {
    std::lock_guard lock(s.write_mutex);
    (void)flush_answer(s, false);
  }
  // (A socket shared since fork() may live on in another process: only the
  // kernel knows which close is the last, so what the kernel holds is left
  // be; the presence entry too, harmless once the socket goes.)
  if (!s.shared.load()) {
    presence::remove(s.presence_cookie.exchange(0));
    discard_protocol_bytes(s);
  }
}

int close(int fd) {
  detail::api_call entered;
  if (find(fd)) {
    stream_ptr s = release_slot(fd);  // null while a dup of it stays open
    if (s) end_stream(*s);
    // The last reference tears the channel down (the peer's later sends fail).
  }
  forget_epoll_set(fd);
  if (fd >= 0) presence::descriptors_closing(fd, fd);
  return ::close(fd);
}

int close_range(unsigned int first, unsigned int last, int flags) {
  detail::api_call entered;
  if (!(flags & CLOSE_RANGE_CLOEXEC)) {
    // Our streams in the range close the way close() does; the kernel then
    // closes the rest.
    for (int fd : descriptors())
      if (static_cast<unsigned>(fd) >= first && static_cast<unsigned>(fd) <= last)
        vmmc::sockets::close(fd);
    forget_epoll_sets(first, last);
    presence::descriptors_closing(first, last);
  }
  return ::close_range(first, last, flags);
}

int dup(int fd) {
  detail::api_call entered;
  int copy = ::dup(fd);
  if (copy >= 0) {
    if (stream_ptr s = find(fd)) alias(copy, s);
    duplicated_epoll_set(fd, copy);
  }
  return copy;
}

int dup3(int fd, int target, int flags) {
  detail::api_call entered;
  if (fd == target) return ::dup3(fd, target, flags);  // EINVAL, as the kernel says
  stream_ptr s = find(fd);
  stream_ptr replaced = find(target) ? release_slot(target) : nullptr;  // closed silently
  if (target >= 0) presence::descriptors_closing(target, target);
  int r = ::dup3(fd, target, flags);
  if (r >= 0 && s) alias(target, s);
  if (r >= 0) duplicated_epoll_set(fd, target);  // or forgets a set `target` named
  return r;
}

int dup2(int fd, int target) {
  detail::api_call entered;
  if (fd == target) return ::dup2(fd, target);
  return vmmc::sockets::dup3(fd, target, 0);
}

namespace {
// With write_mutex held, our writes on the channel: their end goes there.
void end_writes_in_channel(stream& s) {
  (void)s.chan->close_write();
  // Our reader placed our hello and left its doorbell to our next write:
  // there is none, and the peer may sleep in the kernel on our raw bytes.
  // The end must reach it as a FIN would.
  if (s.switch_doorbell_owed) {
    s.switch_doorbell_owed = false;
    ring_doorbell(s);
  }
}
}  // namespace

int shutdown(int fd, int how) {
  detail::api_call entered;
  stream_ptr s = managed(fd);
  if (!s || s->state.load() != phase::upgraded) {
    // Our direction ends on TCP: it must never switch to a channel later.
    // Marked before the FIN: a reader that took the peer's answer meanwhile
    // placed our hello after it, which sent the peer to the channel for an
    // end only TCP carried (it waited there for ever, 1 fork-at-accept run
    // in about 100).
    const bool ends_writes = s && how != SHUT_RD;
    if (ends_writes) (void)s->out.shut_down();
    int r = ::shutdown(fd, how);
    if (ends_writes) {
      std::lock_guard lock(s->write_mutex);
      if (r != 0)
        s->out.shutdown_refused();
      else if (s->out.on_channel())
        end_writes_in_channel(*s);  // a hello placed before our mark
    }
    return r;
  }
  if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) {
    errno = EINVAL;
    return -1;
  }
  if (how != SHUT_WR) (void)s->in.shut_down();
  if (how != SHUT_RD && !s->out.is_shut()) {
    // As the kernel's: a writer blocked for space (a stopped reader) returns
    // at once with EPIPE or its count, rather than holding the lock we need.
    // Marked first: from here no hello is placed, and a direction still on
    // TCP ends there.
    (void)s->out.shut_down();
    if (s->chan) s->chan->stop_writing();
    // A writer in the kernel's send (our direction on TCP, its reader
    // stopped) keeps the lock until the reader reads: the kernel's shutdown
    // sends it back, as it would without us.
    bool tcp_ended = false;
    std::unique_lock lock(s->write_mutex, std::defer_lock);
    while (!lock.try_lock_for(std::chrono::milliseconds(1)))
      if (!tcp_ended && s->sending_on_tcp.load()) {
        if (::shutdown(fd, SHUT_WR) != 0) return -1;
        tcp_ended = true;
      }
    auto end_tcp = [&] { return tcp_ended ? 0 : ::shutdown(fd, SHUT_WR); };
    if (s->out.reverted()) return end_tcp();
    if (s->out.switched()) {
      // The TCP connection stays open: it still carries our doorbells.
      end_writes_in_channel(*s);
    } else {
      s->hello_pending.store(false);  // this direction ends on TCP
      return end_tcp();
    }
  }
  return 0;
}

int getsockopt(int fd, int level, int name, void* value, socklen_t* length) {
  detail::api_call entered;
  if (level == IPPROTO_TCP && name == TCP_NODELAY && value && length && *length >= sizeof(int))
    if (stream_ptr s = find(fd); s && s->out.switched()) {
      *static_cast<int*>(value) = s->app_nodelay.load() ? 1 : 0;
      *length = sizeof(int);
      return 0;
    }
  return ::getsockopt(fd, level, name, value, length);
}

int setsockopt(int fd, int level, int name, const void* value, socklen_t length) {
  detail::api_call entered;
  int r = ::setsockopt(fd, level, name, value, length);
  if (r == 0 && level == IPPROTO_TCP && name == TCP_NODELAY && length >= sizeof(int)) {
    if (stream_ptr s = find(fd)) {
      s->app_nodelay.store(*static_cast<const int*>(value) != 0);
      if (s->out.switched()) nagle_off_for_doorbells(*s);
    }
  }
  if (r == 0 && level == SOL_SOCKET && (name == SO_RCVTIMEO || name == SO_SNDTIMEO)) {
    if (stream_ptr s = find(fd)) {
      (name == SO_RCVTIMEO ? s->receive_timeout : s->send_timeout).store(timeout_of(value, length));
    }
  }
  return r;
}

int getsockname(int fd, sockaddr* address, socklen_t* length) {
  detail::api_call entered;
  return ::getsockname(fd, address, length);
}
int getpeername(int fd, sockaddr* address, socklen_t* length) {
  detail::api_call entered;
  return ::getpeername(fd, address, length);
}

int fcntl(int fd, int command, long argument) {
  detail::api_call entered;
  int r = ::fcntl(fd, command, argument);
  if (r >= 0 && command == F_SETFL)
    if (stream_ptr s = find(fd)) s->nonblocking.store(argument & O_NONBLOCK);
  if (r >= 0 && (command == F_DUPFD || command == F_DUPFD_CLOEXEC)) {
    if (stream_ptr s = find(fd)) alias(r, s);
    duplicated_epoll_set(fd, r);
  }
  return r;
}

int ioctl(int fd, unsigned long request, void* argument) {
  detail::api_call entered;
  stream_ptr s = find(fd);
  if (s && request == FIONBIO && argument) {
    int r = ::ioctl(fd, request, argument);
    if (r == 0) s->nonblocking.store(*static_cast<int*>(argument) != 0);
    return r;
  }
  if (s && request == FIONREAD && argument) {
    if (s->state.load() == phase::undecided) try_decide(*s, false);
    const phase p = s->state.load();
    if (p == phase::plain || p == phase::deferred || (raw_prefix_done(*s) && input_on_tcp(*s))) {
      // Back on TCP: what we took off the connection, then the kernel's.
      int* count = static_cast<int*>(argument);
      if (::ioctl(fd, FIONREAD, count) != 0) return -1;
      *count += static_cast<int>(std::min<size_t>(stash_size(*s), INT32_MAX / 2));
      return 0;
    }
    if (s->state.load() == phase::upgraded) {
      int* count = static_cast<int*>(argument);
      if (raw_prefix_done(*s)) {
        *count = static_cast<int>(std::min<size_t>(s->chan->readable(), INT32_MAX));
        return 0;
      }
      if (::ioctl(fd, FIONREAD, count) != 0) return -1;
      int at_mark = 0;
      if (::ioctl(fd, SIOCATMARK, &at_mark) == 0 && at_mark) {
        // The kernel counts only up to an urgent byte (the peer's offer) at
        // the head; what follows it is what a read returns.
        // On the heap: a thread_local buffer this size would come out of
        // every thread's stack as static TLS (small-stack threads fail).
        constexpr std::size_t peek_max = 65536;
        auto scratch = std::make_unique<char[]>(peek_max);
        ssize_t n = ::recv(fd, scratch.get(), peek_max, MSG_PEEK | MSG_DONTWAIT);
        *count = n > 0 ? static_cast<int>(n) : 0;
      }
      if (learn_peer_raw(*s)) {
        std::uint64_t remaining = *s->peer_raw - s->tcp_in.load();
        *count = static_cast<int>(
            std::min<std::uint64_t>(static_cast<std::uint64_t>(*count), remaining));
      }
      return 0;
    }
  }
  return ::ioctl(fd, request, argument);
}

ssize_t read(int fd, void* buffer, size_t length) {
  detail::api_call entered;
  stream_ptr s = managed(fd);
  return s ? receive(*s, buffer, length, 0, /*rw=*/true) : ::read(fd, buffer, length);
}
ssize_t write(int fd, const void* buffer, size_t length) {
  detail::api_call entered;
  stream_ptr s = managed(fd);
  return s ? transmit(*s, buffer, length, 0, /*rw=*/true) : ::write(fd, buffer, length);
}
ssize_t recv(int fd, void* buffer, size_t length, int flags) {
  detail::api_call entered;
  stream_ptr s = managed(fd);
  return s ? receive(*s, buffer, length, flags) : ::recv(fd, buffer, length, flags);
}
ssize_t send(int fd, const void* buffer, size_t length, int flags) {
  detail::api_call entered;
  stream_ptr s = managed(fd);
  return s ? transmit(*s, buffer, length, flags) : ::send(fd, buffer, length, flags);
}
ssize_t recvfrom(int fd, void* buffer, size_t length, int flags, sockaddr* address,
                 socklen_t* address_length) {
  detail::api_call entered;
  stream_ptr s = managed(fd);
  if (!s) return ::recvfrom(fd, buffer, length, flags, address, address_length);
  if (address_length) *address_length = 0;  // stream sockets report no source
  return receive(*s, buffer, length, flags);
}
ssize_t sendto(int fd, const void* buffer, size_t length, int flags, const sockaddr* address,
               socklen_t address_length) {
  detail::api_call entered;
  stream_ptr s = managed(fd);
  if (!s) return ::sendto(fd, buffer, length, flags, address, address_length);
  return transmit(*s, buffer, length, flags);  // connected TCP ignores the address
}
ssize_t readv(int fd, const iovec* iov, int count) {
  detail::api_call entered;
  stream_ptr s = managed(fd);
  return s ? receive_vector(*s, iov, count, 0, /*rw=*/true) : ::readv(fd, iov, count);
}
ssize_t writev(int fd, const iovec* iov, int count) {
  detail::api_call entered;
  stream_ptr s = managed(fd);
  return s ? transmit_vector(*s, iov, count, 0, /*rw=*/true) : ::writev(fd, iov, count);
}
ssize_t recvmsg(int fd, msghdr* message, int flags) {
  detail::api_call entered;
  stream_ptr s = managed(fd);
  if (!s || kernel_reads(*s)) return ::recvmsg(fd, message, flags);
  message->msg_namelen = 0;
  message->msg_controllen = 0;
  message->msg_flags = 0;
  return receive_vector(*s, message->msg_iov, static_cast<int>(message->msg_iovlen), flags);
}
ssize_t sendmsg(int fd, const msghdr* message, int flags) {
  detail::api_call entered;
  stream_ptr s = managed(fd);
  if (s && message->msg_controllen) stay_on_tcp(*s);  // ancillary data only the kernel carries
  if (!s || message->msg_controllen || kernel_writes(*s)) return ::sendmsg(fd, message, flags);
  return transmit_vector(*s, message->msg_iov, static_cast<int>(message->msg_iovlen), flags);
}

ssize_t sendfile(int out_fd, int in_fd, off_t* offset, size_t count) {
  detail::api_call entered;
  stream_ptr s = managed(out_fd);
  if (!s) return ::sendfile(out_fd, in_fd, offset, count);
  // Kernel TCP until the connection earns a channel: the kernel's sendfile,
  // counted like a write, in pieces, so that a large file moves on to the
  // channel once the connection has one.
  size_t done = 0;
  for (ssize_t n = 0; done < count && s->state.load() == phase::deferred;) {
    const size_t piece = std::min<size_t>(count - done, 256 << 10);
    auto call = [&] { return ::sendfile(out_fd, in_fd, offset, piece); };
    if (!deferred_call(*s, call, &s->tcp_out, n)) continue;
    if (n <= 0) return done > 0 ? static_cast<ssize_t>(done) : n;
    done += static_cast<size_t>(n);
    if (static_cast<size_t>(n) < piece) return static_cast<ssize_t>(done);
  }
  if (done == count) return static_cast<ssize_t>(done);
  auto more = [&](ssize_t n) {
    if (n < 0) return done > 0 ? static_cast<ssize_t>(done) : n;
    return static_cast<ssize_t>(done + static_cast<size_t>(n));
  };
  if (s->state.load() == phase::plain && !s->stash)
    return more(::sendfile(out_fd, in_fd, offset, count - done));
  count -= done;
  // Read at an explicit position, so that bytes the socket did not take are
  // not consumed from the file either.
  off_t at = offset ? *offset : ::lseek(in_fd, 0, SEEK_CUR);
  if (at < 0) return more(-1);
  thread_local std::vector<char> chunk(1 << 18);
  size_t moved = 0;
  while (moved < count) {
    ssize_t got = ::pread(in_fd, chunk.data(), std::min(chunk.size(), count - moved), at);
    if (got <= 0) {
      if (got < 0 && moved == 0) return more(-1);
      break;
    }
    ssize_t sent = transmit(*s, chunk.data(), static_cast<size_t>(got), 0);
    if (sent <= 0) {
      if (moved == 0) return more(-1);
      break;
    }
    moved += static_cast<size_t>(sent);
    at += sent;
    if (sent < got) break;
  }
  if (offset) {
    *offset = at;
  } else {
    ::lseek(in_fd, at, SEEK_SET);
  }
  return more(static_cast<ssize_t>(moved));
}

int recvmmsg(int fd, mmsghdr* messages, unsigned int count, int flags, timespec* timeout) {
  detail::api_call entered;
  stream_ptr s = managed(fd);
  if (!s) return ::recvmmsg(fd, messages, count, flags, timeout);
  // A stream has no message boundaries: each entry takes what is there; only
  // the first may wait (the timeout, as Linux's, is checked between entries).
  unsigned int done = 0;
  for (; done < count; ++done) {
    int f = flags & ~MSG_WAITFORONE;
    if (done > 0 && (flags & MSG_WAITFORONE)) f |= MSG_DONTWAIT;
    if (done > 0) f |= MSG_DONTWAIT;
    ssize_t n = vmmc::sockets::recvmsg(fd, &messages[done].msg_hdr, f);
    if (n < 0) return done > 0 ? static_cast<int>(done) : -1;
    messages[done].msg_len = static_cast<unsigned int>(n);
    if (n == 0) return static_cast<int>(done + 1);
  }
  return static_cast<int>(done);
}

int sendmmsg(int fd, mmsghdr* messages, unsigned int count, int flags) {
  detail::api_call entered;
  stream_ptr s = managed(fd);
  if (!s) return ::sendmmsg(fd, messages, count, flags);
  unsigned int done = 0;
  for (; done < count; ++done) {
    ssize_t n = vmmc::sockets::sendmsg(fd, &messages[done].msg_hdr, flags);
    if (n < 0) return done > 0 ? static_cast<int>(done) : -1;
    messages[done].msg_len = static_cast<unsigned int>(n);
  }
  return static_cast<int>(done);
}

int describe_line(int fd, char* out, size_t length) {
  detail::api_call entered;
  auto info = describe(fd);
  if (!info) return -1;
  int n = std::snprintf(out, length,
                        "accelerated=%d plain=%d path=%s tcp_in=%llu tcp_out=%llu vmmc_in=%llu "
                        "vmmc_out=%llu",
                        info->accelerated, info->plain, info->path.c_str(),
                        static_cast<unsigned long long>(info->tcp_bytes_in),
                        static_cast<unsigned long long>(info->tcp_bytes_out),
                        static_cast<unsigned long long>(info->bytes_in),
                        static_cast<unsigned long long>(info->bytes_out));
  return n;
}

int wakeup_descriptor(int fd, int limit) {
  detail::api_call entered;
  stream_ptr s = find(fd);
  const int wait_fd = s ? wait_fd_of(*s) : -1;
  if (wait_fd < 0) {
    errno = s ? ENOTCONN : EBADF;
    return -1;
  }
  // A copy: the channel's own closes with the channel, and a number the
  // caller polls must not come to name another file meanwhile.
  const int copy = ::fcntl(wait_fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return -1;
  if (copy >= limit) {
    ::close(copy);
    errno = EMFILE;
    return -1;
  }
  s->sleeps_in_our_waits.store(true, std::memory_order_relaxed);
  return copy;
}

std::optional<socket_info> describe(int fd) {
  detail::api_call entered;
  stream_ptr s = find(fd);
  if (!s) return std::nullopt;
  socket_info info{};
  // Kernel TCP for good with no reason to fall back (the connection ended,
  // or was shut down, before it earned a channel) is no plain peer.
  info.plain = s->state.load() == phase::plain && s->fallback_reason.load() != fallback::none;
  if (info.plain) info.why = fallback_text(s->fallback_reason.load());
  info.accelerated =
      s->state.load() == phase::upgraded && s->out.on_channel() && s->in.on_channel();
  info.path = info.accelerated && s->chan && s->chan->connected() ? s->chan->path() : "tcp";
  info.tcp_bytes_in = s->tcp_in.load();
  info.tcp_bytes_out = s->tcp_out.load();
  if (s->state.load() == phase::upgraded && s->chan && !s->inherited.load()) {
    auto c = s->chan->stats();
    info.bytes_in = c.bytes_received;
    info.bytes_out = c.bytes_sent;
    info.bytes_copied = c.bytes_copied;
    info.bytes_redirected = c.bytes_redirected;
    info.doorbells_out = c.doorbells_rung;
  }
  info.doorbells_in = s->doorbells_in.load();
  return info;
}

}  // namespace vmmc::sockets
