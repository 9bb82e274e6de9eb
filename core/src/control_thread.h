// core/src/control_thread.h: a context's control thread as an object of its
// own (control_thread.cc): the thread, the eventfd that wakes it and the
// flag that ends it. What it does each round is the context's
// (control.cc, context::impl::control_loop).
#pragma once

#include <atomic>
#include <functional>
#include <thread>

#include "unique_fd.h"
#include "vmmc/core/context.h"

namespace vmmc::core::detail {

class control_thread {
 public:
  // The wake-up eventfd: before start().
  status open();
  // Runs `loop` on the thread ("vmmc-control" in ps, top, gdb); the loop
  // returns once stopping() says so.
  void start(std::function<void()> loop);
  // From any thread: the loop's poll() returns (it watches wake_fd()).
  void wake() noexcept;
  // Ends the thread and waits for it.
  void stop();
  bool stopping() const noexcept { return stopping_.load(std::memory_order_acquire); }

  // For the loop: the descriptor to watch, and taking the wake-ups it saw.
  int wake_fd() const noexcept { return wakeup_.get(); }
  void take_wakeups() noexcept;

 private:
  std::thread thread_;
  unique_fd wakeup_;
  std::atomic<bool> stopping_{false};
};

}  // namespace vmmc::core::detail
