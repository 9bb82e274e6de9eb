// vmmc/core/progress.h: the one way anything in vmmc waits. Every wait of
// every layer (core's completions and notifications, redirect's channels,
// sockets' reads and poll/epoll, vRPC's server, NX's node) is a call of
// wait_until: it busy-polls what the wait is for, then arms and sleeps.
//
// How long it busy-polls is one policy, from one setting:
//  - at most VMMC_CORE_SPIN_US, and within that what spinning has been worth
//    to this thread lately: a wait that ended within the most doubles the
//    thread's budget (a full spin would have caught it), one that outlasted
//    it or was given up halves it; each sleep of one wait halves its next
//    spin (a wait that keeps sleeping must not spin at every wake-up);
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
//    sleeping at once, Open MPI's plain spin 0.9 us), but no longer than a
//    sleep and its wake-up cost (10 us). One whose peer shares its CPU
//    sleeps at once: its spin holds the core the answer needs, and a
//    sleeper's wake-up preempts threads that compute. Now and then waits
//    try a yield again;
//  - on a machine with more runnable threads than CPUs, not at all when
//    that has paid: whether those threads are peers that answer or loops
//    that compute, nothing cheap tells, so each thread that would spin
//    plainly tries 32 waits that sleep at once against 32 by its spin
//    policy, and keeps what ended its waits sooner for 0.4 s, longer each
//    time the choice repeats (at most 6.4 s). A trial is counted in waits,
//    not time: a thread that waits in bursts would spend a timed one idle.
//    A watch (no sleep step), and a waiter that yields from the first turn
//    (its own yielding peers make the machine look crowded), are left out.
//
// A waiter that yields looks at every turn, whatever its turns_per_look:
// a peer that shares its CPU cannot answer while turns go by unyielded.
#pragma once
#pragma GCC visibility push(default)  // the library's API (see cmake/layer.cmake)

#include <chrono>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <utility>

namespace vmmc::core {

// A callable borrowed for the length of a call (no allocation, no copy):
// the steps a wait is given.
template <class Signature>
class function_ref;
template <class R, class... Args>
class function_ref<R(Args...)> {
  template <class F>
  static constexpr bool borrowable = !std::is_same_v<std::remove_cvref_t<F>, function_ref> &&
                                     std::is_invocable_r_v<R, F&, Args...>;

 public:
  // Implicit: passed where a wait's steps are expected.
  template <class F, std::enable_if_t<borrowable<F>, int> = 0>
  function_ref(F&& f) noexcept  // NOLINT(google-explicit-constructor)
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* o, Args... a) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<Args>(a)...);
        }) {}
  R operator()(Args... a) const { return call_(object_, std::forward<Args>(a)...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

using wait_clock = std::chrono::steady_clock;

// What one turn of a wait found.
enum class turn {
  waiting,     // nothing yet
  progressed,  // part of what the wait is for came (a write moved some bytes): what was
               // waited so far counts as one wait, and a new one begins
  done,        // the wait is over, whatever its outcome (the caller keeps that)
};

// How a wait ended.
enum class waited {
  done,       // a turn said so
  timed_out,  // the deadline came first
  stopped,    // the sleep step would not sleep (it found the wait is over, a peer gone), or a
              // watch's spin was spent (wait_options::spin_most with no sleep step)
};

struct wait_options {
  // Spin no longer than this, whatever the budget: a watch for something
  // that may not come while other work may be waiting (a server watching
  // one connection for its client's next call).
  std::chrono::nanoseconds spin_most = std::chrono::nanoseconds::max();
  // False: nothing to busy-poll (the sleep step is the whole wait: a kernel
  // poll over descriptors only), sleep at once.
  bool spin = true;
  // Look at the clock every this many turns (a turn that costs a few
  // nanoseconds would otherwise mostly read the clock).
  unsigned turns_per_look = 1;
};

// The sleep step: the spin is over. Arm the wake-ups, take one more turn's
// look, and sleep at most `most` (never past the deadline). True: slept (or
// found news while arming): turn again. False: the wait ends (`stopped`).
using sleep_step = function_ref<bool(std::chrono::nanoseconds most)>;

// The wait: takes turns (each drives progress without blocking and says
// what it found), spinning by the policy above, then calls `sleep`, until
// a turn says done or the deadline comes. `sleep` may be empty: a watch,
// which ends `stopped` when its spin is spent.
waited wait_until(function_ref<turn()> step, wait_clock::time_point deadline,
                  std::optional<sleep_step> sleep, const wait_options& options = {});

// The same for a wait whose turns only say done or not.
template <class F>
concept predicate = std::is_invocable_r_v<bool, F&>;
template <predicate Ready>
waited wait_until(Ready&& ready, wait_clock::time_point deadline, std::optional<sleep_step> sleep,
                  const wait_options& options = {}) {
  auto step = [&] { return ready() ? turn::done : turn::waiting; };
  return wait_until(function_ref<turn()>(step), deadline, sleep, options);
}

// A sleep step for waits with nothing to sleep on (a ring whose space rings
// no doorbell, a queue that drains as the peer progresses): naps at most
// `nap` at a time; a zero nap yields the core.
bool sleep_briefly(std::chrono::nanoseconds nap);  // always true
inline auto napping(std::chrono::nanoseconds nap) {
  return [nap](std::chrono::nanoseconds most) { return sleep_briefly(nap < most ? nap : most); };
}

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

// True while the machine has more runnable threads than CPUs (two samples
// of /proc/loadavg in a row, a few milliseconds apart): then each thread
// tries waits that sleep at once against its spin policy, and keeps what
// ended its waits sooner (see above). For diagnostics and tests.
bool machine_is_crowded();

// The most a wait spins (VMMC_CORE_SPIN_US).
std::chrono::microseconds spin_limit();
// What this thread has learnt a spin is worth: the budget of its next wait
// while cores are to spare.
std::chrono::nanoseconds thread_spin_budget();

}  // namespace vmmc::core

#pragma GCC visibility pop
