// tests/bench/bench_core.cc: the `core` benchmark (see bench_core.h).
//
// Temporary body: measures the references only and leaves "ours" unmeasured
// (NaN, printed "-"), so the table and JSON paths run end to end until the
// VMMC core measurements take their place beside the references.
#include "bench_core.h"

#include <iostream>
#include <map>
#include <string>

#include "raw_fabric.h"

namespace vmmc::bench {

void run_core_benchmark(const options& opts, std::vector<result_row>& rows) {
  const bool quick = opts.quick;
  const auto lat_sizes = latency_sizes(quick);
  const auto bw_sizes = bandwidth_sizes(quick);
  const auto oh_sizes = overhead_sizes(quick);
  const std::vector<double> no_ours;  // TODO(core): the VMMC measurements

  std::cerr << "measuring memcpy\n";
  const auto memcpy_GBps = raw::memcpy_bandwidth_GBps(bw_sizes, quick);

  for (const std::string& provider : opts.providers) {
    std::cout << "# " << raw::describe_provider(provider) << "\n";
    const std::string prefix = provider + "/";

    std::cerr << "measuring " << provider << " latency\n";
    add_rows(
        rows, prefix + "latency", metric::latency_us, lat_sizes, no_ours,
        {{"libfabric_write", raw::latency_us(provider, raw::transport::write, lat_sizes, quick)},
         {"libfabric_msg", raw::latency_us(provider, raw::transport::msg, lat_sizes, quick)}});

    std::cerr << "measuring " << provider << " bandwidth\n";
    add_rows(rows, prefix + "bandwidth", metric::bandwidth_GBps, bw_sizes, no_ours,
             {{"libfabric_write",
               raw::write_bandwidth_GBps(provider, raw::direction::one_way, bw_sizes, quick)},
              {"memcpy", memcpy_GBps}});
    add_rows(rows, prefix + "bidir_bandwidth", metric::bandwidth_GBps, bw_sizes, no_ours,
             {{"libfabric_write",
               raw::write_bandwidth_GBps(provider, raw::direction::both_ways, bw_sizes, quick)}});

    std::cerr << "measuring " << provider << " send overhead\n";
    std::vector<double> async_us, sync_us;
    for (const raw::send_overhead& o : raw::write_overhead_us(provider, oh_sizes, quick)) {
      async_us.push_back(o.async_us);
      sync_us.push_back(o.sync_us);
    }
    add_rows(rows, prefix + "overhead_async", metric::overhead_us, oh_sizes, no_ours,
             {{"libfabric_write", async_us}});
    add_rows(rows, prefix + "overhead_sync", metric::overhead_us, oh_sizes, no_ours,
             {{"libfabric_write", sync_us}});
  }
}

}  // namespace vmmc::bench
