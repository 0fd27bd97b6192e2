"""Run-level GPU efficiency through the real workflow, against the full-batch floor.

    python -m bench.efficiency [--gpus 7] [--shards N] [--samples 91400] [--scale 10] [--minutes 4]
    python -m bench.efficiency --smoke    # CI: 1 GPU, 200 samples, a 6-second floor

Snakemake runs the workflow up to ``generate`` with ``--resources gpu=G``: regen's GPU slots, servers
and client, against simulated servers in virtual time (``bench.sim_virtual``, the simulated server's hook): a
decode step of 13.2 ms + 0.154 ms per running request, 350 running at most (the H200 fit of issue #16),
output lengths lognormal with mean 3,000 tokens capped at 8,192.

Scaling, so that a 19-hour run takes a few minutes on a 2-core machine:
- ``--scale K`` divides the samples (914,000 x G / 7 / K by default: the issue's 19-hour 7-GPU run, as
  long at any GPU count) and the running cap (350 / K) by K and
  multiplies the per-running step cost by K: the full-batch step time and per-request decode speed
  are unchanged, each simulated request stands for K real ones;
- virtual time runs ``speed`` times faster than real time, chosen so that the floor takes ``--minutes``.

The floor is every generated token (read back from the shard outputs) at full-batch speed on every
GPU. The wall runs to the last completion, in virtual time, from each GPU's first request (averaged
over the GPUs): Snakemake starting the first jobs one after another takes seconds on a node but
minutes of virtual time here. Everything after a GPU's first request counts: drains, the gaps while
Snakemake starts the next job, idle GPUs at the end. ``run_h`` (stderr) is first request to last.
The bench is sensitive to CPU starvation (a stalled client is an idle GPU for ``speed`` times as
long): run it on a quiet machine, and give it more ``--minutes`` when the machine is shared. Every job
start (a Python process, its imports, its shard) also costs ``speed`` times its CPU seconds: with many
shards per GPU keep ``speed`` (stderr) below ~100 (e.g. 7 GPUs x 140 shards: ``--minutes 4``, speed
275, gave 0.868 on 2 cores; ``--minutes 12``, speed 92, gave 0.997).
The last line is ``efficiency: gpus=G shards=S samples=N wall_h=... floor_h=... ratio=...``.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import orjson
import yaml

from bench.harness import add_smoke, parse_args
from bench.sim_virtual import VIRTUAL_ENV, VIRTUAL_HOOK, VirtualTime
from bench.workflow import copy_workflow, free_port_base, python_path, run_snakemake, write_chats
from regen.io import open_lines
from regen.layout.run import RunLayout
from regen.simulated.launcher import SERVER_HOOK_ENV
from regen.simulated.options import REQUEST_LOG_ENV
from regen.simulated.requestlog import read_request_log

REPO_ROOT = Path(__file__).resolve().parent.parent

FULL_SAMPLES = 914_000
FULL_CAP = 350


def mean_output_tokens(clock: VirtualTime, samples: int, max_tokens: int) -> float:
    """The mean modelled output length over the bench's sample ids (sets the speed)."""
    n = min(samples, 20_000)
    return sum(clock.output_tokens(f"eff-{i:07d}#0", max_tokens) for i in range(n)) / n


def run_config(args: argparse.Namespace, cap: int, port_base: int) -> dict:
    cfg: dict = {
        "dataset": {"path": "data/efficiency.jsonl", "format": "messages", "id_column": "id"},
        "tokenizer": "resources/demo-tokenizer",
        "audit": {"context_limit": 4096},
        "generate": {
            "sampling": {"max_tokens": args.max_tokens},
            "request_timeout_s": 3600,
            "max_attempts": 5,
            "backoff_base_s": 0.05,
        },
        "server": {
            "mode": "simulated",
            "model_path": "demo-model",
            "model_config": "resources/demo-model/config.json",
            "gpu_memory_mib": 81920,
            "port_base": port_base,
            "startup_timeout_s": 120,
            "idle_timeout_s": 120,
            "simulated": {
                "max_running_requests": cap,
                "startup_delay_s": 0.2,
                "faults": {},
            },
        },
    }
    if args.shards:
        cfg["shards"] = {"count": args.shards}
    return cfg


def generated_tokens(layout: RunLayout) -> tuple[int, int]:
    """(completion tokens, records) over every shard's generation records in ``layout``."""
    tokens = records = 0
    for path in layout.record_files():
        with open_lines(path) as lines:
            for line in lines:
                tokens += orjson.loads(line)["usage"]["completion_tokens"]
                records += 1
    return tokens, records


