#!/usr/bin/env bash
# Several hosts on this machine for the multi-node tests: nodes node1…nodeN, each a network
# namespace with an address on a bridge, and, for what `exec` runs there, a hostname of its
# own and an /etc/hosts naming all nodes (target/test-cluster/hosts, bind-mounted); links
# between two nodes cut and healed with iptables DROP rules inside both. Needs root (ip
# netns, iptables). Traffic stays inside the namespaces.
#
#   scripts/test-cluster.sh up N               # (re)make N nodes; removes leftovers first
#   scripts/test-cluster.sh down               # remove nodes, bridge, hosts files, processes
#   scripts/test-cluster.sh exec NODE -- CMD…  # run CMD as host NODE (it becomes CMD: exec)
#   scripts/test-cluster.sh addr NODE          # NODE's address
#   scripts/test-cluster.sh cut A B            # drop every packet between A and B
#   scripts/test-cluster.sh heal A B           # undo cut A B
#   scripts/test-cluster.sh status             # nodes, addresses, cuts
#   scripts/test-cluster.sh slurm CTL NODE…    # slurmctld on CTL, slurmd on each NODE; prints SLURM_CONF
#
# Environment: AUGUR_CLUSTER_BRIDGE (augbr0), AUGUR_CLUSTER_SUBNET (10.213.0: node i is
# .10+i), AUGUR_CLUSTER_DIR (target/test-cluster: the hosts file and the node count).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
bridge=${AUGUR_CLUSTER_BRIDGE:-augbr0}
subnet=${AUGUR_CLUSTER_SUBNET:-10.213.0}
dir=${AUGUR_CLUSTER_DIR:-$repo/target/test-cluster}
# Host ends of the veth pairs: the bridge's name and the node's number (<= 15 characters).
veth_prefix=${bridge}v

die() {
    echo "test-cluster: $*" >&2
    exit 1
}

