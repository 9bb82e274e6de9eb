// Publishing this process's connections for vmmc-stat (stat_page.h,
// vmmc/sockets/stat.h): the file, its rows, and the thread that refreshes
// the counters when a reader asks.
//
// Nothing here runs on the data path: rows are written when a connection is
// made, decided or closed (calls.cc, handshake.cc, table.cc), and the byte
// counters the streams and channels keep anyway are copied in only when
// vmmc-stat asks. The file is made at the first connection; its descriptor
// is closed at once (the program sees none of ours), and it is removed at
// exit. After fork() the child publishes in a file of its own.
#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "sockets.h"
#include "stat_page.h"
#include "wire.h"

namespace vmmc::sockets::detail {

bool stat_page::proc_stat(const char* path, long& id, std::uint64_t& start_time) {
  char buffer[1024];
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t n = ::read(fd, buffer, sizeof buffer - 1);
  ::close(fd);
  if (n <= 0) return false;
  buffer[n] = '\0';
  // The fields after the command (which may hold spaces and parentheses):
  // state is field 3, the start time field 22.
  const char* p = std::strrchr(buffer, ')');
  unsigned long long start = 0;
  int field = 2;
  for (p = p ? p + 1 : buffer + n; *p && field < 22; ++p)
    if (*p == ' ') ++field;
  if (field != 22 || std::sscanf(p, "%llu", &start) != 1 || std::sscanf(buffer, "%ld", &id) != 1)
    return false;
  start_time = start;
  return true;
}

std::uint64_t stat_page::start_time(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  long id = 0;
  std::uint64_t start = 0;
  return proc_stat(path, id, start) ? start : 0;
}

namespace {
namespace page = stat_page;

// errno is the program's: none of this may change it.
struct keep_errno {
  int saved = errno;
  ~keep_errno() { errno = saved; }
};

void own_command(char* out, std::size_t length) {
  out[0] = '\0';
  int fd = ::open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ssize_t n = ::read(fd, out, length - 1);
  ::close(fd);
  if (n <= 0) return;
  while (n > 0 && out[n - 1] == '\0') --n;
  for (ssize_t i = 0; i < n; ++i)
    if (out[i] == '\0') out[i] = ' ';
  out[n] = '\0';
}

page::endpoint endpoint_of(const sockaddr_storage& a) {
  page::endpoint e{};
  if (a.ss_family == AF_INET) {
    auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    e.family = AF_INET;
    e.port = ntohs(v4->sin_port);
    std::memcpy(e.address, &v4->sin_addr, 4);
  } else if (a.ss_family == AF_INET6) {
    auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    e.family = AF_INET6;
    e.port = ntohs(v6->sin6_port);
    std::memcpy(e.address, &v6->sin6_addr, 16);
  }
  return e;
}

struct publisher {
  std::mutex mutex;  // one writer of rows and header counters at a time
  page::header* header = nullptr;
  std::size_t bytes = 0;
  std::string path;
  std::uint32_t rows = 0;
  std::vector<bool> allocated;        // pages of rows backed by memory
  std::vector<const stream*> owners;  // the stream each row describes
  bool refresher_started = false;
  pid_t owner = 0;                   // getpid() of the process that made it
  publisher* before_fork = nullptr;  // the parent's, kept reachable
  page::row* row_at(std::uint32_t i) {
    return reinterpret_cast<page::row*>(reinterpret_cast<char*>(header) + page::header_bytes +
                                        std::size_t{i} * page::row_bytes);
  }
};

std::atomic<publisher*> current{nullptr};
publisher* from_parent = nullptr;  // the parent's publisher, in a fork() child
std::mutex creation;
bool creation_failed = false;  // no file in this process (setting off, or an error)

void removed_at_exit() {
  publisher* p = current.load();
  if (p && p->owner == ::getpid()) ::unlink(p->path.c_str());
}

// The child's rows are its own: the parent's publisher (its lock possibly
// held by a thread that does not exist here) is left alone.
void child_after_fork() {
  from_parent = current.load();
  current.store(nullptr);
  new (&creation) std::mutex;  // a thread of the parent may have held it
  creation_failed = false;
}

std::string directory_for_user() {
  std::string base = core::setting_string(settings::stat_dir);
  if (base.empty()) return {};
  std::string dir = base + "/vmmc-" + std::to_string(::geteuid());
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return {};
  struct stat st {};
  // Ours alone: another user's folder (made first to catch our files) is refused.
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() ||
      (st.st_mode & 077) != 0)
    return {};
  return dir;
}

// Files of processes that died without removing theirs (killed): a few at a
// time, so that a folder full of them costs a bounded start.
void sweep(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  int looked = 0;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.' || ++looked > 256) continue;
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (!end || *end || pid <= 0) continue;
    // Gone, or its pid taken by a later process, as /proc (which names the
    // files) and kill() both see it: in a pid namespace of its own with the
    // host's /proc, a process sees other processes in /proc only.
    std::uint64_t now = stat_page::start_time(static_cast<pid_t>(pid));
    bool gone = now == 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
    if (!gone && now != 0) {
      int fd = ::openat(::dirfd(d), e->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0) continue;
      page::header h{};
      bool read = ::pread(fd, &h, sizeof h, 0) == static_cast<ssize_t>(sizeof h);
      ::close(fd);
      gone = read && h.start_time != 0 && h.start_time != now;
    }
    if (gone) ::unlinkat(::dirfd(d), e->d_name, 0);
  }
  ::closedir(d);
}

