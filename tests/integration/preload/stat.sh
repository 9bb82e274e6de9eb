#!/usr/bin/env bash
# vmmc-stat on an unmodified redis-server under LD_PRELOAD with three
# clients that count their bytes (stat_client.py): two preloaded, one plain,
# and one preloaded with the server's port excluded. vmmc-stat --json must
# list the server's four connections: the preloaded clients' as accelerated
# on the mapped path with the bytes each client sent and received, the plain
# and the excluded one as kernel TCP because their peer does not run vmmc,
# with the kernel's counts; and the clients' own ends (the excluded one's as
# excluded). Once the server is killed (no exit handler runs), its file is
# not listed.
#   stat.sh <LD_PRELOAD value> <vmmc-stat>     (exit 77: redis-server not installed)
set -euo pipefail
preload=$1
stat_tool=$2
here=$(dirname "$(readlink -f "$0")")
command -v redis-server >/dev/null || { echo "redis-server not installed: skipped"; exit 77; }
work=$(mktemp -d)
server=
clients=()
source "$here/../../../scripts/servers.sh"  # free_port, wait_port, stop_server
cleanup() {
  touch "$work/done"
  for c in "${clients[@]}"; do kill "$c" 2>/dev/null || true; wait "$c" 2>/dev/null || true; done
  stop_server
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$work"/*.log "$work"/stat.*; do [[ -s $f ]] && sed "s|^|  ${f##*/}: |" "$f"; done
  exit 1
}
# Only this test's processes publish here, and vmmc-stat reads here.
export VMMC_SOCKETS_STAT_DIR=$work

port=$(free_port)
timeout 60 env LD_PRELOAD="$preload" redis-server --port "$port" --bind 127.0.0.1 --save '' \
  --appendonly no >"$work/redis.log" 2>&1 &
server=$!
wait_port "$port" || fail "redis-server did not listen"
redis=$(tr -d " " <"/proc/$server/task/$server/children")

# The interpreter itself: a python3 on PATH may be a wrapper script (pyenv)
# whose helpers would run preloaded too.
python=$(python3 -c 'import sys; print(sys.executable)')
# Under ASan, python3's own allocations left at exit are not ours to report.
[[ -z ${ASAN_OPTIONS:-} ]] || client_asan=ASAN_OPTIONS=$ASAN_OPTIONS:detect_leaks=0
# client <name> <value bytes> [env...]: started in the background.
client() {
  local name=$1 size=$2
  shift 2
  timeout 60 env ${client_asan:-} "$@" "$python" "$here/stat_client.py" "$port" "$size" \
    "$work/done" >"$work/$name.out" 2>"$work/$name.log" &
  clients+=($!)
}
client fast 100000 LD_PRELOAD="$preload"
client small 3000 LD_PRELOAD="$preload"
client plain 5000
client excluded 7000 LD_PRELOAD="$preload" VMMC_SOCKETS_EXCLUDE="$port"
for name in fast small plain excluded; do
  for _ in $(seq 400); do grep -q ready "$work/$name.out" && break; sleep 0.05; done
  grep -q ready "$work/$name.out" || fail "client $name did not get its replies"
done

# The kernel counts a plain connection's bytes once acknowledged: a few tries.
for attempt in $(seq 20); do
  "$stat_tool" --json >"$work/stat.json" || fail "vmmc-stat --json exited with $?"
  checked=0
  python3 - "$work" "$redis" >"$work/stat.check" 2>&1 <<'PY' && checked=1
import json, sys
work, redis = sys.argv[1], int(sys.argv[2])
doc = json.load(open(work + "/stat.json"))
procs = {p["pid"]: p for p in doc["processes"]}
def fail(why):
    sys.exit("FAIL: " + why)
if redis not in procs:
    fail("redis-server (pid %d) not listed" % redis)
server = procs[redis]
if not server["live"] or not server["has_context"]:
    fail("redis-server did not answer with fresh counters")
rows = {c["remote"]: c for c in server["connections"]}
if len(rows) != 4:
    fail("redis-server lists %d connections, not 4" % len(rows))
for name in ("fast", "small", "plain", "excluded"):
    _, port, sent, received = open("%s/%s.out" % (work, name)).read().split()
    row = rows.get("127.0.0.1:" + port)
    if row is None:
        fail("no server row for client %s (port %s)" % (name, port))
    got = (row["bytes_in"], row["bytes_out"])
    if got != (int(sent), int(received)):
        fail("client %s: server counts in/out %s, the client sent %s and received %s"
             % (name, got, sent, received))
    ends = [c for p in doc["processes"] for c in p["connections"]
            if c["local"] == "127.0.0.1:" + port]
    if name in ("plain", "excluded"):
        if (row["state"], row["path"], row["fallback"]) != ("tcp", "tcp", "peer_plain"):
            fail("the %s client's server row: %s" % (name, row))
        if row["counted_by"] != "kernel" or row["reason"] != "peer does not run vmmc":
            fail("the %s client's server row: %s" % (name, row))
        print("%s: tcp, %s, %d in, %d out (server end)" % (name, row["reason"], *got))
        if name == "plain":
            if ends:
                fail("the plain client is listed: %s" % ends)
            continue
        if len(ends) != 1 or (ends[0]["state"], ends[0]["fallback"]) != ("tcp", "excluded"):
            fail("the excluded client's own end: %s" % ends)
        if (ends[0]["bytes_out"], ends[0]["bytes_in"]) != (int(sent), int(received)):
            fail("the excluded client's own counts: %s" % ends[0])
        print("excluded: its own end tcp, %s" % ends[0]["reason"])
        continue
    if (row["state"], row["path"], row["fallback"]) != ("accelerated", "mapped", None):
        fail("client %s's server row: %s" % (name, row))
    if row["tcp_bytes_in"] + row["vmmc_bytes_in"] != int(sent):
        fail("client %s: server row split %s" % (name, row))
    if row["vmmc_bytes_in"] != row["bytes_copied"] + row["bytes_redirected"]:
        fail("client %s: copied + redirected != vmmc bytes in: %s" % (name, row))
    if len(ends) != 1:
        fail("client %s's own end listed %d times" % (name, len(ends)))
    end = ends[0]
    if (end["role"], end["state"], end["path"]) != ("client", "accelerated", "mapped"):
        fail("client %s's own row: %s" % (name, end))
    if (end["bytes_out"], end["bytes_in"]) != (int(sent), int(received)):
        fail("client %s's own counts: %s" % (name, end))
    print("%s: accelerated, mapped, %d in, %d out (server end); client end agrees" % (name, *got))
PY
  ((checked)) && break
  sleep 0.1
done
((checked)) || fail "$(tail -1 "$work/stat.check")"
cat "$work/stat.check"
"$stat_tool" >"$work/stat.txt" || fail "vmmc-stat exited with $?"
grep -q "accelerated *mapped" "$work/stat.txt" || fail "vmmc-stat shows no accelerated connection"
grep -q "peer does not run vmmc" "$work/stat.txt" || fail "vmmc-stat shows no fallback reason"
cat "$work/stat.txt"

# Killed, the server leaves its file; it must not be listed.
touch "$work/done"
for c in "${clients[@]}"; do wait "$c" || fail "a client exited with $?"; done
clients=()
stop_server
"$stat_tool" --json >"$work/stat.json" || fail "vmmc-stat --json exited with $?"
python3 -c '
import json, sys
doc = json.load(open(sys.argv[1]))
if doc["processes"]:
    sys.exit("FAIL: listed after the processes ended: %s" % [p["pid"] for p in doc["processes"]])
' "$work/stat.json" || fail "a dead process is listed"
[[ -e $work/vmmc-$(id -u)/$redis ]] || fail "the killed server's file is gone: the test proves nothing"
echo "the killed redis-server's file is not listed"
