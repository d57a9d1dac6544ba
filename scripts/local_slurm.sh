#!/usr/bin/env bash
# A SLURM cluster on this machine, for testing `harness sweep hydra/launcher=submitit_slurm` and
# scripts/ray_slurm.sbatch.
#
#   scripts/local_slurm.sh start    # install slurm-wlm + munge (apt, if missing), start munged, slurmctld, slurmd
#   scripts/local_slurm.sh status   # daemons, sinfo, squeue
#   scripts/local_slurm.sh stop     # stop the daemons started here (by their pid files)
#
# One node ("localhost") by default. With --nodes N (2..8; give it to start, status and stop), N nodes
# h1..hN, each a host of scripts/netns_hosts.sh (a network namespace with its own address and
# hostname): slurmctld and slurmd h1 run on h1, slurmd hK on hK, munged outside (its socket is a file,
# which every host sees). The commands reach slurmctld from a host only, as from a cluster's login node:
#   scripts/netns_hosts.sh exec 1 srun --nodes=2 hostname      # prints h1 and h2
# `stop --nodes N` also takes the hosts down.
#
# Everything lives under $HARNESS_SLURM_DIR (default /tmp/harness-slurm; /tmp/harness-slurm-nodes with
# --nodes, so both clusters can run at once): slurm.conf, the munge key and socket, state, logs, pid
# files. Nothing of the system's own slurm/munge setup is used or changed (the commands get
# SLURM_CONF from the environment file printed by `start`). Needs root (apt, SlurmUser=root,
# ip netns). Partition "debug" (default), CPUs per node = the CPUs this machine gives its first process.
set -euo pipefail

CMD=${1:-}
NODES=0  # 0: the one-node cluster on localhost
if [ "${2:-}" = --nodes ]; then
    NODES=${3:-}
    if ! [[ $NODES =~ ^[0-9]+$ ]] || [ "$NODES" -lt 2 ] || [ "$NODES" -gt 8 ]; then
        echo "[local_slurm] error: --nodes takes 2..8, got '$NODES'" >&2
        exit 2
    fi
elif [ -n "${2:-}" ]; then
    echo "[local_slurm] error: unknown option '$2' (usage: $0 start|stop|status [--nodes N])" >&2
    exit 2
fi
HOSTS_SH=$(dirname "$0")/netns_hosts.sh
if [ "$NODES" = 0 ]; then
    DIR=${HARNESS_SLURM_DIR:-/tmp/harness-slurm}
    NODE_NAMES=(localhost)
else
    DIR=${HARNESS_SLURM_DIR:-/tmp/harness-slurm-nodes}
    mapfile -t NODE_NAMES < <(seq -f 'h%g' 1 "$NODES")
fi
CONF=$DIR/etc/slurm.conf
MUNGE_SOCKET_DIR=$DIR/munge-run
MUNGE_SOCKET=$MUNGE_SOCKET_DIR/munge.socket.2
ENV_FILE=$DIR/env.sh

log() { echo "[local_slurm] $*"; }

need_root() {
    if [ "$(id -u)" != 0 ]; then
        echo "[local_slurm] error: run as root (SlurmUser=root, apt-get)" >&2
        exit 1
    fi
}

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null 2>&1 || missing+=(slurm-wlm)
    command -v munged >/dev/null 2>&1 || missing+=(munge)
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing ${missing[*]} (apt-get) ..."
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

write_config() {
    local cpus
    # The CPUs this machine (container) gives its first process, not the calling shell's affinity (a
    # test process may be pinned to one CPU); nproc where python3 is missing
    cpus=$(python3 -c 'import os; print(len(os.sched_getaffinity(1)))' 2>/dev/null || nproc)
    mkdir -p "$DIR"/{etc,state,spool,log,run,munge-etc,munge-lib,munge-log} "$MUNGE_SOCKET_DIR"
    chmod 755 "$DIR" "$MUNGE_SOCKET_DIR"
    chmod 700 "$DIR/munge-etc" "$DIR/munge-lib" "$DIR/munge-log"
    if [ ! -s "$DIR/munge-etc/munge.key" ]; then
        dd if=/dev/urandom of="$DIR/munge-etc/munge.key" bs=1 count=1024 status=none
    fi
    chmod 400 "$DIR/munge-etc/munge.key"
    local ctld=localhost nodes="NodeName=localhost" first_job=1
    if [ "$NODES" != 0 ]; then  # the hosts' addresses (netns_hosts.sh: hK at 10.213.0.K)
        ctld="h1(10.213.0.1)"
        nodes="NodeName=h[1-$NODES] NodeAddr=10.213.0.[1-$NODES]"
        first_job=100000  # no job id in common with the one-node cluster (tests look for ray-JOBID processes)
    fi
    cat >"$CONF" <<EOF
ClusterName=harness-local
SlurmctldHost=$ctld
FirstJobId=$first_job
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldPort=${HARNESS_SLURMCTLD_PORT:-6817}
SlurmdPort=${HARNESS_SLURMD_PORT:-6818}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
SwitchType=switch/none
InactiveLimit=0
KillWait=10
MinJobAge=300
SlurmctldTimeout=60
SlurmdTimeout=60
Waittime=0
$nodes CPUs=$cpus RealMemory=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10)) State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    cat >"$ENV_FILE" <<EOF
export SLURM_CONF=$CONF
EOF
}

pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1" 2>/dev/null)" 2>/dev/null; }

on_node() {  # on_node K CMD...: CMD on node K (1-based): here for the one-node cluster, else on host hK
    local k=$1
    shift
    if [ "$NODES" = 0 ]; then "$@"; else "$HOSTS_SH" exec "$k" "$@"; fi
}

nodes_up() {  # how many nodes sinfo shows as usable
    on_node 1 sinfo -h -N -o %T 2>/dev/null | grep -cE '^(idle|mixed|allocated)$' || true  # not idle* (not responding)
}

start() {
    need_root
    install_packages
    if [ "$NODES" != 0 ] && [ "$("$HOSTS_SH" count)" != "$NODES" ]; then
        "$HOSTS_SH" up "$NODES"
    fi
    write_config
    export SLURM_CONF=$CONF
    if ! pid_alive "$DIR/run/munged.pid"; then
        log "starting munged (socket $MUNGE_SOCKET)"
        munged --key-file="$DIR/munge-etc/munge.key" --socket="$MUNGE_SOCKET" \
            --pid-file="$DIR/run/munged.pid" --log-file="$DIR/munge-log/munged.log" \
            --seed-file="$DIR/munge-lib/munged.seed" --force
    fi
    if ! pid_alive "$DIR/run/slurmctld.pid"; then
        log "starting slurmctld on ${NODE_NAMES[0]}"
        # -c: no jobs from an earlier cluster (with --nodes its hosts went down with it)
        on_node 1 slurmctld -f "$CONF" $([ "$NODES" = 0 ] || echo -c)
    fi
    local k=0
    for name in "${NODE_NAMES[@]}"; do
        k=$((k + 1))
        mkdir -p "$DIR/spool/$name"
        if ! pid_alive "$DIR/run/slurmd-$name.pid"; then
            log "starting slurmd -N $name"
            on_node "$k" slurmd -f "$CONF" -N "$name"
        fi
    done
    for _ in $(seq 1 30); do
        [ "$(nodes_up)" -ge "${#NODE_NAMES[@]}" ] && break
        sleep 1
    done
    if [ "$(nodes_up)" -lt "${#NODE_NAMES[@]}" ]; then
        for name in "${NODE_NAMES[@]}"; do on_node 1 scontrol update NodeName="$name" State=RESUME 2>/dev/null || true; done
        sleep 2
    fi
    on_node 1 sinfo
    if [ "$(nodes_up)" -lt "${#NODE_NAMES[@]}" ]; then
        echo "[local_slurm] error: $(nodes_up) of ${#NODE_NAMES[@]} node(s) came up; logs in $DIR/log" >&2
        exit 1
    fi
    if [ "$NODES" = 0 ]; then
        log "ready. In your shell: source $ENV_FILE   (sets SLURM_CONF=$CONF)"
    else
        log "ready: ${#NODE_NAMES[@]} nodes. Commands run on a host (login node h1): source $ENV_FILE; $HOSTS_SH exec 1 sinfo"
    fi
}

stop() {
    # slurmd: the pid file of a cluster started before pid files were named per node
    for d in "${NODE_NAMES[@]/#/slurmd-}" slurmd slurmctld munged; do
        local pf=$DIR/run/$d.pid
        if pid_alive "$pf"; then
            log "stopping $d (pid $(cat "$pf"))"
            kill "$(cat "$pf")" || true
            for _ in $(seq 1 20); do pid_alive "$pf" || break; sleep 0.5; done
        fi
        rm -f "$pf"
    done
    if [ "$NODES" != 0 ]; then
        "$HOSTS_SH" down  # kills what jobs left on the hosts
    fi
}

status() {
    export SLURM_CONF=$CONF
    local rc=0
    for d in munged slurmctld "${NODE_NAMES[@]/#/slurmd-}"; do
        if pid_alive "$DIR/run/$d.pid"; then
            echo "$d: running (pid $(cat "$DIR/run/$d.pid"))"
        else
            echo "$d: not running"
            rc=1
        fi
    done
    if [ $rc = 0 ]; then
        on_node 1 sinfo
        on_node 1 squeue
    fi
    return $rc
}

case "$CMD" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: $0 start|stop|status [--nodes N]" >&2; exit 2 ;;
esac
