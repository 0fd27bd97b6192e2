#!/usr/bin/env bash
# Start a real multi-node Slurm on this one machine for the tests: slurmctld in the root namespace and
# REGEN_SLURM_NODES (2) slurmd nodes n1..nN, each in namespaces of its own. Idempotent.
#
#   .ci/slurm-multinode-up.sh   # then: REGEN_S3_IP=10.77.0.1 .ci/s3-up.sh (S3 the nodes can reach)
#   .ci/slurm-multinode-down.sh
#
# Each node:
# * network namespace regen-nK with a veth on the bridge regenbr0 (10.77.0.1/24 here), address 10.77.0.1K;
#   the controller listens on the bridge address. Nothing else is routed: traffic stays between the
#   namespaces this script made (no NAT, no default route out of a node);
# * UTS namespace: `hostname` in a job says nK;
# * mount namespace: /scratch/local is the node's own directory ($STATE/nodes/nK/scratch); every other
#   path (the tests' results directories, /etc/slurm, the repo) is the one shared filesystem;
# * 2 fake GPUs as gres (character devices aliasing /dev/null, File= per node: without File= slurmd
#   reports 0 and the node goes INVAL);
# * a TaskProlog exports TMPDIR=/scratch/local, so a job's temp files (and regen's port locks) are
#   node-local as on a cluster.
#
# Processes are tracked by cgroup (proctrack/cgroup, v1) where this machine mounts the cgroup v1 freezer, as
# most clusters do: a step's processes die when it ends, so a group job's server lives in its batch step
# (regen's slot host, started by the profile's precommand: profiles/slurm/README.md). Elsewhere, or with
# REGEN_SLURM_PROCTRACK=linuxproc, by parent PID: a detached process outlives its job step.
# slurmd is started with `nsenter --net=` (not `ip netns exec`, which remounts /sys and leaves slurmd no
# cgroup filesystem). No slurmdbd: Snakemake uses `--slurm-status-command squeue` (MinJobAge=600).
# SlurmdTimeout=20: a node whose processes are all killed is DOWN about 30 s later
# (see /work/shared/notes/multinode-slurm.md for the measured facts).
set -euo pipefail

STATE="${REGEN_SLURM_STATE:-/tmp/regen-slurm}"
NODES="${REGEN_SLURM_NODES:-2}"
NGPU="${REGEN_SLURM_GPUS:-2}"
NET="${REGEN_SLURM_NET:-10.77.0}"
BRIDGE=regenbr0
SCRATCH=/scratch/local
CONF_DIR=/etc/slurm
MARK="# written by regen .ci/slurm-multinode-up.sh"
# cgroup or linuxproc. Unset: while this script's slurmctld runs, what it was started with, so a restart (a
# test bringing a lost node back) never mixes two kinds in one cluster; else cgroup where v1 is mounted
if [[ -z "${REGEN_SLURM_PROCTRACK:-}" ]] && grep -qF "$MARK" "$CONF_DIR/slurm.conf" 2>/dev/null \
  && kill -0 "$(cat "$STATE/slurmctld.pid" 2>/dev/null)" 2>/dev/null; then
  REGEN_SLURM_PROCTRACK="$(sed -n 's|^ProctrackType=proctrack/||p' "$CONF_DIR/slurm.conf")"
fi
if [[ -z "${REGEN_SLURM_PROCTRACK:-}" ]]; then
  if grep -qE '^cgroup /sys/fs/cgroup/freezer cgroup ' /proc/mounts; then
    REGEN_SLURM_PROCTRACK=cgroup
  else
    REGEN_SLURM_PROCTRACK=linuxproc
  fi
fi
PROCTRACK="$REGEN_SLURM_PROCTRACK"

log() { echo "slurm-multinode-up: $*" >&2; }
# install_slurm, start_munge, alive
source "$(dirname "${BASH_SOURCE[0]}")/slurm-common.sh"

node_names() { for i in $(seq 1 "$NODES"); do echo "n$i"; done; }

cluster_ready() { # controller answers and every node is usable
  command -v sinfo >/dev/null 2>&1 || return 1
  grep -qF "$MARK" "$CONF_DIR/slurm.conf" 2>/dev/null || return 1
  scontrol ping 2>/dev/null | grep -q "UP" || return 1
  local up
  up=$(sinfo -h -N -o '%N %T' 2>/dev/null | grep -c -E " (idle|mixed|allocated)$" || true)
  [[ "$up" -ge "$NODES" ]]
}

if cluster_ready; then
  log "already running: $(sinfo -h -N -o '%N %T %G' | tr '\n' ' ')"
  exit 0
fi

install_slurm
for tool in ip nsenter unshare mknod; do
  command -v "$tool" >/dev/null 2>&1 || { log "missing $tool"; exit 1; }
done

# A single-node cluster of .ci/slurm-up.sh shares /etc/slurm: stop it first.
if [[ -f "$CONF_DIR/slurm.conf" ]] && grep -qF "written by regen .ci/slurm-up.sh" "$CONF_DIR/slurm.conf"; then
  log "stopping the single-node cluster of .ci/slurm-up.sh"
  REGEN_SLURM_KEEP_MUNGE=1 bash "$(dirname "$0")/slurm-down.sh" || true
