// tests/bench/bench_nx.h: the `nx` benchmark of vmmc-bench.
//
// "ours" is NX over VMMC (nx_node.c under nxrun), the reference "openmpi"
// Debian's Open MPI (mpi_reference.c under mpirun, shared-memory transport:
// ob1 + vader), the same loops in the same run, alternating jobs:
//   nx/latency       one-way ping-pong latency, csend/crecv vs MPI_Send/Recv
//                    (0 B .. 8 MiB, 2 processes)
//   nx/bandwidth     the same ping-pong as bytes per one-way time
//   nx/gdsum_<N>p    gdsum of one double vs MPI_Allreduce, N = 2 and 4 processes
//   nx/gsync_<N>p    gsync vs MPI_Barrier
// Each figure is the best of 3 alternating runs' medians (loops of ~0.02 s
// with --quick, ~0.15 s otherwise). options::providers is ignored: nx uses
// the same-host path.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "bench_common.h"

namespace vmmc::bench {

// Measures the nx benchmark and appends its rows. Throws on failure
// (a job that fails, or no mpirun/mpi_reference: then "openmpi" is missing).
void run_nx_benchmark(const options& opts, std::vector<result_row>& rows);

// The command that starts the Open MPI reference on this host, up to its
// binding options and -n: mpirun as root, ob1 over shared memory (vader).
extern const char* const openmpi_on_this_host;

// The same rows under `prefix` for each count of `node_counts`, each job
// started by the launcher's command for that count (followed by the program
// and its arguments): nx_node by `ours_launcher`, mpi_reference by
// `openmpi_launcher`.
void measure_nx_rows(bool quick, const std::string& prefix, const std::vector<int>& node_counts,
                     const std::function<std::string(int)>& ours_launcher,
                     const std::function<std::string(int)>& openmpi_launcher,
                     std::vector<result_row>& rows, scope what = scope::all);

}  // namespace vmmc::bench
