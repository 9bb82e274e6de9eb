// Reading the files processes publish for vmmc-stat (stat_page.h): which of
// them belong to live processes, asking each for fresh counters, and taking
// consistent copies of their rows. The files are other processes' (another
// user's, for root): every size, string and count in them is checked, and
// they are opened without following links.
#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <optional>
#include <string>

#include "sockets.h"
#include "stat_page.h"

namespace vmmc::sockets {

namespace {
namespace page = detail::stat_page;

// One open file of a live process: its header mapped (for the futex words),
// rows read with pread (a file cut short under us costs a short read, not a
// SIGBUS).
struct source {
  int fd = -1;
  page::header* header = nullptr;
  std::uint32_t asked = 0;
  bool waiting = false;
  published_process process;
  ~source() {
    if (header) ::munmap(header, page::header_bytes);
    if (fd >= 0) ::close(fd);
  }
};

long futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, value, timeout, nullptr,
                   0);
}

bool refresher_runs(pid_t pid, std::int32_t tid) {
  if (tid <= 0) return false;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/task/%d", static_cast<int>(pid), tid);
  return ::access(path, F_OK) == 0;
}

// The file at `dir_fd`/`name`, if it is a well-formed file of a live process.
std::unique_ptr<source> open_source(int dir_fd, const char* name, pid_t only) {
  char* end = nullptr;
  long pid = std::strtol(name, &end, 10);
  if (!end || *end || pid <= 0 || pid > INT_MAX) return nullptr;
  if (only && pid != only) return nullptr;
  auto s = std::make_unique<source>();
  s->fd = ::openat(dir_fd, name, O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (s->fd < 0) return nullptr;
  struct stat st {};
  if (::fstat(s->fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<std::size_t>(st.st_size) < page::header_bytes)
    return nullptr;
  void* m = ::mmap(nullptr, page::header_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
  if (m == MAP_FAILED) return nullptr;
  s->header = static_cast<page::header*>(m);
  page::header h;
  std::memcpy(static_cast<void*>(&h), s->header, sizeof h);
  if (!page::header_ok(h, static_cast<std::uint64_t>(st.st_size), pid)) return nullptr;
  // Alive, and the same process that made the file (not a later one that got the pid).
  if (h.start_time == 0 || page::start_time(static_cast<pid_t>(pid)) != h.start_time)
    return nullptr;
  s->process.pid = static_cast<pid_t>(pid);
  s->process.uid = st.st_uid;
  s->process.command = page::bounded(h.command, sizeof h.command);
  return s;
}

void ask(source& s) {
  if (!refresher_runs(s.process.pid, s.header->refresher_tid.load())) return;
  s.asked = s.header->request.fetch_add(1) + 1;
  s.waiting = true;
  futex(&s.header->request, FUTEX_WAKE, INT_MAX, nullptr);
}

void await(source& s, const timespec& deadline) {
  if (!s.waiting) return;
  for (;;) {
    std::uint32_t answered = s.header->answered.load(std::memory_order_acquire);
    if (static_cast<std::int32_t>(answered - s.asked) >= 0) {
      s.process.live = true;
      return;
    }
    timespec now{};
    ::clock_gettime(CLOCK_MONOTONIC, &now);
    long long left = (deadline.tv_sec - now.tv_sec) * 1000000000LL + deadline.tv_nsec - now.tv_nsec;
    if (left <= 0) return;
    timespec wait{static_cast<time_t>(left / 1000000000LL), static_cast<long>(left % 1000000000LL)};
    futex(&s.header->answered, FUTEX_WAIT, answered, &wait);
  }
}

// A consistent copy of a row, or of the header's counters: the sequence
// word even and unchanged across the copy.
template <class T>
bool read_consistent(int fd, off_t at, T& out) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    T a, b;
    if (::pread(fd, static_cast<void*>(&a), sizeof a, at) != static_cast<ssize_t>(sizeof a) ||
        ::pread(fd, static_cast<void*>(&b), sizeof b, at) != static_cast<ssize_t>(sizeof b))
      return false;
    std::uint32_t sa = a.sequence.load(std::memory_order_relaxed);
    if ((sa & 1) == 0 &&
        std::memcmp(static_cast<void*>(&a), static_cast<void*>(&b), sizeof a) == 0) {
      std::memcpy(static_cast<void*>(&out), static_cast<void*>(&a), sizeof a);
      return true;
    }
  }
  return false;
}

// The socket inode the process's descriptor `fd` names (0: none, not a
// socket); nullopt where /proc does not let us look.
std::optional<std::uint64_t> socket_inode(pid_t pid, int fd) {
  char path[64], target[64];
  std::snprintf(path, sizeof path, "/proc/%d/fd/%d", static_cast<int>(pid), fd);
  ssize_t n = ::readlink(path, target, sizeof target - 1);
  if (n < 0) {
    if (errno == EACCES || errno == EPERM) return std::nullopt;
    return 0;
  }
  target[n] = '\0';
  unsigned long long inode = 0;
  char end = 0;
  if (std::sscanf(target, "socket:[%llu%c", &inode, &end) != 2 || end != ']') return 0;
  return inode;
}

std::string file_text(const std::string& path) {
  std::string text;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return text;
  char buffer[65536];
  for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0 && text.size() < (64u << 20);)
    text.append(buffer, static_cast<std::size_t>(n));
  ::close(fd);
  return text;
}

