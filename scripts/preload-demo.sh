#!/usr/bin/env bash
# The interposer demo: unmodified Debian programs (sockperf, iperf3,
# redis-server + redis-benchmark) over kernel TCP loopback and with both ends
# under LD_PRELOAD=libvmmc_preload.so, alternating, in the same run; prints one
# comparison table (best of --rounds runs each). Servers listen on 127.0.0.1
# only and are killed on exit.
#   scripts/preload-demo.sh [--build DIR] [--rounds N] [--seconds S] [--requests N]
#                           [--preload VALUE]
# --preload: the LD_PRELOAD value of the vmmc runs (default: the module of
# --build; the sanitizer test builds put their runtime first). Exits 1 when a
# program failed or got wrong bytes back (listed under PROBLEMS).
set -euo pipefail
cd "$(dirname "$0")/.."

build=build rounds=2 seconds=4 requests=200000 lib=
while (($#)); do
  case $1 in
    --build) build=$2; shift 2 ;;
    --preload) lib=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --requests) requests=$2; shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--rounds N] [--seconds S] [--requests N] [--preload VALUE]" >&2
       exit 2 ;;
  esac
done
# A time-bound client that outlives this is stuck.
limit=$((seconds * 5 + 20))
[[ -n $lib ]] || lib=$(realpath "$build/preload/libvmmc_preload.so")
for tool in sockperf iperf3 redis-server redis-benchmark; do
  command -v $tool >/dev/null || { echo "missing $tool (scripts/setup.sh installs it)" >&2; exit 1; }
done
work=$(mktemp -d)
cleanup() {
  [[ -f $work/pids ]] && while read -r p; do kill "$p" 2>/dev/null || true; done <"$work/pids"
  rm -rf "$work"
}
trap cleanup EXIT

source scripts/servers.sh  # free_port, wait_port, stop_server
# run_with <mode> timeout <seconds> cmd...: the program under its time limit,
# preloaded in mode "vmmc" (both ends are); `timeout` itself never is: in a
# sanitizer build its exit-time leak check forks a tracer that stop_server,
# which kills the children of `timeout`, would kill, hanging the check.
run_with() {
  local mode=$1 limit=$3; shift 3
  if [[ $mode == vmmc ]]; then
    timeout "$limit" env LD_PRELOAD="$lib" "$@"
  else
    timeout "$limit" "$@"
  fi
}
start_server() {  # start_server <mode> <log> cmd...; its pid in $server
  local mode=$1 log=$2; shift 2
  # Started here, not through run_with: $server must be the pid of `timeout`.
  if [[ $mode == vmmc ]]; then
    timeout 120 env LD_PRELOAD="$lib" "$@" >"$log" 2>&1 &
  else
    timeout 120 "$@" >"$log" 2>&1 &
  fi
  server=$!
  echo "$server" >>"$work/pids"
}
# Problems found inside $(...) subshells go to a file.
problem() { echo "$*" >>"$work/problems"; }
# client <mode> <name> <out> <server-log> cmd...: runs a client; a failing exit
# (a timeout included) is a problem, listed with the last lines of both ends.
client() {
  local mode=$1 name=$2 out=$3 slog=$4 rc=0; shift 4
  run_with "$mode" "$@" >"$out" 2>&1 || rc=$?
  ((rc == 0)) && return
  problem "$name ($mode): exit status $rc$( ((rc == 124)) && echo ' (timed out)')"
  problem "$(tail -n 5 "$out" | sed 's/^/    client: /')"
  problem "$(tail -n 5 "$slog" 2>/dev/null | sed 's/^/    server: /')"
}

# --mps=3000000, not the default (max): sockperf sizes its table of send times
# for (1 + t) x mps messages and aborts with "_seqN > m_maxSequenceNo" on its
# first send past it; max sends unpaced but sizes for 600k round trips a second,
# which the preloaded path (over 1M) outruns. An explicit rate paces the client
# so the table suffices, and 3M (a 0.33 us round trip) holds neither path back.
sockperf_pingpong() {  # -> one-way latency in usec
  local mode=$1 port; port=$(free_port)
  start_server "$mode" "$work/sp-server" sockperf sr --tcp -i 127.0.0.1 -p "$port"
  wait_port "$port" || sleep 1
  client "$mode" "sockperf ping-pong" "$work/sp" "$work/sp-server" \
    timeout "$limit" sockperf pp --tcp -i 127.0.0.1 -p "$port" -m 64 -t "$seconds" --mps=3000000
  stop_server
  grep -q "dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0" "$work/sp" ||
    problem "sockperf ping-pong ($mode): $(grep -m1 'dropped' "$work/sp" || tail -1 "$work/sp")"
  sed -n 's/.*Summary: Latency is \([0-9.]*\) usec.*/\1/p' "$work/sp" | tail -1
}

sockperf_throughput() {  # -> messages/s of 64 B
  local mode=$1 port; port=$(free_port)
  start_server "$mode" "$work/st-server" sockperf sr --tcp -i 127.0.0.1 -p "$port"
  wait_port "$port" || sleep 1
  client "$mode" "sockperf throughput" "$work/st" "$work/st-server" \
    timeout "$limit" sockperf tp --tcp -i 127.0.0.1 -p "$port" -m 64 -t "$seconds"
  stop_server
  sed -n 's/.*Summary: Message Rate is \([0-9]*\) \[msg\/sec\].*/\1/p' "$work/st" | tail -1
}

