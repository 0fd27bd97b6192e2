#!/usr/bin/env bash
# Stop the daemons started by .ci/slurm-up.sh (slurmd, slurmctld, munged), by their PID files. Idempotent.
set -euo pipefail
STATE="${REGEN_SLURM_STATE:-/tmp/regen-slurm}"

stop_pidfile() {
  local f="$1" pid
  [[ -f "$f" ]] || return 0
  pid="$(cat "$f")"
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" || true
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" || true
  fi
  rm -f "$f"
}

if [[ -f /etc/slurm/slurm.conf ]] && command -v scancel >/dev/null 2>&1 && scontrol ping 2>/dev/null | grep -q UP; then
  scancel --full --state=RUNNING,PENDING -u "$(id -un)" 2>/dev/null || true
fi
stop_pidfile "$STATE/slurmd.pid"
stop_pidfile "$STATE/slurmctld.pid"
if [[ "${REGEN_SLURM_KEEP_MUNGE:-0}" != 1 ]]; then
  stop_pidfile /run/munge/munged.pid
fi
echo "slurm-down: stopped" >&2
