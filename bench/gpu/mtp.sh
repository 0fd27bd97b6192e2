#!/bin/bash
# The MTP grid (bench/gpu/mtp_grid.py, issue 25) on one H200, from the root of the tree the device tool sends.
#   mtp.sh stage            copy this call's payload part (.gpu/pNN, bench/gpu/pack.sh) to /tmp/parts
#   mtp.sh start SECONDS    stage + build /tmp/site, the deep_gemm stand-in, the flashinfer sampling prewarm,
#                           copy this tree to /tmp/repo, start mtp_grid.py detached (its own session: it
#                           outlives the call), wait up to SECONDS, collect
#   mtp.sh wait SECONDS     wait up to SECONDS for its last line (mtp-grid: done), collect
# Collect to $OUT (6 flat files): mtp.log, mtp-<date>.{json,md,svg}, fi-prewarm.log, mtp-logs.tgz (every
# server's log, its supervisor's lines, nvidia-smi; a log over 6 MiB as its tail).
# DEADLINE (default 860 s from the program's start) bounds the campaign, server starts included; GRID_ARGS
# are further mtp_grid.py arguments (e.g. "--acceptances 2.9 --answer-tokens 192").
# DRY=1 rehearses the same sequence here against regen's simulated server (PY=$PWD/.venv/bin/python, no payload).
#
# Device sequence (kind nvidia-h200; back to back: /tmp survives only while the machine stays warm; each
# call's tree + carry <= 64 MiB; parts from bench/gpu/pack.sh, ~62 MiB each):
#   1. carry [".gpu/p01"]: bash bench/gpu/mtp.sh stage; nvidia-smi            (~1 min)
#   2. carry [".gpu/p02"]: bash bench/gpu/mtp.sh stage                        (~1 min)
#   3. carry [".gpu/p03"]: bash bench/gpu/mtp.sh stage                        (~1 min)
#   4. carry [".gpu/p04"]: bash bench/gpu/mtp.sh start 570                    (setup ~1 min, then the grid)
#   5. at once: bash bench/gpu/mtp.sh wait 590                                (the grid ends ~16 min after 4)
#   6. if 5 printed "running": bash bench/gpu/mtp.sh wait 300
# The last lines of mtp.log (printed by start/wait once done): one "mtp: acceptance=..." line per
# acceptance, then "mtp-grid: done"; partial results are in the JSON/markdown after every level.
mode=$1
budget=${2:-570}
t0=$(date +%s)
PY=${PY:-python3}
T=${MTP_TMP:-/tmp}
OUT=${OUT:-$T/mtp-collected}
export PYTHONPATH=$T/site:$T/repo HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
[ "${DRY:-0}" = 1 ] && export PYTHONPATH=$T/repo
# the MTP draft worker's graph capture imports deep_gemm (not in the payload): a stand-in, JIT off (notes/gpu-mtp.md)
export SGLANG_ENABLE_JIT_DEEPGEMM=0
collect() {
  mkdir -p "$OUT" "$T/mtp-collect"
  cp "$T/mtp.log" "$OUT/mtp.log" 2>/dev/null
  cp "$T/fi-prewarm.log" "$OUT/fi-prewarm.log" 2>/dev/null
  cp "$T"/mtp-out/*.json "$T"/mtp-out/*.md "$T"/mtp-out/*.svg "$OUT/" 2>/dev/null
  rm -rf "$T/mtp-collect"/* && mkdir -p "$T/mtp-collect/logs"
  for d in "$T"/mtp-work/*/logs; do
    [ -d "$d" ] || continue
    n=$(basename "$(dirname "$d")")
    mkdir -p "$T/mtp-collect/logs/$n"
    for f in "$d"/*; do
      [ -f "$f" ] || continue
      if [ "$(stat -c %s "$f")" -gt 6291456 ]; then tail -c 6291456 "$f" > "$T/mtp-collect/logs/$n/$(basename "$f").tail"
      else cp "$f" "$T/mtp-collect/logs/$n/"; fi
    done
  done
  nvidia-smi > "$T/mtp-collect/logs/nvidia-smi.txt" 2>&1
  tar czf "$OUT/mtp-logs.tgz" -C "$T/mtp-collect" logs
  ls -la "$OUT"
}
if [ "$mode" = stage ]; then
  bash bench/gpu/stage.sh || exit 1
  exit 0
fi
if [ "$mode" = start ]; then
  if [ "${DRY:-0}" != 1 ]; then
    bash bench/gpu/stage.sh || exit 1
    bash bench/gpu/setup.sh || exit 1
    mkdir -p "$T/site/deep_gemm"
    [ -f "$T/site/deep_gemm/__init__.py" ] \
      || echo "# stand-in: SGLang's DSA backend imports deep_gemm at CUDA-graph capture" > "$T/site/deep_gemm/__init__.py"
    bash bench/gpu/prewarm_sampling.sh "$PY" "$T/fi-prewarm.log"  # (the grid's requests are greedy; the probe may not be)
  fi
  rm -rf "$T/repo" "$T/mtp-out" "$T/mtp-work" && mkdir -p "$T/repo"
  tar --exclude=./.gpu --exclude=./.gpurun --exclude=./.venv --exclude=./.git --exclude=./.snk -cf - . \
    | tar -xf - -C "$T/repo"
  cd "$T/repo" || exit 1  # imports from the copy, not from the tree the call runs in
  $PY -c 'import aiohttp, orjson, regen.tune.sweep, regen.sglang.plan, regen.sglang.realized, regen.serving' || exit 1
  extra=""
  if [ "${DRY:-0}" = 1 ]; then
    extra="--dry-cpu"
  else
    $PY -c 'import sglang, transformers; print("sglang", sglang.__version__, "transformers", transformers.__version__)' || exit 1
    nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv
  fi
  (cd "$T/repo" && setsid nohup $PY -m bench.gpu.mtp_grid $extra --out "$T/mtp-out" --work "$T/mtp-work" \
      --deadline-s "${DEADLINE:-860}" ${GRID_ARGS:-} > "$T/mtp.log" 2>&1 < /dev/null &)
  sleep 2
fi
. bench/gpu/wait_line.sh
wait_line "$T/mtp.log" '^mtp-grid: done' '^Traceback' bench.gpu.mtp_grid
state=$wait_state
tail -n 40 "$T/mtp.log"
echo "--- key lines ---"
grep -E '^mtp: |ready in|failed|not started|deadline' "$T/mtp.log"
echo "--- mtp grid $state; $(( $(date +%s) - t0 )) s in this call ---"
collect
