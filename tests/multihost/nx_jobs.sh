# tests/multihost/nx_jobs.sh: sourced by nx_mpirun.sh and nx_srun.sh, which
# differ only in the launcher. The caller defines job SECONDS PROGRAM... (one
# 2-node job through its launcher, nx's log at level 3) and sets $build,
# $work and $scale.
#
# nx_jobs: examples/nx_jacobi must agree with its serial result and
# nx_pingpong must complete, the pair on kernel TCP (no RDMA device here:
# issue 15, item 3); failures are added to $problem.
nx_jobs() {
  if ! job $((60 * scale)) "$build/examples/nx_jacobi" > "$work/jacobi" 2>&1; then
    problem+=" nx_jacobi failed;"
  fi
  grep "^jacobi" "$work/jacobi" || true
  grep -q "^jacobi .* on 2 nodes: .*: ok$" "$work/jacobi" ||
    problem+=" nx_jacobi did not agree with its serial result;"
  if ! job $((60 * scale)) "$build/examples/nx_pingpong" 65536 200 > "$work/pingpong" 2>&1; then
    problem+=" nx_pingpong failed;"
  fi
  grep -E "^ +[0-9]+ |^nx: node [01] <->" "$work/pingpong" | head -n 5 || true
  grep -q "^nx: node 0 <-> node 1: kernel TCP" "$work/pingpong" ||
    problem+=" the nodes did not take kernel TCP to each other;"
}

# nx_jobs_verdict LAUNCHER: exits 1 with the programs' output if anything
# went wrong, else says so.
nx_jobs_verdict() {
  if [[ -n $problem ]]; then
    echo "FAIL:$problem"
    grep -v "^vmmc" "$work/jacobi" | tail -n 15
    grep -v "^vmmc" "$work/pingpong" | tail -n 8
    exit 1
  fi
  echo "ok: NX across hosts under $1, no vmmc settings"
}
