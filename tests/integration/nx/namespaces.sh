#!/usr/bin/env bash
# tests/integration/nx/namespaces.sh NXRUN NX_CASES TEST_NX: NX nodes on two
# simulated hosts that share a host name (network namespaces joined by a
# veth pair, created and removed here; nxrun starts each node through a
# wrapper that enters its namespace). "Same host" is core::host_identity's
# (kernel and network namespace), never the host name:
#  - with no setting, a pair on two hosts talks over kernel TCP (no RDMA
#    device here: the fabric cannot beat it; issue 15, item 3), as the log
#    says, and test_nx's suites pass with the nodes alternating between the
#    hosts (pairs on one host and pairs across in one job): point to point,
#    collectives, nodes killed, vanished, stopped, exiting in order, hrecv
#    handlers. Once, a node whose neighbour died stopped taking in the other
#    nodes' stream messages (suite vanished);
#  - over the fabric (VMMC_NX_REMOTE=fabric, VMMC_CORE_PROVIDERS=tcp),
#    20000 ping-pong round trips and the collectives complete: no node waits
#    for a doorbell that cannot reach it (with the host name as the test
#    they did not end in 120 s, each wake-up waiting out a 100 ms nap);
#  - over the fabric with no provider setting (VMMC_NX_REMOTE=fabric
#    only), the point-to-point suite completes over the fabric.
# Exit 77 (skip) where namespaces cannot be created.
set -euo pipefail
nxrun=$1 cases=$2 test_nx=$3
. "$(dirname "$0")/../../support/two_hosts.sh"
scale=${VMMC_TEST_TIME_SCALE:-1}
ns=vmmc-nxh-$$
work=$(mktemp -d)
cleanup() {
  remove_two_hosts "$ns-0" "$ns-1"
  rm -rf "$work"
}
trap cleanup EXIT
two_hosts "$ns-0" "$ns-1" 10.233.0
# The point of the test: both "hosts" carry the same host name.
[[ $(ip netns exec "$ns-0" hostname) == $(ip netns exec "$ns-1" hostname) ]] ||
  { echo "FAIL: the namespaces' host names differ; the test means nothing"; exit 1; }

# nxrun runs this for each node (VMMC_NX_RANK set): node r enters namespace
# r mod 2. No address setting: the stack finds the namespace's own.
cat > "$work/node.sh" <<SH
#!/bin/sh
exec ip netns exec $ns-\$((VMMC_NX_RANK % 2)) "\$@"
SH
chmod +x "$work/node.sh"

problem=
# No setting: kernel TCP between the hosts, said in the log.
if ! VMMC_CORE_LOG_LEVEL=3 timeout $((60 * scale)) "$nxrun" -n 2 "$work/node.sh" "$cases" \
  pingpong > "$work/tcp.out" 2>&1; then
  problem+=" pingpong over kernel TCP did not complete;"
  grep -v "^vmmc" "$work/tcp.out" | tail -n 5
elif ! grep -q "^nx: node 0 <-> node 1: kernel TCP" "$work/tcp.out"; then
  problem+=" the nodes did not take kernel TCP to each other;"
  grep "^nx" "$work/tcp.out" | tail -n 5
else
  echo "pingpong across two namespaces: $(grep "^nx: node 0 <-> node 1" "$work/tcp.out")"
fi
# Not the tests of one host's paths (large messages redirected, the
# fabric providers' variants), and "sent before exit" 5 times here, not 30
# (the CI's time: the suites take 3 times longer under TSan).
if ! NX_TEST_NODE_WRAPPER=$work/node.sh timeout $((240 * scale)) "$test_nx" \
  --gtest_filter='nx_nxrun.*:nx_faults.*:nx_exit.*nxrun:nx_handlers.*nxrun:-nx_nxrun.large_*:nx_nxrun.over_fabric_*:nx_faults.*over_fabric*:nx_exit.sent_before_exit*' \
  > "$work/suites.out" 2>&1; then
  problem+=" test_nx's suites failed across the hosts;"
  grep -E "^\[  FAILED|Failure|CHECK|^nx" "$work/suites.out" | head -n 20
else
  echo "test_nx across two namespaces: $(grep -c "^\[       OK" "$work/suites.out") tests passed"
fi
for run in 1 2 3 4 5; do
  if ! timeout $((30 * scale)) "$nxrun" -n 2 "$work/node.sh" "$cases" send_then_exit \
    > "$work/exit.out" 2>&1; then
    problem+=" a message sent before exit was lost across the hosts (run $run);"
    tail -n 5 "$work/exit.out"
    break
  fi
done

for suite in pingpong collectives; do
  start=$SECONDS
  if ! VMMC_NX_REMOTE=fabric VMMC_CORE_PROVIDERS=tcp timeout $((60 * scale)) "$nxrun" -n 2 \
    "$work/node.sh" "$cases" "$suite" > "$work/$suite.out" 2>&1; then
    problem+=" $suite did not complete across namespaces in $((60 * scale)) s;"
    tail -n 5 "$work/$suite.out"
  else
    echo "$suite across two namespaces over the fabric: $((SECONDS - start)) s: $(tail -n 1 "$work/$suite.out")"
  fi
done

# Over the fabric with no provider setting: the process's context opens
# libfabric's default providers when the job turns out to span hosts (it
# once opened only shm under nxrun, and such a job failed).
if ! VMMC_NX_REMOTE=fabric VMMC_CORE_LOG_LEVEL=3 timeout $((30 * scale)) "$nxrun" -n 2 \
  "$work/node.sh" "$cases" p2p > "$work/default.out" 2>&1; then
  problem+=" p2p over the fabric with no provider setting failed;"
  tail -n 5 "$work/default.out"
elif ! grep -q "node 0 <-> node 1: the fabric" "$work/default.out"; then
  problem+=" p2p over the fabric with no provider setting did not take the fabric;"
  grep "<->" "$work/default.out" || true
else
  echo "p2p across two namespaces over the fabric, no provider setting:" \
    "$(grep "^nx_cases p2p" "$work/default.out")"
fi

if [[ -n $problem ]]; then
  echo "FAIL:$problem"
  exit 1
fi
echo "ok: NX across two namespaces that share a host name"