fi

mkdir -p "$STATE"/{state,log,spool} /run/munge "$CONF_DIR" "$SCRATCH"

# munge: one munged in the root namespace serves every node (its socket is a file).
start_munge

# The bridge and one namespace + veth per node.
if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
  ip link add "$BRIDGE" type bridge
  ip addr add "$NET.1/24" dev "$BRIDGE"
fi
ip link set "$BRIDGE" up
i=0
for n in $(node_names); do
  i=$((i + 1))
  ns="regen-$n"
  addr="$NET.$((10 + i))"
  if ! ip netns list | grep -qw "$ns"; then
    ip netns add "$ns"
  fi
  if ! ip link show "veth-$n" >/dev/null 2>&1; then
    ip link add "veth-$n" type veth peer name eth0 netns "$ns"
    ip link set "veth-$n" master "$BRIDGE" up
    ip -n "$ns" addr add "$addr/24" dev eth0
  fi
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 up
  mkdir -p "$STATE/spool/$n" "$STATE/nodes/$n/scratch" "$STATE/nodes/$n/gpu"
  for k in $(seq 0 $((NGPU - 1))); do
    f="$STATE/nodes/$n/gpu/gpu$k"
    [[ -c "$f" ]] || { rm -f "$f"; mknod "$f" c 1 3; }
  done
done

cat > "$STATE/task-prolog.sh" <<PROLOG
#!/bin/sh
# Slurm TaskProlog: a job's temp files go to its node's own scratch
echo "export TMPDIR=$SCRATCH"
PROLOG
chmod 755 "$STATE/task-prolog.sh"

CTL_HOST="$(hostname -s)"
NODE_LINES=""
i=0
for n in $(node_names); do
  i=$((i + 1))
  NODE_LINES+="NodeName=$n NodeAddr=$NET.$((10 + i)) CPUs=2 RealMemory=4500 Gres=gpu:$NGPU State=UNKNOWN"$'\n'
done
ALL_NODES="$(node_names | paste -sd, -)"

if [[ -f "$CONF_DIR/slurm.conf" ]] && ! grep -qF "written by regen .ci/slurm" "$CONF_DIR/slurm.conf"; then
  log "keeping a copy of the existing slurm.conf as slurm.conf.regen-bak"
  cp -n "$CONF_DIR/slurm.conf" "$CONF_DIR/slurm.conf.regen-bak"
fi
cat > "$CONF_DIR/slurm.conf" <<CONF
$MARK
ClusterName=ci
SlurmctldHost=$CTL_HOST($NET.1)
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/state
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.%n.log
ProctrackType=proctrack/$PROCTRACK
TaskPlugin=task/none
TaskProlog=$STATE/task-prolog.sh
MpiDefault=none
MailProg=/bin/true
SelectType=select/cons_tres
# CR_LLN: a job goes to the least loaded node, so group jobs spread over the nodes and a lost node's
# jobs find room on the others
SelectTypeParameters=CR_Core,CR_LLN
ReturnToService=2
SlurmdTimeout=20
# finished jobs stay visible to squeue for 10 min: Snakemake's squeue status check relies on it
MinJobAge=600
GresTypes=gpu
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
${NODE_LINES}PartitionName=debug Nodes=$ALL_NODES Default=YES MaxTime=INFINITE State=UP
CONF
{
  echo "$MARK"
  echo "AutoDetect=off"
  for n in $(node_names); do echo "NodeName=$n Name=gpu File=$STATE/nodes/$n/gpu/gpu[0-$((NGPU - 1))]"; done
} > "$CONF_DIR/gres.conf"

if [[ "$PROCTRACK" == cgroup ]]; then
  printf '%s\nCgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nConstrainDevices=no\n' "$MARK" \
    > "$CONF_DIR/cgroup.conf"
elif grep -qF "$MARK" "$CONF_DIR/cgroup.conf" 2>/dev/null; then
  rm -f "$CONF_DIR/cgroup.conf"
fi

if ! alive "$STATE/slurmctld.pid"; then
  log "starting slurmctld on $NET.1"
  /usr/sbin/slurmctld -c   # -c: forget jobs from an earlier run
fi
for n in $(node_names); do
  if ! alive "$STATE/slurmd.$n.pid"; then
    log "starting slurmd $n in namespace regen-$n"
    # own network (nsenter), own hostname and mounts (unshare); slurmd daemonizes inside them
    nsenter --net="/var/run/netns/regen-$n" unshare --uts --mount --propagation private \
      sh -c "hostname $n && mount --bind '$STATE/nodes/$n/scratch' '$SCRATCH' && exec /usr/sbin/slurmd -N $n"
  fi
done

for i in $(seq 1 120); do
  if cluster_ready; then
    log "ready: $(sinfo -h -N -o '%N %T %G' | tr '\n' ' ')"
    exit 0
  fi
  if (( i % 10 == 0 )) && sinfo -h -N -o %T 2>/dev/null | grep -q -E "down|drain"; then
    for n in $(node_names); do scontrol update NodeName="$n" State=RESUME 2>/dev/null || true; done
  fi
  sleep 0.5
done
log "not ready after 60 s"; sinfo -N >&2 || true
tail -20 "$STATE"/log/*.log >&2 || true
exit 1
