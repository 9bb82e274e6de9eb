#!/bin/bash
# unit.core.settings_listed: every VMMC_* environment variable the product
# reads or documents is a declared setting that `vmmc-settings` lists, and
# nothing reads one but core's settings calls (so each has one name, type,
# default and help). Usage: settings_listed.sh <vmmc-settings> <source dir>
set -euo pipefail
tool=$1 src=$2
cd "$src"
product=(core redirect sockets vrpc nx preload tools examples)
failed=0
fail() { echo "FAIL: $*"; failed=1; }

listed=$("$tool" | grep -oE '^VMMC_[A-Z0-9_]+' | sort -u)
count=$(wc -l <<<"$listed")
[ "$count" -gt 0 ] || fail "vmmc-settings lists nothing"
echo "vmmc-settings lists $count settings"

# 1. Reads go through core's settings calls, never getenv("VMMC_..."). One
# exception: the interposer looks whether connections were handed over
# (VMMC_SOCKETS_INHERIT) before it loads anything of ours, core included,
# to load its engine at once then (preload/src/preload.cc).
while IFS= read -r hit; do
  fail "reads the environment directly: $hit"
done < <(grep -rnE 'getenv[[:space:]]*\([[:space:]]*"VMMC_' "${product[@]}" \
           --include='*.cc' --include='*.c' --include='*.h' |
           grep -vE '^preload/src/preload\.cc:[0-9]+:.*getenv\("VMMC_SOCKETS_INHERIT"\)' || true)

# 2. Every VMMC_* name the product's code (as a string), scripts and pages
# use is listed. (Unquoted VMMC_* in C/C++ are macros; VMMC_TEST_* belong to
# the test suite.)
used=$( {
  grep -rhoE '"VMMC_[A-Z0-9_]*[A-Z0-9]"' "${product[@]}" \
    --include='*.cc' --include='*.c' --include='*.h' | tr -d '"'
  grep -rhoE '\bVMMC_[A-Z0-9_]*[A-Z0-9]\b' "${product[@]}" README.md \
    --include='*.in' --include='*.sh' --include='*.1' --include='*.md'
} | grep -v '^VMMC_TEST_' | sort -u)
checked=0
for name in $used; do
  checked=$((checked + 1))
  grep -qx "$name" <<<"$listed" || fail "$name is used but vmmc-settings does not list it"
done
echo "$checked names used in the sources, scripts and pages"

# 3. Every declared table is registered where vmmc-settings sees it.
while IFS= read -r decl; do
  layer=$(sed -E 's/.*\{"([a-z]+)", *"([a-z_]+)".*/\1/' <<<"$decl")
  name=$(sed -E 's/.*\{"([a-z]+)", *"([a-z_]+)".*/\2/' <<<"$decl")
  env="VMMC_${layer^^}_${name^^}"
  grep -qx "$env" <<<"$listed" || fail "$env is declared but vmmc-settings does not list it"
done < <(grep -rhE 'setting +[a-z_]+ *\{"[a-z]+", *"[a-z_]+"' "${product[@]}" \
           --include='*.cc' --include='*.h')
[ "$failed" = 0 ] && echo "every setting is declared once and listed"
exit "$failed"