// Backs the page of rows holding row `i` with memory (reopening the file: we
// keep no descriptor). False if /dev/shm is full: the row is not shown.
bool allocate_row(publisher& p, std::uint32_t i) {
  std::size_t page_index = std::size_t{i} * page::row_bytes / 4096;
  if (p.allocated[page_index]) return true;
  int fd = ::open(p.path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok =
      ::fallocate(fd, 0, static_cast<off_t>(page::header_bytes + page_index * 4096), 4096) == 0;
  ::close(fd);
  if (ok) p.allocated[page_index] = true;
  return ok;
}

publisher* create() {
  std::string dir = directory_for_user();
  if (dir.empty()) return nullptr;
  sweep(dir);
  // Named by the pid /proc shows (a pid namespace may have the host's /proc),
  // which readers check for liveness.
  long pid = 0;
  std::uint64_t start = 0;
  if (!stat_page::proc_stat("/proc/self/stat", pid, start)) return nullptr;
  auto p = std::make_unique<publisher>();
  p->owner = ::getpid();
  p->path = dir + "/" + std::to_string(pid);
  rlimit limit{};
  rlim_t wanted = ::getrlimit(RLIMIT_NOFILE, &limit) == 0 ? limit.rlim_cur : 1024;
  p->rows = static_cast<std::uint32_t>(std::clamp<rlim_t>(wanted, 64, page::max_rows));
  p->bytes = page::header_bytes + std::size_t{p->rows} * page::row_bytes;
  p->allocated.assign((p->bytes - page::header_bytes + 4095) / 4096, false);
  p->owners.assign(p->rows, nullptr);
  ::unlink(p->path.c_str());  // an image before exec(), or a dead process of this pid
  int fd = ::open(p->path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return nullptr;
  void* m = MAP_FAILED;
  if (::ftruncate(fd, static_cast<off_t>(p->bytes)) == 0 &&
      ::fallocate(fd, 0, 0, page::header_bytes) == 0)
    m = ::mmap(nullptr, p->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) {
    ::unlink(p->path.c_str());
    return nullptr;
  }
  p->header = static_cast<page::header*>(m);
  page::header& h = *p->header;
  h.version = page::version;
  h.row_size = page::row_bytes;
  h.row_count = p->rows;
  h.pid = static_cast<std::int32_t>(pid);
  h.uid = ::geteuid();
  h.start_time = start;
  own_command(h.command, sizeof h.command);
  std::atomic_thread_fence(std::memory_order_release);
  std::memcpy(h.magic, page::magic, sizeof h.magic);  // complete from here on
  p->before_fork = from_parent;
  static bool handlers = false;  // inherited by fork() children, which keep them
  if (!handlers) {
    handlers = true;
    std::atexit(removed_at_exit);
    ::pthread_atfork(nullptr, nullptr, child_after_fork);
  }
  return p.release();
}

publisher* get(bool create_if_missing) {
  publisher* p = current.load(std::memory_order_acquire);
  if (p || !create_if_missing) return p;
  std::lock_guard lock(creation);
  p = current.load();
  if (p || creation_failed) return p;
  if (!core::setting_bool(settings::stat) || !(p = create())) {
    creation_failed = true;
    return nullptr;
  }
  current.store(p, std::memory_order_release);
  return p;
}

// Changes row `r` with `change` while its sequence word is odd: a reader
// that saw it odd, or changed, reads the row again.
template <class Change>
void change_row(page::row& r, Change change) {
  std::uint32_t s = r.sequence.load(std::memory_order_relaxed);
  r.sequence.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  change();
  r.sequence.store(s + 2, std::memory_order_release);
}

void write_row(page::row& r, const page::row& value) {
  change_row(r, [&] {
    // Every field but the sequence word.
    constexpr std::size_t skip = sizeof(std::atomic<std::uint32_t>);
    std::memcpy(reinterpret_cast<char*>(&r) + skip, reinterpret_cast<const char*>(&value) + skip,
                sizeof(page::row) - skip);
  });
}

// The row describing `s` now; false for a stream that is no connection yet.
bool describe_row(stream& s, page::row& r) {
  phase ph = s.state.load();
  fallback why = s.fallback_reason.load();
  std::string path = "tcp";
  page::row_state state = page::row_state::tcp;
  r.tcp_bytes_in = s.tcp_in.load(std::memory_order_relaxed);
  r.tcp_bytes_out = s.tcp_out.load(std::memory_order_relaxed);
  switch (ph) {
    case phase::idle:
      if (why == fallback::none) return false;  // not connected yet
      break;
    case phase::connecting:
      state = why == fallback::none ? page::row_state::connecting : page::row_state::tcp;
      break;
    case phase::undecided:
      state = page::row_state::undecided;
      break;
    case phase::deferred:
      // A client whose server answered (across hosts) or that asked (on
      // this host): its channel comes with use. Otherwise neither end knows
      // yet whether the other speaks vmmc.
      state = s.is_client.load() && (!s.ask_later.load() || s.asked.load())
                  ? page::row_state::upgrading
                  : page::row_state::undecided;
      break;
    case phase::plain:
      if (why == fallback::none && (s.out.reverted() || s.in.reverted())) why = fallback::reverted;
      break;
    case phase::upgraded: {
      // The channel is set before the phase says upgraded, and stays.
      redirect::channel* chan = s.inherited.load() ? nullptr : s.chan.get();
      if (s.out.reverted() || s.in.reverted()) {
        why = fallback::reverted;
      } else if (chan && why == fallback::none) {
        // Our writes on VMMC: the peer's switch too, at the byte count its
        // hello names (in.switched() only says we have read up to it).
        bool out = s.out.switched(), in = s.in.switched();
        state = out ? page::row_state::accelerated : page::row_state::upgrading;
        if ((out || in) && chan->connected()) path = chan->path();
      } else if (why == fallback::none) {
        why = fallback::setup_failed;
      }
      if (chan) {
        auto c = chan->stats();
        r.vmmc_bytes_in = c.bytes_received;
        r.vmmc_bytes_out = c.bytes_sent;
        r.bytes_copied = c.bytes_copied;
        r.bytes_redirected = c.bytes_redirected;
      }
      break;
    }
  }
  r.state = static_cast<std::uint8_t>(state);
  r.fallback = static_cast<std::uint8_t>(why);
  r.is_client = s.is_client.load();
  // Our own bytes the kernel counts on a connection that stayed kernel TCP:
  // the offer this client sent, or the one this server took and refused (a
  // client on this host vouches through the presence table: no byte).
  if (state == page::row_state::tcp) {
    bool refused =
        why == fallback::refused || why == fallback::no_context || why == fallback::setup_failed;
    r.protocol_bytes_out = r.is_client && s.offer_sent.load() ? 1 : 0;
    r.protocol_bytes_in = !r.is_client && refused && !s.client_vouched.load() ? 1 : 0;
    // A server on this host that declined our ask: its accept byte and frame.
    if (r.is_client && s.ask_later.load() && why == fallback::refused)
      r.protocol_bytes_in = 1 + sizeof(wire::hello_frame);
  }
  // Cut to the field (zeroed by the caller: the NUL stays).
  std::memcpy(r.path, path.data(), std::min(path.size(), sizeof r.path - 1));
  r.in_use = 1;
  return true;
}

// Writes `s`'s row (with the publisher's lock held). Asked by a reader
// (refresh: `ask_kernel`), the row is made whole: the socket's inode (by
// which a reader tells a live row from a stale one) and both ends. Written
// as the connection changes, it costs no system call: what the stream
// knows, and `remote`, the address a connect() names; a refresh, or the
// reader itself from /proc (stat_reader.cc), completes it.
void publish_locked(publisher& p, stream& s, const sockaddr* remote, socklen_t remote_length,
                    bool ask_kernel) {
  if (s.closed.load()) return;  // its row went with its last descriptor
  int fd = s.fd.load();
  if (fd < 0) return;
  if (static_cast<std::uint32_t>(fd) >= p.rows) return;
  auto i = static_cast<std::uint32_t>(fd);
  page::row* slot = p.row_at(i);
  page::row r{};
  if (!describe_row(s, r)) return;
  if (p.owners[i] == &s && slot->in_use && slot->inode != 0) {
    r.fd = slot->fd;
    r.inode = slot->inode;
    r.local = slot->local;
    r.remote = slot->remote;
  } else {
    if (!allocate_row(p, i)) return;
    r.fd = fd;
    const bool ends_known = s.ends_known.load(std::memory_order_acquire);
    if (ends_known) {
      r.local = endpoint_of(s.local_end);
      r.remote = endpoint_of(s.peer_end);
    } else if (remote && remote_length <= sizeof(sockaddr_storage)) {
      sockaddr_storage a{};
      std::memcpy(&a, remote, remote_length);
      r.remote = endpoint_of(a);
    } else if (p.owners[i] == &s && slot->in_use) {
      r.local = slot->local;
      r.remote = slot->remote;
    }
    if (ask_kernel) {
      struct stat st {};
      if (::fstat(fd, &st) == 0) r.inode = st.st_ino;
      sockaddr_storage a{};
      socklen_t length = sizeof a;
      if (!ends_known && ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &length) == 0)
        r.local = endpoint_of(a);
      a = {};
      length = sizeof a;
      if (!ends_known && ::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &length) == 0)
        r.remote = endpoint_of(a);
    }
    p.owners[i] = &s;
  }
  write_row(*slot, r);
  std::uint32_t used = p.header->rows_used.load(std::memory_order_relaxed);
  if (i + 1 > used) p.header->rows_used.store(i + 1, std::memory_order_release);
}

