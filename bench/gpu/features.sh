#!/bin/bash
# The features bench (issue 59 item 6, bench/gpu/features.py) on the GPU host, from the repo root.
#   features.sh start SECONDS   stage + build /tmp/site (no-ops when the race's staging left them), copy the tree
#                               to /tmp/feat-repo, import-check, start bench.gpu.features detached, wait, collect
#   features.sh wait SECONDS    wait for its last line (features: targets=...), then collect
# Device call (same machine and session as the race's staging: /tmp/site there; carry none):
#   bash bench/gpu/features.sh start 575        (timeout_s 600; the bench's own deadline is 550 s)
# and only if it ended before "features: targets=" (the job goes on detached while the machine stays warm):
#   bash bench/gpu/features.sh wait 590
# On a fresh machine stage the payload first (race.sh's calls 1-4, carry .gpu/p0N), then start with .gpu/p05.
# FEATURES_ARGS passes options to bench.gpu.features (e.g. "--dense-layers 32 --deadline-s 1100").
# Collect ($OUT, flat, 7 files): features.log, features.json, features-dense.json, features-moe.json,
# features-logs.tgz (each step's log, nvidia-smi, df, disk-probe.txt: 1 GB written with fdatasync before the run),
# jit-cache.tgz and jit-cache-du.txt (bench/gpu/jit_cache.sh: carry it as .gpu/jit/ to a later session).
# What ran on CPU before the first GPU run: the whole GPU code path at tiny sizes (SGLang 0.5.17's own runner in
# process with --device cpu, attention torch_native, the cp312 payload's compiled parts reinstalled for 3.11,
# torchvision and vllm's rope kernel stubbed): both arms, SpecForge's capture class with its 0.5.17 changes, the
# checks (dense passes; tiny MoE at 4.3e-2 relative error, cosine 0.9992):
#   .venv/bin/python -m bench.gpu.features --tiny --device cpu --torch-python WRAPPER --rows 24 --median-len 24 \
#     --max-len 96 --check-rows 6 --batch-tokens 256 --sf-batch 8 --reserve-s 5 \
#     --server-args '{"device": "cpu", "attention_backend": "torch_native", "dtype": "bfloat16", "context_length": 1024}'
# CPU rehearsal of this plumbing (the --smoke bench; PY with regen's dependencies, TORCH_PY with torch):
#   DRY=1 PY=$PWD/.venv/bin/python TORCH_PY=$PWD/.venv-trainers/bin/python FEAT_TMP=/tmp/featd \
#     OUT=/tmp/featd/out bash bench/gpu/features.sh start 120
mode=$1; budget=${2:-575}
t0=$(date +%s)
T=${FEAT_TMP:-/tmp}
PY=${PY:-python3}
TORCH_PY=${TORCH_PY:-$PY}
OUT=${OUT:-$T/feat-collected}
export PYTHONPATH=/tmp/site:$T/feat-repo HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
SMOKE=""
if [ "${DRY:-0}" = 1 ]; then export PYTHONPATH=$T/feat-repo; SMOKE="--smoke"; fi
collect() {
  mkdir -p "$OUT" && rm -rf "$T/feat-collect" && mkdir -p "$T/feat-collect/logs"
  cp "$T/features.log" "$OUT/features.log" 2>/dev/null
  cp "$T"/features-out/features*.json "$OUT/" 2>/dev/null
  cp "$T"/features-work/logs/*.log "$T/feat-collect/logs/" 2>/dev/null
  nvidia-smi > "$T/feat-collect/logs/nvidia-smi.txt" 2>&1
  cp "$T/disk-probe.txt" "$T/feat-collect/logs/" 2>/dev/null
  df -h "$T" > "$T/feat-collect/logs/df.txt" 2>&1
  tar czf "$OUT/features-logs.tgz" -C "$T/feat-collect" logs
  [ "${DRY:-0}" = 1 ] || bash bench/gpu/jit_cache.sh save "$OUT"
  ls -la "$OUT"
}
if [ "$mode" = start ]; then
  if [ "${DRY:-0}" != 1 ]; then
    bash bench/gpu/stage.sh || exit 1
    bash bench/gpu/setup.sh || exit 1
  fi
  rm -rf "$T/feat-repo" "$T/features-out" "$T/features.log" && mkdir -p "$T/feat-repo"
  tar --exclude=./.gpu --exclude=./.venv --exclude=./.venv-trainers --exclude=./.git -cf - . | tar -xf - -C "$T/feat-repo"
  if [ "${DRY:-0}" != 1 ]; then
    df -h /tmp | tail -1
    # the disk the features go to: 1 GB written and synced (a row's file is synced before its rename)
    dd if=/dev/zero of="$T/dd-probe" bs=16M count=64 conv=fdatasync 2>&1 | tail -1 | tee "$T/disk-probe.txt"
    rm -f "$T/dd-probe"
    "$PY" -c 'import sglang, torch, transformers, safetensors, specforge, regen.features.compute, regen.features.projection, bench.gpu.features; from sglang.srt.distributed.parallel_state_wrapper import ParallelState; from sglang.srt.model_executor.model_runner import ModelRunner; from specforge.offline_capture.sglang_backend.utils import wrap_offline_eagle3_logits_processors; print("sglang", sglang.__version__, "torch", torch.__version__, "transformers", transformers.__version__, "safetensors", safetensors.__version__)' || exit 1
  fi
  (cd "$T/feat-repo" && setsid nohup "$PY" -m bench.gpu.features --out "$T/features-out" --work "$T/features-work" \
      --torch-python "$TORCH_PY" $SMOKE ${FEATURES_ARGS:-} > "$T/features.log" 2>&1 < /dev/null &)
  sleep 2
fi
. bench/gpu/wait_line.sh
wait_line "$T/features.log" '^features: targets=' '^Traceback' || echo "features driver $wait_state"
tail -n 40 "$T/features.log"
collect
