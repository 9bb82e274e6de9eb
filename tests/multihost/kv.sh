#!/usr/bin/env bash
# tests/multihost/kv.sh SERVER CLIENT PRELOAD: the rpcgen example (examples/kv)
# across two simulated hosts (tests/support/bridged_hosts.sh), with no vmmc
# setting: the vRPC server on host b, registered with an rpcbind of its own
# (b's namespace, and a private /run for rpcbind's socket, as on a real
# host), the unmodified rpcgen client on host a, plain and under
# libvrpc_preload.so. Both must store and fetch the same bytes, over TCP and
# UDP, and print the same; the server must say which path the calls took:
# kernel TCP ("tcp": no RDMA device lets the fabric beat it; issue 15,
# item 3). Prints the put round trip of each (measured, not judged: the
# bars are vmmc-bench multihost's). Exit 77 (skip) where namespaces cannot
# be created or rpcbind is missing.
set -euo pipefail
kv_server=$(realpath "$1")
kv_client=$(realpath "$2")
preload=$3
here=$(cd "$(dirname "$0")" && pwd)
[[ -x /usr/sbin/rpcbind ]] || { echo "no rpcbind"; exit 77; }
. "$here/../support/bridged_hosts.sh"
prefix=vmmc-kv-$$ net=10.238.$(($$ % 200))
work=$(mktemp -d)
server=
cleanup() {
  [[ -z $server ]] || kill "$server" 2>/dev/null || true
  [[ -z $server ]] || wait "$server" 2>/dev/null || true
  remove_bridged_hosts "$prefix" a b
  rm -rf "$work"
}
trap cleanup EXIT
bridged_hosts "$prefix" "$net" a b
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
scale=${VMMC_TEST_TIME_SCALE:-1}

# Host b: rpcbind, then the kv server, in a mount namespace with its own
# /run; both end with the test (timeout, and the trap's kill).
cat > "$work/host_b.sh" <<SH
#!/bin/sh
mount -t tmpfs tmpfs /run || exit 1
timeout $((120 * scale)) /usr/sbin/rpcbind -f -w &
for i in \$(seq 500); do [ -S /run/rpcbind.sock ] && break; sleep 0.01; done
exec timeout $((120 * scale)) "$kv_server" $net.2
SH
chmod +x "$work/host_b.sh"
ip netns exec "$prefix-b" unshare --mount --propagation private "$work/host_b.sh" \
  > "$work/server.out" 2>&1 &
server=$!
for _ in $(seq 100); do grep -q "^kv:" "$work/server.out" && break; sleep 0.05; done
grep -q "^kv:" "$work/server.out" || { echo "FAIL: the kv server did not start"; cat "$work/server.out"; exit 1; }

# client <mode> <args...>: the rpcgen client on host a, plain or preloaded.
client() {
  local mode=$1
  shift
  local env=(env)
  [[ $mode == vmmc ]] && env+=(LD_PRELOAD="$preload")
  timeout $((30 * scale)) ip netns exec "$prefix-a" "${env[@]}" \
    "$kv_client" "$net.2" "$@" 2>&1
}

problem=
value=$(head -c 3000 /dev/urandom | base64 -w 0)
for mode in plain vmmc; do
  for nettype in tcp udp; do
    # The last get finds nothing: status 3, "(not found)".
    out=$( { client $mode $nettype put "k-$mode-$nettype" "$value" &&
             client $mode $nettype get "k-$mode-$nettype" &&
             client $mode $nettype delete "k-$mode-$nettype" &&
             client $mode $nettype get "k-$mode-$nettype"; echo "status $?"; } )
    printf '%s\n' "$out" > "$work/$mode-$nettype"
  done
  path=$(client $mode tcp transport)
  echo "$mode client: the server served its calls over $path"
  [[ $path == tcp ]] || problem+=" $mode client: path '$path', not kernel TCP;"
done
for nettype in tcp udp; do
  if ! cmp -s "$work/plain-$nettype" "$work/vmmc-$nettype"; then
    problem+=" over $nettype the preloaded client printed otherwise than the plain one;"
    diff "$work/plain-$nettype" "$work/vmmc-$nettype" | cut -c1-120 | head -n 6
  fi
  grep -qx "$value" "$work/plain-$nettype" ||
    problem+=" over $nettype the value did not come back whole;"
  grep -qx "status 3" "$work/plain-$nettype" || problem+=" over $nettype a call failed;"
done
for mode in plain vmmc; do
  echo "$mode: $(client $mode tcp bench 2000 64)"
done

if [[ -n $problem ]]; then
  echo "FAIL:$problem"
  exit 1
fi
echo "ok: the rpcgen example across hosts, plain and preloaded, no vmmc settings"
