#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) into build-fuzz/ with clang and
# runs each, or the named ones, for a bounded time. See --help.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'USAGE'
usage: scripts/fuzz.sh [--minutes N] [--list] [target...]

Configures and builds build-fuzz/ (clang, -DVMMC_FUZZ=ON; installs clang and
libclang-rt-14-dev with apt-get when missing, as root), then runs every fuzz
target, or the named ones (core_control or fuzz.core.control), two at a
time (one per core).

  --minutes N   run each target N minutes (default: 30 s each, the CI run)
  --list        print the targets and exit
  -h, --help    this text

Each target starts from its seed corpus (tests/fuzz/corpus/<target>/, never
written) and keeps what it finds in build-fuzz/fuzz-runs/<target>/corpus.
A crash is saved in build-fuzz/fuzz-runs/<target>/crashes/; copy it to
tests/fuzz/corpus/<target>/regress-<what> once the bug is fixed. Exits
non-zero if any target crashed.
USAGE
}

seconds=30
targets=()
list=0
while (($#)); do
  case $1 in
    --minutes)
      [[ ${2:-} =~ ^[0-9]+$ ]] || { echo "fuzz.sh: --minutes takes a whole number" >&2; exit 2; }
      seconds=$(($2 * 60)); shift 2 ;;
    --list) list=1; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) name=${1#fuzz.}; targets+=("${name//./_}"); shift ;;
  esac
done

all=()
for f in tests/fuzz/fuzz_*.cc; do
  f=${f#tests/fuzz/fuzz_}
  all+=("${f%.cc}")
done
if ((list)); then printf '%s\n' "${all[@]}"; exit 0; fi
((${#targets[@]})) || targets=("${all[@]}")
for t in "${targets[@]}"; do
  [[ -f tests/fuzz/fuzz_$t.cc ]] || { echo "fuzz.sh: no target $t (see --list)" >&2; exit 2; }
done

scripts/install-packages.sh clang libclang-rt-14-dev

CC=clang CXX=clang++ cmake -S . -B build-fuzz -DVMMC_FUZZ=ON -DVMMC_BUILD_TESTS=OFF \
  -DVMMC_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j"$(( $(nproc) < 2 ? $(nproc) : 2 ))" --target fuzz_targets

# Two targets at a time, one per core (nproc caps it): the same fuzzing time
# per target in half the wall time.
jobs=$(( $(nproc) < 2 ? 1 : 2 ))
run_one() {
  local t=$1 work=build-fuzz/fuzz-runs/$1 status=0
  mkdir -p "$work"
  tests/fuzz/run_target.sh "build-fuzz/tests/fuzz/fuzz_$t" "tests/fuzz/corpus/$t" "$work" \
    "$seconds" >"$work/last.log" 2>&1 || status=$?
  echo "$status" >"$work/status"
}
crashed=()
for ((i = 0; i < ${#targets[@]}; i += jobs)); do
  batch=("${targets[@]:i:jobs}")
  for t in "${batch[@]}"; do
    echo "== $t: ${seconds} s (log: build-fuzz/fuzz-runs/$t/last.log)"
    run_one "$t" &
  done
  wait
  for t in "${batch[@]}"; do
    work=build-fuzz/fuzz-runs/$t
    echo "-- $t:"
    grep -E '^(#[0-9]+ +DONE|stat::number_of_executed_units|==[0-9]+==|SUMMARY|Test unit written)' \
      "$work/last.log" || true
    [[ $(cat "$work/status" 2>/dev/null) == 0 ]] || crashed+=("$t")
  done
done
if ((${#crashed[@]})); then
  echo "== crashed: ${crashed[*]} (inputs in build-fuzz/fuzz-runs/<target>/crashes/)" >&2
  exit 1
fi
echo "== no crashes"
