// vmmc/core/progress.h: how long every wait in vmmc busy-polls before it
// sleeps. One policy for every layer's waits (core's completions and
// notifications, redirect's channels, sockets' reads and poll/epoll, vRPC's
// server, NX's node):
//  - at most VMMC_CORE_SPIN_US, and within that what spinning has been worth
//    to this thread lately: a wait that ended within the most doubles the
//    thread's budget (a full spin would have caught it), one that outlasted
//    it or was given up halves it;
//  - plainly for the first microseconds, then yielding at every turn: a
//    peer that has not answered by then may be waiting for this core, and
//    where nobody waits a yield returns at once. A waiter confined to one CPU,
//    or whose layer said its peers share its CPUs (set_peers_share_cpus),
//    yields from the first turn: a peer on its core cannot answer while it
//    spins;
//  - without yields while yields are costly: on a machine with more
//    runnable threads than CPUs, yields that took a time slice on average
//    gave the core to threads that compute. A waiter whose peer may run on
//    another CPU then spins plainly, within what spinning has been worth (a
//    peer that runs beside it answers within microseconds, where a sleeper
//    pays a wake-up: NX gdsum with two busy threads on 2 cores, 22 us
//    sleeping at once, Open MPI's plain spin 0.9 us). One whose peer shares
//    its CPU sleeps at once: its spin holds the core the answer needs, and a
//    sleeper's wake-up preempts threads that compute. Now and then waits
//    try a yield again.
#pragma once
#pragma GCC visibility push(default)  // the library's API (see cmake/layer.cmake)

#include <chrono>
#include <cstdint>
#include <optional>

namespace vmmc::core {

// One wait's spin phase. Use:
//   spinner spin;
//   while (!ready()) {
//     drive progress;
//     if (spin.again()) continue;
//     arm, sleep on a descriptor;
//     spin.woke();
//   }
// A spinner belongs to one wait of one thread. It costs nothing until the
// first again() (a wait whose answer is already there never spins), and
// learns, for the thread's later waits, when it is destroyed.
class spinner {
 public:
  using clock = std::chrono::steady_clock;

  spinner() noexcept;
  // A wait that never spins longer than `most` whatever the budget: a watch
  // for something that may not come, while other work may be waiting (a
  // server watching one connection for its client's next call).
  explicit spinner(std::chrono::nanoseconds most) noexcept : most_(most) {}
  ~spinner();
  spinner(const spinner&) = delete;
  spinner& operator=(const spinner&) = delete;

  // True: poll again (now and then it lets another thread have the core
  // first). False: this spin is over, sleep.
  [[nodiscard]] bool again() noexcept { return again(clock::now()); }
  // The same, for a caller that has just read the clock.
  [[nodiscard]] bool again(clock::time_point now) noexcept;
  // After a sleep: spin again before the next one (a wake-up may come a
  // moment before what it announces), for half as long as the last spin.
  void woke() noexcept;
  // What the caller waited for came, and it waits again for more: the wait
  // so far counts as one, a new one begins.
  void restart() noexcept;
  // The budget of this wait's current spin.
  std::chrono::nanoseconds budget() const { return budget_; }

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
  bool forced_ = false;     // costly yields, not the thread's budget, said "sleep at once"
};

// What a layer knows that the thread's CPU set does not tell (NX knows its
// nodes' CPU sets): true, peers share the CPUs this process runs on (yield
// from the first turn); false, each waiter has a core of its own (spin
// plainly first, even when confined to one CPU); nullopt, decide by the
// thread's CPU set (the default). Thread-safe; process-wide.
void set_peers_share_cpus(std::optional<bool> share);

// True while yields are costly: one of the last few milliseconds took a
// time slice, and they took over 100 us on average, on a machine with more
// runnable threads than CPUs (see above). For diagnostics and tests.
bool yields_are_costly();

// The most a wait spins (VMMC_CORE_SPIN_US).
std::chrono::microseconds spin_limit();
// What this thread has learnt a spin is worth: the budget of its next wait
// while cores are to spare.
std::chrono::nanoseconds thread_spin_budget();

}  // namespace vmmc::core

#pragma GCC visibility pop
