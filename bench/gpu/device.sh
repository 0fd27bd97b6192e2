#!/bin/bash
# On the GPU host, from the repo root.
#   device.sh start SECONDS   stage the last part, build /tmp/site, start run.py detached, wait up to SECONDS
#   device.sh wait SECONDS    wait up to SECONDS for run.py to finish
# Both then copy the results JSON/markdown, the bench log and the server logs (tar) to $OUT.
mode=$1; budget=${2:-560}
t0=$(date +%s)
export PYTHONPATH=/tmp/site:/tmp/repo HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
collect() {
  mkdir -p "$OUT" /tmp/collect
  cp /tmp/bench.log "$OUT/bench.log" 2>/dev/null
  cp /tmp/bench-out/*.json /tmp/bench-out/*.md "$OUT/" 2>/dev/null
  rm -rf /tmp/collect/* && mkdir -p /tmp/collect/logs
  for d in /tmp/bench-work/logs-* /tmp/bench-work/servers-*; do
    [ -d "$d" ] && cp -r "$d" /tmp/collect/logs/
  done
  for d in /tmp/bench-work/out-*; do
    [ -d "$d" ] && mkdir -p /tmp/collect/logs/$(basename $d) && cp "$d"/failed.jsonl /tmp/collect/logs/$(basename $d)/ 2>/dev/null
    [ -f "$d/records.jsonl" ] && head -c 3000 "$d/records.jsonl" > /tmp/collect/logs/$(basename $d)/records.head
  done
  nvidia-smi > /tmp/collect/logs/nvidia-smi.txt 2>&1
  tar czf "$OUT/serverlogs.tgz" -C /tmp/collect logs
  ls -la "$OUT"
}
if [ "$mode" = start ]; then
  bash bench/gpu/stage.sh || exit 1
  bash bench/gpu/setup.sh || exit 1
  rm -rf /tmp/repo && mkdir -p /tmp/repo
  tar --exclude=./.gpu --exclude=./.venv --exclude=./.git -cf - . | tar -xf - -C /tmp/repo
  python3 -c 'import sglang, orjson, transformers, regen.generate.client, regen.serving, regen.sglang.plan, regen.sglang.realized, regen.tune.tune; print("sglang", sglang.__version__, "transformers", transformers.__version__)' || exit 1
  nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv
  (cd /tmp/repo && setsid nohup python3 -m bench.gpu.run --out /tmp/bench-out --work /tmp/bench-work \
      --deadline-s "${DEADLINE:-1100}" > /tmp/bench.log 2>&1 < /dev/null &)
  sleep 2
fi
while [ $(( $(date +%s) - t0 )) -lt "$budget" ]; do
  grep -q '^gpu:' /tmp/bench.log 2>/dev/null && break
  # no PID check: $! of a backgrounded setsid is not run.py (seen 2026-11-29: it read as gone while
  # run.py ran on); run.py survives the end of the call, so only the final line ends the wait
  grep -q 'Traceback' /tmp/bench.log 2>/dev/null && { echo "run.py failed"; break; }
  sleep 5
done
tail -n 40 /tmp/bench.log
collect
