#!/usr/bin/env bash
# scripts/local_slurm.sh start|stop|status [DIR]: a one-node SLURM cluster on this machine.
#
#   start   installs munge, slurmctld, slurmd and slurm-client with apt-get where they are
#           missing (root only), writes a one-node slurm.conf in DIR (select/cons_tres, one
#           partition, state and spool in DIR, ports of its own), starts munged, slurmctld and
#           slurmd (their pids in DIR), waits until the node is idle and prints the line
#           SLURM_CONF=DIR/slurm.conf (export it for sbatch, squeue, scancel and submitit)
#   stop    stops the daemons it started, by the pids in DIR
#   status  sinfo against DIR's cluster
#
# DIR defaults to ${TMPDIR:-/tmp}/loaderbench-slurm. Exit 2 (with the reason on stderr) where
# SLURM cannot run here: not root, no apt-get, a daemon that does not start. The tests use it
# through a session fixture (tests/conftest.py: local_slurm), which stops what it started.
set -euo pipefail

ACTION=${1:-}
DIR=${2:-${TMPDIR:-/tmp}/loaderbench-slurm}
PORT=${LOCAL_SLURM_PORT:-16817}
PACKAGES=(munge slurmctld slurmd slurm-client)

cannot() {
    echo "local_slurm: $*" >&2
    exit 2
}

install_packages() {
    local missing=()
    command -v munged >/dev/null || missing+=(munge)
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    ((${#missing[@]})) || return 0
    [[ $(id -u) == 0 ]] || cannot "needs ${missing[*]} and is not root (run: apt-get install ${PACKAGES[*]})"
    command -v apt-get >/dev/null || cannot "needs ${missing[*]} and there is no apt-get"
    echo "local_slurm: installing ${missing[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >"$DIR/apt.log" 2>&1 ||
        {
            apt-get update -q >>"$DIR/apt.log" 2>&1 &&
                DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" \
                    >>"$DIR/apt.log" 2>&1
        } || cannot "apt-get install ${missing[*]} failed (see $DIR/apt.log)"
}

write_config() {
    local host cpus memory
    host=$(hostname -s)
    # The CPUs this process may run on: nproc answers OMP_NUM_THREADS instead where it is set
    # (a thread count, not the node's: the test suite sets it to each worker's share).
    cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
    memory=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10))
    mkdir -p "$DIR/state" "$DIR/spool" "$DIR/munge"
    # Quick turns for tests: a requeued job waits cred_expire seconds (120 by default) before
    # it may start again, and pending jobs are looked at every sched_interval/bf_interval
    # seconds (60/30 by default).
    cat >"$DIR/slurm.conf" <<EOF
ClusterName=loaderbench
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket,cred_expire=10
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
JobRequeue=1
ReturnToService=2
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=30
MinJobAge=300
KillWait=10
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

alive() {
    [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

start() {
    mkdir -p "$DIR"
    if alive "$DIR/slurmctld.pid" && alive "$DIR/slurmd.pid"; then
        echo "SLURM_CONF=$DIR/slurm.conf"
        return 0
    fi
    install_packages
    write_config
    export SLURM_CONF=$DIR/slurm.conf
    [[ -f /etc/munge/munge.key ]] || cannot "no /etc/munge/munge.key (the munge package makes it)"
    munged --force --socket="$DIR/munge/munge.socket" --pid-file="$DIR/munged.pid" \
        --log-file="$DIR/munged.log" --seed-file="$DIR/munge/munge.seed" ||
        cannot "munged did not start (see $DIR/munged.log)"
    slurmctld -i -f "$SLURM_CONF" || cannot "slurmctld did not start (see $DIR/slurmctld.log)"
    slurmd -f "$SLURM_CONF" || cannot "slurmd did not start (see $DIR/slurmd.log)"
    local tries
    for tries in $(seq 60); do
        if sinfo -h -o %T 2>/dev/null | grep -qx idle; then
            echo "SLURM_CONF=$SLURM_CONF"
            return 0
        fi
        # A node that came up "down" or "drained" from an earlier state: put it back.
        scontrol update nodename="$(hostname -s)" state=resume >/dev/null 2>&1 || true
        sleep 0.5
    done
    cannot "the node did not become idle (sinfo: $(sinfo -h 2>&1 | head -n 3); see $DIR/*.log)"
}

stop() {
    local name
    for name in slurmd slurmctld munged; do
        if alive "$DIR/$name.pid"; then
            kill "$(cat "$DIR/$name.pid")" 2>/dev/null || true
        fi
    done
    for _ in $(seq 40); do
        alive "$DIR/slurmd.pid" || alive "$DIR/slurmctld.pid" || alive "$DIR/munged.pid" || return 0
        sleep 0.25
    done
    for name in slurmd slurmctld munged; do
        alive "$DIR/$name.pid" && kill -9 "$(cat "$DIR/$name.pid")" 2>/dev/null || true
    done
}

case $ACTION in
    start) start ;;
    stop) stop ;;
    status) SLURM_CONF=$DIR/slurm.conf sinfo ;;
    *)
        echo "usage: $0 start|stop|status [DIR]" >&2
        exit 2
        ;;
esac
