// The one wait loop of vmmc, and its spin policy (see progress.h).
#include "vmmc/core/progress.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "spinner.h"
#include "vmmc/core/settings.h"

namespace vmmc::core {

namespace {
using clock = std::chrono::steady_clock;
using std::chrono::nanoseconds;

// A waiter that may run on more than one CPU spins plainly this long, then
// yields at every turn: a peer that has not answered by then may be waiting
// for this core, and where nobody waits a yield returns at once. (Four vRPC
// client threads and their server on 2 cores: 270-370k calls/s yielding from
// the first turn, 650-730k after 5 us.) A waiter confined to one CPU yields
// from the first turn: a peer that shares the CPU cannot answer while it
// spins (a vRPC null call with client and server on one core: 13 us
// spinning 5 us first, 5 us yielding at once).
constexpr auto plain_spin = std::chrono::microseconds(5);
// A yield that took a time slice gave the core to a thread that computes,
// not to a peer that answers and waits again: 4 busy loops on 2 cores held
// preloaded redis-benchmark under 1k requests/s, against 20k over kernel
// TCP. While yields cost that much on average, waits do not yield: those
// whose peer may run beside them spin plainly (their budget still learns
// whether that pays), the others sleep at once (a sleeper's wake-up
// preempts threads that compute, where a yielder waits for their slice to
// end). On average, not once: on a shared machine a
// handoff yield now and then takes as long (4 vRPC client threads and their
// server on 2 cores: 0.3% of yields; sleeping at once for a while after
// each cost 40% of their calls), while behind a busy loop every third or
// so takes 4 ms (the others return at once: the loop's slice put it behind).
constexpr auto costly_yield = std::chrono::microseconds(500);
// While yields are costly, a waiter whose peer may run on another CPU
// spins plainly, but no longer than a sleep and its wake-up cost: the
// answer comes within microseconds while the peer runs, and not before a
// busy loop's time slice ends when it does not (blocking 64 B ping-pong
// beside two busy loops on 2 cores, 4 runs of 2 s: 1.2-1.4 us spinning at
// most 10 us, 1.1-6.7 at most 200; kernel TCP 3.8-16.5).
constexpr auto busy_spin_most = std::chrono::microseconds(10);
constexpr auto costly_average = std::chrono::microseconds(100);
constexpr int average_over = 64;  // yields, about
// Without yields the average does not move: this long after the last costly
// yield, waits yield again, and find out.
constexpr auto no_yields_for = std::chrono::milliseconds(100);
// And only while the machine has more runnable threads than CPUs: a peer
// confined to the waiter's one CPU that writes a long burst also makes the
// waiter's yields long, yet they pay (64-byte writes with writer and reader
// on one CPU: 0.34 GB/s yielding, 0.17 sleeping at once). The count is
// looked at every few milliseconds (/proc/loadavg, a few microseconds).
constexpr auto busy_sample_every = std::chrono::milliseconds(5);

std::int64_t ticks(clock::time_point at = clock::now()) {
  return std::chrono::duration_cast<nanoseconds>(at.time_since_epoch()).count();
}

nanoseconds limit() {
  static const nanoseconds value =
      std::chrono::microseconds(std::max<std::int64_t>(0, setting_integer(settings::spin_us)));
  return value;
}

// This thread's budget, learnt from its waits; negative until its first.
[[gnu::tls_model("initial-exec")]] thread_local std::int64_t thread_budget_ns = -1;

std::atomic<int> peers_share{-1};  // -1: not said; 0: no; 1: yes
std::atomic<std::int64_t> last_costly_yield{INT64_MIN / 2};
// What a yield of this process took lately, a moving average in nanoseconds
// (races between threads only blur it).
std::atomic<std::int64_t> yield_average{0};

std::atomic<std::int64_t> busy_sampled_at{INT64_MIN / 2};
std::atomic<bool> machine_busy{false};

// Threads runnable on the machine now, this one included (the fourth field
// of /proc/loadavg, "running/total"); 0 if unknown.
long runnable_threads() {
  int fd = ::open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char text[128];
  ssize_t n = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  if (n <= 0) return 0;
  text[n] = '\0';
  const char* p = text;
  for (int field = 0; field < 3 && p; ++field)
    if ((p = std::strchr(p, ' '))) ++p;
  return p ? std::strtol(p, nullptr, 10) : 0;
}

bool busy_machine(std::int64_t now) {
  std::int64_t at = busy_sampled_at.load(std::memory_order_relaxed);
  // One waiter at a time takes the sample; the others use the last one.
  if (now - at >= nanoseconds(busy_sample_every).count() &&
      busy_sampled_at.compare_exchange_strong(at, now, std::memory_order_relaxed)) {
    static const long cpus = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
    // Two samples in a row: a kernel thread or a short job that runs beside
    // two peers that spin would make a quiet machine look busy.
    static std::atomic<bool> last_sample{false};
    const bool crowded = runnable_threads() > cpus;
    machine_busy.store(crowded && last_sample.exchange(crowded, std::memory_order_relaxed),
                       std::memory_order_relaxed);
  }
  return machine_busy.load(std::memory_order_relaxed);
}

bool yields_costly(std::int64_t now) {
  return yield_average.load(std::memory_order_relaxed) > nanoseconds(costly_average).count() &&
         now - last_costly_yield.load(std::memory_order_relaxed) <
             nanoseconds(no_yields_for).count() &&
         busy_machine(now);
}

// Yields, and notes what that cost.
void timed_yield() {
  const std::int64_t before = ticks();
  ::sched_yield();
  const std::int64_t after = ticks();
  const std::int64_t took = after - before;
  if (took >= nanoseconds(costly_yield).count())
    last_costly_yield.store(after, std::memory_order_relaxed);
  const std::int64_t average = yield_average.load(std::memory_order_relaxed);
  yield_average.store(average + (took - average) / average_over, std::memory_order_relaxed);
}

// While the machine has more runnable threads than CPUs, whether a wait
// should spin at all depends on who those threads are, which nothing cheap
// tells: peers that answer (four vRPC client threads and their server on 2
// cores: 455-525k calls/s spinning, 107-154k sleeping at once), or loops
// that compute, beside which a spinner may hold the very CPU its peer was
// woken onto. So each thread tries both, a number of waits each, and keeps
// the one under which its waits ended sooner, until it tries again. A
// trial is counted in waits, not time: a thread that waits in bursts (a
// client between requests, a benchmark that alternates with another
// transport) would spend a timed trial idle and decide nothing. Trials are
// short beside what is kept, and what is kept again and again is kept
// longer: a thread whose choice was right loses little to the other's trial.
constexpr std::int64_t trial_waits = 32;
// A thread that waits so seldom that a trial takes longer than this keeps
// what it had: its waits cost the machine little either way.
constexpr auto trial_most = std::chrono::milliseconds(200);
// A wait counts for at most this long: one preemption (milliseconds) in a
// trial would outweigh its other waits.
constexpr auto counted_most = std::chrono::milliseconds(1);
constexpr auto keep_length = std::chrono::milliseconds(400);
constexpr unsigned keep_doublings = 4;  // 6.4 s at most

struct crowd_trial {
  enum : std::uint8_t { trying_spins, trying_sleeps, keeping } stage = keeping;
  bool sleep_kept = false;
  unsigned same_choices = 0;  // in a row, before this one
  std::int64_t stage_ends = INT64_MIN / 2;
  std::int64_t waited_ns[2] = {0, 0}, waits[2] = {0, 0};  // [slept at once]

