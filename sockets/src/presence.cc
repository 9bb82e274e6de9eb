// The presence tables (presence.h): one shared file per user, looked up
// through sock_diag.
#include "presence.h"

#include <fcntl.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>

#include "sockets.h"

namespace vmmc::sockets::detail::presence {
namespace {

// --- The table: 2048 buckets of 8 slots, a slot a cookie, the pid that
// entered it (to take over slots of dead processes when a bucket is full)
// and whether it asks for the upgrade. A cookie may sit in either of two
// buckets (two halves of one hash) and goes to the emptier: with one
// bucket per cookie, 2,000 entries (a process with 1,000 connections on
// this host: an eighth of the table) overflow some bucket in one run of
// 500, and 4,000 in two of five (a connection then stays kernel TCP); with
// two, 12,000 entries overflow in one run of 17. (A process built before this
// looks in the first bucket only: it misses some entries, so the
// connection stays kernel TCP, never anything worse.)
constexpr std::uint64_t table_magic = 0x31434e4553455250;  // "PRESENC1"
constexpr std::uint32_t bucket_count = 2048, slots_per_bucket = 8;
struct slot {
  std::atomic<std::uint64_t> cookie;
  std::atomic<std::int32_t> pid;
  std::atomic<std::uint32_t> asking;
};
struct table {
  std::uint64_t magic;
  std::uint32_t buckets, ways;
  slot slots[bucket_count * slots_per_bucket];
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);

std::array<slot*, 2> buckets_of(const table& t, std::uint64_t cookie) {
  std::uint64_t x = cookie + 0x9e3779b97f4a7c15;  // splitmix64: cookies count up
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9;
  x = (x ^ (x >> 27)) * 0x94d049bb133111eb;
  x ^= x >> 31;
  auto* slots = const_cast<slot*>(t.slots);
  return {&slots[(x % bucket_count) * slots_per_bucket],
          &slots[((x >> 32) % bucket_count) * slots_per_bucket]};
}

// The slot that holds `cookie`, or null.
slot* slot_of(const table& t, std::uint64_t cookie) {
  for (slot* b : buckets_of(t, cookie))
    for (std::uint32_t i = 0; i < slots_per_bucket; ++i)
      if (b[i].cookie.load(std::memory_order_acquire) == cookie) return &b[i];
  return nullptr;
}

std::uint32_t used_slots(const slot* b) {
  std::uint32_t used = 0;
  for (std::uint32_t i = 0; i < slots_per_bucket; ++i) used += b[i].cookie.load() != 0;
  return used;
}

std::string path_for(uid_t uid) {
  std::string base = core::setting_string(settings::stat_dir);
  if (base.empty()) return {};
  return base + "/vmmc-presence-" + std::to_string(uid);
}

// Maps `uid`'s table if it is what it should be: a regular file of that
// user that nobody else may write (another user's file in its place, made
// first to vouch for sockets not its own, is refused).
table* map_table(uid_t uid, bool writable) {
  std::string path = path_for(uid);
  if (path.empty()) return nullptr;
  int fd = ::open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st {};
  void* at = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == uid && (st.st_mode & 022) == 0 &&
      st.st_size == static_cast<off_t>(sizeof(table)))
    at = ::mmap(nullptr, sizeof(table), PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
  ::close(fd);
  if (at == MAP_FAILED) return nullptr;
  auto* t = static_cast<table*>(at);
  if (t->magic != table_magic || t->buckets != bucket_count || t->ways != slots_per_bucket) {
    ::munmap(at, sizeof(table));
    return nullptr;
  }
  return t;
}

// Our user's table, made whole under a temporary name and then linked into
// place, so that no process ever maps a half-made one.
table* make_own_table() {
  const uid_t uid = ::geteuid();
  if (table* t = map_table(uid, true)) return t;
  std::string path = path_for(uid);
  if (path.empty()) return nullptr;
  std::string temporary = path + "." + std::to_string(::getpid());
  int fd = ::open(temporary.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return nullptr;
  const std::uint32_t header[] = {static_cast<std::uint32_t>(table_magic),
                                  static_cast<std::uint32_t>(table_magic >> 32), bucket_count,
                                  slots_per_bucket};
  bool made = ::fchmod(fd, 0644) == 0 && ::ftruncate(fd, sizeof(table)) == 0 &&
              ::pwrite(fd, header, sizeof header, 0) == static_cast<ssize_t>(sizeof header);
  ::close(fd);
  if (made && ::link(temporary.c_str(), path.c_str()) != 0 && errno != EEXIST) made = false;
  ::unlink(temporary.c_str());
  if (!made) return nullptr;
  table* t = map_table(uid, true);
  if (!t) log(1, "presence table %s is not this user's alone: no upgrades", path.c_str());
  return t;
}

// Our user's table. A process that changes its user (a server that starts
// as root and drops to its own) enters its later sockets in the new user's
// table, whose owner they are. The former user's mapping stays as it is (a
// thread may be using it).
struct own_table_state {
  uid_t uid = 0;
  table* mapped = nullptr;
  bool failed = false;
};
std::mutex own_mutex;  // made again in a fork() child (install_child_handler)
own_table_state own_state;
std::atomic<table*> own{nullptr};

void install_child_handler();

// getpid() once per process (fork() children again, install_child_handler).
std::atomic<std::int32_t> cached_pid{0};
std::int32_t own_pid() {
  std::int32_t pid = cached_pid.load(std::memory_order_relaxed);
  if (pid == 0) cached_pid.store(pid = ::getpid(), std::memory_order_relaxed);
  return pid;
}

// geteuid() is a system call: asked at the first socket entered (in a
// fork() child too) and every 64th after it. Until a change of user is
// noticed, sockets go to the former user's table, where no server looks for
// sockets of the new one: those connections stay kernel TCP.
std::atomic<std::uint32_t> entered_since_uid_check{0};

table* own_table() {
  install_child_handler();
  if (table* t = own.load(std::memory_order_acquire))
    if (entered_since_uid_check.fetch_add(1, std::memory_order_relaxed) % 64 != 0) return t;
  const uid_t uid = ::geteuid();
  std::lock_guard lock(own_mutex);
  if (own_state.uid != uid || (!own_state.mapped && !own_state.failed)) {
    own_state = {uid, make_own_table(), false};
    own_state.failed = !own_state.mapped;
    own.store(own_state.mapped, std::memory_order_release);
  }
  return own_state.mapped;
}

// The tables looked in (any user's, ours too: no geteuid() per lookup),
// mapped read-only on first need and kept. A user without one is looked
// for again next time (it may start a vmmc process).
struct other_table {
  std::atomic<std::uint64_t> key{0};  // uid + 1
  std::atomic<table*> mapped{nullptr};
};
other_table others[32];

// `uid`'s table; `unmap` set when it had no place among the kept ones (more
// users than places, or a race): the caller unmaps it after use.
const table* table_of(uid_t uid, bool& unmap) {
  unmap = false;
  const std::uint64_t key = std::uint64_t{uid} + 1;
  for (auto& o : others)
    if (o.key.load(std::memory_order_acquire) == key)
      if (table* t = o.mapped.load()) return t;
  table* t = map_table(uid, false);
  if (!t) return nullptr;
  for (auto& o : others) {
    std::uint64_t none = 0;
    if (o.key.compare_exchange_strong(none, key)) {
      o.mapped.store(t);
      return t;
    }
    if (none == key) break;  // another thread is placing its own mapping
  }
  unmap = true;
  return t;
}

entry entry_in(uid_t uid, std::uint64_t cookie) {
  bool unmap = false;
  const table* t = cookie == 0 ? nullptr : table_of(uid, unmap);
  if (!t) return entry::absent;
  entry found = entry::absent;
  if (const slot* s = slot_of(*t, cookie)) switch (s->asking.load(std::memory_order_acquire)) {
      case 0:
        found = entry::entered;
        break;
      case 1:
        found = entry::asking;
        break;
      default:
        found = entry::declined;
        break;
    }
  if (unmap) ::munmap(const_cast<table*>(t), sizeof(table));
  return found;
}

// --- sock_diag: the owner and cookie of a TCP socket of this network
// namespace, by its addresses as that socket sees them.
struct endpoint {
  int family = 0;  // AF_INET or AF_INET6 (v4-mapped addresses as AF_INET)
  std::uint32_t address[4] = {};
  std::uint16_t port = 0;  // network order
};

std::optional<endpoint> endpoint_of(const sockaddr* a, socklen_t length) {
  endpoint e;
  if (a->sa_family == AF_INET && length >= sizeof(sockaddr_in)) {
    auto* v4 = reinterpret_cast<const sockaddr_in*>(a);
    e.family = AF_INET;
    e.address[0] = v4->sin_addr.s_addr;
    e.port = v4->sin_port;
    return e;
  }
  if (a->sa_family != AF_INET6 || length < sizeof(sockaddr_in6)) return std::nullopt;
  auto* v6 = reinterpret_cast<const sockaddr_in6*>(a);
  e.port = v6->sin6_port;
  if (IN6_IS_ADDR_V4MAPPED(&v6->sin6_addr)) {
    e.family = AF_INET;
    std::memcpy(e.address, v6->sin6_addr.s6_addr + 12, 4);
  } else {
    e.family = AF_INET6;
    std::memcpy(e.address, v6->sin6_addr.s6_addr, 16);
  }
  return e;
}

// One netlink socket per process, made at its first lookup and kept: a
// socket and a close per connection cost more than the lookup. A fork()
// child closes its copy (parent's and child's replies would share one
// queue) and makes its own. A program that closes or overwrites the
// descriptor (close_range() in a daemon, dup2() onto it) makes us forget
// it first (descriptors_closing), so a lookup never writes to its file.
// (The socket answers for the network namespace it was made in: a thread
// that moves to another one with setns() gets answers for the old one.)
std::mutex diag_mutex;
std::atomic<int> diag_fd{-1};
std::uint32_t diag_sequence = 0;  // under diag_mutex

// A fork() child starts with unlocked mutexes and no lookup socket of its
// parent's. pthread_once, not a static initializer: a fork() during glibc's
// once runs it again in the child, where a static's guard would stay taken
// by a thread that is not there.
pthread_once_t child_handler_installed = PTHREAD_ONCE_INIT;
void install_child_handler() {
  ::pthread_once(&child_handler_installed, [] {
    ::pthread_atfork(nullptr, nullptr, [] {
      new (&own_mutex) std::mutex;
      new (&diag_mutex) std::mutex;
      cached_pid.store(0, std::memory_order_relaxed);
      entered_since_uid_check.store(0, std::memory_order_relaxed);
      if (int inherited = diag_fd.exchange(-1); inherited >= 0) ::close(inherited);
    });
  });
}

int diag_socket_locked() {
  int fd = diag_fd.load();
  if (fd < 0) {
    fd = ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    diag_fd.store(fd);
  }
  return fd;
}

// One exact lookup (no dump): the kernel finds the socket as it would for
// a packet, a listener included, and queues its one answer before sendto()
// returns.
std::optional<socket_id> socket_owner(const endpoint& local, const endpoint* remote, int states) {
  struct {
    nlmsghdr header;
    inet_diag_req_v2 request;
  } message{};
  message.header.nlmsg_len = sizeof message;
  message.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  message.header.nlmsg_flags = NLM_F_REQUEST;
  message.request.sdiag_family = static_cast<std::uint8_t>(local.family);
  message.request.sdiag_protocol = IPPROTO_TCP;
  message.request.idiag_states = static_cast<std::uint32_t>(states);
  message.request.id.idiag_sport = local.port;
  std::memcpy(message.request.id.idiag_src, local.address, sizeof local.address);
  if (remote) {
    message.request.id.idiag_dport = remote->port;
    std::memcpy(message.request.id.idiag_dst, remote->address, sizeof remote->address);
  }
  message.request.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  message.request.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  alignas(nlmsghdr) char reply[1024];
  install_child_handler();
  std::lock_guard lock(diag_mutex);
  const int fd = diag_socket_locked();
  if (fd < 0) return std::nullopt;
  message.header.nlmsg_seq = ++diag_sequence;
  if (::sendto(fd, &message, sizeof message, 0, reinterpret_cast<sockaddr*>(&kernel),
               sizeof kernel) != static_cast<ssize_t>(sizeof message)) {
    // Made unusable somehow (a full queue of stale answers): a new one next time.
    ::close(diag_fd.exchange(-1));
    return std::nullopt;
  }
  // Answers of earlier lookups left behind (a recv() cut short) are skipped.
  for (int stale = 0; stale < 16; ++stale) {
    ssize_t n;
    do n = ::recv(fd, reply, sizeof reply, MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    auto* h = reinterpret_cast<const nlmsghdr*>(reply);
    if (n < static_cast<ssize_t>(NLMSG_HDRLEN)) return std::nullopt;
    if (h->nlmsg_seq != message.header.nlmsg_seq) continue;
    if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
        n < static_cast<ssize_t>(NLMSG_LENGTH(sizeof(inet_diag_msg))))
      return std::nullopt;  // NLMSG_ERROR: no such socket
    inet_diag_msg diag;
    std::memcpy(&diag, reply + NLMSG_HDRLEN, sizeof diag);
    return socket_id{diag.idiag_uid,
                     diag.id.idiag_cookie[0] | std::uint64_t{diag.id.idiag_cookie[1]} << 32};
  }
  return std::nullopt;
}

using clock = std::chrono::steady_clock;
// Listeners looked up lately, by address, for a second: a client that
// connects again and again (a load generator, a proxy) asks the kernel once
// a second at connect. A vmmc server that takes a plain one's port over
// meanwhile gets plain connections from us for at most that long (correct,
// only not accelerated); what decides an ask is looked up afresh, a "plain"
// as well as an "entered" (a port given to another listener within the
// second: CI15's echo server took the port of the plain listener that had
// just measured a vmmc client's preamble, and its vmmc client stayed plain).
struct known_listener {
  endpoint at;
  listener kind;
  clock::time_point until;
};
std::mutex known_mutex;
known_listener known_listeners[8];
unsigned known_next = 0;  // under known_mutex: the entry replaced next

bool same(const endpoint& a, const endpoint& b) {
  return a.family == b.family && a.port == b.port &&
         std::memcmp(a.address, b.address, sizeof a.address) == 0;
}

std::optional<listener> known(const endpoint& at) {
  const auto now = clock::now();
  std::lock_guard lock(known_mutex);
  for (const known_listener& k : known_listeners)
    if (k.until > now && same(k.at, at)) return k.kind;
  return std::nullopt;
}

void remember(const endpoint& at, listener kind) {
  const auto until = clock::now() + std::chrono::seconds(1);
  std::lock_guard lock(known_mutex);
  for (known_listener& k : known_listeners)
    if (same(k.at, at)) {
      k = {at, kind, until};
      return;
    }
  known_listeners[known_next++ % std::size(known_listeners)] = {at, kind, until};
}

}  // namespace

std::uint64_t enter(int fd) {
  table* t = own_table();
  std::uint64_t cookie = 0;
  socklen_t length = sizeof cookie;
  if (!t || ::getsockopt(fd, SOL_SOCKET, SO_COOKIE, &cookie, &length) != 0 || cookie == 0) return 0;
  if (slot_of(*t, cookie)) return cookie;
  auto buckets = buckets_of(*t, cookie);
  if (used_slots(buckets[1]) < used_slots(buckets[0])) std::swap(buckets[0], buckets[1]);
  const std::int32_t pid = own_pid();
  for (int round = 0; round < 2; ++round) {
    for (slot* b : buckets) {
      for (std::uint32_t i = 0; i < slots_per_bucket; ++i) {
        std::uint64_t seen = b[i].cookie.load();
        // A free slot; in the second round, one whose process is gone.
        bool free = seen == 0;
        if (!free && round == 1) {
          std::int32_t holder = b[i].pid.load();
          free = holder > 0 && holder != pid && ::kill(holder, 0) != 0 && errno == ESRCH;
        }
        if (free && b[i].cookie.compare_exchange_strong(seen, cookie)) {
          b[i].asking.store(0);
          b[i].pid.store(pid);
          return cookie;
        }
      }
    }
  }
  log(2, "fd %d: presence table full; this socket is not entered", fd);
  return 0;
}

namespace {
void mark(std::uint64_t cookie, std::uint32_t value) {
  table* t = own.load(std::memory_order_acquire);
  if (!t || cookie == 0) return;
  if (slot* s = slot_of(*t, cookie)) s->asking.store(value, std::memory_order_release);
}
}  // namespace

void ask(std::uint64_t cookie) {
  mark(cookie, 1);
}

void decline(std::uint64_t cookie) {
  mark(cookie, 2);
}

void remove(std::uint64_t cookie) {
  table* t = own.load(std::memory_order_acquire);
  if (!t || cookie == 0) return;
  if (slot* s = slot_of(*t, cookie)) {
    std::uint64_t seen = cookie;
    (void)s->cookie.compare_exchange_strong(seen, 0);
  }
}

listener listener_at(const sockaddr* address, socklen_t length, bool fresh) {
  auto to = endpoint_of(address, length);
  if (!to) return listener::none;
  if (auto kind = known(*to); kind && !fresh) return *kind;
  auto found = socket_owner(*to, nullptr, 1 << TCP_LISTEN);
  if (!found) return listener::none;  // none there now: the connection will say
  const listener kind =
      entry_in(found->uid, found->cookie) != entry::absent ? listener::entered : listener::plain;
  remember(*to, kind);
  return kind;
}

void descriptors_closing(unsigned first, unsigned last) {
  auto ours = [&] {
    const int fd = diag_fd.load(std::memory_order_relaxed);
    return fd >= 0 && static_cast<unsigned>(fd) >= first && static_cast<unsigned>(fd) <= last;
  };
  if (!ours()) return;
  std::lock_guard lock(diag_mutex);  // not while a lookup uses it
  if (ours()) diag_fd.store(-1);     // the program's call closes it
}

std::optional<socket_id> peer_socket(const sockaddr* local, socklen_t local_length,
                                     const sockaddr* peer, socklen_t peer_length) {
  auto ours = endpoint_of(local, local_length);
  auto theirs = endpoint_of(peer, peer_length);
  if (!ours || !theirs) return std::nullopt;
  return socket_owner(*theirs, &*ours, ~0);
}

entry entry_of(const socket_id& socket) {
  return entry_in(socket.uid, socket.cookie);
}

}  // namespace vmmc::sockets::detail::presence
