#!/usr/bin/env bash
# Start a one-node Slurm cluster on this machine for tests/jobs/slurm.rs (installing slurm-wlm and
# munge when missing), exactly as ../shared/RUNBOOK.md describes: munged, slurmctld, slurmd,
# one partition `debug` holding this host. Waits until `sinfo` shows the node idle.
# Idempotent: daemons already running are left alone; a second run changes nothing.
set -euo pipefail

log() { printf 'start-slurm: %s\n' "$*" >&2; }

if ! command -v sbatch >/dev/null 2>&1 || ! command -v slurmctld >/dev/null 2>&1 \
  || ! command -v slurmd >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
  log "installing slurm-wlm and munge"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >&2
fi

host=$(hostname -s)
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge

mem_mb=$(free -m | awk '/Mem:/{print $2}')
conf=$(cat <<EOF
ClusterName=augur-test
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=$host CPUs=$(nproc) RealMemory=$((mem_mb - 1024)) State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
)
conf_changed=0
if [ "$(cat /etc/slurm/slurm.conf 2>/dev/null || true)" != "$conf" ]; then
  log "writing /etc/slurm/slurm.conf"
  printf '%s\n' "$conf" >/etc/slurm/slurm.conf
  conf_changed=1
fi

[ -f /etc/munge/munge.key ] || mungekey -c
chown munge:munge /etc/munge/munge.key /run/munge
chmod 400 /etc/munge/munge.key

# munged: running when a credential round-trips.
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  log "starting munged"
  runuser -u munge -- munged
  for _ in $(seq 1 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n | unmunge >/dev/null || { log "munged did not start"; exit 1; }
fi

# slurmctld: running when it answers a ping.
ctld_up() { scontrol ping 2>/dev/null | grep -q 'is UP'; }
if ctld_up; then
  if [ "$conf_changed" = 1 ]; then
    log "slurm.conf changed: scontrol reconfigure"
    scontrol reconfigure >&2
  fi
else
  log "starting slurmctld"
  slurmctld
  for _ in $(seq 1 100); do ctld_up && break; sleep 0.1; done
  ctld_up || { log "slurmctld did not start; see /var/log/slurm/slurmctld.log"; exit 1; }
fi

# slurmd: its pid file names a live process.
slurmd_up() {
  local pid
  pid=$(cat /run/slurmd.pid /var/run/slurmd.pid 2>/dev/null | head -n1 || true)
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}
if ! slurmd_up; then
  log "starting slurmd"
  slurmd
fi

# Wait for the node to register and become idle (or busy with jobs of an earlier run).
state=""
for _ in $(seq 1 150); do
  state=$(sinfo -h -n "$host" -o '%T' 2>/dev/null | head -n1 || true)
  case "$state" in
    idle|mixed|allocated|completing) break ;;
    drained|draining|down|drain*|down*)
      # A node left down/drained by an earlier, unclean run: give it back.
      scontrol update NodeName="$host" State=RESUME >/dev/null 2>&1 || true ;;
  esac
  sleep 0.2
done
case "$state" in
  idle|mixed|allocated|completing) ;;
  *) log "node $host is '${state:-unknown}', not idle; see /var/log/slurm/"; sinfo >&2 || true; exit 1 ;;
esac
sinfo >&2
log "Slurm is up: node $host $state"
