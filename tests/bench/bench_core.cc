// tests/bench/bench_core.cc: the `core` benchmark (see bench_core.h).
//
// Latency comes twice: "latency" is the VMMC papers' experiment (a plain
// deliberate update, the receiver spins on its last byte) beside raw fi_write
// polled the same way; "latency_notify" carries a notification and waits for
// its handler, beside fi_writedata + remote CQ completion and fi_send.
// "ours" is vmmc::core as a user gets it: for "shm" the same-host default
// (memory from context::allocate, so the mapped path), for "tcp" libfabric
// tcp;ofi_rxm. The row group "shm-fabric" shows our libfabric path over shm
// (mapped path off) beside the same references, for what the mapped path buys.
// Each experiment mirrors its raw_fabric.cc reference: same sizes, same
// calibration, same pattern (one source buffer, one destination offset).
#include "bench_core.h"

#include <sys/mman.h>

#include <atomic>
#include <cmath>
#include <iostream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>

#include "raw_fabric.h"
#include "vmmc/core/context.h"

namespace vmmc::bench {
namespace {

using namespace vmmc::core;

struct variant {
  std::string name;      // row prefix
  std::string provider;  // the one provider opened
  bool mapped;           // mapped path on, exported memory from allocate()
};

enum class experiment : std::uint32_t {
  latency_polled,
  latency,
  bandwidth,
  bidir,
  overhead_async,
  overhead_sync
};

struct plan {
  experiment what;
  std::uint64_t size;
  std::uint64_t iterations;
};

constexpr std::size_t region_size = (8 << 20) + 4096;
constexpr std::size_t stream_window = 32;      // as the raw reference
constexpr std::size_t copied_send_max = 4096;  // VMMC_CORE_INLINE_MAX default

[[noreturn]] void fail(const char* what, std::error_code ec) {
  throw std::runtime_error(std::string(what) + ": " + ec.message());
}

// One process's side: a context, an exported region whose notifications
// count up `notified`, a page-aligned source buffer and the peer's import.
struct session {
  std::optional<context> ctx;
  mappable_buffer mapped;
  std::byte* region = nullptr;
  std::byte* source = nullptr;
  std::atomic<std::uint64_t> notified{0};
  import_handle peer{};

  session(const variant& v, peer_link& link, bool parent) {
    context_options o;
    o.providers = {v.provider};
    o.mapped_path = v.mapped ? 1 : 0;
    if (v.provider == "tcp") o.local_address = this_host_address();
    auto c = context::create(o);
    if (!c) fail("context::create", c.error());
    ctx.emplace(std::move(*c));
    if (v.mapped) {
      auto b = ctx->allocate(region_size);
      if (!b) fail("allocate", b.error());
      mapped = std::move(*b);
      region = mapped.data();
    } else {
      region = page_aligned(region_size);
    }
    source = page_aligned(region_size);
    std::memset(source, 7, region_size);
    std::memset(region, 0, region_size);
    export_options eo;
    eo.on_notify = [this](const notification&) {
      notified.fetch_add(1, std::memory_order_relaxed);
    };
    if (auto e = ctx->export_buffer("bench", region, region_size, eo); !e)
      fail("export", e.error());
    std::string peer_address;
    if (parent) {
      link.send(ctx->address());
      peer_address = link.recv();
    } else {
      peer_address = link.recv();
      link.send(ctx->address());
    }
    auto h = ctx->import_buffer(peer_address, "bench");
    if (!h) fail("import", h.error());
    peer = *h;
    link.barrier();
  }
  ~session() {
    ctx.reset();
    if (!mapped.data()) ::munmap(region, region_size);
    ::munmap(source, region_size);
  }

  static std::byte* page_aligned(std::size_t n) {
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap");
    return static_cast<std::byte*>(p);
  }

