// tests/bench/bench_multihost.h: the `multihost` benchmark of vmmc-bench.
//
// The other benchmarks' pairs across two simulated hosts: network namespaces
// a and b on a bridge (and c, from which mpirun starts the NX jobs), made
// and removed by the benchmark (it needs root; without namespaces it fails
// saying so). The client of each pair runs on host a, its server on host
// b, every process with vmmc's default settings, so "ours" is whatever path
// the per-peer decision took (said in the output); each row has its
// reference measured in the same run:
//   hosts/sockets/*   latency, bandwidth, connect ...     ref kernel_tcp
//   hosts/vrpc/*      null call, parallel calls, args ... refs libtirpc_tcp, _udp
//   hosts/nx/*        ping-pong, gdsum, gsync (2 nodes)   ref openmpi (ob1, btl tcp)
//   hosts/core-tcp/latency  core over libfabric tcp       ref libfabric_write (raw)
#pragma once

#include <vector>

#include "bench_common.h"

namespace vmmc::bench {

// Measures the multihost benchmark and appends its rows. Throws on failure.
void run_multihost_benchmark(const options& opts, std::vector<result_row>& rows);

}  // namespace vmmc::bench
