#!/usr/bin/env bash
# Preloaded clients of a plain server that reads urgent bytes inline (issue
# 14, item 14): unmodified curl and socat sent "\xd6GET ..." and "\xd6hello"
# there (our urgent offer byte, taken for data). On one host a client now
# offers only to a listener a vmmc process entered in its presence table:
# the server must read exactly what each program wrote.
#   plain_peers.sh <LD_PRELOAD value>     (exit 77: curl or socat missing)
set -euo pipefail
preload=$1
here=$(cd "$(dirname "$0")" && pwd)
command -v curl >/dev/null && command -v socat >/dev/null || { echo "curl/socat missing: skipped"; exit 77; }
work=$(mktemp -d)
server=
cleanup() {
  [[ -z $server ]] || kill "$server" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; cat "$work/seen" 2>/dev/null; exit 1; }

mkfifo "$work/port"
timeout 60 python3 "$here/inline_urgent_server.py" 2 >"$work/port" &
server=$!
exec 3<"$work/port"
read -r -u 3 port
timeout 10 env LD_PRELOAD="$preload" curl -s "http://127.0.0.1:$port/" >"$work/curl.out" || fail "curl: exit $?"
echo hello | timeout 10 env LD_PRELOAD="$preload" socat -t1 - "TCP:127.0.0.1:$port" >/dev/null ||
  fail "socat: exit $?"
cat <&3 >"$work/seen"
wait "$server" || fail "server: exit $?"
server=
[[ $(cat "$work/curl.out") == ok ]] || fail "curl got $(cat "$work/curl.out")"
mapfile -t seen <"$work/seen"
echo "the plain server read: ${seen[*]}"
[[ ${seen[0]} == "b'GET / HTTP/1.1\\r\\n'" ]] || fail "curl's request began ${seen[0]}"
[[ ${seen[1]} == "b'hello\\n'" ]] || fail "socat's bytes were ${seen[1]}"
echo "PASS: the plain server read exactly the programs' bytes"
