# tests/support/bridged_hosts.sh: sourced by the tests that need several
# simulated hosts on one network (tests/multihost/).
#
# bridged_hosts PREFIX NET HOST...: a network namespace per HOST (named
# PREFIX-HOST, address NET.1, NET.2, ... in order, /24) and a wire namespace
# PREFIX-wire whose bridge br0 joins them: host HOST's veth is
# "<HOST>0" on its side and "w<HOST>" on the wire's. Exits 77 (skip) where
# namespaces cannot be created. remove_bridged_hosts PREFIX HOST..., from
# the caller's EXIT trap, deletes them all. hosts_reach PREFIX IP HOST...
# waits (up to 5 s) until each HOST answers a ping to IP: the bridge
# forwards once its ports have learned (mpirun's daemons call mpirun back as
# they start); false if one never does.
bridged_hosts() {
  local prefix=$1 net=$2 i=0 host
  shift 2
  ip netns add "$prefix-wire" 2>/dev/null || { echo "cannot create network namespaces"; exit 77; }
  ip -n "$prefix-wire" link add br0 type bridge
  ip -n "$prefix-wire" link set br0 up
  for host in "$@"; do
    i=$((i + 1))
    ip netns add "$prefix-$host"
    ip link add "${host}0" netns "$prefix-$host" type veth peer name "w$host" netns "$prefix-wire"
    ip -n "$prefix-$host" addr add "$net.$i/24" dev "${host}0"
    ip -n "$prefix-$host" link set lo up
    ip -n "$prefix-$host" link set "${host}0" up
    ip -n "$prefix-wire" link set "w$host" master br0 up
  done
}

remove_bridged_hosts() {
  local prefix=$1 host
  shift
  for host in wire "$@"; do ip netns del "$prefix-$host" 2>/dev/null || true; done
}

hosts_reach() {
  local prefix=$1 ip=$2 host
  shift 2
  for host in "$@"; do
    for _ in $(seq 50); do
      ip netns exec "$prefix-$host" ping -c 1 -W 1 "$ip" > /dev/null 2>&1 && continue 2
      sleep 0.1
    done
    return 1
  done
}
