#!/usr/bin/env bash
# tests/apps/apps.sh: the apps matrix. Unmodified Debian programs run with and
# without the interposers in four modes each: none (the reference: kernel
# TCP), server (only the server preloaded), client (only the client), both.
# Every mode must give what the reference gave: bytes (by checksum), exit
# statuses of clients and servers, no crash file (*.btr, core) and no process
# left behind. Prints one row per program and mode with the ratio ours/kernel
# of the program's headline figure (>1: vmmc better).
#   tests/apps/apps.sh [--build DIR] [--preload VALUE] [--vrpc-preload VALUE]
#                      [--rounds N] [--modes M,...] [--full] [--keep] [CASE...]
# Cases (default: all): nginx_ab nginx_ab_keepalive curl_big socat_fork sshd
# postgres python_asyncio python_banner vrpc_fork. --full: larger runs, 3 rounds.
# --preload / --vrpc-preload: the LD_PRELOAD values (default: the modules of
# --build). --modes: which of both,server,client run beside none (default:
# all). --keep: leave the logs of every run in /tmp. Exits 1 when any mode of
# any case failed (listed under FAILURES).
# Needs root (sshd, a user for nginx/postgres, namespaces for rpcbind).
set -Eeuo pipefail
# The driver is a child subreaper (prctl, kept across exec): whatever it
# starts stays its descendant even when its parent dies or it daemonises, so
# "left running" is exactly "a descendant still alive" (setproctitle in nginx,
# postgres and sshd overwrites their environment, so a marker there would not do).
if [[ ${VMMC_APPS_REAPER:-} != "$$" ]]; then
  exec env VMMC_APPS_REAPER=$$ python3 -c 'import ctypes, os, sys
if ctypes.CDLL(None).prctl(36, 1, 0, 0, 0) != 0: sys.exit("apps.sh: PR_SET_CHILD_SUBREAPER failed")
os.execv(sys.argv[1], sys.argv[1:])' "$0" "$@"
fi
unset VMMC_APPS_REAPER
export PATH=$PATH:/usr/sbin:/sbin  # sshd, nginx, rpcbind
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
self=$here/$(basename "$0")
all_cases=(nginx_ab nginx_ab_keepalive curl_big socat_fork sshd postgres python_asyncio python_banner
           vrpc_fork)
modes=(none both server client)

build=$root/build preload= vpreload= rounds=2 full=0 inner=0 keep=0 cases=()
while (($#)); do
  case $1 in
    --build) build=$(cd "$2" && pwd); shift 2 ;;
    --preload) preload=$2; shift 2 ;;
    --vrpc-preload) vpreload=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --modes)  # the reference (none) always runs, first
      IFS=, read -ra wanted <<<"$2"; modes=(none)
      for m in "${wanted[@]}"; do
        case $m in none) ;; both | server | client) modes+=("$m") ;; *) echo "apps.sh: unknown mode $m" >&2; exit 2 ;; esac
      done
      shift 2 ;;
    --full) full=1; rounds=3; shift ;;
    --keep) keep=1; shift ;;  # leave the work directory (logs of every run) in /tmp
    --inner) inner=1; shift ;;  # internal: already in the vrpc case's namespaces
    -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "apps.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) cases+=("$1"); shift ;;
  esac
