#!/bin/bash
# style.exports: the layers' libraries export their public API only
# (-fvisibility=hidden, cmake/layer.cmake; public headers push default):
# no symbol of a detail namespace or an impl class, nor one that names such
# a type (a constructor taking an impl, a std template instance over a
# detail type), but the internal entry points the test suite's impostor
# peers and its relay (which mirrors the presence entry of the client behind
# it) use. Usage: exports.sh <lib>...
set -euo pipefail
allowed='^vmmc::sockets::detail::presence::(enter\(int\)|ask\(unsigned long\)|decline\(unsigned long\)|entry_of\(vmmc::sockets::detail::presence::socket_id const&\)|peer_socket\(sockaddr const\*, unsigned int, sockaddr const\*, unsigned int\))$'
bad=0
for lib in "$@"; do
  symbols=$(nm -DC --defined-only "$lib" | awk '$2 ~ /^[TWVDBRiu]$/ { $1 = ""; $2 = ""; sub(/^  /, ""); print }')
  total=$(grep -c . <<<"$symbols" || true)
  internal=$(grep -E 'vmmc::([A-Za-z_]+::)*(detail|impl|[a-z_]*_impl)\b' <<<"$symbols" \
               | grep -vE "$allowed" || true)
  echo "$(basename "$lib"): $total symbols exported, $(grep -c . <<<"$internal" || true) internal"
  if [ -n "$internal" ]; then
    head -5 <<<"$internal" | sed 's/^/  exported: /'
    bad=1
  fi
  [ "$total" -gt 0 ] || { echo "  exports nothing"; bad=1; }
done
exit "$bad"
