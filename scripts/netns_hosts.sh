#!/usr/bin/env bash
# Several "hosts" on this machine, as Linux network namespaces on a private bridge: for testing what
# reaches past one host (a rollout server on another host, Ray and SLURM across nodes).
#
#   scripts/netns_hosts.sh up [N]       # N hosts (default 2): harness-h1..hN at 10.213.0.1..N, names h1..hN
#   scripts/netns_hosts.sh exec H CMD.. # run CMD on host H (1..N): in its namespace, with its hostname
#   scripts/netns_hosts.sh status       # the hosts, their addresses, the processes in each
#   scripts/netns_hosts.sh count        # how many hosts are up (0 if none)
#   scripts/netns_hosts.sh down         # kill every process in the hosts, remove namespaces, links, files
#
# Each host is a network namespace (harness-hK) holding one end of a veth pair (eth0, 10.213.0.K/24)
# whose other end (hns-hK) is enslaved to a bridge (hns-br0) with no address: the hosts reach each
# other and nothing else, and nothing is routed off the machine. `exec` runs the command in the host's
# network namespace with a mount namespace of its own, where /etc/netns/harness-hK/hosts is mounted over
# /etc/hosts (h1..hN resolve inside every host), and a UTS namespace with hostname hK (SLURM reads it). The filesystem is shared, as on
# a cluster with a shared filesystem. Needs root (ip netns). `down` is idempotent and also cleans up
# after a failed `up` or a test that died.
set -euo pipefail

PREFIX=harness-h
BRIDGE=hns-br0
SUBNET=10.213.0

log() { echo "[netns_hosts] $*"; }

need_root() {
    if [ "$(id -u)" != 0 ]; then
        echo "[netns_hosts] error: run as root (ip netns)" >&2
        exit 1
    fi
}

hosts() {  # the namespaces of ours that exist now
    ip netns list 2>/dev/null | awk '{print $1}' | grep "^${PREFIX}[0-9]*$" || true
}

up() {
    local n=${1:-2}
    if ! [[ $n =~ ^[0-9]+$ ]] || [ "$n" -lt 2 ] || [ "$n" -gt 8 ]; then
        echo "[netns_hosts] error: up N takes 2..8 hosts, got '$n'" >&2
        exit 2
    fi
    down >/dev/null
    ip link add "$BRIDGE" type bridge
    ip link set "$BRIDGE" up
    for k in $(seq 1 "$n"); do
        local ns=$PREFIX$k
        ip netns add "$ns"
        ip link add "hns-h$k" type veth peer name eth0 netns "$ns"
        ip link set "hns-h$k" master "$BRIDGE" up
        ip -n "$ns" addr add "$SUBNET.$k/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
        mkdir -p "/etc/netns/$ns"
        {
            echo "127.0.0.1 localhost"
            for j in $(seq 1 "$n"); do echo "$SUBNET.$j h$j"; done
        } >"/etc/netns/$ns/hosts"
        echo "h$k" >"/etc/netns/$ns/hostname"
    done
    log "up: $n hosts on $BRIDGE ($(for k in $(seq 1 "$n"); do printf 'h%s=%s.%s ' "$k" "$SUBNET" "$k"; done))"
}

run_on() {
    local k=$1
    shift
    local ns=$PREFIX$k
    if ! ip netns list | awk '{print $1}' | grep -qx "$ns"; then
        echo "[netns_hosts] error: no host h$k (run: scripts/netns_hosts.sh up)" >&2
        exit 2
    fi
    # Not `ip netns exec`: it remounts /sys, which hides /sys/fs/cgroup (slurmd needs it). Instead a
    # mount and UTS namespace of its own, the host's network namespace, its hosts file and hostname.
    exec unshare --mount --uts --propagation slave nsenter --net="/run/netns/$ns" \
        sh -c 'mount --bind "/etc/netns/$0/hosts" /etc/hosts && hostname "$1" && shift && exec "$@"' "$ns" "h$k" "$@"
}

status() {
    local found
    found=$(hosts)
    if [ -z "$found" ]; then
        log "no hosts"
        return 0
    fi
    for ns in $found; do
        local addr pids
        addr=$(ip -n "$ns" -4 -o addr show dev eth0 2>/dev/null | awk '{print $4}')
        pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
        echo "${ns#harness-}  $addr  pids: ${pids:-none}"
    done
}

down() {
    for ns in $(hosts); do
        local pids tries=0
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        if [ -n "$pids" ]; then
            kill -TERM $pids 2>/dev/null || true
            sleep 1
        fi
        # KILL until none is left: a daemon may fork (slurmstepd, a Ray worker) after the first list
        while pids=$(ip netns pids "$ns" 2>/dev/null || true) && [ -n "$pids" ] && [ $tries -lt 20 ]; do
            kill -KILL $pids 2>/dev/null || true
            tries=$((tries + 1))
            sleep 0.2
        done
        [ -z "$pids" ] || echo "[netns_hosts] warning: processes still in $ns after 20 KILLs: $pids" >&2
        ip netns del "$ns" 2>/dev/null || true
        rm -rf "/etc/netns/$ns"
    done
    for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E '^hns-(h[0-9]+|br0)$' || true); do
        ip link del "$link" 2>/dev/null || true
    done
    log "down: no namespace, link or file of ours is left"
}

need_root
case "${1:-}" in
    up) up "${2:-2}" ;;
    exec) shift; [ $# -ge 2 ] || { echo "usage: $0 exec HOST CMD..." >&2; exit 2; }; run_on "$@" ;;
    status) status ;;
    count) hosts | grep -c . || true ;;
    down) down ;;
    *) echo "usage: $0 up [N] | exec HOST CMD... | status | count | down" >&2; exit 2 ;;
esac
