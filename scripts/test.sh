#!/usr/bin/env bash
# Set up, build, and run the default test suite (unit + integration; the
# benchmarks are not part of it). Extra arguments go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cd build
ctest --output-on-failure --timeout 600 "$@"
