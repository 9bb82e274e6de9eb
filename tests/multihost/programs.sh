#!/usr/bin/env bash
# tests/multihost/programs.sh PRELOAD: unmodified iperf3 and sockperf across
# two simulated hosts on a bridge (tests/support/bridged_hosts.sh), each run
# without the interposer and then with both ends preloaded, with no vmmc
# setting at all. Both runs must complete (iperf3's ends with status 0, its
# server receiving what was sent but for what was still in flight when the
# client stopped counting: iperf3 counts it as sent, not received, kernel TCP
# alone showed 142352 of 3.7 GB; sockperf's replies neither lost, doubled nor
# out of order), and each preloaded end must say which path it chose and
# why: here kernel TCP, as no RDMA device lets the fabric beat it (issue 15,
# item 3). Prints ours/kernel for each headline figure (measured, not
# judged: the bars are vmmc-bench's). Exit 77 (skip) where namespaces cannot be created
# or a program is missing.
set -euo pipefail
preload=$1
[[ ! -f $preload ]] || preload=$(realpath "$preload")
here=$(cd "$(dirname "$0")" && pwd)
for p in iperf3 sockperf; do command -v $p > /dev/null || { echo "no $p"; exit 77; }; done
. "$here/../support/bridged_hosts.sh"
prefix=vmmc-mp-$$ net=10.236.$(($$ % 200)) port=5401
work=$(mktemp -d)
server=
cleanup() {
  [[ -z $server ]] || kill "$server" 2>/dev/null || true
  remove_bridged_hosts "$prefix" a b
  rm -rf "$work"
}
trap cleanup EXIT
bridged_hosts "$prefix" "$net" a b
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"

# on <host> <mode> <program...>: in that host's namespace, preloaded in mode
# "vmmc" (with the sockets layer's log, to see its decision).
on() {
  local host=$1 mode=$2
  shift 2
  local env=(env)
  [[ $mode == vmmc ]] && env+=(LD_PRELOAD="$preload" VMMC_SOCKETS_LOG_LEVEL=3)
  timeout 60 ip netns exec "$prefix-$host" "${env[@]}" "$@"
}
problem=
decided() {  # decided <label> <log...>: each log says kernel TCP, and why
  local label=$1 log
  shift
  for log in "$@"; do
    grep -q "plain TCP (peer on another host and no RDMA device" "$log" ||
      problem+=" $label: $(basename "$log") did not say it kept kernel TCP and why;"
    ! grep -q "switched to" "$log" || problem+=" $label: $(basename "$log") switched;"
  done
}

in_flight=$(($(ip netns exec "$prefix-b" cut -f3 /proc/sys/net/ipv4/tcp_wmem) +
  $(ip netns exec "$prefix-a" cut -f3 /proc/sys/net/ipv4/tcp_rmem)))
declare -A figure
for mode in kernel vmmc; do
  ((port += 1))
  on a $mode iperf3 -s -1 -p $port -B "$net.1" > "$work/iperf3-server" 2> "$work/iperf3-server.log" &
  server=$!
  sleep 0.5
  if ! on b $mode iperf3 -c "$net.1" -p $port -n 2G -J > "$work/iperf3-client" \
    2> "$work/iperf3-client.log"; then
    problem+=" iperf3 ($mode) failed;"
  fi
  wait "$server" || problem+=" the iperf3 server ($mode) failed;"
  server=
  read -r sent received bps < <(python3 -c '
import json, sys
e = json.load(open(sys.argv[1]))["end"]
print(e["sum_sent"]["bytes"], e["sum_received"]["bytes"], e["sum_received"]["bits_per_second"])
' "$work/iperf3-client") || { problem+=" iperf3 ($mode): no result;"; sent=0 received=-1 bps=0; }
  # In flight at the end: at most what the two socket buffers hold.
  ((sent - received <= in_flight && received <= sent)) ||
    problem+=" iperf3 ($mode): sent $sent, received $received;"
  figure[iperf3-$mode]=$bps
  [[ $mode == kernel ]] || decided iperf3 "$work/iperf3-server.log" "$work/iperf3-client.log"

  ((port += 1))
  on a $mode sockperf sr --tcp -i "$net.1" -p $port > "$work/sockperf-server" 2>&1 &
  server=$!
  sleep 0.5
  if ! on b $mode sockperf pp --tcp -i "$net.1" -p $port -m 64 -t 2 --mps=3000000 \
    > "$work/sockperf-client" 2>&1; then
    problem+=" sockperf ($mode) failed;"
  fi
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  server=
  grep -q "dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0" \
    "$work/sockperf-client" || problem+=" sockperf ($mode): replies lost, doubled or out of order;"
  figure[sockperf-$mode]=$(sed -n 's/.*Summary: Latency is \([0-9.]*\) usec.*/\1/p' "$work/sockperf-client")
  [[ $mode == kernel ]] || decided sockperf "$work/sockperf-server" "$work/sockperf-client"
done
python3 - "${figure[iperf3-vmmc]}" "${figure[iperf3-kernel]}" "${figure[sockperf-kernel]:-0}" \
  "${figure[sockperf-vmmc]:-0}" <<'PY'
import sys
ours, kernel, lat_kernel, lat_ours = map(float, sys.argv[1:])
print(f"iperf3 {ours / 1e9:.2f} vs {kernel / 1e9:.2f} Gbit/s: {ours / kernel if kernel else 0:.2f}")
print(f"sockperf 64 B latency {lat_ours:.2f} vs {lat_kernel:.2f} us: "
      f"{lat_kernel / lat_ours if lat_ours else 0:.2f}")
PY
if [[ -n $problem ]]; then
  echo "FAIL:$problem"
  tail -n 3 "$work"/*.log
  exit 1
fi
echo "ok: iperf3 and sockperf across hosts, kernel TCP chosen and said"
