#!/usr/bin/env bash
# Unmodified `sockperf ping-pong` with both ends under LD_PRELOAD (issue 14),
# at 14, 64 and 1000 B: sockperf finds no dropped, doubled or out-of-order
# reply and both ends report the connection switched to VMMC.
#   sockperf.sh <LD_PRELOAD value>     (exit 77: sockperf not installed)
# --mps: sockperf sizes its table of send times for (1 + t) x mps messages and
# aborts with "_seqN > m_maxSequenceNo" on the first send beyond it. Its
# default for ping-pong, max, sends unpaced but sizes the table for 600k
# round trips a second, which a fast enough transport (ours: over 1M) runs
# past: an explicit rate paces the client so the table always suffices, and
# one above what we reach (3M: a 0.33 us round trip) does not slow us down.
set -euo pipefail
preload=$1
command -v sockperf >/dev/null || { echo "sockperf not installed: skipped"; exit 77; }
source "$(dirname "$0")/../../../scripts/servers.sh"  # free_port, wait_port, stop_server
scratch_with_server
fail() { echo "FAIL: $*"; sed 's/^/  client: /' "$work/client"; sed 's/^/  server: /' "$work/server"; exit 1; }

for size in 14 64 1000; do
  port=$(free_port)
  # Only sockperf is preloaded, not `timeout` (see scripts/preload-demo.sh).
  timeout 60 env VMMC_SOCKETS_LOG_LEVEL=3 LD_PRELOAD="$preload" \
    sockperf sr --tcp -i 127.0.0.1 -p "$port" >"$work/server" 2>&1 &
  server=$!
  wait_port "$port" || fail "the server did not listen"
  timeout 60 env VMMC_SOCKETS_LOG_LEVEL=3 LD_PRELOAD="$preload" \
    sockperf pp --tcp -i 127.0.0.1 -p "$port" -m "$size" -t 2 --mps=3000000 >"$work/client" 2>&1 ||
    fail "sockperf pp -m $size exited with $?"
  stop_server
  grep -q "dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0" "$work/client" ||
    fail "sockperf pp -m $size: replies lost, doubled or out of order"
  grep -q "writes switched to" "$work/client" || fail "-m $size: the client stayed on TCP"
  grep -q "writes switched to" "$work/server" || fail "-m $size: the server stayed on TCP"
  echo "-m $size: $(grep -m1 'Summary' "$work/client") $(grep -m1 'Total Run' "$work/client" | sed 's/.*\] //')"
done
