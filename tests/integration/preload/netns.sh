#!/usr/bin/env bash
# tests/integration/preload/netns.sh PRELOAD: two simulated hosts (network
# namespaces joined by a veth pair, created and removed here). A preloaded
# python3 server and client move 32 MiB each way, twice, and every byte must
# arrive, checked by SHA-256:
#  - by default the connection stays kernel TCP, decided by both ends before
#    any byte (no RDMA device here: libfabric's tcp provider, TCP underneath,
#    cannot beat kernel TCP), and the log says so;
#  - with VMMC_SOCKETS_REMOTE=fabric it switches to the fabric (the sockets
#    layer opens the providers for a peer on another host).
# Exit 77 (skip) where namespaces cannot be created.
set -euo pipefail
preload=$1
. "$(dirname "$0")/../../support/two_hosts.sh"
a=vmmc-pl-$$-a b=vmmc-pl-$$-b
work=$(mktemp -d)
cleanup() {
  remove_two_hosts "$a" "$b"
  rm -rf "$work"
}
trap cleanup EXIT
two_hosts "$a" "$b" 10.231.0

cat > "$work/peer.py" <<'PY'
import hashlib, random, socket, sys, threading
role, address, port, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def exchange(conn, seed):  # both ways at once, as a full-duplex protocol would
    out = random.Random(seed).randbytes(size)
    sender = threading.Thread(target=conn.sendall, args=(out,))
    sender.start()
    got, h = 0, hashlib.sha256()
    while got < size:
        chunk = conn.recv(min(1 << 20, size - got))
        if not chunk:
            sys.exit(f"{role}: end of stream after {got} of {size} bytes")
        h.update(chunk)
        got += len(chunk)
    sender.join()
    print(f"{role} sent {hashlib.sha256(out).hexdigest()} got {h.hexdigest()}", flush=True)
if role == "server":
    l = socket.create_server((address, port))
    print("listening", flush=True)
    c, _ = l.accept()
    exchange(c, 1)
    if c.recv(1) != b"":
        sys.exit("server: bytes after the end")
else:
    c = socket.create_connection((address, port), timeout=60)
    exchange(c, 2)
    c.shutdown(socket.SHUT_WR)
    if c.recv(1) != b"":
        sys.exit("client: bytes after the end")
c.close()
PY

# python3 keeps its interpreter state at exit: LeakSanitizer (in the
# sanitizer builds' preload list) would report the interpreter, not us.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
size=$((32 << 20)) port=47311
# pair <label> <env...>: one server and one client, both preloaded with the
# given settings; checks the bytes, leaves the logs in $work.
pair() {
  local label=$1 status=0 server
  shift
  run() {  # namespace, peer.py arguments... (no address setting: the
    # stack takes the connection's)
    local ns=$1
    shift
    timeout 90 ip netns exec "$ns" env LD_PRELOAD="$preload" \
      VMMC_SOCKETS_LOG_LEVEL=3 "${settings[@]}" python3 "$work/peer.py" "$@"
  }
  settings=("$@")
  ((port += 1))
  run "$a" server 10.231.0.1 $port $size > "$work/server.out" 2> "$work/server.err" &
  server=$!
  for _ in $(seq 100); do grep -q listening "$work/server.out" && break; sleep 0.05; done
  run "$b" client 10.231.0.1 $port $size > "$work/client.out" 2> "$work/client.err" ||
    status=$?
  wait "$server" || status=$?
  cat "$work/server.out" "$work/client.out"
  read -r _ _ server_sent _ server_got < <(grep "^server sent" "$work/server.out") || true
  read -r _ _ client_sent _ client_got < <(grep "^client sent" "$work/client.out") || true
  [[ $status == 0 ]] || problem+=" $label: a peer failed (status $status)"
  [[ -n ${server_sent:-} && $server_sent == "${client_got:-}" ]] ||
    problem+=" $label: server->client bytes differ"
  [[ -n ${client_sent:-} && $client_sent == "${server_got:-}" ]] ||
    problem+=" $label: client->server bytes differ"
}
problem=
pair default
for side in server client; do
  grep -q "plain TCP (peer on another host and no RDMA device" "$work/$side.err" ||
    problem+=" default: the $side did not keep kernel TCP, saying why"
  ! grep -q "switched to" "$work/$side.err" || problem+=" default: the $side switched"
done
cp "$work/client.err" "$work/client.default.err"
pair fabric VMMC_SOCKETS_REMOTE=fabric
for side in server client; do
  grep -q "switched to fabric" "$work/$side.err" || problem+=" fabric: the $side did not switch"
done
if [[ -n $problem ]]; then
  echo "FAIL:$problem"
  tail -n 5 "$work/client.default.err" "$work/server.err" "$work/client.err"
  exit 1
fi
echo "ok: 2 x $size bytes across namespaces, on kernel TCP by default and over the fabric"
