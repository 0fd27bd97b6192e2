"""What keeping the server's token ids costs: regen's client with ``return_token_ids`` on vs off.

Both runs drive the same simulated SGLang server in token mode (the demo tokenizer; a separate
process pinned to another core) with realistic lengths (reasoning ~``--reasoning`` tokens, answer
~``--answer`` tokens). Prints journal bytes per record, req/s and client CPU-seconds per 1,000
requests for each; the last line is
``token_ids: off_rps=… on_rps=… rps_ratio=… off_cpu_ms=… on_cpu_ms=… ratio=… off_journal_bytes=…
on_journal_bytes=… size_ratio=…`` (ratios are on / off; ``ratio``, the headline, is the client's CPU per
request: what keeping the ids costs).

    .venv/bin/python -m bench.token_ids            # 3,000 requests
    .venv/bin/python -m bench.token_ids --smoke    # CI: 200 requests
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

from bench.harness import Stopwatch, add_smoke, parse_args
from regen.generate.client import Endpoint, ProgressOptions, ShardJob, generate_shard_async
from regen.runconfig import GenerateConfig
from regen.simulated.launcher import start_simulated_server
from regen.types import Message, Sample

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = str(ROOT / "resources" / "demo-tokenizer")


def samples(n: int) -> list[Sample]:
    return [
        Sample(f"s{i}", (Message("system", "be brief"), Message("user", f"question number {i}")))
        for i in range(n)
    ]


def run(url: str, n: int, concurrency: int, token_ids: bool, max_tokens: int) -> tuple[float, float, float]:
    """(req/s, client CPU ms per request, journal bytes per record) of one client run."""
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        cfg = {
            "concurrency": concurrency,
            "sampling": {"max_tokens": max_tokens},
            "backoff_base_s": 0.01,
            "return_token_ids": token_ids,
        }
        with Stopwatch() as clock:
            stats = asyncio.run(
                generate_shard_async(
                    ShardJob(
                        samples(n),
                        t / "j.jsonl",
                        t / "o.jsonl",
                        t / "f.jsonl",
                        GenerateConfig.from_dict(cfg),
                        Endpoint(url, "gpu0", model="demo-model"),
                        "00000",
                        ProgressOptions(status_path=t / "status.json"),
                    )
                )
            )
        wall, cpu = clock.wall_s, clock.cpu_s
        assert stats.completed == n, stats
        size = (t / "j.jsonl").stat().st_size
    rps, cpu_ms, per_record = n / wall, 1000 * cpu / n, size / n
    print(
        f"{'on' if token_ids else 'off':>4}: n={n} wall={wall:.2f}s req/s={rps:.0f} "
        f"cpu_ms_per_req={cpu_ms:.3f} journal_bytes_per_record={per_record:.0f}",
        flush=True,
    )
    return rps, cpu_ms, per_record


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bench/token_ids.py", description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=3000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--reasoning", type=int, default=400, help="mean reasoning tokens")
    p.add_argument("--answer", type=int, default=200, help="mean answer tokens")
    p.add_argument("--client-cpu", type=int, default=0)
    p.add_argument("--server-cpu", type=int, default=1)
    add_smoke(p, n=200)
    a = parse_args(p, argv)
    ncpu = os.cpu_count() or 1
    url, stop = start_simulated_server(
        subprocess_mode=True,
        cpus={a.server_cpu % ncpu},
        inline=True,
        max_running_requests=a.concurrency,
        mean_reasoning_tokens=a.reasoning,
        mean_answer_tokens=a.answer,
        long_fraction=0.0,
        tokenizer_path=TOKENIZER,
    )
    os.sched_setaffinity(0, {a.client_cpu % ncpu})
    max_tokens = 4 * (a.reasoning + a.answer)
    try:
        run(url, min(a.n, 300), a.concurrency, True, max_tokens)  # warm-up
        off = run(url, a.n, a.concurrency, False, max_tokens)
        on = run(url, a.n, a.concurrency, True, max_tokens)
    finally:
        stop()
    print(
        f"token_ids: off_rps={off[0]:.0f} on_rps={on[0]:.0f} rps_ratio={on[0] / off[0]:.3f} "
        f"off_cpu_ms={off[1]:.3f} on_cpu_ms={on[1]:.3f} ratio={on[1] / off[1]:.3f} "
        f"off_journal_bytes={off[2]:.0f} on_journal_bytes={on[2]:.0f} size_ratio={on[2] / off[2]:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
