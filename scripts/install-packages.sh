#!/usr/bin/env bash
# scripts/install-packages.sh PACKAGE...: installs with apt-get (as root) the
# Debian packages named that are not installed yet; does nothing when all are.
# Shared by setup.sh (build and tests) and fuzz.sh (clang).
set -euo pipefail
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "== installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Servers the tests run themselves (nginx, sshd, postgres) must not start
  # as system services on install, listening on every interface: Debian's
  # policy-rc.d says no to service starts while this runs.
  policy=/usr/sbin/policy-rc.d
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
