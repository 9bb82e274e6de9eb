// vmmc/core/memory_monitor.h: tells registration caches when memory goes away.
//
// A cached registration pins the physical pages that backed a virtual range
// when it was registered. If the range is later unmapped (munmap, free() of a
// large malloc block, brk shrinking, mmap(MAP_FIXED) over it), moved (mremap)
// or discarded (madvise MADV_DONTNEED / MADV_FREE / MADV_REMOVE), the same
// addresses may come to mean other pages, and the registration must never be
// used again. The monitor watches ranges with Linux userfaultfd in
// non-cooperative mode (UNMAP, REMOVE and REMAP events) and forwards every such
// event to its attached listeners (the caches).
//
// How it works: watch() registers a range with the monitor's userfaultfd in
// write-protect mode but never write-protects a page, so ordinary reads and
// writes are never trapped. The kernel then queues an event whenever a watched
// range is unmapped, moved or discarded, and makes the calling thread wait
// until the monitor thread has *read* the event. The monitor thread sleeps in
// poll() (an idle process burns no CPU), reads events, and calls the
// listeners.
//
// The remaining window, and how it is closed: the kernel lets munmap() return
// as soon as the event is read, slightly before the listeners have run. The
// monitor raises a flag before it reads and lowers it after every listener
// returned; synchronize() waits while the flag is up. A cache calls
// synchronize() before each lookup, so a lookup that happens after munmap()
// returned (in the same thread, or in one that learned of the munmap through
// any synchronisation) never finds the stale entry. A lookup that truly races
// with the munmap in another thread may still hit the old entry; that program
// is using memory it is concurrently freeing, which no cache can make correct.
//
// Limits (what is not watched; watch() fails and callers must not cache):
// - userfaultfd unavailable (kernel without it, seccomp, or
//   vm.unprivileged_userfaultfd=0 without privilege): create() fails.
// - regular file mappings (write-protect mode supports anonymous memory,
//   shmem/memfd and hugetlbfs only), misaligned hugetlbfs ranges, and ranges
//   another userfaultfd already owns (EBUSY). (Kernel 6.x accepts a range
//   with unmapped holes and watches its mapped parts; registering such a
//   range then fails in the registrar.)
// - after fork() the child's mappings are not watched (no EVENT_FORK) and the
//   child has no monitor thread: caches must not be used across fork.
// Costs: watched ranges are never unwatched (the registration belongs to the
// mapping and disappears with it), so munmap of memory that was once cached
// pays one monitor-thread wake-up (a few microseconds). Each watched range may
// split a mapping in the kernel (vm.max_map_count applies; watch() then fails).
//
// Thread safety: every member function may be called from any thread except
// the monitor thread itself (i.e. not from inside on_unmapped).
#pragma once
#pragma GCC visibility push(default)  // the library's API (see cmake/layer.cmake)

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "vmmc/core/error.h"

namespace vmmc::core {

// Receives the ranges that stopped mapping the memory they mapped.
class unmap_listener {
 public:
  // Runs on the monitor thread with a page-aligned range that was unmapped,
  // moved away or discarded (it may cover more than what was watched). It must
  // return quickly, must not free or unmap memory (free() may unmap, and the
  // monitor thread would wait for itself), and must not wait for a thread that
  // may be inside munmap().
  virtual void on_unmapped(const void* addr, std::size_t length) noexcept = 0;

 protected:
  ~unmap_listener() = default;
};

class memory_monitor {
 public:
  // Opens a userfaultfd with UNMAP/REMOVE/REMAP events and starts the monitor
  // thread. Errors: errc::system_error if userfaultfd is unavailable or lacks
  // these events, or the thread cannot start.
  static result<std::unique_ptr<memory_monitor>> create();

  // A monitor shared by the whole process, created on first use; nullptr if
  // create() failed. Deliberately never destroyed, so that caches destroyed
  // during static destruction can still detach from it. Two monitors cannot
  // watch the same range, so prefer this one outside tests.
  static memory_monitor* process_wide() noexcept;

  // Stops the thread and closes the userfaultfd, which unwatches every range.
  // Precondition: no listener is attached.
  ~memory_monitor();
  memory_monitor(const memory_monitor&) = delete;
  memory_monitor& operator=(const memory_monitor&) = delete;

  // Watches the pages covering [addr, addr + length). Idempotent.
  // Errors: errc::invalid_argument for null addr, zero length or a range that
  // wraps; errc::system_error if the kernel refuses (see Limits above) or the
  // caller is a fork() child of the process that created the monitor.
  status watch(const void* addr, std::size_t length);

  // Adds a listener; from now on it sees every event. The listener must stay
  // alive until detach() returned.
  void attach(unmap_listener& listener);
  // Removes a listener. When detach() returns, no call into it is running and
  // none will start. Must not be called while holding a lock that the
  // listener's on_unmapped takes.
  void detach(unmap_listener& listener);

  // Waits until every event the monitor thread has read so far has been
  // delivered to the listeners. Costs one atomic load when no event is being
  // delivered. See "The remaining window" above.
  void synchronize() const noexcept;

  // Events delivered so far (unmap, remove, remap). For tests and diagnostics.
  std::uint64_t events() const noexcept { return events_.load(std::memory_order_relaxed); }

 private:
  memory_monitor(int uffd, int stop_fd);
  void run() noexcept;
  void deliver(std::uintptr_t start, std::uintptr_t end) noexcept;

  const int uffd_;
  const int stop_fd_;  // eventfd: written by the destructor to stop the thread
  const int owner_pid_;
  std::atomic<std::uint32_t> draining_{0};  // 1 from before read() until delivery is done
  std::atomic<std::uint64_t> events_{0};
  std::mutex attach_mutex_;     // serialises attach/detach (never taken by the monitor thread)
  std::mutex listeners_mutex_;  // held by the monitor thread while it delivers
  // Replaced, never resized, under listeners_mutex_: resizing there could
  // free() and so wait for the monitor thread (see unmap_listener).
  std::vector<unmap_listener*> listeners_;
  std::thread thread_;
};

}  // namespace vmmc::core

#pragma GCC visibility pop