usage() {
    sed -n '8,16p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

# The node number of NODE (node3 -> 3), or die.
number_of() {
    [[ $1 =~ ^node([0-9]+)$ ]] || die "not a node name: $1"
    echo "${BASH_REMATCH[1]}"
}

addr_of() {
    local n
    n=$(number_of "$1")
    echo "$subnet.$((10 + n))"
}

# Nodes that exist now (namespaces named nodeN whose host end is on our bridge, or any
# nodeN listed in our state file), one a line.
existing_nodes() {
    {
        ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^node[0-9]+$' || true
    } | sort -V | while read -r node; do
        n=$(number_of "$node")
        if ip link show "$veth_prefix$n" >/dev/null 2>&1 || grep -qx "$node" "$dir/nodes" 2>/dev/null; then
            echo "$node"
        fi
    done
}

require_node() {
    ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$1" || die "no node $1 (run: $0 up N)"
}

cmd_down() {
    local node n pid
    for node in $(existing_nodes); do
        # Whatever still runs there (a killed test's servers) goes with its node.
        for pid in $(ip netns pids "$node" 2>/dev/null); do
            kill -KILL "$pid" 2>/dev/null || true
        done
        ip netns del "$node" 2>/dev/null || true
    done
    for n in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^${veth_prefix}[0-9]+$" || true); do
        ip link del "$n" 2>/dev/null || true
    done
    if ip link show "$bridge" >/dev/null 2>&1; then
        ip link del "$bridge"
    fi
    rm -f "$dir/nodes" "$dir/hosts"
}

cmd_up() {
    local count=${1:-}
    [[ $count =~ ^[0-9]+$ && $count -ge 1 && $count -le 200 ]] || die "up N: N from 1 to 200"
    cmd_down
    mkdir -p "$dir"
    echo "127.0.0.1 localhost" >"$dir/hosts.new"
    for i in $(seq 1 "$count"); do
        echo "$subnet.$((10 + i)) node$i" >>"$dir/hosts.new"
    done
    mv "$dir/hosts.new" "$dir/hosts"
    ip link add "$bridge" type bridge
    ip link set "$bridge" up
    for i in $(seq 1 "$count"); do
        local node=node$i
        ip netns add "$node"
        echo "$node" >>"$dir/nodes"
        ip link add "$veth_prefix$i" type veth peer name eth0 netns "$node"
        ip link set "$veth_prefix$i" master "$bridge" up
        ip netns exec "$node" ip addr add "$(addr_of "$node")/24" dev eth0
        ip netns exec "$node" ip link set eth0 up
        ip netns exec "$node" ip link set lo up
    done
}

cmd_exec() {
    local node=${1:-}
    [[ -n $node ]] || usage
    shift
    [[ ${1:-} == -- ]] && shift
    [[ $# -ge 1 ]] || usage
    require_node "$node"
    # The node's network, a hostname and (in a mount namespace of its own) the cluster's hosts
    # file; not `ip netns exec`, whose fresh /sys has no cgroups (slurmd needs them). Each
    # step execs the next, so that the caller's child process is CMD itself.
    # shellcheck disable=SC2016 # expanded by that sh, not here
    exec nsenter --net="/var/run/netns/$node" unshare --uts --mount -- \
        sh -c 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"' \
        sh "$dir/hosts" "$node" "$@"
}

# Add (cut) or remove every copy of (heal) the DROP rules inside NODE for PEER's address.
drop_rules() {
    local action=$1 node=$2 peer=$3 rule
    for rule in "INPUT -s $peer" "OUTPUT -d $peer"; do
        # shellcheck disable=SC2086 # the rule's words
        if [[ $action == cut ]]; then
            ip netns exec "$node" iptables -w -C $rule -j DROP 2>/dev/null ||
                ip netns exec "$node" iptables -w -I $rule -j DROP
        else
            while ip netns exec "$node" iptables -w -C $rule -j DROP 2>/dev/null; do
                ip netns exec "$node" iptables -w -D $rule -j DROP
            done
        fi
    done
}

# cut|heal A B: both directions, in both nodes.
cmd_link() {
    local action=$1
    shift
    [[ $# -eq 2 && $1 != "$2" ]] || usage
    require_node "$1"
    require_node "$2"
    drop_rules "$action" "$1" "$(addr_of "$2")"
    drop_rules "$action" "$2" "$(addr_of "$1")"
}

# A Slurm cluster on the nodes (the RUNBOOK's one-node recipe, spread out): its own munged
# (socket, state, logs under $dir/slurm), slurmctld on CTL and a slurmd on each NODE, all
# killed by `down` with their nodes. Prints the slurm.conf to give as SLURM_CONF.
cmd_slurm() {
    [[ $# -ge 2 ]] || usage
    local ctl=$1 node slurm=$dir/slurm cpus memory
    shift
    for node in "$ctl" "$@"; do require_node "$node"; done
    rm -rf "$slurm"
    mkdir -p "$slurm/state" "$slurm/log" "$slurm/munge"
    chown munge:munge "$slurm/munge"
    [[ -f /etc/munge/munge.key ]] || mungekey -c
    cpus=$(nproc)
    memory=$(($(free -m | awk '/Mem:/{print $2}') / 4))
    {
        echo "ClusterName=augur-test-nodes"
        echo "SlurmctldHost=$ctl($(addr_of "$ctl"))"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "AuthType=auth/munge"
        echo "AuthInfo=socket=$slurm/munge/munge.socket"
        echo "StateSaveLocation=$slurm/state"
        echo "SlurmdSpoolDir=$slurm/spool-%n"
        echo "SlurmctldPidFile=$slurm/slurmctld.pid"
        echo "SlurmdPidFile=$slurm/slurmd-%n.pid"
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/none"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_Core"
        echo "ReturnToService=2"
        # A node that stops answering is DOWN within seconds, not the default 5 minutes: the
        # tests take nodes down mid-trial.
        echo "SlurmdTimeout=10"
        echo "SchedulerType=sched/backfill"
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "AccountingStorageType=accounting_storage/none"
        echo "SlurmctldLogFile=$slurm/log/slurmctld.log"
        echo "SlurmdLogFile=$slurm/log/slurmd-%n.log"
        for node in "$@"; do
            echo "NodeName=$node NodeAddr=$(addr_of "$node") CPUs=$cpus RealMemory=$memory State=UNKNOWN"
        done
        echo "PartitionName=nodes Nodes=$(IFS=,; echo "$*") Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4"
    } >"$slurm/slurm.conf"
    # munged on the controller's node too, so that `down` ends it; its socket is a file.
    "$0" exec "$ctl" -- runuser -u munge -- munged --socket="$slurm/munge/munge.socket" \
        --pid-file="$slurm/munge/munged.pid" --log-file="$slurm/munge/munged.log" \
        --seed-file="$slurm/munge/munge.seed" --key-file=/etc/munge/munge.key
    "$0" exec "$ctl" -- slurmctld -f "$slurm/slurm.conf"
    for node in "$@"; do
        "$0" exec "$node" -- slurmd -f "$slurm/slurm.conf" -N "$node"
    done
    local tries=0
    until [[ $(SLURM_CONF=$slurm/slurm.conf "$0" exec "$ctl" -- sinfo -h -t idle -o %D 2>/dev/null) == "$#" ]]; do
        tries=$((tries + 1))
        [[ $tries -le 60 ]] || die "slurm: not every node idle after 30 s (logs: $slurm/log)"
        sleep 0.5
    done
    echo "$slurm/slurm.conf"
}

cmd_status() {
    local node
    for node in $(existing_nodes); do
        echo "$node $(addr_of "$node") pids: $(ip netns pids "$node" | wc -l)"
        ip netns exec "$node" iptables -w -S INPUT | grep -- '-j DROP' | sed 's/^/  cut: /' || true
    done
}

[[ $(id -u) -eq 0 ]] || die "needs root (network namespaces, iptables)"
command=${1:-}
[[ -n $command ]] || usage
shift
case $command in
up) cmd_up "$@" ;;
down) cmd_down ;;
exec) cmd_exec "$@" ;;
addr)
    [[ $# -eq 1 ]] || usage
    require_node "$1"
    addr_of "$1"
    ;;
cut) cmd_link cut "$@" ;;
heal) cmd_link heal "$@" ;;
status) cmd_status ;;
slurm) cmd_slurm "$@" ;;
*) usage ;;
esac
