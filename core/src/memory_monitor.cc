// memory_monitor: userfaultfd non-cooperative events -> unmap listeners.
#include "vmmc/core/memory_monitor.h"

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <system_error>

namespace vmmc::core {
namespace {

std::uintptr_t page_size() {
  static const auto size = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  return size;
}

int open_userfaultfd() {
  // UFFD_USER_MODE_ONLY needs no privilege where vm.unprivileged_userfaultfd
  // is 0; we never handle faults, so losing kernel-mode faults costs nothing.
  // Kernels before 5.11 reject the flag: retry without it.
  int fd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY));
  if (fd < 0 && errno == EINVAL)
    fd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
  return fd;
}

// UFFDIO_API may be called once per descriptor, so the supported features are
// learnt on a throw-away descriptor first.
std::uint64_t supported_features() {
  const int fd = open_userfaultfd();
  if (fd < 0) return 0;
  uffdio_api api{};
  api.api = UFFD_API;
  const std::uint64_t features = ioctl(fd, UFFDIO_API, &api) == 0 ? api.features : 0;
  close(fd);
  return features;
}

}  // namespace

result<std::unique_ptr<memory_monitor>> memory_monitor::create() {
  constexpr std::uint64_t required =
      UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_REMAP;
  // Lets shmem/memfd mappings (context::allocate) be watched too.
  constexpr std::uint64_t optional = UFFD_FEATURE_WP_HUGETLBFS_SHMEM;
  const std::uint64_t supported = supported_features();
  if ((supported & required) != required) return errc::system_error;

  const int uffd = open_userfaultfd();
  if (uffd < 0) return errc::system_error;
  uffdio_api api{};
  api.api = UFFD_API;
  api.features = required | (supported & optional);
  if (ioctl(uffd, UFFDIO_API, &api) != 0) {
    close(uffd);
    return errc::system_error;
  }
  const int stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd < 0) {
    close(uffd);
    return errc::system_error;
  }
  std::unique_ptr<memory_monitor> monitor(new memory_monitor(uffd, stop_fd));
  try {
    monitor->thread_ = std::thread([m = monitor.get()] { m->run(); });
  } catch (const std::system_error&) {
    return errc::system_error;  // the destructor closes both descriptors
  }
  return monitor;
}

memory_monitor* memory_monitor::process_wide() noexcept {
  static memory_monitor* const instance = [] {
    auto created = create();
    return created ? std::move(created).value().release() : nullptr;
  }();
  return instance;
}

memory_monitor::memory_monitor(int uffd, int stop_fd)
    : uffd_(uffd), stop_fd_(stop_fd), owner_pid_(getpid()) {}

memory_monitor::~memory_monitor() {
  assert(listeners_.empty());
  if (thread_.joinable()) {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = write(stop_fd_, &one, sizeof one);
    thread_.join();
  }
  // Closing releases every thread still waiting in munmap() for an unread
  // event and unregisters all watched ranges.
  close(uffd_);
  close(stop_fd_);
}

status memory_monitor::watch(const void* addr, std::size_t length) {
  const auto start = reinterpret_cast<std::uintptr_t>(addr);
  std::uintptr_t end = 0;
  if (addr == nullptr || length == 0 || __builtin_add_overflow(start, length, &end) ||
      end > UINTPTR_MAX - page_size())
    return errc::invalid_argument;
  // The descriptor operates on the creator's address space; a fork() child
  // would watch its parent's memory.
  if (getpid() != owner_pid_) return errc::system_error;
  const std::uintptr_t first = start & ~(page_size() - 1);
  const std::uintptr_t last = (end + page_size() - 1) & ~(page_size() - 1);
  uffdio_register reg{};
  reg.range.start = first;
  reg.range.len = last - first;
  // Write-protect mode traps nothing as long as no page is write-protected,
  // which we never do; it only attaches the range to our userfaultfd.
  reg.mode = UFFDIO_REGISTER_MODE_WP;
  if (ioctl(uffd_, UFFDIO_REGISTER, &reg) != 0) return errc::system_error;
  return {};
}

void memory_monitor::attach(unmap_listener& listener) {
  std::lock_guard attach_lock(attach_mutex_);
  std::vector<unmap_listener*> next = listeners_;  // only attach/detach write it
  next.push_back(&listener);
  {
    std::lock_guard lock(listeners_mutex_);
    listeners_.swap(next);
  }
}  // the old vector is freed here, outside listeners_mutex_

void memory_monitor::detach(unmap_listener& listener) {
  std::lock_guard attach_lock(attach_mutex_);
  std::vector<unmap_listener*> next = listeners_;
  next.erase(std::remove(next.begin(), next.end(), &listener), next.end());
  {
    // Taking the mutex also waits for a delivery in progress to finish.
    std::lock_guard lock(listeners_mutex_);
    listeners_.swap(next);
  }
}

void memory_monitor::synchronize() const noexcept {
  for (std::uint32_t s = draining_.load(std::memory_order_acquire); s != 0;
       s = draining_.load(std::memory_order_acquire))
    draining_.wait(s, std::memory_order_acquire);
}

void memory_monitor::deliver(std::uintptr_t start, std::uintptr_t end) noexcept {
  if (end <= start) return;
  events_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lock(listeners_mutex_);
  for (unmap_listener* l : listeners_)
    l->on_unmapped(reinterpret_cast<const void*>(start), end - start);
}

void memory_monitor::run() noexcept {
  // This thread must never free or unmap memory, and allocates nothing: an
  // munmap of watched memory from here would wait for this very thread.
  for (;;) {
    pollfd fds[2] = {{uffd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      std::fprintf(stderr, "vmmc: memory monitor stopped: poll: %s\n", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) {
      if (fds[0].revents != 0) return;  // POLLERR: the descriptor is unusable
      continue;
    }
    // Raised before read(): the kernel lets the unmapping thread go once the
    // event is read, and its next lookup must see the flag (seq_cst store).
    draining_.store(1, std::memory_order_seq_cst);
    uffd_msg msgs[16];
    const ssize_t n = read(uffd_, msgs, sizeof msgs);
    for (ssize_t i = 0; i < n / static_cast<ssize_t>(sizeof(uffd_msg)); ++i) {
      const uffd_msg& m = msgs[i];
      switch (m.event) {
        case UFFD_EVENT_UNMAP:
        case UFFD_EVENT_REMOVE:
          deliver(m.arg.remove.start, m.arg.remove.end);
          break;
        case UFFD_EVENT_REMAP:  // the old range no longer maps those pages
          deliver(m.arg.remap.from, m.arg.remap.from + m.arg.remap.len);
          break;
        case UFFD_EVENT_PAGEFAULT: {
          // Not expected (no page is ever write-protected). Never leave the
          // faulting thread stuck: clear protection on the page and wake it.
          uffdio_writeprotect wp{};
          wp.range.start = m.arg.pagefault.address & ~(page_size() - 1);
          wp.range.len = page_size();
          wp.mode = 0;
          if (ioctl(uffd_, UFFDIO_WRITEPROTECT, &wp) != 0) {
            uffdio_range wake{wp.range.start, wp.range.len};
            (void)ioctl(uffd_, UFFDIO_WAKE, &wake);
          }
          break;
        }
        default:
          break;
      }
    }
    draining_.store(0, std::memory_order_release);
    draining_.notify_all();
  }
}

}  // namespace vmmc::core