void clear_locked(publisher& p, int fd) {
  if (fd < 0 || static_cast<std::uint32_t>(fd) >= p.rows) return;
  auto i = static_cast<std::uint32_t>(fd);
  p.owners[i] = nullptr;
  if (!p.allocated[std::size_t{i} * page::row_bytes / 4096]) return;
  page::row* slot = p.row_at(i);
  if (!slot->in_use) return;
  // Readers show only rows in use: the rest of it may stay as it was.
  change_row(*slot, [&] { slot->in_use = 0; });
}

// Every row and the UTLB counters, now (the publisher thread, on request).
void refresh(publisher& p) {
  busy_call busy;  // the exit-time teardown waits, or we do
  std::vector<stream_ptr> streams = all_streams();
  core::counters c{};
  bool has_context = context_started();
  if (has_context)
    if (core::context* ctx = process_context()) c = ctx->stats();
  std::lock_guard lock(p.mutex);
  std::vector<bool> described(p.rows, false);
  std::uint32_t beyond = 0;
  for (auto& s : streams) {
    int fd = s->fd.load();
    if (fd < 0) continue;
    if (static_cast<std::uint32_t>(fd) >= p.rows) {
      ++beyond;
      continue;
    }
    publish_locked(p, *s, nullptr, 0, /*ask_kernel=*/true);
    described[static_cast<std::uint32_t>(fd)] = true;
  }
  std::uint32_t used = p.header->rows_used.load();
  for (std::uint32_t i = 0; i < used && i < p.rows; ++i)
    if (!described[i]) clear_locked(p, static_cast<int>(i));
  page::header& h = *p.header;
  std::uint32_t s = h.sequence.load(std::memory_order_relaxed);
  h.sequence.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  h.has_context = has_context;
  h.utlb_lookups = c.utlb_lookups;
  h.utlb_hits = c.utlb_hits;
  h.utlb_misses = c.utlb_misses;
  h.utlb_registrations = c.utlb_registrations;
  h.utlb_evictions = c.utlb_evictions;
  h.utlb_bytes_registered = c.utlb_bytes_registered;
  h.sequence.store(s + 2, std::memory_order_release);
  h.not_shown.store(beyond);
}

long futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t value) {
  return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, value, nullptr, nullptr,
                   0);
}

// Asleep on the request word until a reader asks; not private: the word is
// in a shared file. Signals are the program's threads' to take (all blocked
// here, from its creation).
void refresher(publisher* p) {
  ::pthread_setname_np(::pthread_self(), "vmmc-stat");
  page::header& h = *p->header;
  long tid = 0;
  std::uint64_t start = 0;
  if (stat_page::proc_stat("/proc/thread-self/stat", tid, start))
    h.refresher_tid.store(static_cast<std::int32_t>(tid));
  std::uint32_t served = h.answered.load();
  for (;;) {
    std::uint32_t wanted = h.request.load(std::memory_order_acquire);
    if (wanted == served) {
      futex(&h.request, FUTEX_WAIT, wanted);
      continue;
    }
    refresh(*p);
    served = wanted;
    h.answered.store(wanted, std::memory_order_release);
    futex(&h.answered, FUTEX_WAKE, INT_MAX);
  }
}
}  // namespace

void stat_publish(stream& s, bool first, const sockaddr* remote, socklen_t remote_length) {
  keep_errno keep;
  publisher* p = get(first);
  if (!p) return;
  std::lock_guard lock(p->mutex);
  publish_locked(*p, s, remote, remote_length, /*ask_kernel=*/false);
}

