"""Generation client throughput: regen's client vs AsyncOpenAI + Semaphore vs a bare aiohttp loop.

All three talk to the same simulated SGLang server (inline mode, zero latency) running in a
separate process pinned to another core; this process is pinned to one core. regen runs with
its journal, retries and progress accounting on. Each client gets its prompts as a prepared list
(regen's as the Sample list its job holds once it read its shard) and its config built before the
clock starts; bare and regen run ``--repeat`` times alternated and the best run of each counts (load
from elsewhere on the machine only slows a run). Prints req/s and CPU-seconds per 1,000 requests
for each; the last line is
``client: regen_rps=… baseline_rps=… bare_rps=… ratio=… vs_bare=… cpu_ratio=… cpu_vs_bare=…``
(ratio = regen / AsyncOpenAI, vs_bare = regen / bare aiohttp, in req/s; the cpu_ variants compare
client CPU-seconds per request, which stay meaningful when the one-core server is the ceiling).

    .venv/bin/python -m bench.client            # 20,000 requests, 3 rounds
    .venv/bin/python -m bench.client --smoke    # CI: 300 requests, one round, 200 for AsyncOpenAI
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.harness import Stopwatch, add_smoke, parse_args
from regen.generate.client import Endpoint, ProgressOptions, ShardJob, generate_shard_async
from regen.runconfig import GenerateConfig
from regen.simulated.launcher import start_simulated_server
from regen.types import Message, Sample

MODEL = "demo-model"
#: what every client sends besides model, messages and seed: regen's request fields at the config's
#: defaults (temperature, top_p, top_k from the schema) with max_tokens 256
SAMPLING = {
    "temperature": 0.6,
    "top_p": 0.95,
    "top_k": 20,
    "max_tokens": 256,
    "n": 1,
    "chat_template_kwargs": {"enable_thinking": True},
    "separate_reasoning": True,
}


def messages(i: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"question number {i}"}]


def samples(n: int) -> list[Sample]:
    return [
        Sample(
            f"s{i}",
            (
                Message("system", "be brief"),
                Message("user", f"question number {i}"),
                Message("assistant", "a"),
            ),
        )
        for i in range(n)
    ]


def prepare_regen(url: str, n: int, concurrency: int) -> Callable[[], Awaitable[None]]:
    """regen's client on a shard of ``n`` samples given as a list (as the job has them once it read
    its shard), with its journal, retries and progress file on."""
    cfg = GenerateConfig.from_dict(
        {"concurrency": concurrency, "sampling": {"max_tokens": 256}, "backoff_base_s": 0.01}
    )
    shard = samples(n)

    async def run() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            t = Path(tmp)
            stats = await generate_shard_async(
                ShardJob(
                    shard,
                    t / "j.jsonl",
                    t / "o.jsonl",
                    t / "f.jsonl",
                    cfg,
                    Endpoint(url, "gpu0", model=MODEL),
                    "00000",
                    ProgressOptions(status_path=t / "status.json"),
                )
            )
            assert stats.completed == n, stats

    return run


def prepare_openai(url: str, n: int, concurrency: int) -> Callable[[], Awaitable[None]]:
    from openai import AsyncOpenAI

    prompts = [messages(i) for i in range(n)]

    async def run() -> None:
        client = AsyncOpenAI(api_key="none", base_url=url + "/v1")
        sem = asyncio.Semaphore(concurrency)
        await asyncio.gather(*(one(client, sem, i) for i in range(n)))
        await client.close()

    async def one(client: Any, sem: asyncio.Semaphore, i: int) -> None:
        async with sem:
            r = await client.chat.completions.create(
                model=MODEL,
                messages=prompts[i],
                max_tokens=256,
                temperature=0.6,
                top_p=0.95,
                seed=i,
                extra_body={
                    "top_k": 20,
                    "chat_template_kwargs": {"enable_thinking": True},
                    "separate_reasoning": True,
                },
            )
            assert r.choices[0].message.content is not None

    return run


def prepare_bare(url: str, n: int, concurrency: int) -> Callable[[], Awaitable[None]]:
    """A bare aiohttp loop: one POST per prompt of a prepared list with the fields regen's request
    sends (``regen.generate.request.Requests.body``: the same sampling, the same server work), the
    answer parsed, nothing kept."""
    chat = url + "/v1/chat/completions"
    prompts = [messages(i) for i in range(n)]

    async def run() -> None:
        it = iter(range(n))

        async def worker(session: aiohttp.ClientSession) -> None:
            for i in it:
                body = orjson.dumps({"model": MODEL, "messages": prompts[i], **SAMPLING, "seed": i})
                async with session.post(chat, data=body, headers={"Content-Type": "application/json"}) as r:
                    orjson.loads(await r.read())

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
            await asyncio.gather(*(worker(s) for _ in range(concurrency)))

    return run


def measure(
    name: str, prepare: Callable[[str, int, int], Callable[[], Awaitable[None]]], url: str, n: int, c: int
) -> tuple[float, float]:
    """req/s and client CPU-seconds of one run; its inputs are built before the clock starts."""
    run = prepare(url, n, c)
    with Stopwatch() as clock:
        asyncio.run(run())
    wall, cpu = clock.wall_s, clock.cpu_s
    rps = n / wall
    print(f"{name:>8}: n={n} wall={wall:.2f}s req/s={rps:.0f} cpu_s_per_1k={1000 * cpu / n:.3f}", flush=True)
    return rps, cpu


def best_of(runs: list[tuple[float, float]]) -> tuple[float, float]:
    """The fastest rate and the least CPU of repeated runs (other load on the machine only slows a run)."""
    return max(r for r, _ in runs), min(c for _, c in runs)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bench/client.py", description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=20000, help="requests for regen and the bare loop")
    p.add_argument(
        "--baseline-n", type=int, default=4000, help="requests for AsyncOpenAI (slow; rates compare)"
    )
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3, help="alternated runs of bare and regen; best of each")
    p.add_argument("--client-cpu", type=int, default=0)
    p.add_argument("--server-cpu", type=int, default=1)
    add_smoke(p, n=300, baseline_n=200, repeat=1)
    a = parse_args(p, argv)
    ncpu = os.cpu_count() or 1
    server_cpus = {a.server_cpu % ncpu}
    url, stop = start_simulated_server(
        subprocess_mode=True,
        cpus=server_cpus,
        inline=True,
        max_running_requests=a.concurrency,
        mean_reasoning_tokens=8,
        mean_answer_tokens=8,
        long_fraction=0.0,
    )
    os.sched_setaffinity(0, {a.client_cpu % ncpu})
    print(
        f"server pinned to cpus {sorted(server_cpus)}, client to cpu {a.client_cpu % ncpu}; "
        f"concurrency {a.concurrency}"
    )
    try:
        measure("warmup", prepare_bare, url, min(500, a.n), a.concurrency)
        bare_runs, regen_runs = [], []
        for _ in range(a.repeat):  # alternated, so a slow minute on the machine hits both
            bare_runs.append(measure("bare", prepare_bare, url, a.n, a.concurrency))
            regen_runs.append(measure("regen", prepare_regen, url, a.n, a.concurrency))
        (bare, bare_cpu), (regen, regen_cpu) = best_of(bare_runs), best_of(regen_runs)
        base, base_cpu = measure("openai", prepare_openai, url, a.baseline_n, a.concurrency)
    finally:
        stop()
    # When the one-core server is the ceiling (bare ~= regen), req/s understates how much cheaper regen
    # is than the baseline; CPU-seconds per request (client core) shows it independently of the server.
    regen_per, base_per, bare_per = regen_cpu / a.n, base_cpu / a.baseline_n, bare_cpu / a.n
    print(
        f"client: regen_rps={regen:.0f} baseline_rps={base:.0f} bare_rps={bare:.0f} "
        f"ratio={regen / base:.2f} vs_bare={regen / bare:.2f} "
        f"cpu_ratio={base_per / regen_per:.2f} cpu_vs_bare={bare_per / regen_per:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
