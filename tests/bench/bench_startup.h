// tests/bench/bench_startup.h: the `startup` benchmark of vmmc-bench: what
// being under an interposer costs a process, beside the same process without
// it (the kernel's TCP), in the same run. Fresh processes
// (vmmc-bench-startup-peer, plain libc) are started with and without
// LD_PRELOAD, alternately:
//   startup/exec_<module>     /bin/true, start to exit (microseconds)
//   startup/first_connection  a fresh client's first connect + 64-byte round
//                             trip, both ends under libvmmc_preload.so
//   startup/one_shot_process  a client process that makes that one connection
//                             and exits, start to exit
//   startup/connect_p50, _p99 connect + first round trip of later connections
//                             (size = connections measured)
//   startup/rss               resident-set growth of a client holding `size`
//                             connections (MB)
// options::providers is ignored: the stack picks its path itself.
#pragma once

#include <vector>

#include "bench_common.h"

namespace vmmc::bench {

// Measures the startup benchmark and appends its rows. Throws on failure.
void run_startup_benchmark(const options& opts, std::vector<result_row>& rows);

}  // namespace vmmc::bench
