// unit.core.progress: the spin policy every wait follows (core/progress.h):
// a spin never outlasts its budget, learns what spinning has been worth,
// and does not yield while yields hand the core to threads that compute.
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "vmmc/core/progress.h"

namespace vmmc::test {
namespace {

using namespace std::chrono_literals;
using clock = std::chrono::steady_clock;
using core::spinner;
using std::chrono::nanoseconds;

nanoseconds most() {
  return std::chrono::duration_cast<nanoseconds>(core::spin_limit());
}

// Runs `body` in a fresh thread (it starts from the full budget: what a
// thread learnt stays with it) until it ran undisturbed: on a shared machine
// one of its yields may take a time slice, and waits then sleep at once for
// a while, which the expected figures do not allow for. `body` returns
// false when a wait's budget said so.
template <class Body>
void undisturbed(Body body) {
  for (int attempt = 0; attempt < 10; ++attempt) {
    while (core::yields_are_costly()) std::this_thread::sleep_for(5ms);
    bool clean = false;
    std::thread t([&] { clean = body(); });
    t.join();
    if (clean) return;
  }
  FAIL() << "10 runs were disturbed by costly yields";
}

TEST(Progress, ASpinLastsItsBudgetThenSaysSleep) {
  undisturbed([] {
    spinner s;
    auto start = clock::now();
    int turns = 0;
    while (s.again()) ++turns;
    auto spun = clock::now() - start;
    if (s.budget() == 0ns) return false;
    EXPECT_EQ(s.budget(), most()) << "a fresh thread starts from the most";
    EXPECT_GE(spun, s.budget());
    EXPECT_GT(turns, 0);
    return true;
  });
}

TEST(Progress, SpinningThatDoesNotPayShrinksAndThatWhichPaysGrows) {
  undisturbed([] {
    bool clean = true;
    auto spin_out = [&](spinner& s) {
      while (s.again()) {
      }
      clean &= s.budget() > 0ns;
    };
    // Three waits that outlast the most: the spins were wasted.
    for (int i = 0; i < 3; ++i) {
      spinner s;
      spin_out(s);
      std::this_thread::sleep_for(core::spin_limit() + 1ms);  // the "sleep"
      s.woke();
    }
    const auto after_wasted = core::thread_spin_budget();
    // A watch given up when its spin was spent (a server's wait for a next
    // call that does not come) halves it too.
    {
      spinner s;
      spin_out(s);
    }
    const auto after_given_up = core::thread_spin_budget();
    // Waits answered within the most double it again, up to the most.
    for (int i = 0; i < 40; ++i) {
      spinner s;
      (void)s.again();  // answered at the next look
      clean &= s.budget() > 0ns;
    }
    if (!clean) return false;
    EXPECT_EQ(after_wasted, most() / 8) << "halved by each of 3 wasted waits";
    EXPECT_EQ(after_given_up, most() / 16);
    EXPECT_EQ(core::thread_spin_budget(), most());
    return true;
  });
}

// A wait that keeps sleeping (a stopped peer; shm, which has no descriptor
// and naps in 50 us slices) spins half as long after each wake-up, not the
// whole budget every time.
TEST(Progress, AWaitThatKeepsSleepingSpinsLessEachTime) {
  undisturbed([] {
    spinner s;
    std::vector<nanoseconds> budgets;
    for (int sleep = 0; sleep < 4; ++sleep) {
      while (s.again()) {
      }
      budgets.push_back(s.budget());
      s.woke();
    }
    for (auto b : budgets)
      if (b == 0ns) return false;
    EXPECT_EQ(budgets, (std::vector<nanoseconds>{most(), most() / 2, most() / 4, most() / 8}));
    return true;
  });
}

TEST(Progress, AWatchSpinsNoLongerThanItsOwnLimit) {
  undisturbed([] {
    spinner s(20us);
    while (s.again()) {
    }
    if (s.budget() == 0ns) return false;
    EXPECT_EQ(s.budget(), 20us);
    return true;
  });
}

TEST(Progress, AWaitAnsweredAtOnceCostsAndTeachesNothing) {
  std::thread t([] {
    for (int i = 0; i < 10; ++i) {
      spinner s;  // never asked: the answer was there
      EXPECT_EQ(s.budget(), 0ns);
    }
    EXPECT_EQ(core::thread_spin_budget(), core::spin_limit());
  });
  t.join();
}

// Yields behind a thread that computes on the waiter's CPU take its time
// slice; soon yields count as costly, and no wait yields any more: one whose
// peer shares its CPU (as NX says of its nodes) sleeps at once, since a
// sleeper's wake-up preempts such a thread where a yielder waits for its
// slice to end; one whose peer may run on another CPU spins plainly, as it
// would be answered within microseconds.
void with_costly_yields(const std::function<void()>& then) {
  core::set_peers_share_cpus(true);
  std::thread t([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(0, &one);
    ASSERT_EQ(::sched_setaffinity(0, sizeof one, &one), 0);
    // One thread that computes per CPU, the first on ours.
    std::atomic<bool> stop{false};
    std::vector<std::thread> computing;
    for (unsigned cpu = 0; cpu < std::max(1u, std::thread::hardware_concurrency()); ++cpu)
      computing.emplace_back([&, cpu] {
        cpu_set_t its;
        CPU_ZERO(&its);
        CPU_SET(cpu, &its);
        (void)::sched_setaffinity(0, sizeof its, &its);
        while (!stop.load(std::memory_order_relaxed)) {
        }
      });
    std::this_thread::sleep_for(10ms);  // they run
    // Each wait yields to the one on our CPU, which takes its slice.
    int waits = 0;
    for (auto until = clock::now() + 2s; !core::yields_are_costly() && clock::now() < until;
         ++waits) {
      spinner s;
      (void)s.again();  // one yield, then the answer is there
    }
    EXPECT_TRUE(core::yields_are_costly()) << "after " << waits << " waits";
    EXPECT_LE(waits, 100);
    then();
    stop = true;
    for (auto& c : computing) c.join();
  });
  t.join();
  core::set_peers_share_cpus(std::nullopt);
}

TEST(Progress, WithCostlyYieldsAWaitWhosePeerSharesItsCpuSleepsAtOnce) {
  with_costly_yields([] {
    spinner s;
    EXPECT_FALSE(s.again());
    EXPECT_EQ(s.budget(), 0ns);
  });
}

TEST(Progress, WithCostlyYieldsAWaitWhosePeerRunsBesideItSpinsWithoutYielding) {
  with_costly_yields([] {
    core::set_peers_share_cpus(false);
    // A spin of its budget turns thousands of times when it does not yield;
    // each yield here takes a time slice. The spin may be preempted (the
    // thread that computes shares the CPU), so the best of a few counts.
    int most_turns = 0;
    for (int attempt = 0; attempt < 5 && core::yields_are_costly(); ++attempt) {
      spinner s;
      int turns = 0;
      while (s.again()) ++turns;
      EXPECT_GT(s.budget(), 0ns);
      most_turns = std::max(most_turns, turns);
    }
    EXPECT_GT(most_turns, 100);
  });
}

}  // namespace
}  // namespace vmmc::test