void read_rows(source& s) {
  page::header h;
  if (!read_consistent(s.fd, 0, h)) return;
  published_process& p = s.process;
  p.has_context = h.has_context != 0;
  p.utlb_lookups = h.utlb_lookups;
  p.utlb_hits = h.utlb_hits;
  p.utlb_misses = h.utlb_misses;
  p.utlb_registrations = h.utlb_registrations;
  p.utlb_evictions = h.utlb_evictions;
  p.utlb_bytes_registered = h.utlb_bytes_registered;
  p.not_shown = h.not_shown.load();
  std::string tcp_table;  // the process's /proc/net/tcp and tcp6, read when needed
  bool tcp_table_read = false;
  std::uint32_t used = std::min(h.rows_used.load(), h.row_count);
  for (std::uint32_t i = 0; i < used; ++i) {
    page::row r;
    if (!read_consistent(
            s.fd, static_cast<off_t>(page::header_bytes + std::size_t{i} * page::row_bytes), r))
      continue;
    auto c = page::parse_row(r, i);
    if (!c) continue;
    // Shown while its descriptor still names the socket (closed, or lost by
    // exec: the row is stale). A row written as the connection changed
    // (stat.cc: no system call there) has no inode yet: its descriptor is
    // believed while it names a socket (closes clear rows, and an exec()
    // completes them first), and that socket's ends come from the kernel.
    auto named = socket_inode(p.pid, c->fd);
    if (named && *named == 0) continue;
    if (c->inode == 0 && named) {
      c->inode = *named;
      if (c->local == "?" || c->remote == "?") {
        if (!tcp_table_read) {
          const std::string base = "/proc/" + std::to_string(p.pid) + "/net/";
          tcp_table = file_text(base + "tcp") + file_text(base + "tcp6");
          tcp_table_read = true;
        }
        std::string local, remote;
        if (page::ends_in_proc_net(tcp_table, c->inode, local, remote)) {
          if (c->local == "?") c->local = local;
          if (c->remote == "?") c->remote = remote;
        }
      }
    } else if (named && *named != c->inode) {
      continue;
    }
    p.connections.push_back(std::move(*c));
  }
}
}  // namespace

std::vector<published_process> read_published(const read_options& options) {
  std::string base = options.directory.empty() ? core::setting_string(detail::settings::stat_dir)
                                               : options.directory;
  std::vector<std::unique_ptr<source>> sources;
  if (DIR* top = ::opendir(base.c_str())) {
    while (dirent* user = ::readdir(top)) {
      if (std::strncmp(user->d_name, "vmmc-", 5) != 0) continue;
      // Other users' folders are 0700: only root gets further.
      int dir_fd =
          ::openat(::dirfd(top), user->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (dir_fd < 0) continue;
      if (DIR* d = ::fdopendir(dir_fd)) {
        while (dirent* e = ::readdir(d))
          if (auto s = open_source(::dirfd(d), e->d_name, options.only_pid))
            sources.push_back(std::move(s));
        ::closedir(d);
      } else {
        ::close(dir_fd);
      }
    }
    ::closedir(top);
  }
  for (auto& s : sources) ask(*s);
  timespec deadline{};
  ::clock_gettime(CLOCK_MONOTONIC, &deadline);
  auto wait_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(options.wait).count();
  deadline.tv_sec += static_cast<time_t>((deadline.tv_nsec + wait_ns) / 1000000000LL);
  deadline.tv_nsec = static_cast<long>((deadline.tv_nsec + wait_ns) % 1000000000LL);
  std::vector<published_process> all;
  for (auto& s : sources) {
    await(*s, deadline);
    read_rows(*s);
    all.push_back(std::move(s->process));
  }
  std::sort(all.begin(), all.end(), [](auto& a, auto& b) { return a.pid < b.pid; });
  return all;
}

}  // namespace vmmc::sockets
