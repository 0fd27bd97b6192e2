#!/usr/bin/env bash
# Stop the SeaweedFS server started by .ci/s3-up.sh and remove its data. Idempotent.
set -euo pipefail
STATE="${REGEN_S3_STATE:-/tmp/regen-s3}"
PIDFILE="$STATE/weed.pid"
if [[ -f "$PIDFILE" ]]; then
  PID="$(cat "$PIDFILE")"
  if kill -0 "$PID" 2>/dev/null; then
    kill "$PID" || true
    for _ in $(seq 1 40); do kill -0 "$PID" 2>/dev/null || break; sleep 0.25; done
    kill -0 "$PID" 2>/dev/null && kill -KILL "$PID" || true
  fi
  rm -f "$PIDFILE"
fi
rm -rf "$STATE/data" "$STATE/env.sh"
echo "s3-down: stopped" >&2
