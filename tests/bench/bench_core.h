// tests/bench/bench_core.h: the `core` benchmark of vmmc-bench.
//
// Cases, for each provider in options::providers ("<provider>/<case>"):
//   latency          one-way ping-pong, receiver polls memory   ref libfabric_write (polled)
//   latency_notify   one-way ping-pong with notifications  refs libfabric_writedata, _msg
//   bandwidth        one-way streaming bandwidth       refs libfabric_write, memcpy,
//                                                       memcpy_cold
//   bidir_bandwidth  both directions at once (total)   ref  libfabric_write
//   overhead_async   per-call cost of an async send    ref  libfabric_write (fi_write)
//   overhead_sync    per-call cost of a sync send      ref  libfabric_write (inject or write+wait)
// with the size sweeps of bench_common.h.
#pragma once

#include <string>
#include <vector>

#include "bench_common.h"

namespace vmmc::bench {

// Measures the core benchmark and appends its rows. Throws on failure.
void run_core_benchmark(const options& opts, std::vector<result_row>& rows);
// Only its latency rows for `provider`, under `prefix`, wherever
// placement() puts the pair.
void measure_core_latency_rows(bool quick, const std::string& provider, const std::string& prefix,
                               std::vector<result_row>& rows);

}  // namespace vmmc::bench
