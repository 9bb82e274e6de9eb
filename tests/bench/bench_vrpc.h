// tests/bench/bench_vrpc.h: the `vrpc` benchmark of vmmc-bench.
//
// "ours" is a vRPC client (clnt_vmmc_create) against a vRPC server transport;
// the references are libtirpc's own TCP and UDP clients and transports. All
// three transports live in one server process under one svc_run() with the
// same dispatch function; the parent process is the client:
//   vrpc/null_call       round trip of a null procedure (microseconds)
//   vrpc/calls_parallel  null calls per second, N client threads with one
//                        connection each (size = N)
//   vrpc/args            bandwidth of an opaque<> argument, void-sized reply
//   vrpc/results         bandwidth of an opaque<> result, tiny argument
// UDP is measured only where a datagram holds the call (libtirpc's default
// 8800-byte UDP buffers). options::providers is ignored.
#pragma once

#include <string>
#include <vector>

#include "bench_common.h"

namespace vmmc::bench {

// Measures the vrpc benchmark and appends its rows. Throws on failure.
void run_vrpc_benchmark(const options& opts, std::vector<result_row>& rows);
// Its rows under `prefix`, wherever placement() puts the pair.
void measure_vrpc_rows(bool quick, const std::string& prefix, std::vector<result_row>& rows,
                       scope what = scope::all);

}  // namespace vmmc::bench