  void send(std::size_t size, bool notify) {
    if (status s = ctx->send(peer, 0, source, size, {notify, size}); !s) fail("send", s.error());
  }
  // The VMMC papers' latency experiment: a plain deliberate update whose
  // last byte carries a fresh tag; the receiver spins on it in its region.
  std::uint8_t sent_tag = 0, seen_tag = 0;
  static std::uint8_t next(std::uint8_t t) { return static_cast<std::uint8_t>(t % 255 + 1); }
  void ping_polled(std::size_t size) {
    sent_tag = next(sent_tag);
    source[size - 1] = std::byte{sent_tag};
    send(size, false);
  }
  void await_polled(std::size_t size) {
    seen_tag = next(seen_tag);
    const volatile std::byte* last = region + size - 1;
    while (*last != std::byte{seen_tag}) ctx->progress();
  }
  void await(std::uint64_t target) {
    while (notified.load(std::memory_order_relaxed) < target) ctx->poll_notifications();
  }
  // `count` sends of `size` bytes, copied ones synchronously and zero-copy
  // ones with up to stream_window in flight, then a notification behind them.
  void stream(std::size_t size, std::size_t count) {
    std::vector<request> window;
    for (std::size_t i = 0; i < count; ++i) {
      if (size <= copied_send_max) {
        send(size, false);
        continue;
      }
      if (window.size() == stream_window) {
        if (auto c = ctx->wait(window.front()); !c || c->error)
          fail("wait", c ? c->error : c.error());
        window.erase(window.begin());
      }
      auto r = ctx->send_async(peer, 0, source, size);
      if (!r) fail("send_async", r.error());
      window.push_back(*r);
    }
    for (request r : window)
      if (auto c = ctx->wait(r); !c || c->error) fail("wait", c ? c->error : c.error());
    send(0, true);
  }
};

// Runs the child's side of every plan the parent sends until a zero plan.
void serve(session& s, peer_link& link) {
  for (;;) {
    const plan p = link.recv_value<plan>();
    if (p.iterations == 0) return;
    link.send("ready");
    switch (p.what) {
      case experiment::latency_polled:
        for (std::uint64_t i = 0; i < p.iterations; ++i) {
          s.await_polled(p.size);
          s.ping_polled(p.size);
        }
        break;
      case experiment::latency:
        for (std::uint64_t i = 0; i < p.iterations; ++i) {
          s.await(s.notified + 1);
          s.send(p.size, true);
        }
        break;
      case experiment::bandwidth:
        s.await(s.notified + 1);
        s.send(0, true);
        break;
      case experiment::bidir: {
        const std::uint64_t target = s.notified + 1;
        s.stream(p.size, p.iterations);
        s.await(target);
        break;
      }
      case experiment::overhead_async:
      case experiment::overhead_sync: {
        const std::uint64_t target = s.notified + 1;  // the parent's "stop"
        while (s.notified < target) {
          s.ctx->progress();
          s.ctx->poll_notifications();
        }
        break;
      }
    }
    link.send("done");
  }
}

// Parent side of one measurement: returns seconds for `n` iterations.
double measure(session& s, peer_link& link, experiment what, std::size_t size, std::size_t n) {
  link.send_value(plan{what, size, n});
  if (link.recv() != "ready") throw std::runtime_error("child out of step");
  double seconds = 0;
  switch (what) {
    case experiment::latency_polled: {
      const auto t0 = bench_clock::now();
      for (std::size_t i = 0; i < n; ++i) {
        s.ping_polled(size);
        s.await_polled(size);
      }
      seconds = seconds_between(t0, bench_clock::now());
      break;
    }
    case experiment::latency: {
      const auto t0 = bench_clock::now();
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint64_t target = s.notified + 1;
        s.send(size, true);
        s.await(target);
      }
      seconds = seconds_between(t0, bench_clock::now());
      break;
    }
    case experiment::bandwidth:
    case experiment::bidir: {
      const std::uint64_t target = s.notified + 1;
      const auto t0 = bench_clock::now();
      s.stream(size, n);
      s.await(target);  // the peer's acknowledgement, or its own stream's end
      seconds = seconds_between(t0, bench_clock::now());
      break;
    }
    case experiment::overhead_async: {
      std::vector<request> batch;
      for (std::size_t done = 0; done < n;) {
        const std::size_t k = std::min<std::size_t>(64, n - done);
        const auto t0 = bench_clock::now();
        for (std::size_t i = 0; i < k; ++i) {
          auto r = s.ctx->send_async(s.peer, 0, s.source, size);
          if (!r) fail("send_async", r.error());
          batch.push_back(*r);
        }
        seconds += seconds_between(t0, bench_clock::now());
        for (request r : batch)
          if (auto c = s.ctx->wait(r); !c || c->error) fail("wait", c ? c->error : c.error());
        batch.clear();
        done += k;
      }
      s.send(0, true);
      break;
    }
    case experiment::overhead_sync: {
      const auto t0 = bench_clock::now();
      for (std::size_t i = 0; i < n; ++i) s.send(size, false);
      seconds = seconds_between(t0, bench_clock::now());
      s.send(0, true);
      break;
    }
  }
  if (link.recv() != "done") throw std::runtime_error("child out of step");
  return seconds;
}

struct ours_results {
  std::vector<double> latency_polled, latency, bandwidth, bidir, overhead_async, overhead_sync;
};

ours_results measure_ours(const variant& v, const std::vector<std::size_t>& lat_sizes,
                          const std::vector<std::size_t>& bw_sizes,
                          const std::vector<std::size_t>& oh_sizes, bool quick) {
  ours_results r;
  run_pair(
      [&](peer_link& link) {
        session s(v, link, true);
        auto one = [&](experiment what, std::size_t size, std::size_t probe, auto value) {
          return calibrated_median(
              quick, probe, 2'000'000,
              [&](std::size_t n) { return measure(s, link, what, size, n); }, value);
        };
        auto one_way_us = [](double sec, std::size_t n) {
          return sec / static_cast<double>(n) / 2 * 1e6;
        };
        measure(s, link, experiment::latency_polled, 8, quick ? 200 : 2000);  // warm-up
        for (std::size_t size : lat_sizes)
          r.latency_polled.push_back(one(experiment::latency_polled, size, 50, one_way_us));
        for (std::size_t size : lat_sizes)
          r.latency.push_back(one(experiment::latency, size, 50, one_way_us));
        measure(s, link, experiment::bandwidth, 64 * 1024, 64);  // warm-up
        auto gbps = [](std::size_t size, int directions) {
          return [size, directions](double sec, std::size_t n) {
            return static_cast<double>(size * n) * directions / sec / 1e9;
          };
        };
        for (std::size_t size : bw_sizes) {
          const std::size_t probe = size >= (1 << 20) ? 8 : 64;
          r.bandwidth.push_back(one(experiment::bandwidth, size, probe, gbps(size, 1)));
          r.bidir.push_back(one(experiment::bidir, size, probe, gbps(size, 2)));
        }
        auto per_call_us = [](double sec, std::size_t n) {
          return sec / static_cast<double>(n) * 1e6;
        };
        for (std::size_t size : oh_sizes) {
          r.overhead_async.push_back(one(experiment::overhead_async, size, 256, per_call_us));
          r.overhead_sync.push_back(one(experiment::overhead_sync, size, 256, per_call_us));
        }
        link.send_value(plan{experiment::latency, 0, 0});
      },
      [&](peer_link& link) {
        session s(v, link, false);
        serve(s, link);
      },
      std::chrono::seconds(120));
  return r;
}

}  // namespace

