// tests/bench/bench_sockets.h: the `sockets` benchmark of vmmc-bench.
//
// "ours" is vmmc::sockets, the reference "kernel_tcp" the kernel's own socket
// calls; both run the same code (templates over an api type) in the same run,
// between two processes over 127.0.0.1 TCP with TCP_NODELAY on both ends:
//   sockets/latency              one-way ping-pong latency, blocking read loops
//                                (1 B .. 64 KiB)
//   sockets/bandwidth            streaming, the reader reads into an 8 MiB buffer
//                                (64 B .. 8 MiB messages)
//   sockets/bandwidth_sized_reads  the same, the reader reads one message at a time
//   sockets/connect              socket + connect + accept + one 1-byte round trip
//                                (median per connection)
//   sockets/many_connections     64-byte request/response over 100 connections,
//                                both ends on epoll (requests per second)
//   sockets/placement            1 MiB into another process: ours = memcpy out of
//                                a shared mapping, ref process_vm_writev
// It also prints what vmmc::sockets::describe() says about ours' ping-pong
// connection, so a reader sees which path was measured. options::providers is
// ignored: the sockets layer chooses its own path.
#pragma once

#include <string>
#include <vector>

#include "bench_common.h"

namespace vmmc::bench {

// Measures the sockets benchmark and appends its rows. Throws on failure.
void run_sockets_benchmark(const options& opts, std::vector<result_row>& rows);

// Its pair rows (latency .. many_connections) under `prefix`, ours with the
// core settings for `provider` ("shm", "tcp"; empty: the defaults, as a user
// runs it), wherever placement() puts the pair.
void measure_sockets_rows(bool quick, const std::string& provider, const std::string& prefix,
                          std::vector<result_row>& rows, scope what = scope::all);

}  // namespace vmmc::bench
