#!/bin/sh
# run_target.sh <fuzzer> <seed corpus dir> <work dir> <seconds>
# One bounded run of a libFuzzer target: the seeds are copied into
# <work dir>/corpus (the source tree is never written), new inputs collect
# there, a crash goes to <work dir>/crashes/. Exits non-zero on a crash.
set -eu
fuzzer=$1 seeds=$2 work=$3 seconds=$4
mkdir -p "$work/corpus" "$work/crashes"
cp -R "$seeds/." "$work/corpus/"
exec "$fuzzer" -max_total_time="$seconds" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix="$work/crashes/" "$work/corpus"
