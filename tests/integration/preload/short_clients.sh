#!/usr/bin/env bash
# Short-lived clients of a preloaded server (issue 14): a preloaded
# redis-server and 40 preloaded `redis-cli set` commands, each of which
# exits right after its answer, often before the server's side of the
# upgrade is done. Every connection must end at the server (no CLOSE-WAIT
# left: a server would run out of descriptors), and every value must be
# stored.
#   short_clients.sh <LD_PRELOAD value>     (exit 77: redis not installed)
set -euo pipefail
preload=$1
command -v redis-server >/dev/null && command -v redis-cli >/dev/null ||
  { echo "redis not installed: skipped"; exit 77; }
source "$(dirname "$0")/../../../scripts/servers.sh"  # free_port, wait_port, stop_server
scratch_with_server
fail() { echo "FAIL: $*"; tail -n 20 "$work/server.log"; exit 1; }

port=$(free_port)
timeout 60 env LD_PRELOAD="$preload" VMMC_SOCKETS_LOG_LEVEL=3 \
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no >"$work/server.log" 2>&1 &
server=$!
wait_port "$port" || fail "redis-server did not listen"
clients=40
for i in $(seq "$clients"); do
  [[ $(timeout 10 env LD_PRELOAD="$preload" redis-cli -p "$port" set "k$i" "v$i") == OK ]] ||
    fail "set k$i"
done
# The server sees each client's end within a moment, as with kernel TCP.
for _ in $(seq 40); do
  waiting=$(ss -Htn state close-wait "sport = :$port" | wc -l)
  ((waiting == 0)) && break
  sleep 0.05
done
((waiting == 0)) || fail "$waiting of $clients connections left in CLOSE-WAIT at the server"
connected=$(redis-cli -p "$port" info clients | sed -n 's/^connected_clients:\([0-9]*\).*/\1/p')
((connected == 1)) || fail "the server still counts $connected clients (1 expected: this one)"
for i in 1 $((clients / 2)) "$clients"; do
  [[ $(redis-cli -p "$port" get "k$i") == "v$i" ]] || fail "k$i was not stored"
done
accelerated=$(grep -c "writes switched to" "$work/server.log" || true)
echo "ok: $clients short clients ended at the server ($accelerated of its ends switched to VMMC)"
