# scripts/servers.sh: sourced by the scripts that run unmodified servers
# (scripts/preload-demo.sh, tests/integration/preload/sockperf.sh and
# short_clients.sh, tests/apps/apps.sh).

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Waits until something listens on the port (without connecting: iperf3 -1
# would take a probe for its one client).
wait_port() { for _ in $(seq 200); do ss -Hltn "sport = :$1" | grep -q . && return 0; sleep 0.05; done; return 1; }

# Ends the server started as `timeout ... server` whose pid is in $server:
# SIGKILL to the server, not SIGTERM: sockperf's SIGTERM handler calls
# exit(), which runs every atexit handler (the interposer's too) inside the
# signal handler: not async-signal-safe, and reported as such by the
# ThreadSanitizer build's tests.
stop_server() {
  if [[ -n ${server:-} ]]; then
    kill -KILL $(cat "/proc/$server/task/$server/children" 2>/dev/null) 2>/dev/null || true
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
  fi
  server=
}

# stop_server_gently <signal> <seconds>: ends the server of $server (started
# as `timeout ... server`) the way its init script would, with <signal> to the
# server itself; SIGKILL (stop_server) when it has not exited after <seconds>.
# Sets $server_status to the exit status `timeout` returned (128+n: died by
# signal n; 137 also when it had to be killed).
stop_server_gently() {
  local sig=$1 limit=$2 i
  server_status=
  [[ -n ${server:-} ]] || return 0
  kill -"$sig" $(cat "/proc/$server/task/$server/children" 2>/dev/null) 2>/dev/null || true
  for ((i = 0; i < limit * 10; i++)); do
    [[ $(cut -d' ' -f3 "/proc/$server/stat" 2>/dev/null) == Z || ! -e /proc/$server ]] && break
    sleep 0.1
  done
  ((i < limit * 10)) || kill -KILL $(cat "/proc/$server/task/$server/children" 2>/dev/null) 2>/dev/null || true
  server_status=0
  wait "$server" 2>/dev/null || server_status=$?
  server=
}

# A scratch directory in $work and one server slot in $server, both gone
# when the script exits (the preload tests that run one server at a time).
scratch_with_server() {
  work=$(mktemp -d)
  server=
  trap 'stop_server; rm -rf "$work"' EXIT
}
