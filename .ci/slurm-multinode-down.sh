#!/usr/bin/env bash
# Stop what .ci/slurm-multinode-up.sh started: the jobs, every process left in a node's namespace, the
# slurmd nodes, slurmctld, munged (unless REGEN_SLURM_KEEP_MUNGE=1), the namespaces, veths and bridge.
# Idempotent.
set -euo pipefail
STATE="${REGEN_SLURM_STATE:-/tmp/regen-slurm}"
NODES="${REGEN_SLURM_NODES:-2}"
BRIDGE=regenbr0

if [[ -f /etc/slurm/slurm.conf ]] && command -v scancel >/dev/null 2>&1 && scontrol ping 2>/dev/null | grep -q UP; then
  scancel --full --state=RUNNING,PENDING -u "$(id -un)" 2>/dev/null || true
fi
for i in $(seq 1 "$NODES"); do
  ns="regen-n$i"
  if ip netns list 2>/dev/null | grep -qw "$ns"; then
    pids="$(ip netns pids "$ns" 2>/dev/null || true)"
    # shellcheck disable=SC2086
    [[ -n "$pids" ]] && kill -KILL $pids 2>/dev/null || true
    ip netns del "$ns" || true
  fi
  ip link del "veth-n$i" 2>/dev/null || true
  rm -f "$STATE/slurmd.n$i.pid"
done
ip link del "$BRIDGE" 2>/dev/null || true
REGEN_SLURM_KEEP_MUNGE="${REGEN_SLURM_KEEP_MUNGE:-0}" bash "$(dirname "$0")/slurm-down.sh"
echo "slurm-multinode-down: stopped" >&2
