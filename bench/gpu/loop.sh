#!/bin/bash
# The drafter loop (issue 36) on one H200: bench/loop/sequence.py (the dense known-answer target, regen's whole
# workflow on SGLang 0.5.17, prepare, capture x3, SpecForge train x2, EAGLE3 served x2 + the ceiling, the
# report), detached in its own session under $LOOP_TMP (/tmp/loop), so it outlives the call that starts it.
#   loop.sh start SECONDS   stage this call's payload part, build /tmp/site (+ /tmp/snk, the deep_gemm stand-in,
#                           flashinfer's sampling prewarm: known_target.device.setup), unzip the loop's wheels
#                           (.gpu/loopwheels/*.whl -> /tmp/loopwheels), copy the tree to $LOOP_TMP/repo, start
#                           the sequence, wait up to SECONDS, collect
#   loop.sh wait SECONDS    wait up to SECONDS for "loop-bench: done", collect
# Collect ($OUT, 4 files, flat): loop.log, loop-<date>.json, loop-<date>.md, loop-logs.tgz (steps.json,
# prepare.json, capture.json x3, train.json + train.log x2, accept JSON x3, the workflow's Snakemake log and
# server log, the accept servers' logs, each capped to its last 4 MiB, nvidia-smi).
# LOOP_ARGS are passed on to the sequence (e.g. LOOP_ARGS="--n 300 --train-steps 200").
# Device sequence (kind nvidia-h200; back to back: /tmp survives only while the machine stays warm):
#   1. carry [.gpu/p01, .snk/a]: bash bench/gpu/live.sh stage; nvidia-smi
#   2. carry [.gpu/p02, .snk/b]: bash bench/gpu/live.sh stage
#   3. carry [.gpu/p03]: bash bench/gpu/stage.sh
#   4. carry [.gpu/p04, .gpu/loopwheels]: bash bench/gpu/loop.sh start 560
#   5. then, as often as needed: bash bench/gpu/loop.sh wait 590
# Budget: ~15-20 min of device time after staging (README: "The drafter loop").
# CPU rehearsal (regen's simulated server in chain mode, tiny dense target, CPU capture and training):
#   DRY=1 PY=/work/main/.venv/bin/python LOOP_PY=/work/main/.venv-trainers/bin/python LOOP_TMP=/tmp/loopd \
#     OUT=/tmp/loopd/out LOOP_ARGS="--n 80 --train-steps 20" bash bench/gpu/loop.sh start 1200
mode=$1
budget=${2:-560}
t0=$(date +%s)
T=${LOOP_TMP:-/tmp/loop}
PY=${PY:-python3}
LOOP_PY=${LOOP_PY:-$PY}
OUT=${OUT:-$T/collected}
DATE=$(date -u +%Y-%m-%d)
export PYTHONPATH=/tmp/site:/tmp/snk:/tmp/loopwheels:$T/repo HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
export SGLANG_ENABLE_JIT_DEEPGEMM=0  # the draft worker imports deep_gemm: a stand-in (notes/gpu-mtp.md)
[ "${DRY:-0}" = 1 ] && export PYTHONPATH=$T/repo
capped() {  # copy $1 to $2, its last 4 MiB when bigger
  [ -f "$1" ] || return 0
  mkdir -p "$(dirname "$2")" && tail -c 4194304 "$1" > "$2"
}
collect() {
  mkdir -p "$OUT" && rm -rf "$T/collect" && mkdir -p "$T/collect/logs"
  cp "$T/loop.log" "$OUT/loop.log" 2>/dev/null
  cp "$T"/results/loop-*.json "$T"/results/loop-*.md "$OUT/" 2>/dev/null
  L=$T/collect/logs R=$T/root
  capped "$R/steps.json" "$L/steps.json"
  capped "$R/data/prepare.json" "$L/prepare.json"
  for f in "$R"/feat/*/capture.json; do capped "$f" "$L/capture-$(basename "$(dirname "$f")").json"; done
  for n in regen original; do
    capped "$R/train/$n/train.json" "$L/train-$n.json"
    capped "$R/train/$n/train.log" "$L/train-$n.log"
    capped "$R/acc/$n.json" "$L/accept-$n.json"
    capped "$R/acc/$n/logs/gpu0.log" "$L/accept-$n-server.log"
  done
  capped "$R/acc/ceiling.json" "$L/accept-ceiling.json"
  capped "$R/work/snakemake.log" "$L/snakemake.log"
  capped "$R/work/known_target_measured.md" "$L/known_target_measured.md"
  for f in "$R"/work/run/logs/servers/gpu*.log; do capped "$f" "$L/workflow-$(basename "$f")"; done
  capped /tmp/fi-prewarm.log "$L/fi-prewarm.log"
  nvidia-smi > "$L/nvidia-smi.txt" 2>&1
  tar czf "$OUT/loop-logs.tgz" -C "$T/collect" logs
  ls -la "$OUT"
}
if [ "$mode" = start ]; then
  if [ "${DRY:-0}" != 1 ]; then
    $PY -c 'from bench.gpu.known_target.device import setup; setup()' || exit 1  # stage.sh + setup.sh + snk
    if [ -d .gpu/loopwheels ] && [ ! -f /tmp/loopwheels/.ok ]; then
      mkdir -p /tmp/loopwheels
      for w in .gpu/loopwheels/*.whl; do $PY -m zipfile -e "$w" /tmp/loopwheels || exit 1; done
      touch /tmp/loopwheels/.ok
    fi
  fi
  rm -rf "$T/repo" "$T/results" && mkdir -p "$T/repo" "$T/results"
  tar --exclude=./.gpu --exclude=./.venv --exclude=./.git --exclude=./.snk -cf - . | tar -xf - -C "$T/repo"
  cd "$T/repo" || exit 1  # imports from the copy, not from the tree the call runs in
  $PY -c 'import aiohttp, orjson, zstandard, jsonschema, yaml, regen.cli, bench.loop.sequence, bench.gpu.known_target.run' || exit 1
  if [ "${DRY:-0}" != 1 ]; then
    $PY -c 'import sglang, transformers, snakemake; print("sglang", sglang.__version__, "transformers", transformers.__version__)' || exit 1
    $LOOP_PY -c 'import torch, specforge, datasets, safetensors; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' || exit 1
    nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv
    df -h /tmp | tail -1
  fi
  # the sequence's work dir survives a second start (a step done before is skipped: resume)
  seq="REGEN_PY=$PY LOOP_PY=$LOOP_PY $PY -m bench.loop.sequence --root $T/root --results $T/results --date $DATE ${LOOP_ARGS:-}"
  setsid nohup bash -c "$seq; echo 'loop-bench: done'" > "$T/loop.log" 2>&1 < /dev/null &
  sleep 2
fi
while [ $(( $(date +%s) - t0 )) -lt "$budget" ]; do
  grep -q '^loop-bench: done' "$T/loop.log" 2>/dev/null && break
  sleep 5
done
grep -E '^(=== step|loop sequence:|loop:|accept:|train:)' "$T/loop.log" 2>/dev/null
tail -n 25 "$T/loop.log"
collect
