#!/bin/bash
# regen's generation stage on 2 GPUs through the real workflow (Snakemake, --resources gpu=2).
# From the repo root:
#   two_gpu.sh stage               (GPU host) copy this call's payload part + snakemake parts to /tmp
#   two_gpu.sh run [BUDGET_S]      (GPU host) setup, model, dataset, snakemake, checks; results to $OUT
#   two_gpu.sh --dry-cpu [BUDGET_S] same, here, with server.mode simulated (PY= the python to use)
# Snakemake travels as .whl/{a,b}/snk.tar.xz.a? (pure-Python snakemake 9.27.1 + its deps that the
# GPU image lacks, taken from .venv without compiled extensions; split to fit beside a payload part).
# Device sequence (kind nvidia-h200-x2, back to back; results: measurements/gpu2-2026-11-29.md):
#   carry [.gpu/p01, .whl/a]: two_gpu.sh stage   carry [.gpu/p02, .whl/b]: two_gpu.sh stage
#   carry [.gpu/p03]: two_gpu.sh stage           carry [.gpu/p04]: two_gpu.sh run 575  (~315 s)
set -u
mode=${1:-run}
budget=${2:-540}
t0=$(date +%s)
R=$PWD
W=/tmp/two_gpu
mkdir -p "$W"
if [ "$mode" = stage ]; then
  bash bench/gpu/stage.sh || exit 1
  mkdir -p /tmp/whl && cp .whl/*/snk.tar.xz.a? /tmp/whl/ 2>/dev/null
  ls -la /tmp/whl
  exit 0
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset CUDA_VISIBLE_DEVICES
CFG=bench/gpu/two_gpu.yaml
if [ "$mode" = --dry-cpu ]; then
  [ -d .git ] && { echo "--dry-cpu deletes work/ results/ logs/: run it in a copy of the tree"; exit 1; }
  PY=${PY:-.venv/bin/python}
  OUT=${OUT:-/tmp/two_gpu_out}
  CFG=$W/two_gpu_cpu.yaml
  $PY - <<'EOF' || exit 1
import yaml
cfg = yaml.safe_load(open("bench/gpu/two_gpu.yaml"))
cfg["server"].update(mode="simulated", simulated={"token_rate": 20000, "startup_delay_s": 2.0})
yaml.safe_dump(cfg, open("/tmp/two_gpu/two_gpu_cpu.yaml", "w"))
EOF
else
  PY=python3
  bash bench/gpu/stage.sh > /dev/null || exit 1
  bash bench/gpu/setup.sh || exit 1
  mkdir -p /tmp/snk
  cat /tmp/whl/snk.tar.xz.a? | python3 -c "import sys, tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall('/tmp/snk')" || exit 1
  export PYTHONPATH=/tmp/snk:/tmp/site:$R
fi
mkdir -p "$OUT"
$PY -c 'import snakemake, regen.generate.generation, regen.ingest.audit; print("snakemake", snakemake.__version__)' || exit 1
nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv 2>/dev/null

# model (config-only, WordLevel tokenizer + chat template) and 1,024 unique 256-word prompts
rm -rf work results logs benchmarks .snakemake
$PY -m bench.gpu.make_model work/two_gpu/model 64 || exit 1
$PY - <<'EOF' || exit 1
import json, random
rng = random.Random(7)
with open("work/two_gpu/dataset.jsonl", "w") as fh:
    for i in range(1024):
        prompt = " ".join(f"t{rng.randrange(10, 248000)}" for _ in range(256))
        answer = " ".join(f"t{rng.randrange(10, 248000)}" for _ in range(32))
        row = {"id": f"g2-{i:04d}", "messages": [{"role": "user", "content": prompt},
                                                 {"role": "assistant", "content": answer}]}
        fh.write(json.dumps(row) + "\n")
EOF

# GPU memory sampler (both GPUs, every 2 s) for the whole run
( while true; do echo "$(date +%s) $(nvidia-smi --query-gpu=index,memory.used,utilization.gpu \
    --format=csv,noheader,nounits 2>/dev/null | tr '\n' ';')"; sleep 2; done ) > $W/smi.txt 2>&1 &
smi_pid=$!

targets=$(for k in 0 1 2 3 4 5 6 7; do printf 'results/generations/0000%d.jsonl ' $k; done)
left=$(( budget - ($(date +%s) - t0) - 45 ))
echo "snakemake budget ${left} s"
ts=$(date +%s.%N)
timeout -s INT -k 20 "$left" $PY -m snakemake --cores 16 --resources gpu=2 --configfile "$CFG" \
  --scheduler greedy --printshellcmds $targets > $W/snakemake.log 2>&1
snk_rc=$?
te=$(date +%s.%N)
echo "snakemake rc=$snk_rc wall=$(python3 -c "print(round($te-$ts,1))") s"
tail -n 15 $W/snakemake.log
# orphan check right after Snakemake returned (its onsuccess/onerror stops the servers)
sleep 3
ps -eo pid,ppid,etimes,args | grep -E 'sglang|regen\.sglang\.supervisor|launch_server' | grep -v grep > $W/ps_after.txt
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader > $W/smi_after.txt 2>&1
echo "after snakemake: $(wc -l < $W/ps_after.txt) server processes; GPU memory: $(tr '\n' ' ' < $W/smi_after.txt)"
# then stop whatever is left (idempotent), so nothing outlives the call either way
$PY -c 'from regen.serving.lifecycle import stop_all_servers; print("stop_all_servers:", stop_all_servers("work/servers"))'
sleep 2
ps -eo pid,ppid,etimes,args | grep -E 'sglang|regen\.sglang\.supervisor|launch_server' | grep -v grep > $W/ps_final.txt
kill "$smi_pid" 2>/dev/null

$PY - "$snk_rc" "$ts" "$te" <<'EOF' | tee $W/summary.txt
import glob, json, os, re, sys
from collections import defaultdict
rc, ts, te = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
dec = re.compile(r"Decode batch.*?#running-req: (\d+).*?gen throughput \(token/s\): ([0-9.]+)")
per = defaultdict(lambda: {"shards": set(), "records": 0, "completion_tokens": 0, "prompt_tokens": 0,
                           "first_start": None, "last_end": None, "finish": defaultdict(int)})
for path in sorted(glob.glob("results/generations/*.jsonl")):
    if path.endswith(".failed.jsonl"):
        continue
    for line in open(path):
        r = json.loads(line)
        s = per[r["server"]["id"]]
        s["shards"].add(r["shard"]); s["records"] += 1
        s["completion_tokens"] += r["usage"]["completion_tokens"]
        s["prompt_tokens"] += r["usage"]["prompt_tokens"]
        s["finish"][r["finish_reason"]] += 1
        t0, t1 = r["timings"]["started_at"], r["timings"]["started_at"] + r["timings"]["latency_s"]
        s["first_start"] = t0 if s["first_start"] is None else min(s["first_start"], t0)
        s["last_end"] = t1 if s["last_end"] is None else max(s["last_end"], t1)
failed = sum(1 for p in glob.glob("results/generations/*.failed.jsonl") for _ in open(p))
servers = {}
for sid, s in sorted(per.items()):
    wall = s["last_end"] - s["first_start"]
    log = f"logs/servers/{sid}.log"
    text = open(log, errors="replace").read() if os.path.exists(log) else ""
    lines = [(int(a), float(b)) for a, b in dec.findall(text)]
    busy = [tps for run, tps in lines if run >= 32]
    real = f"work/servers/{sid}.realized.json"
    servers[sid] = {
        "shards": sorted(s["shards"]), "records": s["records"], "prompt_tokens": s["prompt_tokens"],
        "completion_tokens": s["completion_tokens"], "finish_reasons": dict(s["finish"]),
        "wall_s": round(wall, 1), "client_out_tok_per_s": round(s["completion_tokens"] / wall, 1),
        "decode_lines": len(lines),
        "decode_tok_per_s_median": sorted(busy)[len(busy) // 2] if busy else None,
        "decode_tok_per_s_max": max(busy) if busy else None,
        "cuda_visible_devices": re.findall(r"CUDA_VISIBLE_DEVICES=(\S+)", text)[:1],
        "realized": json.load(open(real)) if os.path.exists(real) else None,
    }
smi = [l.split(" ", 1) for l in open("/tmp/two_gpu/smi.txt") if " " in l]
peak = defaultdict(int)
for _, rest in smi:
    for part in rest.strip().strip(";").split(";"):
        f = [x.strip() for x in part.split(",")]
        if len(f) >= 2 and f[0].isdigit():
            peak[f[0]] = max(peak[f[0]], int(f[1]))
ps_after = open("/tmp/two_gpu/ps_after.txt").read().strip().splitlines()
ps_final = open("/tmp/two_gpu/ps_final.txt").read().strip().splitlines()
smi_after = open("/tmp/two_gpu/smi_after.txt").read().strip().splitlines()
total_tok = sum(v["completion_tokens"] for v in servers.values())
out = {"snakemake_rc": rc, "snakemake_wall_s": round(te - ts, 1), "servers": servers,
       "failed_records": failed, "shard_files": len([p for p in glob.glob("results/generations/*.jsonl")
                                                     if not p.endswith(".failed.jsonl")]),
       "gpu_peak_memory_mib": dict(peak), "gpu_memory_after": smi_after,
       "server_processes_after_snakemake": ps_after, "server_processes_final": ps_final,
       "total_completion_tokens": total_tok}
json.dump(out, open("/tmp/two_gpu/gpu2.json", "w"), indent=1, default=str)
print(json.dumps({k: v for k, v in out.items() if k != "servers"}, default=str))
for sid, v in servers.items():
    print(sid, {k: v[k] for k in v if k != "realized"})
tps = [v["client_out_tok_per_s"] for v in servers.values()]
print(f"gpu2: servers={len(servers)} shards={'/'.join(str(len(v['shards'])) for v in servers.values())} "
      f"records={sum(v['records'] for v in servers.values())} tok_per_s={'/'.join(str(t) for t in tps)} "
      f"orphans={len(ps_after)} ratio={round(min(tps) / max(tps), 3) if tps else 0}")
EOF
cp $W/gpu2.json $W/snakemake.log "$OUT/" 2>/dev/null
tar czf "$OUT/logs.tgz" -C "$R" logs work/servers benchmarks $(cd "$R" && ls .snakemake/log/*.log 2>/dev/null) \
  -C $W smi.txt ps_after.txt ps_final.txt smi_after.txt 2>/dev/null
ls -la "$OUT"
echo "total $(( $(date +%s) - t0 )) s"