  // Whether a wait starting now sleeps at once.
  bool sleep_first(std::int64_t now) {
    const bool trial_done = stage != keeping && waits[stage == trying_sleeps] >= trial_waits;
    if (trial_done || now >= stage_ends) {
      switch (stage) {
        case trying_spins:
          stage = trial_done ? trying_sleeps : keeping;  // too few waits: what it had
          break;
        case trying_sleeps: {
          // Compared as means, without dividing: a*d < c*b.
          if (trial_done) {
            const bool sleep = waited_ns[1] * waits[0] < waited_ns[0] * waits[1];
            same_choices = sleep == sleep_kept ? std::min(same_choices + 1, keep_doublings) : 0;
            sleep_kept = sleep;
          }
          stage = keeping;
          break;
        }
        case keeping:
          stage = trying_spins;
          break;
      }
      if (stage == trying_spins) waited_ns[0] = waited_ns[1] = waits[0] = waits[1] = 0;
      stage_ends = now + (stage == keeping ? nanoseconds(keep_length).count() << same_choices
                                           : nanoseconds(trial_most).count());
    }
    return stage == trying_sleeps || (stage == keeping && sleep_kept);
  }
  void count(bool slept_first, nanoseconds took) {
    if (stage == keeping) return;
    waited_ns[slept_first] += std::min(took, nanoseconds(counted_most)).count();
    ++waits[slept_first];
  }
};
[[gnu::tls_model("initial-exec")]] thread_local crowd_trial crowd;

// Whether a plain spin can be answered: the peer may run beside us. The
// thread's CPU set is looked at again every few milliseconds (a system call
// per wait would cost as much as a round trip).
[[gnu::tls_model("initial-exec")]] thread_local std::int64_t affinity_checked_at = INT64_MIN / 2;
[[gnu::tls_model("initial-exec")]] thread_local bool several_cpus = true;

bool may_spin_plainly(std::int64_t now) {
  if (int told = peers_share.load(std::memory_order_relaxed); told >= 0) return told == 0;
  if (now - affinity_checked_at > std::chrono::nanoseconds(std::chrono::milliseconds(10)).count()) {
    affinity_checked_at = now;
    cpu_set_t set;
    several_cpus = ::sched_getaffinity(0, sizeof set, &set) != 0 || CPU_COUNT(&set) > 1;
  }
  return several_cpus;
}
}  // namespace

std::chrono::microseconds spin_limit() {
  return std::chrono::duration_cast<std::chrono::microseconds>(limit());
}

bool yields_are_costly() {
  return yields_costly(ticks());
}

bool machine_is_crowded() {
  return busy_machine(ticks());
}

std::chrono::nanoseconds thread_spin_budget() {
  return thread_budget_ns < 0 ? limit() : nanoseconds(thread_budget_ns);
}

void set_peers_share_cpus(std::optional<bool> share) {
  peers_share.store(share ? int(*share) : -1, std::memory_order_relaxed);
}

namespace detail {

void spinner::start(clock::time_point now) noexcept {
  if (thread_budget_ns < 0) thread_budget_ns = limit().count();
  started_ = true;
  start_ = now;
  plain_ = may_spin_plainly(ticks(now));
  begin_spin(now);
}

void spinner::restart() noexcept {
  learn();
  started_ = false;
  yielding_ = false;
  sleeps_ = 0;
}

void spinner::woke() noexcept {
  if (!started_) return;
  ++sleeps_;
  begin_spin(clock::now());
}

void spinner::begin_spin(clock::time_point now) noexcept {
  spent_ = false;
  yielding_ = false;
  const std::int64_t at = ticks(now);
  const bool costly = yields_costly(at);
  no_yields_ = costly && plain_;
  forced_ = costly && !no_yields_;
  // Decided once per wait, at its start (a wake-up does not change it).
  // Only a waiter that would spin plainly takes part in the crowd trial: one
  // that yields from the start (its peers share its CPUs) gives the CPU to
  // whoever is runnable, and costly yields already tell it when those are
  // loops that compute. Its own peers, yielding too, are what makes the
  // machine look crowded, and a trial there measures only the waiter's own
  // waits, not the wake-ups its sleeping costs the others (4 NX nodes on 2
  // CPUs: gsync 4.1-13.5 us trying, 3.7-4.6 yielding throughout).
  if (sleeps_ == 0) {
    crowded_ = may_sleep_ && !forced_ && plain_ && busy_machine(at);
    crowded_sleep_ = crowded_ && crowd.sleep_first(at);
  }
  forced_ = forced_ || crowded_sleep_;
  // Each sleep of one wait halves its next spin: a wait that keeps sleeping
  // (a peer that stopped, a provider without a wait descriptor that naps in
  // short slices) must not spin at every wake-up.
  budget_ = forced_ ? nanoseconds(0)
                    : std::min(most_, nanoseconds(thread_budget_ns >> std::min(sleeps_, 30u)));
  if (no_yields_) budget_ = std::min<nanoseconds>(budget_, busy_spin_most);
  spin_until_ = now + budget_;
  plain_until_ = plain_ ? now + plain_spin : now;
}

bool spinner::again(clock::time_point now) noexcept {
  if (!started_) start(now);
  spent_ = now >= spin_until_;
  yielding_ = !spent_ && now >= plain_until_ && !no_yields_;
  if (yielding_) timed_yield();
  return !spent_;
}

void spinner::learn() noexcept {
  if (!started_) return;
  const nanoseconds took = clock::now() - start_;
  // What a wait that ended by what it waited for took (not one given up
  // when its spin was spent, as a server's watch for the next call is).
  if (crowded_ && !spent_) crowd.count(crowded_sleep_, took);
  // A wait that slept at once for the machine's sake says nothing about
  // what spinning is worth.
  if (forced_) return;
  const std::int64_t most = limit().count();
  // Ended within the most, by what it waited for (not given up when its
  // spin was spent, as a server's watch for the next call is): a full spin
  // would have caught it.
  if (took <= limit() && !spent_)
    thread_budget_ns = std::min(most, std::max<std::int64_t>(2 * thread_budget_ns, 1000));
  else
    thread_budget_ns /= 2;
}

}  // namespace detail

waited wait_until(function_ref<turn()> step, clock::time_point deadline,
                  std::optional<sleep_step> sleep, const wait_options& options) {
  detail::spinner spin(options.spin_most, sleep.has_value());
  const bool spinning = options.spin;
  // A waiter whose peers share its CPUs yields from its first look, so it
  // looks at every turn: 31 turns of polling before each yield held 4 NX
  // nodes on 2 CPUs at 5.5 us a gsync, against Open MPI's 2.4-4.3.
  const unsigned per_look =
      peers_share.load(std::memory_order_relaxed) == 1 ? 1 : std::max(1u, options.turns_per_look);
  for (unsigned turns = 1;; ++turns) {
    switch (step()) {
      case turn::done:
        return waited::done;
      case turn::progressed:
        spin.restart();
        break;
      case turn::waiting:
        break;
    }
    if (spinning && turns % per_look != 0 && !spin.yielding()) continue;
    const auto now = clock::now();
    if (now >= deadline) return waited::timed_out;
    if (spinning && spin.again(now)) continue;
    if (!sleep) return waited::stopped;
    if (!(*sleep)(deadline - now)) return waited::stopped;
    spin.woke();
  }
}

bool sleep_briefly(nanoseconds nap) {
  if (nap > nanoseconds::zero())
    std::this_thread::sleep_for(nap);
  else
    ::sched_yield();
  return true;
}

}  // namespace vmmc::core