void measure_core_latency_rows(bool quick, const std::string& provider, const std::string& prefix,
                               std::vector<result_row>& rows) {
  const auto lat_sizes = latency_sizes(quick);
  std::cout << "# " << raw::describe_provider(provider) << "\n";
  // Raw and ours alternate, each figure the best of its rounds: the machine's
  // state drifts between runs (raw 8 B one-way 5.9 us in one run, 8.5 in the
  // next across the same veth).
  std::vector<double> raw_best(lat_sizes.size(), not_measured),
      ours_best(lat_sizes.size(), not_measured);
  auto keep_min = [](std::vector<double>& best, const std::vector<double>& got) {
    for (std::size_t i = 0; i < best.size() && i < got.size(); ++i)
      if (std::isnan(best[i]) || got[i] < best[i]) best[i] = got[i];
  };
  for (int round = 0; round < 3; ++round) {
    std::cerr << "measuring raw " << provider << " and ours, latency, round " << round + 1 << "\n";
    keep_min(raw_best, raw::latency_us(provider, raw::transport::write_polled, lat_sizes, quick));
    keep_min(ours_best,
             measure_ours({provider, provider, false}, lat_sizes, {}, {}, quick).latency_polled);
  }
  add_rows(rows, prefix + "latency", metric::latency_us, lat_sizes, ours_best,
           {{"libfabric_write", raw_best}});
}

