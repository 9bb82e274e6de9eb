// tests/bench/bench_contention.h: the `contention` benchmark of vmmc-bench.
//
// The small-message round trips of the sockets, vrpc and nx benchmarks
// (scope::latency) when processes compete for CPUs, each beside its
// reference in the same run (kernel TCP, libtirpc, Open MPI):
//   one_core/...    every process of the pair (or job) confined to CPU 0
//                   (sched_setaffinity, as `taskset -c 0`): a busy-poll
//                   holds the core its peer needs;
//   busy/...        no confinement, two more threads on the machine that
//                   compute all the time (its two cores oversubscribed).
// What it shows is core's one spin policy (progress.h): spin only while the
// waiter has a core to itself and spinning pays.
#pragma once

#include <vector>

#include "bench_common.h"

namespace vmmc::bench {

// Measures the contention benchmark and appends its rows. Throws on failure.
void run_contention_benchmark(const options& opts, std::vector<result_row>& rows);

}  // namespace vmmc::bench