def measure(root: Path, request_log: Path, clock: VirtualTime, gpus: int, cap: int) -> dict:
    events = [e for e in read_request_log(request_log) if e["id"]]  # not the servers' readiness probes
    received = [e["vt"] for e in events if e["event"] == "received"]
    completed = [e["vt"] for e in events if e["event"] == "completed"]
    first_by_server: dict[int, float] = {}
    for e in events:
        if e["event"] == "received":
            first_by_server[e["pid"]] = min(e["vt"], first_by_server.get(e["pid"], e["vt"]))
    tokens, records = generated_tokens(RunLayout.under(root))
    end = max(completed)
    # each GPU counts from its own first request: the seconds Snakemake takes to start the first jobs
    # one after another would be minutes here (time runs `speed` times faster) but are seconds on a node
    wall_s = sum(end - first for first in first_by_server.values()) / len(first_by_server)
    floor_s = tokens / (gpus * clock.full_batch_tokens_per_s(cap))
    return {
        "wall_s": wall_s,
        "run_s": end - min(received),
        "floor_s": floor_s,
        "records": records,
        "tokens": tokens,
        "servers": len(first_by_server),
        "not_completed": len(received) - len(completed),
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gpus", type=int, default=7)
    p.add_argument("--shards", type=int, default=None, help="shards.count (default: the workflow's)")
    p.add_argument("--scale", type=int, default=10, help="samples and running cap divided by this")
    p.add_argument("--samples", type=int, default=None, help=f"default {FULL_SAMPLES:,} x gpus / 7 / scale")
    p.add_argument("--minutes", type=float, default=4.0, help="real minutes the floor should take")
    p.add_argument("--max-tokens", type=int, default=8192)
    p.add_argument("--step-ms", type=float, default=13.2)
    p.add_argument("--step-ms-per-running", type=float, default=0.154)
    p.add_argument("--length-mean", type=float, default=3000.0)
    p.add_argument("--length-sigma", type=float, default=1.0)
    p.add_argument("--dir", type=Path, default=None, help="work here (kept) instead of a temp dir")
    add_smoke(p, gpus=1, samples=200, minutes=0.1)
    args = parse_args(p, argv)

    samples = args.samples or FULL_SAMPLES * args.gpus // (7 * args.scale)  # a 19-hour run at any GPU count
    cap = max(1, round(FULL_CAP / args.scale))
    shape = {
        "step_ms": args.step_ms,
        "step_ms_per_running": args.step_ms_per_running * FULL_CAP / cap,
        "length_mean": args.length_mean,
        "length_sigma": args.length_sigma,
        "length_cap": args.max_tokens,
    }
    probe = VirtualTime(speed=1.0, epoch=0.0, **shape)
    floor_estimate_s = (
        samples
        * mean_output_tokens(probe, samples, args.max_tokens)
        / (args.gpus * probe.full_batch_tokens_per_s(cap))
    )
    speed = floor_estimate_s / (args.minutes * 60)

    root = args.dir or Path(tempfile.mkdtemp(prefix="regen-efficiency-"))
    root.mkdir(parents=True, exist_ok=True)
    copy_workflow(REPO_ROOT, root)
    write_chats(
        root / "data" / "efficiency.jsonl",
        (
            (
                f"eff-{i:07d}",
                f"Explain item {i} of the benchmark list in detail.",
                f"Item {i} is explained here with enough words.",
            )
            for i in range(samples)
        ),
    )
    request_log = root / "work" / "requests.jsonl"
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env[REQUEST_LOG_ENV] = str(request_log)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    base = ["--configfile", "config/efficiency.yaml", "--resources", f"gpu={args.gpus}"]

    epoch = time.time()
    virtual = {"speed": speed, "epoch": epoch, **shape}
    env[SERVER_HOOK_ENV], env[VIRTUAL_ENV] = VIRTUAL_HOOK, orjson.dumps(virtual).decode()
    env["PYTHONPATH"] = python_path()
    cfg = run_config(args, cap, free_port_base(args.gpus, random.Random()))
    (root / "config" / "efficiency.yaml").write_text(yaml.safe_dump(cfg, sort_keys=True))
    real_s, gen = run_snakemake(
        root, [*base, "--cores", str(2 * args.gpus + 1), "--until", "generate", "--quiet", "all"], env
    )
    if gen.returncode != 0:
        sys.stderr.write(gen.stdout[-3000:] + gen.stderr[-3000:])
        return 1
    clock = VirtualTime(speed=speed, epoch=epoch, **shape)
    m = measure(root, request_log, clock, args.gpus, cap)
    shards = args.shards or len(RunLayout.under(root).shard_files())
    print(
        f"# scale={args.scale} cap={cap} speed={speed:.0f} real_s={real_s:.0f} records={m['records']} "
        f"tokens={m['tokens']} servers={m['servers']} run_h={m['run_s'] / 3600:.2f} "
        f"requests_not_completed={m['not_completed']} dir={root}",
        file=sys.stderr,
    )
    print(
        f"efficiency: gpus={args.gpus} shards={shards} samples={samples} wall_h={m['wall_s'] / 3600:.2f} "
        f"floor_h={m['floor_s'] / 3600:.2f} ratio={m['floor_s'] / m['wall_s']:.3f}"
    )
    if args.dir is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
