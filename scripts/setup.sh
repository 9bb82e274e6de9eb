#!/usr/bin/env bash
# Installs what vmmc needs on Debian 12 (as root) and builds it into build/
# (or $VMMC_BUILD_DIR, with $VMMC_CMAKE_ARGS: scripts/test.sh's sanitizer
# builds). Safe to run again: apt-get skips what is installed, cmake
# rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake pkg-config libfabric-dev libfabric-bin libboost-dev
          libtirpc-dev libgtest-dev iproute2 iputils-ping  # ping: tests/multihost
          rpcbind rpcsvc-proto                        # vrpc: rpcinfo/portmapper, rpcgen
          openmpi-bin libopenmpi-dev libpmix-dev      # nx: mpirun reference and PMIx launch
          slurmd slurmctld slurm-client munge         # nx: srun across hosts (tests/multihost)
          gfortran                                    # nx: the Fortran interface's test
          sockperf iperf3 redis-server redis-tools    # preload demo: unmodified Debian programs
          nginx apache2-utils curl socat openssh-server openssh-client
          postgresql                                  # tests/apps: the apps matrix
          clang-format)                               # tests: style.format
scripts/install-packages.sh "${packages[@]}"

build_type=${VMMC_BUILD_TYPE:-RelWithDebInfo}
build_dir=${VMMC_BUILD_DIR:-build}
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE="$build_type" ${VMMC_CMAKE_ARGS:-} >/dev/null
cmake --build "$build_dir" -j"$(nproc)"