iperf3_bandwidth() {  # -> Gbit/s received
  local mode=$1 port; port=$(free_port)
  start_server "$mode" "$work/ip-server" iperf3 -s -1 -B 127.0.0.1 -p "$port"
  wait_port "$port" || sleep 1
  client "$mode" "iperf3" "$work/ip" "$work/ip-server" \
    timeout "$limit" iperf3 -c 127.0.0.1 -p "$port" -t "$seconds" -J
  stop_server
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%.1f" % (d["end"]["sum_received"]["bits_per_second"]/1e9))' \
    "$work/ip" 2>/dev/null || { problem "iperf3 ($mode): $(tail -c 300 "$work/ip")"; echo 0; }
}

redis_rate() {  # <mode> <test> -> requests/s (50 clients, the default)
  local mode=$1 test=$2 port; port=$(free_port)
  start_server "$mode" "$work/rs" redis-server --bind 127.0.0.1 --port "$port" --save '' \
    --appendonly no --protected-mode yes
  wait_port "$port" || sleep 1
  client "$mode" "redis-benchmark $test" "$work/rb" "$work/rs" \
    timeout 120 redis-benchmark -h 127.0.0.1 -p "$port" -t "$test" -n "$requests" -q
  # Correctness: a value written and read back through the same path.
  local got; got=$(run_with "$mode" timeout 10 redis-cli -h 127.0.0.1 -p "$port" \
    eval "redis.call('set','vmmc:check','payload-42'); return redis.call('get','vmmc:check')" 0 2>&1)
  [[ $got == payload-42 ]] || problem "redis check ($mode): $got"
  if grep -qi "error" "$work/rb"; then problem "redis-benchmark $test ($mode): $(grep -i -m1 error "$work/rb")"; fi
  stop_server
  tr '\r' '\n' <"$work/rb" | sed -n 's/.*: \([0-9.]*\) requests per second.*/\1/p' | tail -1
}

best() {  # best <higher|lower> values... (none when every run failed: its problem is listed)
  local dir=$1; shift
  printf '%s\n' "$@" | { grep -E '^[0-9.]+$' || true; } | sort -g |
    { [[ $dir == lower ]] && head -1 || tail -1; }
}

declare -A result
# run_one <key> <function> [args] <mode>: one run; says on stderr what it got
# and how long it took, so a run cut short by a timeout shows where it stood.
run_one() {
  local key=$1 t0=$SECONDS value; shift
  value=$("$@" 2>/dev/null | tail -1)
  echo "   $key ${*: -1}: ${value:-no result} ($((SECONDS - t0)) s)" >&2
  echo "$value"
}
measure() {  # measure <key> <higher|lower> <function> [args]
  local key=$1 dir=$2; shift 2
  local k=() v=()
  for ((r = 0; r < rounds; r++)); do
    k+=("$(run_one "$key" "$@" kernel)")
    v+=("$(run_one "$key" "$@" vmmc)")
  done
  result[$key.kernel]=$(best "$dir" "${k[@]}")
  result[$key.vmmc]=$(best "$dir" "${v[@]}")
}
with_mode_last() { local f=$1 arg=$2 mode=$3; "$f" "$mode" "$arg"; }

echo "== interposer demo: unmodified programs, kernel TCP vs LD_PRELOAD=libvmmc_preload.so (both ends)"
echo "   best of $rounds alternating runs; ${seconds}s each; redis-benchmark -n $requests, 50 clients"
measure pingpong lower sockperf_pingpong
measure throughput higher sockperf_throughput
measure iperf higher iperf3_bandwidth
measure redis_set higher with_mode_last redis_rate set
measure redis_get higher with_mode_last redis_rate get

row() {  # row <label> <key> <unit> <lower|higher> <target>
  local k=${result[$2.kernel]:-0} v=${result[$2.vmmc]:-0} ratio
  if [[ $4 == lower ]]; then
    ratio=$(python3 -c "print('%.1fx lower' % ($k/$v) if $v > 0 else 'n/a')")
  else
    ratio=$(python3 -c "print('%.2fx higher' % ($v/$k) if $k > 0 else 'n/a')")
  fi
  printf '| %-37s | %12s | %12s | %-13s | %-8s |\n' "$1 ($3)" "$k" "$v" "$ratio" "$5"
}
echo
printf '| %-37s | %12s | %12s | %-13s | %-8s |\n' "program" "kernel TCP" "vmmc preload" "ratio" "target"
printf '|%s|%s|%s|%s|%s|\n' "---------------------------------------" "--------------" "--------------" "---------------" "----------"
row "sockperf ping-pong 64 B latency" pingpong "us" lower ">=10x"
row "sockperf throughput 64 B" throughput "msg/s" higher "-"
row "iperf3 -t $seconds" iperf "Gbit/s" higher ">=2.5x"
row "redis-benchmark SET" redis_set "req/s" higher ">=1.3x"
row "redis-benchmark GET" redis_get "req/s" higher ">=1.3x"
echo
if [[ -s $work/problems ]]; then
  echo "PROBLEMS:"; sed 's/^/  /' "$work/problems"; exit 1
fi
echo "correctness: sockperf no dropped/duplicated/out-of-order; redis-benchmark no errors; redis SET+GET read back"
