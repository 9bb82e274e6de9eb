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
bad=0
for f in $files; do
  if ! clang-format --dry-run -Werror "$f" >/dev/null 2>&1; then
    echo "not formatted: $f (clang-format -i $f)"
    bad=$((bad + 1))
  fi
done
echo "$(wc -w <<<"$files") files checked, $bad not formatted"
[ "$bad" = 0 ]
