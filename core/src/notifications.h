// What a context's polling thread is told and how its sleep ends.
// Notifications that came through the fabric wait here (the mapped rings
// are drained in place, link by link). The application sleeps on an eventfd
// that peers on this host write only while the flag on the wake page is up
// (they map the page read-only: only we raise or lower it).
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "unique_fd.h"
#include "vmmc/core/context.h"

namespace vmmc::core::detail {

struct segment;
struct wake_page;

class notification_queue {
 public:
  status open();  // the eventfd and the wake page
  int fd() const noexcept { return eventfd_.get(); }
  int wake_page_fd() const noexcept;  // lent to importers on this host
  bool sleeping() const noexcept;     // the flag is up

  // A notification that arrived through the fabric (from progress, with an
  // endpoint's lock held): queued, and the sleeper woken.
  void push(const notification& n);
  // Appends what push() queued to `batch`.
  void take(std::vector<notification>& batch);
  bool nonempty() const noexcept { return nonempty_.load(std::memory_order_acquire); }
  void wake() const;  // writes the eventfd

  // Held while handlers run (never two at once) and around the flag.
  std::recursive_mutex& dispatch_lock() noexcept { return dispatch_mutex_; }
  // Under dispatch_lock(). raise_flag(): a sender that wrote after it sees
  // the flag (and wakes us), or we see what it wrote (the fences pair).
  void raise_flag();
  void lower_flag();  // drains the eventfd if the flag was up

 private:
  unique_fd eventfd_;
  std::shared_ptr<segment> page_segment_;
  wake_page* page_ = nullptr;
  std::mutex mutex_;
  std::deque<notification> queued_;
  std::atomic<bool> nonempty_{false};
  std::recursive_mutex dispatch_mutex_;
  bool raised_ = false;  // under dispatch_mutex_
};

}  // namespace vmmc::core::detail
