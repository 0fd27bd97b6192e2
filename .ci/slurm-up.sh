#!/usr/bin/env bash
# Start a real single-node Slurm (Debian's slurm-wlm 22.05 + munge) for the tests. Idempotent.
#
#   .ci/slurm-up.sh      # partition "debug", node $(hostname -s) with REGEN_SLURM_GPUS (2) fake GPUs (gres)
#
# Runs as root, daemons started by hand (no systemd). Config must live in /etc/slurm (the executor plugin
# strips SLURM_* inside jobs, so SLURM_CONF elsewhere breaks srun). No slurmdbd: Snakemake must use
# `--slurm-status-command squeue`, which needs MinJobAge >= 120 s (set to 600 here).
# Stop with .ci/slurm-down.sh.
set -euo pipefail

STATE="${REGEN_SLURM_STATE:-/tmp/regen-slurm}"
NGPU="${REGEN_SLURM_GPUS:-2}"
CONF_DIR=/etc/slurm
MARK="# written by regen .ci/slurm-up.sh"

log() { echo "slurm-up: $*" >&2; }
# install_slurm, start_munge, alive
source "$(dirname "${BASH_SOURCE[0]}")/slurm-common.sh"

cluster_ready() { # controller answers and the node is usable
  command -v sinfo >/dev/null 2>&1 || return 1
  scontrol ping 2>/dev/null | grep -q "UP" || return 1
  sinfo -h -o %T 2>/dev/null | grep -q -E "^(idle|mixed|allocated)" || return 1
}

if cluster_ready; then
  log "Slurm already running: $(sinfo -h -o '%P %D %T %G' | head -1)"
  exit 0
fi

install_slurm

mkdir -p "$STATE"/{state,spool,log} /run/munge "$CONF_DIR"

# munge: key from the package postinst, or make one.
start_munge

NODE="$(hostname -s)"
CPUS="$(nproc)"
MEM_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 8 / 10 ))
LAST=$(( NGPU - 1 ))

# Fake GPUs: character devices (aliases of /dev/null); regular files are rejected by slurmd.
for k in $(seq 0 "$LAST"); do
  [[ -c "$STATE/gpu$k" ]] || { rm -f "$STATE/gpu$k"; mknod "$STATE/gpu$k" c 1 3; }
done

if [[ -f "$CONF_DIR/slurm.conf" ]] && ! grep -qF "$MARK" "$CONF_DIR/slurm.conf"; then
  log "keeping a copy of the existing slurm.conf as slurm.conf.regen-bak"
  cp -n "$CONF_DIR/slurm.conf" "$CONF_DIR/slurm.conf.regen-bak"
fi
cat > "$CONF_DIR/slurm.conf" <<CONF
$MARK
ClusterName=ci
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/state
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
# finished jobs stay visible to squeue for 10 min: Snakemake's squeue status check relies on it
MinJobAge=600
GresTypes=gpu
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB Gres=gpu:$NGPU State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
CONF
cat > "$CONF_DIR/gres.conf" <<CONF
$MARK
AutoDetect=off
NodeName=$NODE Name=gpu File=$STATE/gpu[0-$LAST]
CONF

if ! alive "$STATE/slurmctld.pid"; then
  log "starting slurmctld"
  /usr/sbin/slurmctld -c   # -c: forget jobs from an earlier run
fi
if ! alive "$STATE/slurmd.pid"; then
  log "starting slurmd"
  /usr/sbin/slurmd
fi

for i in $(seq 1 120); do
  if cluster_ready; then
    log "ready: $(sinfo -h -o '%P %D %T %G' | head -1)"
    exit 0
  fi
  # a node left down/drained by an earlier run comes back on request
  if (( i % 10 == 0 )) && sinfo -h -o %T 2>/dev/null | grep -q -E "down|drain"; then
    scontrol update NodeName="$NODE" State=RESUME 2>/dev/null || true
  fi
  sleep 0.5
done
log "not ready after 60 s"; sinfo >&2 || true
tail -20 "$STATE/log/slurmctld.log" "$STATE/log/slurmd.log" >&2 || true
exit 1
