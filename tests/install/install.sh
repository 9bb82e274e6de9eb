#!/usr/bin/env bash
# install.prefix: `cmake --install` into a temporary prefix, then, from outside
# the source tree, everything a user of that prefix does:
#  - the layout: versioned sonames, headers, modules, tools, man pages;
#  - vmmc-settings lists every setting every layer declares;
#  - an NX program built with pkg-config vmmc-nx and with nxcc (and with the
#    build tree's nxcc) runs as 2 nodes under the installed nxrun, and node 1
#    receives node 0's message; a Fortran program built with nxf77 runs
#    (when gfortran is there);
#  - a CMake project finds vmmc::core with find_package and its program
#    sends a notified message from one context into another; a C program
#    of it opens a vRPC listener through vmmc::vrpc (libtirpc found too);
#  - unmodified socat under the installed vmmc-run: both ends switch to VMMC
#    (their --log 3 lines), the bytes arrive intact, --ports keeps the
#    connection on TCP, exit statuses pass through; a missing module (or a
#    library it needs) is refused before anything runs;
#  - the installed vmmc-stat, while unmodified socat under vmmc-run carries
#    1 MiB: both ends listed as accelerated on the mapped path, with the
#    bytes each end sent or received (--json and the table);
#  - vmmc-run --rpc: an unmodified rpcgen client of the kv example upgrades
#    to vRPC, its server (linked with vmmc) under vmmc-run too (rpcbind in
#    network and mount namespaces of our own).
#   install.sh <build dir> <source dir>
set -euo pipefail
build=$(readlink -f "$1")
source_dir=$(readlink -f "$2")
work=$(mktemp -d)
server=
stat_client=
source "$source_dir/scripts/servers.sh"  # free_port, wait_port, stop_server
cleanup() {
  if [[ -n $stat_client ]]; then
    kill "$stat_client" 2>/dev/null || true
    wait "$stat_client" 2>/dev/null || true
  fi
  stop_server
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$work"/*.log; do [[ -s $f ]] && sed "s|^|  ${f##*/}: |" "$f"; done
  exit 1
}
cd "$work"

prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >install.out || fail "cmake --install failed"
arch=$(gcc -print-multiarch)
libdir=$prefix/lib/$arch
bin=$prefix/bin

echo "== layout"
export PKG_CONFIG_PATH=$libdir/pkgconfig
# One version: each library's file, soname and .pc file carry the project's.
version=$(pkg-config --modversion vmmc-core)
for layer in core redirect sockets vrpc nx; do
  [[ -f $libdir/libvmmc_$layer.so.$version ]] || fail "no libvmmc_$layer.so.$version"
  soname=$(readelf -d "$libdir/libvmmc_$layer.so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
  [[ $soname =~ ^libvmmc_$layer\.so\.[0-9]+(\.[0-9]+)?$ && $version. == "${soname#*.so.}".* ]] ||
    fail "libvmmc_$layer.so.$version: soname '$soname'"
  [[ -f $libdir/$soname ]] || fail "no $soname in $libdir"
  [[ $(pkg-config --modversion "vmmc-$layer") == "$version" ]] || fail "vmmc-$layer.pc: another version"
done
for f in include/vmmc/core/context.h include/vmmc/sockets/socket.h include/vmmc/vrpc/vrpc.h \
  include/vmmc/nx/nx.h lib/$arch/vmmc/libvmmc_preload.so lib/$arch/vmmc/libvmmc_preload_engine.so \
  lib/$arch/vmmc/libvrpc_preload.so lib/$arch/vmmc/libvrpc_preload_engine.so \
  lib/$arch/cmake/vmmc/vmmc-config.cmake bin/nxf77 bin/nxfort; do
  [[ -f $prefix/$f ]] || fail "not installed: $f"
done
for tool in vmmc-run vmmc-settings vmmc-stat nxrun nxcc; do
  [[ -x $bin/$tool ]] || fail "not installed: bin/$tool"
  name=$(sed -n '/^\.SH NAME/{n;p;}' "$prefix/share/man/man1/$tool.1" | sed 's/\\-/-/g')
  [[ $name == *"$tool"*" - "* ]] || fail "no man page for $tool (NAME: '$name')"
done

echo "== vmmc-settings"
# Every setting declared in a layer's sources (one setting_type each), listed once.
declared=$(cat "$source_dir"/*/src/*.cc | grep -cE 'setting_type::[a-z]+,[[:space:]]*("|$)')
"$bin/vmmc-settings" >settings.log
listed=$(grep -c '^VMMC_' settings.log)
((listed == declared)) || fail "vmmc-settings lists $listed settings; the sources declare $declared"
[[ -z $(grep '^VMMC_' settings.log | cut -d' ' -f1 | sort | uniq -d) ]] || fail "a setting listed twice"
for layer in CORE REDIRECT SOCKETS PRELOAD VRPC NX; do
  grep -q "^VMMC_${layer}_" settings.log || fail "no VMMC_${layer}_* setting listed"
done
VMMC_NX_STATS=1 "$bin/vmmc-settings" nx | grep -q '^VMMC_NX_STATS  *bool   = 1 ' ||
  fail "VMMC_NX_STATS=1 not shown as its current value"
"$bin/vmmc-run" --ports 6379 --settings sockets | grep -q '^VMMC_SOCKETS_PORTS  *string = 6379 ' ||
  fail "vmmc-run --ports 6379 --settings does not show the port"
echo "$listed settings"

echo "== NX: pkg-config vmmc-nx, nxcc, nxrun"
expected="node 1 got type 7, 18 bytes from node 0: hello from node 0"
cp "$source_dir/tests/install/nx_hello.c" .
# shellcheck disable=SC2046  # the flags are words
cc $(pkg-config --cflags vmmc-nx) nx_hello.c $(pkg-config --libs vmmc-nx) -o nx_pkgconfig ||
  fail "cc with pkg-config vmmc-nx"
got=$(LD_LIBRARY_PATH=$libdir timeout 30 "$bin/nxrun" -n 2 ./nx_pkgconfig) || fail "nx_pkgconfig: status $?"
[[ $got == "$expected" ]] || fail "nx_pkgconfig printed '$got'"
"$bin/nxcc" -c nx_hello.c -o nx_hello.o || fail "nxcc -c"
"$bin/nxcc" nx_hello.o -o nx_nxcc || fail "nxcc (link)"
got=$(timeout 30 "$bin/nxrun" -n 2 ./nx_nxcc) || fail "nx_nxcc: status $?"
[[ $got == "$expected" ]] || fail "nx_nxcc printed '$got'"
"$build/nx/nxcc" nx_hello.c -o nx_build_tree || fail "build/nx/nxcc"
got=$(timeout 30 "$build/nx/nxrun" -n 2 ./nx_build_tree) || fail "nx_build_tree: status $?"
[[ $got == "$expected" ]] || fail "nx_build_tree printed '$got'"
echo "$got"
if command -v gfortran >/dev/null; then
  cp "$source_dir/tests/install/f_hello.f90" .
  "$bin/nxf77" f_hello.f90 -o f_hello || fail "nxf77"
  got=$(timeout 30 ./f_hello) || fail "f_hello: status $?"
  [[ $got == "fortran node 0 of 1" ]] || fail "f_hello printed '$got'"
  echo "nxf77: $got"
else
  echo "nxf77: skipped, no gfortran"
fi

echo "== find_package(vmmc): vmmc::core, vmmc::vrpc"
cp -r "$source_dir/tests/install/consumer" .
cmake -S consumer -B consumer-build -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  >consumer.log 2>&1 || fail "configuring the find_package project"
cmake --build consumer-build >>consumer.log 2>&1 || fail "building the find_package project"
got=$(timeout 30 consumer-build/core_hello) || fail "core_hello: status $?"
[[ $got == "path mapped, notification value 7 at 64, 19 bytes: hello through vmmc" ]] ||
  fail "core_hello printed '$got'"
echo "$got"
got=$(timeout 30 consumer-build/vrpc_hello) || fail "vrpc_hello: status $?"
[[ $got == "vrpc listener, port bound" ]] || fail "vrpc_hello printed '$got'"
echo "$got"

echo "== vmmc-run: socat"
head -c $((32 << 20)) /dev/urandom >sent.bin
# copy <name> [vmmc-run options]: one socat connection carrying sent.bin, both
# ends under vmmc-run with the options; stderr in <name>.server.log / .client.log.
copy() {
  local name=$1 port
  shift
  port=$(free_port)
  rm -f received.bin
  timeout 30 "$bin/vmmc-run" "$@" socat -u "TCP-LISTEN:$port,bind=127.0.0.1,reuseaddr" \
    CREATE:received.bin 2>"$name.server.log" &
  server=$!
  wait_port "$port" || fail "$name: socat did not listen"
  timeout 30 "$bin/vmmc-run" "$@" socat -u OPEN:sent.bin "TCP:127.0.0.1:$port" 2>"$name.client.log" ||
    fail "$name: the socat client exited with $?"
  wait "$server" || fail "$name: the socat server exited with $?"
  server=
  cmp -s sent.bin received.bin || fail "$name: the bytes received differ from those sent"
}
copy accelerated --log 3
grep -q "server accepted VMMC" accelerated.client.log || fail "the client's connection was not accepted for VMMC"
grep -q "writes switched to mapped" accelerated.client.log || fail "the client's writes stayed on TCP"
grep -qE "client (offered|asked for) VMMC" accelerated.server.log || fail "the server saw no VMMC offer or ask"
grep -h "switched" accelerated.*.log
copy other_ports --log 3 --ports 1
! grep -q "switched" other_ports.*.log || fail "--ports 1: a connection on another port switched"
rm -f ./*.log

echo "== vmmc-stat: socat under vmmc-run"
# The client sends what we feed it through a FIFO, and holds the connection
# open until we close our end.
port=$(free_port)
head -c $((1 << 20)) /dev/urandom >stat-sent.bin
mkfifo feed
exec 3<>feed  # read-write: the open never waits for the other end (kept from socat)
timeout 30 "$bin/vmmc-run" socat -u "TCP-LISTEN:$port,bind=127.0.0.1,reuseaddr" \
  CREATE:stat-received.bin 2>stat.server.log 3>&- &
server=$!
wait_port "$port" || fail "vmmc-stat: socat did not listen"
timeout 30 "$bin/vmmc-run" socat -u OPEN:feed "TCP:127.0.0.1:$port" 2>stat.client.log 3>&- &
stat_client=$!
# A first piece, then the rest once the server has answered the client's
# offer: a client that wrote everything before the answer came, and then
# only waited on the FIFO, would never look at its socket again (it stays
# undecided, on TCP, until its next call on it).
head -c 65536 stat-sent.bin >&3
server_answered() {
  "$bin/vmmc-stat" --json | python3 -c '
import json, sys
port = sys.argv[1]
doc = json.load(sys.stdin)
sys.exit(0 if any(c["role"] == "server" and c["local"] == "127.0.0.1:" + port and
                  c["state"] in ("upgrading", "accelerated")
                  for p in doc["processes"] for c in p["connections"]) else 1)' "$port"
}
for _ in $(seq 200); do server_answered && break; sleep 0.05; done
tail -c +65537 stat-sent.bin >&3
for _ in $(seq 200); do
  [[ $(stat -c %s stat-received.bin 2>/dev/null) == $((1 << 20)) ]] && break
  sleep 0.05
done
cmp -s stat-sent.bin stat-received.bin || fail "vmmc-stat: socat's bytes did not all arrive"
"$bin/vmmc-stat" --json >stat.json || fail "vmmc-stat --json exited with $?"
python3 - "$port" stat.json <<'PY' || fail "vmmc-stat --json: $(cat stat.json)"
import json, sys
port, doc = sys.argv[1], json.load(open(sys.argv[2]))
ends = {}
for p in doc["processes"]:
    for c in p["connections"]:
        if c["remote"] == "127.0.0.1:" + port or c["local"] == "127.0.0.1:" + port:
            ends[c["role"]] = (p, c)
assert set(ends) == {"client", "server"}, "socat's two ends not both listed: %s" % ends
for role, count in (("client", "bytes_out"), ("server", "bytes_in")):
    p, c = ends[role]
    assert p["command"].startswith("socat"), p["command"]
    assert (c["state"], c["path"], c["fallback"]) == ("accelerated", "mapped", None), c
    assert c[count] == 1 << 20, "%s %s = %d, not %d" % (role, count, c[count], 1 << 20)
    print("socat %s (pid %d): accelerated, mapped, %s %d" % (role, p["pid"], count, c[count]))
PY
"$bin/vmmc-stat" >stat.txt || fail "vmmc-stat exited with $?"
grep -qE "client 127\.0\.0\.1:[0-9]+ +127\.0\.0\.1:$port +accelerated +mapped +[0-9]+ +1048576 " stat.txt ||
  fail "vmmc-stat does not show socat's client accelerated: $(cat stat.txt)"
exec 3>&-
wait "$stat_client" || fail "vmmc-stat: the socat client exited with $?"
stat_client=
wait "$server" || fail "vmmc-stat: the socat server exited with $?"
server=
rm -f stat-* stat.* feed

echo "== vmmc-run: exit status, environment"
closed=$(free_port)
status=0
socat -u OPEN:sent.bin "TCP:127.0.0.1:$closed" 2>/dev/null || status=$?
under=0
"$bin/vmmc-run" socat -u OPEN:sent.bin "TCP:127.0.0.1:$closed" 2>/dev/null || under=$?
((status != 0 && under == status)) || fail "socat to a closed port: $status plain, $under under vmmc-run"
under=0
"$bin/vmmc-run" sh -c 'exit 7' || under=$?
((under == 7)) || fail "sh -c 'exit 7' under vmmc-run: status $under"
under=0
{ "$bin/vmmc-run" sh -c 'kill -TERM $$' || under=$?; } 2>/dev/null  # no "Terminated" from bash
((under == 128 + 15)) || fail "a program killed by SIGTERM: status $under"
module_dir=$(readlink -f "$libdir/vmmc")
got=$(LD_PRELOAD=libm.so.6 "$bin/vmmc-run" printenv LD_PRELOAD)
[[ $got == "$module_dir/libvmmc_preload.so:libm.so.6" ]] || fail "LD_PRELOAD under vmmc-run: $got"
got=$("$bin/vmmc-run" --rpc printenv LD_PRELOAD)
[[ $got == "$module_dir/libvrpc_preload.so:$module_dir/libvmmc_preload.so" ]] ||
  fail "LD_PRELOAD under vmmc-run --rpc: $got"
echo "statuses $status (socat), 7, 143 passed through"

echo "== vmmc-run: refusals"
# refused <what> <message> program...: vmmc-run must fail with 125, say
# <message> and run nothing (the program would print or create "ran").
refused() {
  local what=$1 message=$2 status=0
  shift 2
  timeout 10 "$bin/vmmc-run" "$@" >refusal.out 2>refusal.log || status=$?
  ((status == 125)) || fail "$what: vmmc-run exited with $status, not 125"
  [[ ! -e ran && ! -s refusal.out ]] || fail "$what: the program ran"
  grep -q "$message" refusal.log || fail "$what: the message does not say '$message'"
  cat refusal.log
}
mv "$libdir/vmmc/libvmmc_preload.so" moved.so
refused "a missing module" "cannot find the interposer module $module_dir/libvmmc_preload.so" touch ran
mv moved.so "$libdir/vmmc/libvmmc_preload.so"
mv "$libdir/vmmc/libvmmc_preload_engine.so" moved.so
refused "a missing engine" "cannot find the interposer's engine $module_dir/libvmmc_preload_engine.so" touch ran
mv moved.so "$libdir/vmmc/libvmmc_preload_engine.so"
sockets_soname=$(readelf -d "$libdir/libvmmc_sockets.so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
mv "$libdir/$sockets_soname" moved.so
refused "a library the module's engine needs" "cannot be loaded: $sockets_soname not found" touch ran
mv moved.so "$libdir/$sockets_soname"
{ "$bin/vmmc-run" touch ran && [[ -e ran ]]; } || fail "vmmc-run does not run the program once restored"
rm ran

echo "== vmmc-run --rpc: an unmodified rpcgen client"
if ! unshare -mn true 2>/dev/null || ! PATH=$PATH:/usr/sbin command -v rpcbind >/dev/null ||
  [[ ! -x $build/examples/kv/vmmc-kv-server ]]; then
  echo "skipped: needs unshare (root), rpcbind and the examples"
  exit 0
fi
# The kv example's vRPC server (built, linked with the sockets layer) under
# vmmc-run as well, as in a service stack started under it (it deadlocked),
# and its plain libtirpc client under vmmc-run --rpc.
# rpc.sh runs as process 1 of new PID, network and mount namespaces: when it
# ends, so does everything it started.
cat >rpc.sh <<EOF
set -euo pipefail
mount -t tmpfs tmpfs /run
ip link set lo up
rpcbind -f -w &
for _ in \$(seq 200); do [[ -S /run/rpcbind.sock ]] && break; sleep 0.05; done
"$bin/vmmc-run" "$build/examples/kv/vmmc-kv-server" 127.0.0.1 >server.log 2>&1 &
for _ in \$(seq 200); do grep -qs '^kv:' server.log && break; sleep 0.05; done
client="$build/examples/kv/vmmc-kv-client"
"$bin/vmmc-run" --rpc --log 3 "\$client" 127.0.0.1 tcp put key value 2>put.log
"$bin/vmmc-run" --rpc --log 3 "\$client" 127.0.0.1 tcp get key 2>get.log
EOF
PATH=$PATH:/usr/sbin timeout 30 unshare -mnpf --kill-child bash rpc.sh >rpc.out 2>rpc.log ||
  fail "the kv client under vmmc-run --rpc: status $?"
[[ $(cat rpc.out) == value ]] || fail "vmmc-run --rpc: get returned '$(cat rpc.out)'"
grep -q "writes switched to mapped" get.log || fail "vmmc-run --rpc: the RPC client stayed on TCP"
grep -h "switched" get.log