done
((${#cases[@]})) || cases=("${all_cases[@]}")
[[ -n $preload ]] || preload=$build/preload/libvmmc_preload.so
[[ -n $vpreload ]] || vpreload=$build/vrpc/libvrpc_preload.so
((EUID == 0)) || { echo "apps.sh: needs root (sshd, a test user, namespaces)" >&2; exit 1; }

# Sizes: quick by default (the whole matrix in 2-4 minutes on 2 cores), yet
# long enough that a preloaded process's start-up (its VMMC context: libfabric
# loaded, threads, 0.3-1 s here) is not all that a figure measures.
if ((full)); then
  ab_n=20000 abk_n=200000 big_mib=1024 socat_mib=128 ssh_mib=256 pg_tx=4000 py_mib=64 kv_calls=5000
  banner_n=4000
else
  ab_n=5000 abk_n=50000 big_mib=200 socat_mib=32 ssh_mib=64 pg_tx=1000 py_mib=16 kv_calls=1000
  banner_n=1000
fi

source "$root/scripts/servers.sh"  # free_port, wait_port, stop_server, stop_server_gently
# A program that crashes leaves a core file where it runs (core_pattern
# permitting), which the crash check finds; the limit is inherited.
ulimit -S -c unlimited 2>/dev/null || true

work=$(mktemp -d /tmp/vmmc-apps.XXXXXX)
chmod 755 "$work"
user= server= created_run_sshd=0 rpcbind_pid=
cleanup() {
  stop_server
  server=$rpcbind_pid stop_server
  local left
  left=$(leftovers)
  [[ -z $left ]] || { echo "apps.sh: killing leftovers: $left" >&2; kill -KILL $(awk '{print $1}' <<<"$left") 2>/dev/null || true; }
  [[ -z $user ]] || userdel "$user" 2>/dev/null || { sleep 1; userdel "$user" || true; }
  ((created_run_sshd == 0)) || rmdir /run/sshd 2>/dev/null || true
  if ((keep)); then echo "apps.sh: kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'echo "apps.sh: line $LINENO: \"$BASH_COMMAND\" failed" >&2' ERR
trap 'exit 130' INT TERM

# Processes we started that still run: our live descendants (we are their
# subreaper), but for this check itself and rpcbind. "pid command" per line.
leftovers() {
  python3 - "$$" "${rpcbind_pid:-0}" <<'EOF'
import os, sys
parent, state = {}, {}
for p in filter(str.isdigit, os.listdir("/proc")):
    try:
        stat = open(f"/proc/{p}/stat").read()
    except (OSError, ValueError):
        continue
    fields = stat[stat.rindex(")") + 2:].split()
    parent[int(p)], state[int(p)] = int(fields[1]), fields[0]
me, skip = int(sys.argv[1]), {os.getpid(), os.getppid(), int(sys.argv[2])}
def ours(p):
    while p > 1:
        if p in skip: return False
        p = parent.get(p, 0)
        if p == me: return True
    return False
for p in sorted(parent):
    if state[p] != "Z" and p not in skip and ours(p):
        cmd = open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ")
        print(p, cmd.decode(errors="replace")[:160])
EOF
}

need() { for t; do command -v "$t" >/dev/null || { echo "apps.sh: missing $t (scripts/setup.sh installs it)" >&2; exit 1; }; done; }

# ---- running programs ------------------------------------------------------
# $pre_server / $pre_client: the LD_PRELOAD value of this mode's server and
# client ("" = not preloaded). `timeout` itself is never preloaded.
# command_as <user|-> <preload> <seconds> cmd...: sets $cmd to the command
# line: env LD_PRELOAD (+ the debug log, which says which connections
# switched to VMMC) only when set.
command_as() {
  local who=$1 pre=$2 limit=$3; shift 3
  local as=() env=(env)
  [[ $who == - ]] || as=(setpriv --reuid="$who" --regid="$who" --clear-groups)
  [[ -z $pre ]] || env+=(LD_PRELOAD="$pre" VMMC_SOCKETS_LOG_LEVEL=3)
  cmd=(timeout "$limit" "${as[@]}" "${env[@]}" "$@")
}
run_as() { local cmd; command_as "$@"; "${cmd[@]}"; }
# serve <user|-> cmd...: the server of this run, in the background, as $server
# (the pid of `timeout`: an external command, not a subshell), its output in
# $run/server.log.
serve() {
  local who=$1 cmd; shift
  command_as "$who" "$pre_server" 150 "$@"
  "${cmd[@]}" >"$run/server.log" 2>&1 &
  server=$!
}
# client <name> <user|-> cmd...: one client program of this run. Its exit
# status goes into the digest; stdout to $run/<name>.out, stderr .err.
client() {
  local name=$1 who=$2 rc=0; shift 2
  run_as "$who" "$pre_client" 120 "$@" >"$run/$name.out" 2>"$run/$name.err" || rc=$?
  digest "$name: exit $rc"
  ((rc == 0)) || problem "$name: exit status $rc$( ((rc == 124)) && echo ' (timed out)')"
  return 0
}
# finish_server <signal>: the server must still be running; stops it with the
# signal (what its init script would send) and records its exit status.
finish_server() {
  local sig=$1 rc=0
  if ! kill -0 "$server" 2>/dev/null || [[ -z $(cat "/proc/$server/task/$server/children" 2>/dev/null) ]]; then
    wait "$server" || rc=$?
    problem "the server ended before it was stopped (status $rc)"
    digest "server: ended early, status $rc"
    server=
    return 0
  fi
  stop_server_gently "$sig" 20
  digest "server: exit $server_status after SIG$sig"
}
digest() { echo "$*" >>"$run/digest"; }          # what must equal the reference
# stall_snapshot <seconds> (in the background): after that long, vmmc-stat's
# view of every process on the host into $run/stall.stat, printed with the
# failure. stop_snapshot <pid>: not needed any more (its sleep ends, so
# nothing is left running).
stall_snapshot() { sleep "$1" && "$build/tools/vmmc-stat" >"$run/stall.stat" 2>&1 || true; }
stop_snapshot() { pkill -P "$1" -x sleep 2>/dev/null || true; wait "$1" 2>/dev/null || true; }
problem() { echo "$*" >>"$run/problems"; }       # a failure in itself
# figure <value>: the headline figure of this run, unless it failed already.
figure() { if [[ $1 =~ ^[0-9.]+$ && ! -s $run/problems ]]; then printf '%.1f\n' "$1" >"$run/figure"; fi; }
mib_per_s() { python3 -c "import sys; print('%.1f' % (float(sys.argv[1]) * 1048576 / 1e6 / float(sys.argv[2])))" "$@"; }
now() { date +%s.%N; }
elapsed() { python3 -c "import sys; print(max(1e-6, float(sys.argv[2]) - float(sys.argv[1])))" "$@"; }
sha() { sha256sum "$1" | cut -c1-64; }
# make_data <file> <MiB>: incompressible bytes.
make_data() { [[ -f $1 ]] || head -c "$(($2 * 1048576))" /dev/urandom >"$1"; }

# A user of our own for servers that should not run as root (nginx without
# a `user`, postgres refuses root); removed on exit.
ensure_user() {
  if [[ -n $user ]]; then return; fi
  user=vmmcapps$$
  useradd --system --no-create-home --home-dir "$work" --shell /usr/sbin/nologin "$user"
}

# ---- cases: case_<name> runs one mode in $run (the cwd), setup_<name> once --
# 1, 2, 3: nginx (event-driven, sendfile), as our user, no daemon.
setup_nginx() {
  need nginx ab curl
  ensure_user
  mkdir -p "$work/www"
  head -c 7500 /dev/urandom | base64 -w 100 >"$work/www/page.html"  # 10 KiB of text
  chown -R "$user" "$work"
}
start_nginx() {  # sets $port
  port=$(free_port)
  mkdir -p "$run/tmp"
  cat >"$run/nginx.conf" <<EOF
worker_processes 2;
pid $run/nginx.pid;
error_log stderr warn;
env VMMC_SOCKETS_LOG_LEVEL;
events { worker_connections 1024; }
http {
  access_log off;
  sendfile on;
  keepalive_requests 1000000;
  default_type application/octet-stream;
  client_body_temp_path $run/tmp/body;
  proxy_temp_path $run/tmp/proxy;
  fastcgi_temp_path $run/tmp/fastcgi;
  uwsgi_temp_path $run/tmp/uwsgi;
  scgi_temp_path $run/tmp/scgi;
  server { listen 127.0.0.1:$port; root $work/www; }
}
EOF
  chown -R "$user" "$run"
  serve "$user" nginx -e stderr -p "$run" -c "$run/nginx.conf" -g 'daemon off;'
  wait_port "$port" || problem "nginx did not listen"
}
ab_run() {  # ab_run <requests> [-k]: 16 concurrent clients, of the 10 KiB page (-s 10: a
            # response that never comes fails the run in 10 s, not ab's default 30)
  local port n=$1; shift
  start_nginx
  client ab - ab "$@" -s 10 -n "$n" -c 16 "http://127.0.0.1:$port/page.html"
  local field
  for field in "Complete requests" "Failed requests" "Non-2xx responses" "Keep-Alive requests" \
               "Total transferred" "HTML transferred" "Document Length"; do
    digest "$(grep "^$field:" "$run/ab.out" | tr -s ' ' || true)"
  done
  if grep -q "^Failed requests: *[1-9]" "$run/ab.out"; then
    problem "ab: $(grep -A1 '^Failed requests' "$run/ab.out" | tr -s ' \n' ' ')"
  fi
  figure "$(sed -n 's/^Requests per second: *\([0-9.]*\).*/\1/p' "$run/ab.out")"
  if grep -q "exited on signal" "$run/server.log"; then
    problem "an nginx worker crashed: $(grep -m1 'exited on signal' "$run/server.log")"
  fi
  finish_server QUIT
}
setup_nginx_ab() { setup_nginx; }
case_nginx_ab() { ab_run "$ab_n"; }
setup_nginx_ab_keepalive() { setup_nginx; }
case_nginx_ab_keepalive() { ab_run "$abk_n" -k; }
unit_nginx_ab=req/s unit_nginx_ab_keepalive=req/s
title_nginx_ab="nginx + ab, a connection per request x $ab_n"
title_nginx_ab_keepalive="nginx + ab -k (keep-alive) x $abk_n"

setup_curl_big() { setup_nginx; make_data "$work/www/big.bin" "$big_mib"; sha "$work/www/big.bin" >"$work/big.sha"; }
case_curl_big() {
  local port; start_nginx
  client curl - curl -sS --fail -o "$run/big.out" -w '%{http_code} %{size_download} %{speed_download}\n' \
    "http://127.0.0.1:$port/big.bin"
  local got; got=$(sha "$run/big.out" 2>/dev/null || echo none)
  digest "curl: http $(cut -d' ' -f1,2 "$run/curl.out") sha256 $got"
  [[ $got == "$(cat "$work/big.sha")" ]] || problem "curl: sha256 $got, the file's is $(cat "$work/big.sha")"
  rm -f "$run/big.out"
  figure "$(awk '{printf "%.1f", $3 / 1e6}' "$run/curl.out")"
  finish_server QUIT
}
unit_curl_big=MB/s title_curl_big="curl, ${big_mib} MiB from nginx (sha256)"

# 4: socat forks a child per connection, which forks cat (EXEC) as the echo.
# Four clients at once, of different sizes (small ones are done writing before
# their server child forks).
socat_sizes=(1024 65536 1048576 $((socat_mib * 1048576)))
setup_socat_fork() {
  need socat
  make_data "$work/socat.bin" "$socat_mib"
  local i
  for i in "${!socat_sizes[@]}"; do
    head -c "${socat_sizes[i]}" "$work/socat.bin" >"$work/socat$i.in"
    sha "$work/socat$i.in" >"$work/socat$i.sha"
  done
}
case_socat_fork() {
  local port i t0 t1 got sent; port=$(free_port)
  serve - socat -t 10 "TCP-LISTEN:$port,bind=127.0.0.1,reuseaddr,fork" EXEC:cat
  wait_port "$port" || problem "socat did not listen"
  t0=$(now)
  for i in "${!socat_sizes[@]}"; do
    client "socat$i" - socat -t 10 -b 65536 - "TCP:127.0.0.1:$port" <"$work/socat$i.in" &
  done
  # Its clients take seconds: one still running after 100 s is stalled (CI19
  # saw one, 601,600 of 32 MiB echoed), and what vmmc-stat then says of every
  # connection on the host goes with the failure.
  local watchdog
  stall_snapshot 100 2>/dev/null & watchdog=$!
  wait $(jobs -p | grep -vx -e "$server" -e "$watchdog")
  t1=$(now)
  stop_snapshot "$watchdog"
  for i in "${!socat_sizes[@]}"; do
    got=$(sha "$run/socat$i.out") sent=$(cat "$work/socat$i.sha")
    digest "socat$i: echo sha256 $got"
    [[ $got == "$sent" ]] || problem "socat$i: ${socat_sizes[i]} bytes sent, $(stat -c %s "$run/socat$i.out") echoed back (sha256 $got, sent $sent)"
    rm -f "$run/socat$i.out"
  done
  local total=0; for i in "${socat_sizes[@]}"; do total=$((total + i)); done
  figure "$(mib_per_s "$(python3 -c "print($total / 1048576)")" "$(elapsed "$t0" "$t1")")"
  finish_server TERM
}
unit_socat_fork=MB/s title_socat_fork="socat fork EXEC:cat echo, 1K+64K+1M+${socat_mib}M"

# 5: OpenSSH: sshd (root, its own config and host key) forks and re-execs a
# child per connection, whose pre-auth child runs under a seccomp sandbox.
setup_sshd() {
  need ssh ssh-keygen /usr/sbin/sshd
  [[ -d /run/sshd ]] || { mkdir -m 755 /run/sshd; created_run_sshd=1; }
  ssh-keygen -q -t ed25519 -N '' -f "$work/host_key"
  ssh-keygen -q -t ed25519 -N '' -f "$work/user_key"
  cp "$work/user_key.pub" "$work/authorized_keys"
  make_data "$work/ssh.bin" "$ssh_mib"
  sha "$work/ssh.bin" >"$work/ssh.sha"
}
case_sshd() {
  local port t0 t1; port=$(free_port)
  cat >"$run/sshd_config" <<EOF
Port $port
ListenAddress 127.0.0.1
HostKey $work/host_key
PidFile none
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
AuthorizedKeysFile $work/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
LogLevel ERROR
EOF
  serve - /usr/sbin/sshd -D -e -f "$run/sshd_config"
  wait_port "$port" || problem "sshd did not listen"
  local ssh=(ssh -F /dev/null -i "$work/user_key" -p "$port" -o BatchMode=yes -o StrictHostKeyChecking=no
             -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR root@127.0.0.1)
  t0=$(now)
  client download - "${ssh[@]}" "cat $work/ssh.bin"
  t1=$(now)
  local got; got=$(sha "$run/download.out")
  digest "download: sha256 $got"
  [[ $got == "$(cat "$work/ssh.sha")" ]] || problem "download: sha256 $got, the file's is $(cat "$work/ssh.sha") ($(stat -c %s "$run/download.out") bytes)"
  rm -f "$run/download.out"
  client upload - "${ssh[@]}" "sha256sum" <"$work/ssh.bin"
  digest "upload: $(cat "$run/upload.out")"
  local rc=0
  run_as - "$pre_client" 60 "${ssh[@]}" 'echo out; echo err >&2; exit 7' >"$run/status.out" 2>"$run/status.err" || rc=$?
  digest "ssh 'exit 7': exit $rc, stdout $(tr '\n' ' ' <"$run/status.out")"
  ((rc == 7)) || problem "ssh 'exit 7' returned $rc: $(last_lines 2 "$run/status.err" | tr -s ' \n' ' ')"
  figure "$(mib_per_s "$ssh_mib" "$(elapsed "$t0" "$t1")")"
  finish_server TERM
}
unit_sshd=MB/s title_sshd="sshd + ssh 'cat ${ssh_mib} MiB' (sha256)"

# 6: PostgreSQL (a process per connection) and pgbench, as our user.
pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
setup_postgres() {
  need "$pg_bin/postgres" "$pg_bin/pgbench" "$pg_bin/psql"
  ensure_user
  chown "$user" "$work"
  run_as "$user" "" 60 "$pg_bin/initdb" -D "$work/pg" -A trust -U postgres --no-sync >"$work/initdb.log" 2>&1 ||
    { cat "$work/initdb.log"; return 1; }
  mkdir -p "$work/pgsock"; chown "$user" "$work/pgsock"
  # Initialised once (plain), so each mode runs its transactions on the same kind of database.
  local port; port=$(free_port); run=$work; pre_server=; pre_client=
  serve "$user" "${pg_cmd[@]}" -p "$port"
  wait_port "$port"
  run_as "$user" "" 60 "$pg_bin/createdb" -h 127.0.0.1 -p "$port" -U postgres bench
  run_as "$user" "" 60 "$pg_bin/pgbench" -h 127.0.0.1 -p "$port" -U postgres -i -s 1 -q bench >"$work/pginit.log" 2>&1 ||
    { cat "$work/pginit.log"; return 1; }
  stop_server_gently INT 20
}
pg_cmd=("$pg_bin/postgres" -D "$work/pg" -k "$work/pgsock" -h 127.0.0.1 -c fsync=off
        -c synchronous_commit=off -c full_page_writes=off -c max_connections=20 -c logging_collector=off)
pg_sums() {  # pg_sums <name>: account balance sum and history rows, through psql
  client "$1" "$user" "$pg_bin/psql" -h 127.0.0.1 -p "$port" -U postgres -d bench -At \
    -c "select sum(abalance) from pgbench_accounts" -c "select count(*) from pgbench_history"
}
case_postgres() {
  local port; port=$(free_port)
  serve "$user" "${pg_cmd[@]}" -p "$port"
  wait_port "$port" || problem "postgres did not listen"
  pg_sums before
  # Fixed seed: each client's transactions are the same in every mode, so the
  # balance moves by the same sum whatever the interleaving.
  client pgbench "$user" "$pg_bin/pgbench" -h 127.0.0.1 -p "$port" -U postgres -n -c 4 -j 2 \
    -t "$pg_tx" --random-seed=7 bench
  pg_sums after
  local -a b a; mapfile -t b <"$run/before.out"; mapfile -t a <"$run/after.out"
  digest "balance change $((${a[0]:-0} - ${b[0]:-0})), history rows added $((${a[1]:-0} - ${b[1]:-0}))"
  digest "$(grep -E '^number of (transactions actually processed|failed transactions)' "$run/pgbench.out" | tr '\n' ' ')"
  figure "$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' "$run/pgbench.out")"
  finish_server INT
}
unit_postgres=tx/s title_postgres="postgres + pgbench TPC-B, 4 clients x $pg_tx"

# 7: python3 asyncio echo server and client (echo.py).
setup_python_asyncio() { need python3; }
case_python_asyncio() {
  local port; port=$(free_port)
  serve - python3 "$here/echo.py" server "$port"
  wait_port "$port" || problem "echo.py server did not listen"
  client echo - python3 "$here/echo.py" client "$port" 8 "$py_mib"
  digest "$(grep '^digest' "$run/echo.out" || true)"
  figure "$(sed -n 's|^MB/s ||p' "$run/echo.out")"
  finish_server TERM
}
unit_python_asyncio=MB/s title_python_asyncio="python3 asyncio echo, 8 x ${py_mib} MiB"

# 7b: a server that speaks first (banner.py), one short connection per
# exchange. With only one side preloaded the other end is plain: the
# connections must cost what the kernel's cost (before, a preloaded server
# waited VMMC_SOCKETS_HOLD_US, 10 ms, for an offer on every one: ratio 0.01).
setup_python_banner() { need python3; }
case_python_banner() {
  local port; port=$(free_port)
  serve - python3 "$here/banner.py" server "$port"
  wait_port "$port" || problem "banner.py server did not listen"
  client banner - python3 "$here/banner.py" client "$port" "$banner_n"
  digest "$(grep '^digest' "$run/banner.out" || true)"
  figure "$(sed -n 's|^conn/s ||p' "$run/banner.out")"
  finish_server TERM
}
unit_python_banner=conn/s title_python_banner="python3 banner server, ${banner_n} connections"
# Modes whose ratio may not fall below a floor: a plain end must not pay.
floor_python_banner="server:0.5 client:0.5"

# 8: vRPC: the kv service (examples/kv) under rpcbind, in network and mount
# namespaces of our own; the rpcgen client (kv_fork_client.c) forks. Modes:
# server = the vRPC server (else libtirpc's TCP, vmmc-kv-server -p), client =
# the client under libvrpc_preload.so.
kv_server=$build/examples/kv/vmmc-kv-server
kv_client=$build/tests/apps/vmmc-apps-kv-fork
setup_vrpc_fork() {
  need rpcbind rpcinfo "$kv_server" "$kv_client"
  mount -t tmpfs tmpfs /run
  ip link set lo up
  # For the whole case (not a leftover): as long as every run could take.
  timeout $((rounds * ${#modes[@]} * 150 + 60)) rpcbind -f -w >"$work/rpcbind.log" 2>&1 &
  rpcbind_pid=$!
  for _ in $(seq 200); do [[ -S /run/rpcbind.sock ]] && break; sleep 0.05; done
  [[ -S /run/rpcbind.sock ]] || { echo "rpcbind did not start"; return 1; }
}
case_vrpc_fork() {
  local plain=(-p); [[ -z $pre_server ]] || plain=()
  local saved=$pre_server; pre_server=  # the vRPC server is linked, never preloaded
  serve - "$kv_server" "${plain[@]}" 127.0.0.1
  pre_server=$saved
  for _ in $(seq 200); do grep -qs '^kv:' "$run/server.log" && break; sleep 0.05; done
  grep -qs '^kv:' "$run/server.log" || problem "vmmc-kv-server did not start"
  [[ -z $pre_client ]] || pre_client=$vpreload
  client kvfork - "$kv_client" 127.0.0.1 3 "$kv_calls" 65536
  digest "$(grep '^digest' "$run/kvfork.out" || true)"
  figure "$(sed -n 's|^calls/s ||p' "$run/kvfork.out")"
  finish_server TERM  # svc_run never returns: killed, as its users stop it
}
unit_vrpc_fork=calls/s title_vrpc_fork="vRPC kv, rpcgen client forking 3 children"

# ---- the matrix --------------------------------------------------------------
declare -A accel
# run_mode <case> <mode> <round>
run_mode() {
  local c=$1 mode=$2 r=$3
  run=$work/$c/$mode.$r
  mkdir -p "$run"
  chmod 755 "$run"
  pre_server= pre_client=
  if [[ $mode == server || $mode == both ]]; then pre_server=$preload; fi
  if [[ $mode == client || $mode == both ]]; then pre_client=$preload; fi
  : >"$run/digest"
  touch "$run/.start"
  local t0=$SECONDS
  cd "$run"
  "case_$c"
  cd "$work"
  sort -o "$run/digest" "$run/digest"  # clients that ran at once appended in any order
  # Nothing of ours may stay behind, nor crash files be left anywhere it ran.
  local left=
  for _ in $(seq 30); do left=$(leftovers); [[ -z $left ]] && break; sleep 0.1; done
  if [[ -n $left ]]; then
    problem "left running after the server stopped: $(tr '\n' ';' <<<"$left")"
    kill -KILL $(awk '{print $1}' <<<"$left") 2>/dev/null || true
  fi
  local crash
  crash=$( (find "$work" -maxdepth 4 -newer "$run/.start" \( -name '*.btr' -o -name 'core' -o -name 'core.[0-9]*' \)
            find / /root /tmp -maxdepth 1 -newer "$run/.start" \( -name '*.btr' -o -name 'core' -o -name 'core.[0-9]*' \)) 2>/dev/null | sort -u | head -5)
  [[ -z $crash ]] || problem "crash files: $crash"
  if [[ -n $user ]] && pgrep -u "$user" >/dev/null; then problem "processes of $user left: $(pgrep -a -u "$user" | tr '\n' ';')"; fi
  accel[$c.$mode.$r]=$(cat "$run"/*.log "$run"/*.err 2>/dev/null | grep -c "writes switched to" || true)
  local unitvar=unit_$c
  echo "   $c $mode (round $r): $(cat "$run/figure" 2>/dev/null || echo '-') ${!unitvar} in $((SECONDS - t0)) s$([[ -s $run/problems ]] && echo ', FAILED')" >&2
}

# last_lines <n> <file>: its last lines but for our debug log's routine ones.
last_lines() {
  grep -vE '^vmmc-sockets\[[0-9]+\]: fd [0-9]+: (client (offered|asked for) VMMC|asked the server for VMMC|server accepted VMMC|server declined VMMC|earned a channel|writes switched to|plain TCP|writes back on TCP|back on TCP|channel set-up failed)' "$2" |
    tail -n "$1" | cut -c1-200 | sed 's/^/     /' || true
}

# best <case> <mode>: the best figure of its rounds (none when all failed).
best() {
  cat "$work/$1/$2".*/figure 2>/dev/null | grep -E '^[0-9.]+$' | sort -g | tail -1 || true
}

# report <case>: one row per mode; a mode fails on a problem of its own or a
# digest other than the reference's (first round of none).
report() {
  local c=$1 unitvar=unit_$1 titlevar=title_$1 mode r ref=$work/$1/none.1
  local unit=${!unitvar} title=${!titlevar} k
  k=$(best "$c" none)
  for mode in "${modes[@]}"; do
    local best status=pass why=() acc=0
    best=$(best "$c" "$mode")
    for ((r = 1; r <= rounds; r++)); do
      local d=$work/$c/$mode.$r
      acc=$((acc + ${accel[$c.$mode.$r]:-0}))
      if [[ -s $d/problems ]]; then status=FAIL; why+=("$d"); continue; fi
      if [[ $mode == none ]]; then continue; fi
      cmp -s "$ref/digest" "$d/digest" || { status=FAIL; why+=("$d"); }
    done
    local ratio=-
    if [[ -n $best && -n $k ]]; then ratio=$(python3 -c "import sys; k,v=map(float,sys.argv[1:]); print('%.2f' % (v/k) if k > 0 else '-')" "$k" "$best"); fi
    if [[ $mode == none ]]; then ratio=1; fi
    local floorvar=floor_$1 floor
    floor=$(tr ' ' '\n' <<<"${!floorvar:-}" | sed -n "s/^$mode://p")
    if [[ -n $floor && $ratio != - ]] && python3 -c "import sys; sys.exit(float(sys.argv[1]) >= float(sys.argv[2]))" "$ratio" "$floor"; then
      status=FAIL
      echo "---- $title, mode $mode: ratio $ratio below its floor $floor" >>"$work/failures"
    fi
    printf '| %-44s | %-6s | %-4s | %12s %-7s | %6s | %5s |\n' "$title" "$mode" "$status" "${best:--}" "$unit" "$ratio" "$acc"
    for d in "${why[@]}"; do
      {
        echo "---- $title, mode $mode ($(basename "$d")):"
        if [[ -s $d/problems ]]; then sed 's/^/   problem: /' "$d/problems"; fi
        diff "$ref/digest" "$d/digest" | sed 's/^/   digest (< reference, > this mode): /' || true
        local f
        for f in "$d"/*.out "$d"/*.err "$d"/server.log; do
          if [[ -s $f ]]; then echo "   last lines of $(basename "$f") (this mode):"; last_lines 6 "$f"; fi
        done
        if [[ -s $d/stall.stat ]]; then
          echo "   vmmc-stat while a client was stalled (this mode):"
          head -n 40 "$d/stall.stat" | cut -c1-200 | sed 's/^/     /'
        fi
        for f in "$ref"/*.err "$ref"/server.log; do
          if [[ -s $f ]]; then echo "   last lines of $(basename "$f") (reference):"; last_lines 3 "$f"; fi
        done
      } >>"$work/failures"
    done
  done
}

header() {
  printf '| %-44s | %-6s | %-4s | %20s | %6s | %5s |\n' "program" "mode" "ok" "best figure" "ratio" "accel"
  printf '|%s|%s|%s|%s|%s|%s|\n' "----------------------------------------------" "--------" "------" \
    "----------------------" "--------" "-------"
}

# The vrpc case needs its own rpcbind: the driver runs it again inside new
# network and mount namespaces.
if ((!inner)); then
  outer=() vrpc=0
  for c in "${cases[@]}"; do
    [[ " ${all_cases[*]} " == *" $c "* ]] || { echo "apps.sh: unknown case $c" >&2; exit 2; }
    if [[ $c == vrpc_fork ]]; then vrpc=1; else outer+=("$c"); fi
  done
  cases=("${outer[@]}")
fi

if ((!inner)); then
  echo "== apps matrix: unmodified programs, modes none (kernel TCP) / both / server / client preloaded; $rounds round(s)"
  echo "   ratio = best figure of the mode / the reference's (>1: vmmc better); accel = connection ends that switched to VMMC (debug log)"
  header
fi
for c in "${cases[@]}"; do
  "setup_$c"
  for ((r = 1; r <= rounds; r++)); do
    for mode in "${modes[@]}"; do run_mode "$c" "$mode" "$r"; done
  done
  report "$c"
done
status=0
if ((!inner && vrpc)); then
  args=(--build "$build" --preload "$preload" --vrpc-preload "$vpreload")
  if ((full)); then args+=(--full); fi  # before --rounds, which it would override
  if ((keep)); then args+=(--keep); fi
  args+=(--rounds "$rounds" --modes "$(IFS=,; echo "${modes[*]}")")
  unshare --net --mount --propagation private "$self" --inner "${args[@]}" vrpc_fork || status=1
fi
if [[ -s $work/failures ]]; then
  echo; echo "FAILURES:"; cat "$work/failures"
  status=1
fi
exit "$status"
