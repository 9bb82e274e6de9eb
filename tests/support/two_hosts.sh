# tests/support/two_hosts.sh: sourced by the tests that need two simulated
# hosts (tests/integration/preload/netns.sh, tests/integration/nx/namespaces.sh).
#
# two_hosts A B NET: network namespaces A and B joined by a veth pair, with
# addresses NET.1 (in A) and NET.2 (in B), /24. Exits 77 (skip) where
# namespaces cannot be created. remove_two_hosts A B, from the caller's EXIT
# trap, deletes them (and so the veth pair).
two_hosts() {
  local a=$1 b=$2 net=$3 link=vh$$ ns
  ip netns add "$a" 2>/dev/null || { echo "cannot create network namespaces"; exit 77; }
  ip netns add "$b"
  ip link add "${link}a" type veth peer name "${link}b"
  ip link set "${link}a" netns "$a"
  ip link set "${link}b" netns "$b"
  ip -n "$a" addr add "$net.1/24" dev "${link}a"
  ip -n "$b" addr add "$net.2/24" dev "${link}b"
  for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
  ip -n "$a" link set "${link}a" up
  ip -n "$b" link set "${link}b" up
}

remove_two_hosts() {
  ip netns del "$1" 2>/dev/null || true
  ip netns del "$2" 2>/dev/null || true
}
