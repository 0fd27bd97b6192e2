#!/bin/bash
# The live-sweep campaign on one H200 (bench/gpu/tune_live.py), from the root of the tree the device
# tool sends. The campaign's code may travel in a carried, git-ignored copy: SRC=.gpurun (default: .).
#   live.sh stage            copy this call's payload part (.gpu/pNN) to /tmp/parts, and Snakemake's
#                            part (.snk/{a,b}/snk.tar.xz.a?, bench/gpu/pack_snakemake.py) to /tmp/whl
#   live.sh start SECONDS    stage + build /tmp/site, copy SRC to /tmp/repo, start tune_live.py detached
#                            (its own session: it outlives the call), wait up to SECONDS, collect
#   live.sh wait SECONDS     wait up to SECONDS for its last line, collect
# Collect: bench log, results JSON + markdown, server logs (tgz) to $OUT.
# DRY=1 runs the same sequence here against regen's simulated server (PY=.venv/bin/python, no payload).
# Device sequence (back to back; /tmp survives only while the machine stays warm):
#   carry [.gpu/p01, .snk/a, .gpurun]: SRC=.gpurun bash .gpurun/bench/gpu/live.sh stage; nvidia-smi
#   carry [.gpu/p02, .snk/b, .gpurun]: SRC=.gpurun bash .gpurun/bench/gpu/live.sh stage
#   carry [.gpu/p03]: bash bench/gpu/stage.sh
#   carry [.gpu/p04, .gpurun]: SRC=.gpurun bash .gpurun/bench/gpu/live.sh start 540
#   then: SRC=.gpurun bash .gpurun/bench/gpu/live.sh wait 590 (as often as needed)
# With Snakemake staged, tune_live.py ends with the workflow (token ids on) against the winner.
# PROG=bench.gpu.profile_step runs the decode-step profile instead (TUNE_ARGS are its arguments).
mode=$1
budget=${2:-540}
t0=$(date +%s)
SRC=${SRC:-.}
PY=${PY:-python3}
OUT=${OUT:-/tmp/live-collected}
export PYTHONPATH=/tmp/site:/tmp/snk:/tmp/repo HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
[ "${DRY:-0}" = 1 ] && export PYTHONPATH=/tmp/repo
collect() {
  mkdir -p "$OUT" /tmp/live-collect
  cp /tmp/live.log "$OUT/bench.log" 2>/dev/null
  cp /tmp/fi-prewarm.log "$OUT/fi-prewarm.log" 2>/dev/null
  cp /tmp/live-out/*.json /tmp/live-out/*.md "$OUT/" 2>/dev/null
  rm -rf /tmp/live-collect/* && mkdir -p /tmp/live-collect/logs
  find /tmp/live-work/trace -name '*.trace.json*' -size -40M -exec cp {} "$OUT/" \; 2>/dev/null
  for d in /tmp/live-work/sweep/cand* /tmp/live-work/winner /tmp/live-work; do
    [ -d "$d/logs" ] || continue
    n=$(basename "$d")
    mkdir -p "/tmp/live-collect/logs/$n" && cp -r "$d"/logs/. "/tmp/live-collect/logs/$n/"
    for j in "$d"/journal.jsonl "$d"/long/journal.jsonl; do
      [ -f "$j" ] && head -c 4000 "$j" > "/tmp/live-collect/logs/$n/$(basename "$(dirname "$j")")-journal.head"
    done
  done
  nvidia-smi > /tmp/live-collect/logs/nvidia-smi.txt 2>&1
  tar czf "$OUT/serverlogs.tgz" -C /tmp/live-collect logs
  ls -la "$OUT"
}
if [ "$mode" = stage ]; then
  bash "$SRC/bench/gpu/stage.sh" || exit 1
  mkdir -p /tmp/whl && cp .snk/*/snk.tar.xz.a? /tmp/whl/ 2>/dev/null
  ls -la /tmp/whl
  exit 0
fi
if [ "$mode" = start ]; then
  if [ "${DRY:-0}" != 1 ]; then
    bash "$SRC/bench/gpu/stage.sh" || exit 1
    bash "$SRC/bench/gpu/setup.sh" || exit 1
    if [ -f /tmp/whl/snk.tar.xz.aa ] && [ -f /tmp/whl/snk.tar.xz.ab ] && [ ! -d /tmp/snk ]; then
      mkdir -p /tmp/snk
      cat /tmp/whl/snk.tar.xz.a? | $PY -c "import sys, tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall('/tmp/snk')" \
        || rm -rf /tmp/snk
    fi
  fi
  wf=""
  $PY -m snakemake --version && $PY -c 'import regen.generate.generation' \
    || { echo "snakemake (or regen.generate.generation) not importable: the workflow step is off"; wf="--workflow-s 0"; }
  rm -rf /tmp/repo /tmp/live-out /tmp/live-work && mkdir -p /tmp/repo
  (cd "$SRC" && tar --exclude=./.gpu --exclude=./.gpurun --exclude=./.venv --exclude=./.git -cf - .) | tar -xf - -C /tmp/repo
  cd /tmp/repo || exit 1  # imports from the copy, not from the tree the call runs in
  $PY -c 'import orjson, regen.generate.client, regen.tune.sweep, regen.serving.metrics, regen.tune.closedloop' || exit 1
  if [ "${DRY:-0}" != 1 ]; then
    $PY -c 'import sglang, transformers; print("sglang", sglang.__version__, "transformers", transformers.__version__)' || exit 1
    nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv
  fi
  extra=""
  [ "${DRY:-0}" = 1 ] && extra="--dry-cpu"
  if [ "${DRY:-0}" != 1 ]; then
    bash bench/gpu/prewarm_sampling.sh "$PY" /tmp/fi-prewarm.log  # (from /tmp/repo) while the first server starts
  fi
  PROG=${PROG:-bench.gpu.tune_live}
  [ "$PROG" = bench.gpu.tune_live ] && extra="$extra $wf --deadline-s ${DEADLINE:-1330}"
  (cd /tmp/repo && setsid nohup $PY -m "$PROG" $extra --out /tmp/live-out --work /tmp/live-work ${TUNE_ARGS:-} \
      > /tmp/live.log 2>&1 < /dev/null &)
  sleep 2
fi
. bench/gpu/wait_line.sh
wait_line /tmp/live.log '^(sweep|profile):' 'Traceback' || echo "${PROG:-bench.gpu.tune_live} $wait_state"
tail -n 30 /tmp/live.log
collect
