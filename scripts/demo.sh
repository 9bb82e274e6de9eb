#!/usr/bin/env bash
# The main demo: set up, then show VMMC between two processes: a ping-pong
# over each path, the core benchmark beside raw libfabric and memcpy, and the
# sockets, vrpc and nx benchmarks beside kernel TCP, libtirpc and Open MPI,
# and unmodified programs under the LD_PRELOAD interposer beside themselves
# over kernel TCP.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo
echo "== vmmc-pingpong: deliberate update + notification, two processes"
for provider in "" "--provider shm" "--provider tcp"; do
  build/examples/vmmc-pingpong $provider --iterations 2000
  echo
done
echo "== vmmc-bench core --quick"
build/tests/bench/vmmc-bench core --quick --provider all --json build/bench-core.json
echo "(JSON written to build/bench-core.json)"
echo
echo "== vmmc-bench sockets --quick (ours vs kernel TCP loopback)"
build/tests/bench/vmmc-bench sockets --quick --json build/bench-sockets.json
echo "(JSON written to build/bench-sockets.json)"
echo
echo "== vmmc-bench vrpc --quick (ours vs libtirpc over TCP and UDP)"
build/tests/bench/vmmc-bench vrpc --quick --json build/bench-vrpc.json
echo
echo "== vmmc-bench nx --quick (NX under nxrun vs Open MPI under mpirun)"
build/tests/bench/vmmc-bench nx --quick --json build/bench-nx.json
echo
scripts/preload-demo.sh --build build
