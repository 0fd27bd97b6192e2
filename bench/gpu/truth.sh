#!/bin/bash
# Issue 33 items 4 and 5 on one H200 with SGLang 0.5.17 (payload: bench/gpu/pack.sh's .gpu/p01..p04):
# bench/gpu/planner_truth.py (regen tune against SGLang's startup log, one dummy-weight start per family,
# ~50 s each, 10 models) then bench/gpu/dense.py (regen's plan against SGLang's defaults, Llama-3.1-8B and
# Qwen3-30B-A3B, a server per arm, each window warmed up for one request lifetime), both detached in their own session under
# $TRUTH_TMP (/tmp/truth), so they outlive the call that starts them.
#   truth.sh start SECONDS   stage this call's part, build /tmp/site, copy the tree to $TRUTH_TMP/repo,
#                            start the benches detached, wait up to SECONDS, collect
#   truth.sh wait SECONDS    wait up to SECONDS for "truth-bench: done", collect
# Collect ($OUT, 6 files): bench.log, planner-truth-*.json/.md, dense-*.json/.md, serverlogs.tgz (trimmed).
# ONLY=planner, dense, families or a comma list of them (run in that order); PLANNER_ARGS / DENSE_ARGS are passed on (e.g.
# PLANNER_ARGS="--only gpt-oss-20b,qwen3.6-27b-text", DENSE_ARGS="--window-s 60 --models llama-3.1-8b").
# Device sequence (kind nvidia-h200; back to back: /tmp survives only while the machine stays warm):
#   1. carry [.gpu/p01]: bash bench/gpu/stage.sh; nvidia-smi
#   2. carry [.gpu/p02]: bash bench/gpu/stage.sh
#   3. carry [.gpu/p03]: bash bench/gpu/stage.sh
#   4. carry [.gpu/p04]: bash bench/gpu/truth.sh start 560
#   5. then, as often as needed: bash bench/gpu/truth.sh wait 590
# Budget: planner ~9-11 min with --hold-s 0 (it starts no model after PLANNER_DEADLINE=660 s), ~3-5 min a
# model held; dense ~8 min a model with
# its default arms (default, regen), ~10 min with the opt-in regen-fp8kv arm (it prints its estimate).
# Measured 2026-12-02 (afternoon): Qwen3-30B-A3B default+regen ~8 min, Llama-3.1-8B default+regen+
# regen-page1+regen-page16 ~11 min: both with staging fill the 30-min session (DENSE_ARGS="--models
# qwen3-30b-a3b:default+regen,llama-3.1-8b:default+regen+regen-page1+regen-page16"); issue `wait` at once.
# Hold at the planned batch (issue 49 item 2; bench/gpu/hold.py): every target is held 60 s by default
# (PLANNER_ARGS="--hold NAMES" holds only those, "--hold-s 0" checks startups only: ~50 s a model)
# after each target's startup check starts regen's recommended server for the workload and drives it
# at its client_concurrency until it has decoded 60 s at >= 90% of that batch (or crashed / retracted /
# never got there); the row's verdict says "not held: ..." otherwise and the last line ends "held=K/N".
# gpt-oss-20b alone (startup ~50 s, hold start ~2-3 min with decode graphs to 1,024, ramp ~30 s, hold 60 s):
#   4. carry [.gpu/p04]: ONLY=planner PLANNER_ARGS="--only gpt-oss-20b,gpt-oss-120b --hold-s 60 --hold gpt-oss-20b" \
#        bash bench/gpu/truth.sh start 560
# Held-out families against the defaults at steady state (issue 49 item 3; bench/gpu/families.py, ~6-7 min
# a model): ONLY=families FAMILIES_ARGS="--models gpt-oss-20b,qwen3-32b-fp8,mixtral-8x7b" truth.sh start 560
# CPU rehearsal of the hold (~20 s):
#   DRY=1 PY=$PWD/.venv/bin/python TRUTH_TMP=/tmp/truthd OUT=/tmp/truthd/out ONLY=planner \
#     PLANNER_ARGS="--only gpt-oss-20b --hold-s 5" bash bench/gpu/truth.sh start 120
# CPU rehearsal (regen's simulated server, ~1.5 min):
#   DRY=1 PY=$PWD/.venv/bin/python TRUTH_TMP=/tmp/truthd OUT=/tmp/truthd/out bash bench/gpu/truth.sh start 300
mode=$1
budget=${2:-560}
t0=$(date +%s)
T=${TRUTH_TMP:-/tmp/truth}
PY=${PY:-python3}
OUT=${OUT:-$T/collected}
export PYTHONPATH=/tmp/site:$T/repo HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
[ "${DRY:-0}" = 1 ] && export PYTHONPATH=$T/repo
collect() {
  mkdir -p "$OUT" "$T/collect/logs"
  cp "$T/bench.log" "$OUT/bench.log" 2>/dev/null
  cp "$T"/out/*.json "$T"/out/*.md "$OUT/" 2>/dev/null
  rm -rf "$T"/collect/logs/* 
  cp "$T"/work/*/logs/*.trimmed.log "$T/collect/logs/" 2>/dev/null
  nvidia-smi > "$T/collect/logs/nvidia-smi.txt" 2>&1
  tar czf "$OUT/serverlogs.tgz" -C "$T/collect" logs
  ls -la "$OUT"
}
if [ "$mode" = start ]; then
  if [ "${DRY:-0}" != 1 ]; then
    bash bench/gpu/stage.sh || exit 1
    bash bench/gpu/setup.sh || exit 1
  fi
  rm -rf "$T/repo" "$T/out" "$T/work" && mkdir -p "$T/repo" "$T/out" "$T/work"
  tar --exclude=./.gpu --exclude=./.venv --exclude=./.git -cf - . | tar -xf - -C "$T/repo"
  cd "$T/repo" || exit 1  # imports from the copy, not from the tree the call runs in
  $PY -c 'import aiohttp, orjson, zstandard, jsonschema, yaml, pyarrow, regen.cli, regen.tune.tune, bench.gpu.serverlog, bench.gpu.planner_truth, bench.gpu.dense, bench.gpu.hold, bench.gpu.truth_run, bench.gpu.families' || exit 1
  dry=""
  if [ "${DRY:-0}" = 1 ]; then
    dry="--dry-cpu"
  else
    $PY -c 'import sglang, transformers; print("sglang", sglang.__version__, "transformers", transformers.__version__)' || exit 1
    $PY -c 'import triton_kernels' 2>/dev/null || echo "no triton_kernels: gpt-oss retries with --moe-runner-backend flashinfer_mxfp4"
    nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv
  fi
  run_planner="$PY -m bench.gpu.truth_run $dry --out $T/out --work $T/work/planner --deadline-s ${PLANNER_DEADLINE:-660} ${PLANNER_ARGS:-}"
  run_dense="$PY -m bench.gpu.dense $dry --out $T/out --work $T/work/dense ${DENSE_ARGS:-}"
  run_families="$PY -m bench.gpu.families $dry --out $T/out --work $T/work/families ${FAMILIES_ARGS:-}"
  # ONLY: a comma list run in its order (e.g. families,planner); unset: dense then planner (dense's targets
  # are strict, the planner list ends at its deadline)
  seq=""
  for bench in $(echo "${ONLY:-dense,planner}" | tr ',' ' '); do
    case "$bench" in
      planner) seq="$seq$run_planner; " ;;
      dense) seq="$seq$run_dense; " ;;
      families) seq="$seq$run_families; " ;;
      *) echo "ONLY: unknown bench $bench (planner, dense, families)"; exit 1 ;;
    esac
  done
  setsid nohup bash -c "$seq echo 'truth-bench: done'" > "$T/bench.log" 2>&1 < /dev/null &
  sleep 2
fi
. bench/gpu/wait_line.sh
wait_line "$T/bench.log" '^truth-bench: done'
grep -E '^(truth|dense|families):' "$T/bench.log" 2>/dev/null
tail -n 25 "$T/bench.log"
collect
