#!/bin/bash
# The race (issue 57) on the GPU host, from the repo root (payload: bench/gpu/pack.sh; parts .gpu/p01..p05).
#   race.sh stage             copy this call's payload part to /tmp/parts
#   race.sh start SECONDS     stage, build /tmp/site, warm Python's bytecode, start bench.gpu.race detached
#   race.sh wait SECONDS      wait for its last line (race:), then copy the results and logs to $OUT
# Device calls, back to back (the machine is given back ~30 s after a call ends):
#   1-4. carry [.gpu/p0N]: bash bench/gpu/race.sh stage
#   5.   carry [.gpu/p05]: bash bench/gpu/race.sh start 480   (stage + setup take ~60 s of the 600-s call)
#   6+.  bash bench/gpu/race.sh wait 580
# RACE_ARGS passes options to bench.gpu.race (--model, --requests, ...).
mode=$1; budget=${2:-560}
t0=$(date +%s)
export PYTHONPATH=/tmp/site:/tmp/repo HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
collect() {
  mkdir -p "$OUT" /tmp/collect
  cp /tmp/race.log "$OUT/race.log" 2>/dev/null
  cp /tmp/race-out/*.json "$OUT/" 2>/dev/null
  rm -rf /tmp/collect/* && mkdir -p /tmp/collect/logs
  cp /tmp/fi-prewarm.log /tmp/collect/logs/ 2>/dev/null
  cp /tmp/race-work/logs/*.log /tmp/collect/logs/ 2>/dev/null
  cp /tmp/race-work/regen-logs/*.log /tmp/collect/logs/ 2>/dev/null
  cp /tmp/race-work/*.json /tmp/race-work/regen-servers/*.json /tmp/race-work/status/*.json /tmp/collect/logs/ 2>/dev/null
  rm -f /tmp/collect/logs/offline-input.json
  for d in /tmp/race-work/*-out; do
    [ -d "$d" ] && tail -c 4000 "$d/records.jsonl" > /tmp/collect/logs/$(basename $d).records.tail 2>/dev/null
  done
  nvidia-smi > /tmp/collect/logs/nvidia-smi.txt 2>&1
  tar czf "$OUT/race-logs.tgz" -C /tmp/collect logs
  bash bench/gpu/jit_cache.sh save "$OUT"
  ls -la "$OUT"
}
if [ "$mode" = stage ]; then
  bash bench/gpu/stage.sh; nvidia-smi --query-gpu=name,memory.total --format=csv; exit 0
fi
if [ "$mode" = start ]; then
  bash bench/gpu/stage.sh || exit 1
  bash bench/gpu/setup.sh || exit 1
  rm -rf /tmp/repo && mkdir -p /tmp/repo
  tar --exclude=./.gpu --exclude=./.venv --exclude=./.git -cf - . | tar -xf - -C /tmp/repo
  python3 -c 'import sglang, sglang.srt.entrypoints.engine, regen.generate.client, regen.serving.lifecycle, bench.gpu.race; print("sglang", sglang.__version__)' || exit 1
  bash bench/gpu/prewarm_sampling.sh python3 /tmp/fi-prewarm.log  # while the warm-up server starts
  (cd /tmp/repo && setsid nohup python3 -m bench.gpu.race --out /tmp/race-out --work /tmp/race-work \
      ${RACE_ARGS:-} > /tmp/race.log 2>&1 < /dev/null &)
  sleep 2
fi
. bench/gpu/wait_line.sh
wait_line /tmp/race.log '^race:' '^Traceback' || echo "race $wait_state"
tail -n 30 /tmp/race.log
collect
