"""The scheduling model behind bench/efficiency.py: which change keeps every GPU busy (issue #16).

    python -m bench.efficiency_model [--samples 914000] [--cap 350] [--gap-s 0] 7x64 7x7 1x20 ...
    python -m bench.efficiency_model --smoke    # CI: 2x4 at 2,000 samples

A discrete-event fluid model, no workflow: G GPUs, S equal shards taken in order, a decode step of
13.2 ms + 0.154 ms x running, output lengths lognormal (mean 3,000, sigma 1) capped at 8,192; a job
switch costs ``--gap-s`` seconds. Policies:
- ``one``: one job per GPU at a time, at most ``cap`` running (regen before #16);
- ``spill``: plus every server's free places filled from any running shard (``generate.spill``);
- ``regen``: plus the next job on a GPU starts as soon as the previous one has sent its last sample
  (two generate jobs per GPU slot), i.e. regen now.
Prints one line per configuration and policy: ``model: gpus=G shards=S policy=P ratio=...``.
"""

from __future__ import annotations

import argparse
import heapq
import math
import sys

import numpy as np

from bench.harness import add_smoke, parse_args
from regen.tune.closedloop import StepModel

POLICIES = ("one", "spill", "regen")


def lengths(n: int, mean: float = 3000.0, sigma: float = 1.0, cap: int = 8192, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    drawn = rng.lognormal(math.log(mean) - sigma**2 / 2, sigma, n)
    return np.minimum(np.maximum(1, np.round(drawn)), cap).astype(int)


def simulate(
    tokens: np.ndarray, gpus: int, shards: int, policy: str, cap: int, steps: StepModel, gap: float
) -> tuple[float, float]:
    """(wall seconds, floor seconds) of one run."""
    unsent = [list(part) for part in np.array_split(tokens, shards)]
    queue = list(range(shards))
    inflight = [0] * shards
    progress = [0.0] * gpus
    running: list[list[tuple[float, int]]] = [[] for _ in range(gpus)]
    owner: list[int | None] = [None] * gpus
    start_at: list[float | None] = [0.0] * gpus
    live: list[int] = []
    t = 0.0

    def fill(k: int) -> None:
        while len(running[k]) < cap:
            job = owner[k]
            src = job if job is not None and unsent[job] else None
            if src is None and policy != "one":
                candidates = [s for s in live if unsent[s]]
                src = max(candidates, key=lambda s: len(unsent[s])) if candidates else None
            if src is None:
                return
            heapq.heappush(running[k], (progress[k] + unsent[src].pop(), src))
            inflight[src] += 1

    def start_jobs() -> None:
        for k in range(gpus):
            at = start_at[k]
            if owner[k] is None and at is not None and at <= t + 1e-12 and queue:
                owner[k] = queue.pop(0)
                live.append(owner[k])
                start_at[k] = None

    start_jobs()
    for k in range(gpus):
        fill(k)
    while True:
        best, best_k = math.inf, -1
        for k in range(gpus):
            if running[k]:
                due = t + (running[k][0][0] - progress[k]) * steps.step_s(len(running[k]))
                if due < best:
                    best, best_k = due, k
        starts = [s for s in start_at if s is not None] if queue else []
        next_start = min(starts) if starts else math.inf
        if best == math.inf and next_start == math.inf:
            break
        now = min(best, next_start)
        for k in range(gpus):
            if running[k]:
                progress[k] += (now - t) / steps.step_s(len(running[k]))
        t = now
        if best <= next_start:
            _, job = heapq.heappop(running[best_k])
            inflight[job] -= 1
            if not unsent[job] and inflight[job] == 0:
                live.remove(job)
                for k in range(gpus):
                    if owner[k] == job:
                        owner[k] = None
                        start_at[k] = t + gap if policy != "regen" else start_at[k]
        if policy == "regen":  # a slot is given up when its job has sent its last sample
            for k in range(gpus):
                job = owner[k]
                if job is not None and not unsent[job]:
                    owner[k] = None
                    start_at[k] = t + gap
        start_jobs()
        for k in range(gpus):
            fill(k)
    floor = tokens.sum() / (gpus * steps.tokens_per_s(cap))
    return t, floor


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("configs", nargs="*", help="GxS: GPUs x shards")
    p.add_argument("--samples", type=int, default=914_000, help="for 7 GPUs; scaled with the GPU count")
    p.add_argument("--cap", type=int, default=350)
    p.add_argument("--gap-s", type=float, default=0.0, help="seconds between a job's end and the next")
    p.add_argument("--policies", default=",".join(POLICIES))
    add_smoke(p, samples=2000)
    args = parse_args(p, argv)
    if not args.configs:
        if not args.smoke:
            p.error("name at least one configuration, GxS (e.g. 7x7)")
        args.configs = ["2x4"]
    steps = StepModel(0.0132, 0.000154 * 350 / args.cap)  # the H200 fit (issue #16), per request at --cap
    for spec in args.configs:
        gpus, shards = (int(x) for x in spec.split("x"))
        tokens = lengths(args.samples * gpus // 7)
        for policy in args.policies.split(","):
            wall, floor = simulate(tokens, gpus, shards, policy, args.cap, steps, args.gap_s)
            print(f"model: gpus={gpus} shards={shards} policy={policy} ratio={floor / wall:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
