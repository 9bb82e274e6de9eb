#!/usr/bin/env bash
# tests/multihost/nx_srun.sh BUILD: NX across simulated hosts under Slurm's
# srun with nothing but srun's own options (issue 15, item 5), as
# nx_mpirun.sh under mpirun. Three hosts on a bridge
# (tests/support/bridged_hosts.sh): slurmctld on host c, a slurmd on hosts a
# and b, each daemon in its namespace with its own host name (UTS) and
# PMIx directory (Slurm's PMIx plugin names a job's directory by job only),
# one munged for all (its socket is a path, which every namespace reaches),
# made and removed here; srun --mpi=pmix on host c. examples/nx_jacobi must
# agree with its serial result and nx_pingpong must complete, the pair on
# kernel TCP (no RDMA device: asserted from nx's log). Exit 77 (skip) where
# namespaces cannot be created or Slurm or munge is missing.
set -euo pipefail
build=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
for p in slurmd slurmctld srun sinfo munged unshare; do
  command -v $p > /dev/null || { echo "no $p"; exit 77; }
done
[[ -r /etc/munge/munge.key ]] || { echo "no munge key"; exit 77; }
. "$here/../support/bridged_hosts.sh"
prefix=vmmc-sr-$$ net=10.243.$(($$ % 200))
work=$(mktemp -d)
daemons=()
cleanup() {
  local p
  for p in "${daemons[@]}"; do kill "$p" 2> /dev/null || true; done
  for p in "${daemons[@]}"; do wait "$p" 2> /dev/null || true; done
  remove_bridged_hosts "$prefix" a b c
  [[ -n ${KEEP:-} ]] || rm -rf "$work"
}
trap cleanup EXIT
bridged_hosts "$prefix" "$net" a b c
scale=${VMMC_TEST_TIME_SCALE:-1}
lifetime=$((180 * scale))  # every daemon ends by itself after this

timeout "$lifetime" munged -F --force --socket="$work/munge.sock" --key-file=/etc/munge/munge.key \
  --pid-file="$work/munged.pid" --log-file="$work/munged.log" --seed-file="$work/munged.seed" \
  > "$work/munged.out" 2>&1 &
daemons+=($!)
mkdir -p "$work/ctld" "$work/spool-a" "$work/spool-b"
cat > "$work/slurm.conf" <<CONF
ClusterName=vmmc-test
SlurmctldHost=c($net.3)
AuthType=auth/munge
AuthInfo=socket=$work/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$work/ctld
SlurmdSpoolDir=$work/spool-%n
SlurmctldPidFile=$work/ctld.pid
SlurmdPidFile=$work/slurmd-%n.pid
SlurmctldLogFile=$work/ctld.log
SlurmdLogFile=$work/slurmd-%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/builtin
SelectType=select/linear
ReturnToService=2
NodeName=a NodeAddr=$net.1 CPUs=$(nproc) State=UNKNOWN
NodeName=b NodeAddr=$net.2 CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=a,b Default=YES MaxTime=INFINITE State=UP
CONF
# Slurm 22.05's slurmd starts its cgroup plugin even for proctrack/pgid; it
# needs the v1 freezer hierarchy mounted (it creates nothing in it here).
echo "CgroupPlugin=cgroup/v1" > "$work/cgroup.conf"
echo "PMIxCliTmpDirBase=$work/pmix" > "$work/mpi.conf"
mkdir -p "$work/pmix"
export SLURM_CONF=$work/slurm.conf
for _ in $(seq 50); do [[ -S $work/munge.sock ]] && break; sleep 0.1; done

# on_host <host> <command>: a daemon with the host's name.
on_host() {
  local host=$1
  shift
  ip netns exec "$prefix-$host" unshare --uts sh -c "hostname $host && $* " \
    > "$work/$host.out" 2>&1 &
  daemons+=($!)
}
on_host c "exec timeout $lifetime slurmctld -D -i"
for host in a b; do
  # The PMIx plugin's directories (mpi.conf) are each slurmd's own, as on
  # separate hosts: it names them by job only, and two slurmds sharing
  # /tmp collided on them.
  on_host $host "mount -t tmpfs none /sys/fs/cgroup && mkdir /sys/fs/cgroup/freezer &&
    mount -t cgroup -o freezer none /sys/fs/cgroup/freezer &&
    mount -t tmpfs none $work/pmix && exec timeout $lifetime slurmd -D"
done
for _ in $(seq 150); do
  ip netns exec "$prefix-c" sinfo -h -o "%T %D" 2> /dev/null | grep -q "^idle 2$" && break
  sleep 0.2
done
if ! ip netns exec "$prefix-c" sinfo -h -o "%T %D" 2> /dev/null | grep -q "^idle 2$"; then
  echo "FAIL: the Slurm nodes did not come up"
  ip netns exec "$prefix-c" sinfo 2>&1 || true
  tail -n 5 "$work"/*.out
  exit 1
fi

# srun passes the caller's environment to the tasks, as usual.
job() {
  local seconds=$1
  shift
  ip netns exec "$prefix-c" env VMMC_CORE_LOG_LEVEL=3 timeout "$seconds" \
    srun -N 2 -n 2 --mpi=pmix "$@"
}
. "$here/nx_jobs.sh"
problem=
nx_jobs
[[ -z $problem ]] || tail -n 5 "$work/slurmd-a.log" "$work/slurmd-b.log" 2> /dev/null || true
nx_jobs_verdict srun