void stat_before_exec() {
  publisher* p = current.load(std::memory_order_acquire);
  if (!p) return;
  keep_errno keep;
  refresh(*p);  // every row with its inode: the new image's sockets are not taken for them
}

void stat_forget(int fd) {
  publisher* p = current.load(std::memory_order_acquire);
  if (!p) return;
  keep_errno keep;
  std::lock_guard lock(p->mutex);
  clear_locked(*p, fd);
}

void stat_context_ready() {
  keep_errno keep;
  publisher* p = get(true);
  if (!p) return;
  {
    std::lock_guard lock(p->mutex);
    if (p->refresher_started) return;
    p->refresher_started = true;
  }
  // Started with every signal blocked, so that none is ever delivered to it.
  sigset_t all, saved;
  ::sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, &saved);
  try {
    std::thread(refresher, p).detach();
  } catch (const std::system_error&) {
    // No thread: readers see rows as of the last connection event.
  }
  ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
}

}  // namespace vmmc::sockets::detail

namespace vmmc::sockets {

namespace {
// Each reason's stable name (--json, scripts) and its phrase for people,
// in the order of the enum.
struct reason_words {
  std::string_view name, text;
};
constexpr reason_words reasons[] = {
    {"none", ""},
    {"disabled", "vmmc disabled (VMMC_SOCKETS_ENABLE=0)"},
    {"excluded", "excluded by VMMC_SOCKETS_PORTS/EXCLUDE"},
    {"peer_plain", "peer does not run vmmc"},
    {"foreign_urgent", "peer's first byte is urgent but not ours"},
    {"refused", "upgrade refused: too many offers awaiting their client"},
    {"no_context", "no VMMC context in this process"},
    {"setup_failed", "channel set-up failed"},
    {"offer_failed", "offer could not be sent"},
    {"protocol_error", "peer broke the upgrade protocol"},
    {"reverted", "went back to TCP before fork/exec"},
    {"remote_no_rdma",
     "peer on another host and no RDMA device: the fabric cannot beat kernel TCP"},
    {"remote_tcp", "peer on another host, VMMC_SOCKETS_REMOTE=tcp"},
};
static_assert(std::size(reasons) == static_cast<std::size_t>(fallback::last_reason) + 1,
              "one entry per fallback reason");

const reason_words* words_of(fallback reason) {
  auto i = static_cast<std::size_t>(reason);
  return i < std::size(reasons) ? &reasons[i] : nullptr;
}
}  // namespace

std::string_view fallback_name(fallback reason) noexcept {
  const reason_words* w = words_of(reason);
  return w ? w->name : "?";
}

std::string_view fallback_text(fallback reason) noexcept {
  const reason_words* w = words_of(reason);
  return w ? w->text : "?";
}

}  // namespace vmmc::sockets
