#!/usr/bin/env bash
# tests/multihost/faults.sh PRELOAD [CASE...]: a checksummed one-way stream
# between two simulated hosts (network namespaces on a bridge, made and
# removed here) meets a fault, once on kernel TCP and once with both ends
# preloaded and upgraded to the fabric path (libfabric tcp). Ours must end
# as kernel TCP's did: survive where it survives, with every byte; where the
# writer dies, the reader gets the end of the stream after at least every
# byte the writer was told was sent, and only bytes of the stream.
#
# Cases: flap (the reader's link down 3 s, then up), stop_reader and
# stop_writer (SIGSTOP for 5 s), kill_writer and kill_reader (SIGKILL), cut
# (the link down for good; both ends set TCP_USER_TIMEOUT and keepalive,
# which must end the stream as they end kernel TCP's), lossy (from the
# stream's second second on, a path that loses 1% of the packets, delays
# them 5 ms and reorders 1%: impair.py, as this kernel has no netem), busy
# (four busy loops on this 2-core machine from the second second on).
# Exit 77 (skip) where namespaces cannot be created.
set -euo pipefail
preload=$1
[[ ! -f $preload ]] || preload=$(realpath "$preload")
shift
cases=("$@")
((${#cases[@]})) || cases=(flap stop_reader stop_writer kill_writer kill_reader cut lossy busy)
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../support/bridged_hosts.sh"
prefix=vmmc-mh-$$ net=10.232.$(($$ % 200)) port=47400
a=$prefix-a b=$prefix-b m=$prefix-wire
work=$(mktemp -d)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  remove_bridged_hosts "$prefix" a b
  rm -rf "$work"
}
trap cleanup EXIT
# Two hosts, a (reader, .1) and b (writer, .2), on the wire namespace's
# bridge br0. For the lossy case their veths move to bridges of their own,
# br1 and br2, joined only through impair.py's TAP pair.
bridged_hosts "$prefix" "$net" a b
for br in br1 br2; do ip -n "$m" link add $br type bridge; ip -n "$m" link set $br up; done
for t in tp1 tp2; do ip -n "$m" tuntap add dev $t mode tap; ip -n "$m" link set $t up; done
ip -n "$m" link set tp1 master br1
ip -n "$m" link set tp2 master br2
wire() {  # wire direct|impaired
  local ends=(br0 br0)
  [[ $1 == impaired ]] && ends=(br1 br2)
  ip -n "$m" link set wa master "${ends[0]}" up
  ip -n "$m" link set wb master "${ends[1]}" up
}
reader_link=a0  # for flap and cut

export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
total=$((64 << 20)) rate=$((24 << 20))

# start <mode> <ns> <out> <peer args...>: prints the pid.
start() {
  local mode=$1 ns=$2 out=$3
  shift 3
  local env=(env)
  [[ $kase == cut ]] && env+=(STREAM_PEER_TIMEOUTS=1)
  # The fabric path on purpose (by default a connection across hosts stays
  # on kernel TCP here: no RDMA device); no address setting.
  [[ $mode == vmmc ]] && env+=(LD_PRELOAD="$preload" VMMC_SOCKETS_REMOTE=fabric
    VMMC_SOCKETS_LOG_LEVEL=3)
  ip netns exec "$ns" "${env[@]}" python3 "$here/stream_peer.py" "$@" > "$out" 2> "$out.err" &
  echo $!
}

# running <pid>: alive and not a zombie (start's subshell made them, so
# nobody here reaps them).
running() {
  local state
  state=$(ps -o stat= -p "$1" 2>/dev/null) && [[ $state != Z* ]]
}

# prefix_sha N: the SHA-256 of the stream's first N bytes (stream_peer.py).
prefix_sha() {
  python3 - "$1" <<'PY'
import hashlib, random, sys
n, rng, h = int(sys.argv[1]), random.Random(7), hashlib.sha256()
while n > 0:
    piece = rng.randbytes(256 << 10)[:n]
    h.update(piece)
    n -= len(piece)
print(h.hexdigest())
PY
}

# run <mode> <case>: one stream and its fault; sets result to a line that
# says how it ended, or "BAD: ..." when its bytes are wrong.
run() {
  local mode=$1 kase=$2 r w
  ((port += 1))
  r=$(start "$mode" "$a" "$work/reader" reader "$net.1" $port)
  pids+=("$r")
  for _ in $(seq 200); do grep -q listening "$work/reader" 2>/dev/null && break; sleep 0.05; done
  w=$(start "$mode" "$b" "$work/writer" writer "$net.1" $port $total $rate)
  pids+=("$w")
  if [[ $kase == lossy ]]; then
    wire impaired
    ip netns exec "$m" python3 "$here/impair.py" tp1 tp2 7 0.01 5 0.01 > "$work/impair" &
    impair=$!
    pids+=("$impair")
  fi
  # The fault comes 1.5 s into the stream, and never before the writer has
  # streamed over the fabric (vmmc) for half a second: a program's start-up
  # is not ours to know (python3 behind a pyenv shim started in 0.7 s, and
  # the writer switched 2.2 s after its start: a fixed 1.5 s faulted it on
  # TCP, or as it switched; a kill then is another case, see the README's
  # limits).
  for _ in $(seq 200); do grep -q "^sent" "$work/writer" 2>/dev/null && break; sleep 0.05; done
  sleep 1.5
  if [[ $mode == vmmc ]] && ! grep -q "switched to fabric" "$work/writer.err" 2>/dev/null; then
    for _ in $(seq 200); do grep -q "switched to fabric" "$work/writer.err" 2>/dev/null && break; sleep 0.05; done
    sleep 0.5
  fi
  case $kase in
    flap) ip -n "$a" link set "$reader_link" down; sleep 3; ip -n "$a" link set "$reader_link" up ;;
    stop_reader) kill -STOP "$r"; sleep 5; kill -CONT "$r" ;;
    stop_writer) kill -STOP "$w"; sleep 5; kill -CONT "$w" ;;
    kill_writer) kill -9 "$w" ;;
    kill_reader) kill -9 "$r" ;;
    cut) ip -n "$a" link set "$reader_link" down ;;
    busy)
      local i
      for i in 1 2 3 4; do
        timeout 30 sh -c 'while :; do :; done' &
        pids+=($!)
      done ;;
  esac
  local deadline=$((SECONDS + 60))
  while running "$r" || running "$w"; do
    ((SECONDS < deadline)) || { kill -9 "$r" "$w" 2>/dev/null || true; echo "$mode $kase: timed out"; }
    sleep 0.1
  done
  wait "$r" "$w" 2>/dev/null || true
  [[ $kase != busy ]] || kill "${pids[@]: -4}" 2>/dev/null || true
  if [[ $kase == lossy ]]; then
    kill "$impair"
    wait "$impair" 2>/dev/null || true
    wire direct
    read -r _ forwarded _ dropped _ reordered < <(grep forwarded "$work/impair") || true
    echo "lossy ($mode): impair.py forwarded ${forwarded:-?} frames, dropped ${dropped:-?}, reordered ${reordered:-?}"
    ((${dropped:-0} > 0 && ${reordered:-0} > 0)) || result="BAD: the path was not impaired"
  fi
  [[ $kase == cut ]] && ip -n "$a" link set "$reader_link" up
  local rl wl sent
  rl=$(grep -E "^(end|error)" "$work/reader" || echo "none")
  wl=$(grep -E "^(done|error)" "$work/writer" || echo "none")
  sent=$(grep "^sent" "$work/writer" | tail -n 1 | cut -d' ' -f2)
  result="reader: ${rl%% [0-9a-f]*[0-9a-f]} / writer: ${wl%% [0-9]*}"
  # Kernel TCP itself gives either of these, by timing: whether the dead
  # reader's queue was empty (FIN, then EPIPE) or not (reset); whether the
  # writer's last try met the kernel's timeout or an unreachable route.
  result=$(sed -E 's/error (EPIPE|ECONNRESET)/error EPIPE|ECONNRESET/g;
                   s/error (ETIMEDOUT|EHOSTUNREACH)/error ETIMEDOUT|EHOSTUNREACH/g' <<< "$result")
  case $rl in
    end*|error*)
      local got sha
      got=$(awk '{print $(NF-1)}' <<< "$rl") sha=$(awk '{print $NF}' <<< "$rl")
      [[ $sha == "$(prefix_sha "$got")" ]] || result="BAD: the reader's $got bytes are not the stream's"
      if [[ $rl == end* && $kase != kill_reader ]] && ((got < ${sent:-0})); then
        result="BAD: the reader got $got bytes, the writer was told $sent were sent"
      fi ;;
  esac
  [[ $mode == vmmc ]] && { cp "$work/reader.err" "$work/$kase.reader.err"; cp "$work/writer.err" "$work/$kase.writer.err"; }
  return 0
}

problem=
for kase in "${cases[@]}"; do
  run kernel "$kase"
  kernel=$result
  run vmmc "$kase"
  ours=$result
  echo "$kase: kernel TCP -> $kernel"
  echo "$kase: vmmc       -> $ours"
  [[ $kernel != BAD* ]] || problem+=" $kase: kernel TCP itself went wrong ($kernel);"
  [[ $ours == "$kernel" ]] || {
    problem+=" $kase: ours ended otherwise;"
    grep -v "^sent" "$work/reader" "$work/writer" || true
    tail -n 3 "$work/$kase.reader.err" "$work/$kase.writer.err"
  }
  grep -q "switched to fabric" "$work/$kase.writer.err" || problem+=" $kase: the writer did not switch to the fabric;"
done
[[ -z $problem ]] || { echo "FAIL:$problem"; exit 1; }
echo "ok: ${cases[*]}: vmmc ended as kernel TCP did"
