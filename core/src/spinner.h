// The spin phase of one wait, by the policy of progress.h. Only
// wait_until uses it: every wait in vmmc is one of its calls.
#pragma once

#include <chrono>
#include <cstdint>

namespace vmmc::core::detail {

class spinner {
 public:
  using clock = std::chrono::steady_clock;

  spinner() noexcept = default;
  // `may_sleep`: the wait has a sleep step (a watch, which has none, gives
  // up when its spin is spent, and takes no part in a crowded machine's
  // trial of sleeping at once).
  spinner(std::chrono::nanoseconds most, bool may_sleep) noexcept
      : most_(most), may_sleep_(may_sleep) {}
  ~spinner() { learn(); }
  spinner(const spinner&) = delete;
  spinner& operator=(const spinner&) = delete;

  // True: poll again (now and then it lets another thread have the core
  // first). False: this spin is over, sleep. The first call starts the
  // spin: a wait whose answer is there at once never spins.
  [[nodiscard]] bool again(clock::time_point now) noexcept;
  // After a sleep: spin again before the next one (a wake-up may come a
  // moment before what it announces), for half as long as the last spin.
  void woke() noexcept;
  // What the caller waited for came, and it waits again for more: the wait
  // so far counts as one, a new one begins.
  void restart() noexcept;
  // Its spin yields at every look now: the caller should look at every turn
  // (a peer that shares the CPU cannot answer while turns go by unyielded).
  bool yielding() const noexcept { return yielding_; }

 private:
  void start(clock::time_point now) noexcept;
  void begin_spin(clock::time_point now) noexcept;
  void learn() noexcept;

  clock::time_point start_, spin_until_, plain_until_;
  std::chrono::nanoseconds budget_{0};
  std::chrono::nanoseconds most_ = std::chrono::nanoseconds::max();
  std::uint32_t sleeps_ = 0;  // in this wait
  bool started_ = false;
  bool spent_ = false;      // the last again() said "sleep"
  bool plain_ = true;       // the peer may run beside us: spin plainly first
  bool no_yields_ = false;  // costly yields: spin plainly throughout
  bool yielding_ = false;   // the last again() yielded
  bool forced_ = false;     // costly yields, not the thread's budget, said "sleep at once"
  bool may_sleep_ = true;
  bool crowded_ = false;        // began on a machine with more runnable threads than CPUs
  bool crowded_sleep_ = false;  // and the thread's trial said "sleep at once"
};

}  // namespace vmmc::core::detail
