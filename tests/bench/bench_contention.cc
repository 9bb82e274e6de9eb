// tests/bench/bench_contention.cc: the `contention` benchmark (see
// bench_contention.h).
#include "bench_contention.h"

#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>

#include "bench_nx.h"
#include "bench_sockets.h"
#include "bench_vrpc.h"

namespace vmmc::bench {
namespace {

// This process, and every process it starts from now on, on CPU 0 only;
// the old CPU set comes back on destruction.
class confined_to_one_cpu {
 public:
  confined_to_one_cpu() {
    if (::sched_getaffinity(0, sizeof saved_, &saved_) != 0)
      throw std::runtime_error("sched_getaffinity failed");
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(0, &one);
    if (::sched_setaffinity(0, sizeof one, &one) != 0)
      throw std::runtime_error("cannot confine the benchmark to CPU 0");
  }
  ~confined_to_one_cpu() { (void)::sched_setaffinity(0, sizeof saved_, &saved_); }
  confined_to_one_cpu(const confined_to_one_cpu&) = delete;
  confined_to_one_cpu& operator=(const confined_to_one_cpu&) = delete;

 private:
  cpu_set_t saved_;
};

// A process of `threads` threads that compute until it is ended on
// destruction (by its PID), when this process dies, or after 10 minutes.
class busy_threads {
 public:
  explicit busy_threads(int threads) {
    std::cout.flush();
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::alarm(600);
      std::atomic<unsigned long> sink{0};
      auto spin = [&sink] {
        for (unsigned long i = 0;; ++i) sink.store(i, std::memory_order_relaxed);
      };
      for (int i = 1; i < threads; ++i) std::thread(spin).detach();
      spin();
    }
  }
  ~busy_threads() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  busy_threads(const busy_threads&) = delete;
  busy_threads& operator=(const busy_threads&) = delete;

 private:
  pid_t pid_;
};

// The three pair benchmarks' round trips under `prefix`; `bind` is the
// launchers' binding option (each launcher binds its nodes to the CPUs it
// was given unless told not to).
void measure_round_trips(bool quick, const std::string& prefix, const std::string& bind,
                         std::vector<result_row>& rows) {
  measure_sockets_rows(quick, "", prefix + "sockets/", rows, scope::latency);
  std::cerr << "measuring vrpc and libtirpc\n";
  measure_vrpc_rows(quick, prefix + "vrpc/", rows, scope::latency);
  measure_nx_rows(
      quick, prefix + "nx/", {2},
      [&](int nodes) {
        return std::string(VMMC_NXRUN) + " " + bind + "-n " + std::to_string(nodes) + " ";
      },
      [&](int nodes) { return openmpi_on_this_host + bind + "-n " + std::to_string(nodes) + " "; },
      rows, scope::latency);
}

}  // namespace

void run_contention_benchmark(const options& opts, std::vector<result_row>& rows) {
  {
    std::cout << "# one_core: every process on CPU 0\n";
    const confined_to_one_cpu confined;
    // Both launchers would refuse to bind two nodes to one CPU, or bind
    // them to it one by one: unbound, they keep the set they inherit.
    measure_round_trips(opts.quick, "one_core/", "--bind-to none ", rows);
  }
  {
    std::cout << "# busy: two more threads compute on the machine's "
              << std::thread::hardware_concurrency() << " CPUs\n";
    const busy_threads busy(2);
    measure_round_trips(opts.quick, "busy/", "", rows);
  }
}

}  // namespace vmmc::bench
