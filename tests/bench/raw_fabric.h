// tests/bench/raw_fabric.h: reference measurements on raw libfabric and memcpy.
//
// These are the numbers the VMMC stack ("ours") is compared with, measured the
// way the VMMC-on-Myrinet papers measured the hardware underneath: ping-pong
// latency, streaming and bidirectional bandwidth, and per-call send overhead,
// between two processes (run_pair) over one RDM endpoint each, plus the
// bandwidth of a single-threaded memcpy.
//
// `provider` is a short name as in options::providers: "shm" or "tcp"
// (tcp;ofi_rxm on 127.0.0.1). Every function forks its own process pair, so it
// must be called with no libfabric objects open in the calling process. Each
// returns one value per entry of `sizes`, in the same order; `quick` shortens
// the measurement (see effort_for). Failures throw std::runtime_error.
//
// The benchmark is a reference, so this file and raw_fabric.cc are the only
// code outside core/ that talks to libfabric directly.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace vmmc::bench::raw {

// How a ping-pong moves its bytes.
enum class transport {
  write_polled,  // "libfabric_write": fi_write (fi_inject_write when small) into the
                 // peer's registered buffer; the peer drives progress and spins on the
                 // last byte, which carries a fresh tag (the VMMC papers' experiment)
  write_data,    // "libfabric_writedata": fi_writedata (fi_inject_writedata when small);
                 // the peer waits for the remote CQ data completion
  msg,           // "libfabric_msg": fi_send (fi_inject when small) into a pre-posted fi_recv
};

// One-way latency in microseconds: the median over repeats of round trip / 2.
std::vector<double> latency_us(const std::string& provider, transport how,
                               const std::vector<std::size_t>& sizes, bool quick);

enum class direction { one_way, both_ways };

// Streaming fi_write bandwidth in GB/s (1e9 bytes/s): a window of outstanding
// writes from one registered buffer into the peer's, closed by a message that
// is ordered after the writes (FI_ORDER_SAW). both_ways: both processes stream
// at once and the figure is the total of both directions.
std::vector<double> write_bandwidth_GBps(const std::string& provider, direction dir,
                                         const std::vector<std::size_t>& sizes, bool quick);

struct send_overhead {
  double async_us;  // one fi_write call, returning after the post
  double sync_us;   // until the source may be reused: fi_inject_write when the size
                    // fits the inject size, else fi_write + wait for its completion
};

// Per-call cost of posting a write (the peer only drives progress).
std::vector<send_overhead> write_overhead_us(const std::string& provider,
                                             const std::vector<std::size_t>& sizes, bool quick);

// Single-threaded memcpy bandwidth in GB/s, in this process. With `cold`,
// sizes of 1 MiB and more cycle through 64 MiB (or 4 x size) source and
// destination arenas so the copies miss the caches; otherwise every copy is
// between the same two buffers, as the transfer experiments reuse one buffer.
std::vector<double> memcpy_bandwidth_GBps(const std::vector<std::size_t>& sizes, bool quick,
                                          bool cold);

// One line about what the provider gave us: its name, inject size, MR mode,
// progress model (fi_getinfo runs in a child process, see above).
std::string describe_provider(const std::string& provider);

}  // namespace vmmc::bench::raw
