"""n completions of each prompt, the cheap way (issue 52 item 2): prompt tokens prefilled per completion
when regen sends a prompt's ``n`` completions back to back (one variant with ``n``), against the same
completions spread over the run (``n`` variants of one completion each, as ``n`` reruns with other seeds
gave them before variants: every prompt once, then every prompt again).

Both go through regen's own client (``generate_shard_async``) against the simulated server, whose radix
cache (``regen.simulated.prefixcache``) holds ``--cache-tokens`` of prompts, least recently used leaving
first: smaller than the dataset's prompts, as a GPU's KV pool is beside a real dataset. What it prefilled
is the server's own count (``/_sim/stats``). The ratio is spread over adjacent: how many times more
prefill the spread order costs.

    .venv/bin/python -m bench.variants            # 2,000 prompts of ~400 tokens, n 4, a 100,000-token cache
    .venv/bin/python -m bench.variants --smoke    # CI: 120 prompts, seconds
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.harness import Stopwatch, add_smoke, fmt, parse_args, report
from regen.generate.client import Endpoint, ProgressOptions, ShardJob, generate_shard_async
from regen.runconfig import GenerateConfig
from regen.simulated.launcher import start_simulated_server
from regen.types import Message, Sample

MODEL = "bench-model"


def prompts(count: int, words: int) -> list[Sample]:
    """One-turn samples, each its own ``words``-word question (no two share a prefix past their start)."""
    return [
        Sample(
            f"p{i:06d}",
            (
                Message("user", f"question {i}: " + " ".join(f"w{i}x{j}" for j in range(words))),
                Message("assistant", "old"),
            ),
        )
        for i in range(count)
    ]


async def prefill_stats(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(url + "/_sim/stats") as r:
        return orjson.loads(await r.read())["prefix_cache"]


async def send(url: str, samples: list[Sample], variants: list[dict[str, Any]], concurrency: int) -> int:
    """One shard of ``samples`` under ``variants`` through regen's client; the completions it made."""
    cfg = GenerateConfig.from_dict(
        {"concurrency": concurrency, "sampling": {"max_tokens": 64}, "variants": variants, "spill": False}
    )
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        endpoint = Endpoint(url, "gpu0", model=MODEL)
        progress = ProgressOptions(status_path=t / "status.json")
        job = ShardJob(samples, t / "j.jsonl", t / "o.jsonl", t / "f.jsonl", cfg, endpoint, "00000", progress)
        stats = await generate_shard_async(job)
    return stats.completed


def measure(samples: list[Sample], plan: list[list[dict[str, Any]]], a: argparse.Namespace) -> dict[str, Any]:
    """Prompt tokens and prefilled tokens of the completions the shard runs in ``plan`` make, on one fresh
    server (an empty cache)."""
    url, stop = start_simulated_server(
        inline=True,
        prefix_cache_tokens=a.cache_tokens,
        mean_reasoning_tokens=4,
        mean_answer_tokens=4,
        long_fraction=0.0,
        max_running_requests=a.concurrency,
    )
    try:
        completions = 0
        with Stopwatch() as t:
            for variants in plan:
                completions += asyncio.run(send(url, samples, variants, a.concurrency))
        counted = asyncio.run(prefill_stats(url))
    finally:
        stop()
    assert completions == len(samples) * a.n, (completions, len(samples), a.n)
    return {**counted, "completions": completions, "wall_s": t.wall_s}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bench/variants.py", description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=2000)
    p.add_argument("--words", type=int, default=400, help="words a prompt (about one token each)")
    p.add_argument("--n", type=int, default=4, help="completions a prompt")
    p.add_argument("--cache-tokens", type=int, default=100_000, help="what the server's radix cache holds")
    p.add_argument("--concurrency", type=int, default=64)
    add_smoke(p, prompts=120, words=100, cache_tokens=3000)
    a = parse_args(p, argv)
    samples = prompts(a.prompts, a.words)
    adjacent = measure(samples, [[{"name": "many", "n": a.n}]], a)
    spread = measure(samples, [[{"name": f"once{k}"}] for k in range(a.n)], a)
    per = {
        name: m["prefilled_tokens"] / m["completions"]
        for name, m in (("adjacent", adjacent), ("spread", spread))
    }
    prompt_tokens = adjacent["prompt_tokens"] / adjacent["completions"]
    for name, m in (("adjacent", adjacent), ("spread", spread)):
        print(
            f"{name}: {m['completions']} completions, {m['prompt_tokens']} prompt tokens, "
            f"{m['cached_tokens']} from the cache, {m['prefilled_tokens']} prefilled, {m['wall_s']:.1f} s"
        )
    return report(
        "variants",
        prompts=a.prompts,
        n=a.n,
        prompt_tokens_per_completion=fmt(prompt_tokens),
        cache_tokens=a.cache_tokens,
        adjacent_prefill_per_completion=fmt(per["adjacent"]),
        spread_prefill_per_completion=fmt(per["spread"]),
        ratio=fmt(per["spread"] / per["adjacent"] if per["adjacent"] else None, 2),
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