void run_core_benchmark(const options& opts, std::vector<result_row>& rows) {
  const bool quick = opts.quick;
  const auto lat_sizes = latency_sizes(quick);
  const auto bw_sizes = bandwidth_sizes(quick);
  const auto oh_sizes = overhead_sizes(quick);

  std::cerr << "measuring memcpy\n";
  // "memcpy": the same two buffers every time, as every transfer row here;
  // "memcpy_cold": through arenas that miss the caches from 1 MiB on.
  const auto memcpy_GBps = raw::memcpy_bandwidth_GBps(bw_sizes, quick, false);
  const auto memcpy_cold_GBps = raw::memcpy_bandwidth_GBps(bw_sizes, quick, true);

  for (const std::string& provider : opts.providers) {
    std::cout << "# " << raw::describe_provider(provider) << "\n";
    std::cerr << "measuring raw " << provider << "\n";
    const auto polled_lat =
        raw::latency_us(provider, raw::transport::write_polled, lat_sizes, quick);
    const auto writedata_lat =
        raw::latency_us(provider, raw::transport::write_data, lat_sizes, quick);
    const auto msg_lat = raw::latency_us(provider, raw::transport::msg, lat_sizes, quick);
    const auto write_bw =
        raw::write_bandwidth_GBps(provider, raw::direction::one_way, bw_sizes, quick);
    const auto write_bidir =
        raw::write_bandwidth_GBps(provider, raw::direction::both_ways, bw_sizes, quick);
    std::vector<double> raw_async, raw_sync;
    for (const raw::send_overhead& o : raw::write_overhead_us(provider, oh_sizes, quick)) {
      raw_async.push_back(o.async_us);
      raw_sync.push_back(o.sync_us);
    }

    std::vector<variant> variants{{provider, provider, provider == "shm"}};
    if (provider == "shm") variants.push_back({"shm-fabric", "shm", false});
    for (const variant& v : variants) {
      std::cerr << "measuring ours: " << v.name << "\n";
      const ours_results o = measure_ours(v, lat_sizes, bw_sizes, oh_sizes, quick);
      const std::string prefix = v.name + "/";
      add_rows(rows, prefix + "latency", metric::latency_us, lat_sizes, o.latency_polled,
               {{"libfabric_write", polled_lat}});
      add_rows(rows, prefix + "latency_notify", metric::latency_us, lat_sizes, o.latency,
               {{"libfabric_writedata", writedata_lat}, {"libfabric_msg", msg_lat}});
      add_rows(rows, prefix + "bandwidth", metric::bandwidth_GBps, bw_sizes, o.bandwidth,
               {{"libfabric_write", write_bw},
                {"memcpy", memcpy_GBps},
                {"memcpy_cold", memcpy_cold_GBps}});
      add_rows(rows, prefix + "bidir_bandwidth", metric::bandwidth_GBps, bw_sizes, o.bidir,
               {{"libfabric_write", write_bidir}});
      add_rows(rows, prefix + "overhead_async", metric::overhead_us, oh_sizes, o.overhead_async,
               {{"libfabric_write", raw_async}});
      add_rows(rows, prefix + "overhead_sync", metric::overhead_us, oh_sizes, o.overhead_sync,
               {{"libfabric_write", raw_sync}});
    }
  }
}

}  // namespace vmmc::bench
