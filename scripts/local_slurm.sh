#!/usr/bin/env bash
# A one-node SLURM cluster on localhost, for testing `harness sweep hydra/launcher=submitit_slurm`.
#
#   scripts/local_slurm.sh start    # install slurm-wlm + munge (apt, if missing), start munged, slurmctld, slurmd
#   scripts/local_slurm.sh status   # daemons, sinfo, squeue
#   scripts/local_slurm.sh stop     # stop the daemons started here (by their pid files)
#
# Everything lives under $HARNESS_SLURM_DIR (default /tmp/harness-slurm): slurm.conf, the munge
# key and socket, state, logs, pid files. Nothing of the system's own slurm/munge setup is used
# or changed (the commands get SLURM_CONF from the environment file printed by `start`).
# Needs root (apt, SlurmUser=root). Partition "debug" (default), node "localhost", CPUs = nproc.
set -euo pipefail

DIR=${HARNESS_SLURM_DIR:-/tmp/harness-slurm}
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
    cpus=$(nproc)
    mkdir -p "$DIR"/{etc,state,spool,log,run,munge-etc,munge-lib,munge-log} "$MUNGE_SOCKET_DIR"
    chmod 755 "$DIR" "$MUNGE_SOCKET_DIR"
    chmod 700 "$DIR/munge-etc" "$DIR/munge-lib" "$DIR/munge-log"
    if [ ! -s "$DIR/munge-etc/munge.key" ]; then
        dd if=/dev/urandom of="$DIR/munge-etc/munge.key" bs=1 count=1024 status=none
    fi
    chmod 400 "$DIR/munge-etc/munge.key"
    cat >"$CONF" <<EOF
ClusterName=harness-local
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
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
NodeName=localhost CPUs=$cpus RealMemory=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10)) State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
    cat >"$ENV_FILE" <<EOF
export SLURM_CONF=$CONF
EOF
}

pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start() {
    need_root
    install_packages
    write_config
    export SLURM_CONF=$CONF
    if ! pid_alive "$DIR/run/munged.pid"; then
        log "starting munged (socket $MUNGE_SOCKET)"
        munged --key-file="$DIR/munge-etc/munge.key" --socket="$MUNGE_SOCKET" \
            --pid-file="$DIR/run/munged.pid" --log-file="$DIR/munge-log/munged.log" \
            --seed-file="$DIR/munge-lib/munged.seed" --force
    fi
    if ! pid_alive "$DIR/run/slurmctld.pid"; then
        log "starting slurmctld"
        slurmctld -f "$CONF"
    fi
    if ! pid_alive "$DIR/run/slurmd.pid"; then
        log "starting slurmd -N localhost"
        slurmd -f "$CONF" -N localhost
    fi
    for _ in $(seq 1 30); do
        if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
            break
        fi
        sleep 1
    done
    if ! sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
        scontrol update NodeName=localhost State=RESUME 2>/dev/null || true
        sleep 2
    fi
    sinfo
    log "ready. In your shell: source $ENV_FILE   (sets SLURM_CONF=$CONF)"
}

stop() {
    for d in slurmd slurmctld munged; do
        local pf=$DIR/run/$d.pid
        if pid_alive "$pf"; then
            log "stopping $d (pid $(cat "$pf"))"
            kill "$(cat "$pf")" || true
            for _ in $(seq 1 20); do pid_alive "$pf" || break; sleep 0.5; done
        fi
        rm -f "$pf"
    done
}

status() {
    export SLURM_CONF=$CONF
    local rc=0
    for d in munged slurmctld slurmd; do
        if pid_alive "$DIR/run/$d.pid"; then
            echo "$d: running (pid $(cat "$DIR/run/$d.pid"))"
        else
            echo "$d: not running"
            rc=1
        fi
    done
    if [ $rc = 0 ]; then
        sinfo
        squeue
    fi
    return $rc
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
