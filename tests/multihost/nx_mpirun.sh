#!/usr/bin/env bash
# tests/multihost/nx_mpirun.sh BUILD: NX across simulated hosts under
# Open MPI's mpirun with nothing but the launcher's own options (issue 15,
# item 5): three hosts on a bridge (tests/support/bridged_hosts.sh); mpirun
# runs on host c and starts its daemons on hosts a and b through an rsh
# agent that enters their namespace (what ssh is between real hosts). No
# vmmc setting, no per-node wrapper: examples/nx_jacobi must agree with its
# serial result and nx_pingpong must complete, the nodes listening where the
# other host reaches them and talking over kernel TCP (no RDMA device),
# both asserted from nx's log. Exit 77 (skip) where
# namespaces cannot be created or mpirun is missing.
set -euo pipefail
build=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
command -v mpirun > /dev/null || { echo "no mpirun"; exit 77; }
. "$here/../support/bridged_hosts.sh"
prefix=vmmc-mx-$$ net=10.235.$(($$ % 200))
work=$(mktemp -d)
cleanup() {
  remove_bridged_hosts "$prefix" a b c
  rm -rf "$work"
}
trap cleanup EXIT
bridged_hosts "$prefix" "$net" a b c

# mpirun's rsh agent enters a host's namespace (tests/support/netns_rsh_agent).
export VMMC_AGENT_TMPDIR=$work/agent

# What the nodes must see of our environment: a daemon started through the
# rsh agent passes on only what mpirun is told to (-x), as over ssh; the
# sanitizer builds' settings among it (their suppressions, their log path).
forward=(-x VMMC_CORE_LOG_LEVEL=3)
for v in ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS TSAN_OPTIONS GLIBC_TUNABLES VMMC_TEST_TIME_SCALE; do
  [[ -z ${!v:-} ]] || forward+=(-x "$v")
done

# The daemons call mpirun back as they start: the hosts must reach c first.
hosts_reach "$prefix" "$net.3" a b || { echo "FAIL: the hosts do not reach host c"; exit 1; }

# mpirun job <seconds> <program...>: both nodes log where they listen.
job() {
  local seconds=$1
  shift
  timeout "$seconds" ip netns exec "$prefix-c" env OMPI_ALLOW_RUN_AS_ROOT=1 \
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --host "$prefix-a,$prefix-b" -n 2 \
    --mca plm_rsh_agent "$here/../support/netns_rsh_agent" "${forward[@]}" "$@"
}
. "$here/nx_jobs.sh"
scale=${VMMC_TEST_TIME_SCALE:-1}
problem=
export VMMC_CORE_LOG_LEVEL=3  # where the nodes listen, which path each pair took
nx_jobs
# Each node takes kernel TCP from the other host at its own address there
# (it opens no fabric: the pair takes the lanes).
for ip in "$net.1" "$net.2"; do
  grep -q "takes kernel TCP from other hosts at $ip:[0-9]*\$" "$work/jacobi" ||
    problem+=" no node listened on $ip;"
done
nx_jobs_verdict mpirun
