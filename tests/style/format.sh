#!/bin/bash
# style.format: every C and C++ source follows the committed .clang-format
# (STYLE.md). Usage: format.sh <source dir>. Skips (77), saying why, where
# Debian 12's clang-format 14 is missing: other versions format differently.
set -euo pipefail
cd "$1"
if ! command -v clang-format >/dev/null; then
  echo "SKIP: no clang-format (scripts/setup.sh installs it)"
  exit 77
fi
version=$(clang-format --version | grep -oE 'version [0-9]+' | grep -oE '[0-9]+')
if [ "$version" != 14 ]; then
  echo "SKIP: clang-format $version; the tree is formatted with Debian 12's clang-format 14"
  exit 77
fi
# From git where there is one (a clean clone), else the source tree. fnx.h is
# Fortran, not C.
if [ -d .git ]; then
  files=$(git ls-files '*.c' '*.cc' '*.h')
else
  files=$(find core redirect sockets vrpc nx preload tools examples tests \
            -name '*.c' -o -name '*.cc' -o -name '*.h')
fi
files=$(grep -v '^nx/include/fnx\.h$' <<<"$files")
# One clang-format for all (one a file took 25 s); it names each file that
# differs in its "<file>:<line>:<column>: error:" lines.
# shellcheck disable=SC2086  # the file names have no spaces
report=$(clang-format --dry-run -Werror $files 2>&1 >/dev/null) || true
bad_files=$(grep -oE '^[^:]+:[0-9]+:[0-9]+: error' <<<"$report" | cut -d: -f1 | sort -u || true)
bad=0
for f in $bad_files; do
  echo "not formatted: $f (clang-format -i $f)"
  bad=$((bad + 1))
done
if [ "$bad" = 0 ] && grep -q 'error' <<<"$report"; then
  echo "clang-format failed: $report"
  exit 1
fi
echo "$(wc -w <<<"$files") files checked, $bad not formatted"
[ "$bad" = 0 ]
