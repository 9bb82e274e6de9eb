// tests/bench/vmmc_bench.cc: the vmmc-bench program.
//
//   vmmc-bench <name> [--quick] [--json PATH] [--provider shm|tcp|all]
//
// Dispatches to one benchmark by name, prints the table of its rows and
// optionally writes them as JSON. Exit codes: 0 success, 1 a measurement
// failed, 2 bad command line.
#include <exception>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "bench_contention.h"
#include "bench_core.h"
#include "bench_multihost.h"
#include "bench_nx.h"
#include "bench_sockets.h"
#include "bench_startup.h"
#include "bench_vrpc.h"

namespace {

using vmmc::bench::options;
using vmmc::bench::result_row;

struct benchmark {
  const char* name;
  std::function<void(const options&, std::vector<result_row>&)> run;
};

const std::vector<benchmark>& benchmarks() {
  static const std::vector<benchmark> all = {
      {"core", vmmc::bench::run_core_benchmark},
      {"sockets", vmmc::bench::run_sockets_benchmark},
      {"nx", vmmc::bench::run_nx_benchmark},
      {"vrpc", vmmc::bench::run_vrpc_benchmark},
      {"startup", vmmc::bench::run_startup_benchmark},
      {"multihost", vmmc::bench::run_multihost_benchmark},
      {"contention", vmmc::bench::run_contention_benchmark},
  };
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  options opts;
  std::string error;
  if (!vmmc::bench::parse_options(argc, argv, opts, error)) {
    std::cerr << "vmmc-bench: " << error << "\n";
    vmmc::bench::print_usage(std::cerr, argv[0]);
    return 2;
  }
  const benchmark* chosen = nullptr;
  for (const benchmark& b : benchmarks())
    if (opts.benchmark == b.name) chosen = &b;
  if (!chosen) {
    std::cerr << "vmmc-bench: unknown benchmark " << opts.benchmark << "\n";
    vmmc::bench::print_usage(std::cerr, argv[0]);
    return 2;
  }

  if (!opts.json_path.empty() && !std::ofstream(opts.json_path)) {
    std::cerr << "vmmc-bench: cannot write " << opts.json_path << "\n";
    return 2;
  }

  // Raw references and ours run with the same provider settings: the core
  // turns Nagle off in libfabric's tcp provider, so the references do too.
  ::setenv("FI_TCP_NODELAY", "1", 0);

  if (const double busy = vmmc::bench::other_runnable_processes(); busy >= 1) {
    std::cout << "# warning: " << busy << " other runnable processes on "
              << std::thread::hardware_concurrency()
              << " cores; busy-polling measurements will be disturbed\n";
  }

  std::vector<result_row> rows;
  try {
    chosen->run(opts, rows);
  } catch (const std::exception& e) {
    std::cerr << "vmmc-bench " << opts.benchmark << ": " << e.what() << "\n";
    return 1;
  }
  vmmc::bench::print_table(std::cout, opts.benchmark, rows);
  if (!opts.json_path.empty()) {
    try {
      vmmc::bench::write_json(opts.json_path, opts.benchmark, rows);
    } catch (const std::exception& e) {
      std::cerr << "vmmc-bench: " << e.what() << "\n";
      return 1;
    }
  }
  return 0;
}
