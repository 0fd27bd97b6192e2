"""Wall time of a generation run from a decode-step cost model: the plateau *and* the drain.

regen's client keeps ``concurrency`` requests in flight (the server's running cap) until the samples
run out; then the batch drains, and each decode step serves fewer requests. A projection that divides
all tokens by the plateau rate misses that tail, which matters when a run is a few times the length
of its longest request (a benchmark, a small shard) and vanishes for long runs.

Model: one decode step of a batch of ``b`` running requests takes ``fixed_s + per_request_s * b``
(weights streamed once per step plus per-request state/KV/GEMM work; SGLang's plateau ``gen
throughput`` already includes the prefills between decode steps). Each request needs as many steps as
it has output tokens. :func:`closed_loop_wall_s` plays the run out exactly: requests are admitted in
order as slots free up, and the time advances from one completion to the next. ``ramp_s`` is the dead
time before the first full batch decodes (the burst of ``concurrency`` prefills at the start; a pilot
measures it as the time from its first request to the first decode line at the running plateau).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True, slots=True)
class StepModel:
    """Seconds per decode step as a line in the batch size, and what the line was drawn from (``basis``:
    a projection says whether its step came from a fit or from one plateau, e.g. after a fit fell back)."""

    fixed_s: float
    per_request_s: float
    basis: str = "given"

    def step_s(self, batch: int) -> float:
        return self.fixed_s + self.per_request_s * batch

    def describe(self) -> str:
        """The line in words, e.g. ``14.53 ms + 0.1390 ms a request``."""
        return f"{self.fixed_s * 1000:.2f} ms + {self.per_request_s * 1000:.4f} ms a request"

    def tokens_per_s(self, batch: int) -> float:
        return batch / self.step_s(batch) if batch > 0 else 0.0

    @classmethod
    def from_plateau(cls, batch: int, tokens_per_s: float, fixed_s: float = 0.0) -> StepModel:
        """The line through a measured plateau (``batch`` running at ``tokens_per_s``) with the given
        batch-independent part (clamped to the measured step time)."""
        if batch < 1 or tokens_per_s <= 0:
            raise ValueError(f"a plateau needs batch >= 1 and a rate > 0 (got {batch}, {tokens_per_s})")
        step = batch / tokens_per_s
        fixed = min(max(0.0, fixed_s), 0.9 * step)
        basis = f"one plateau ({batch} running), fixed part {fixed * 1000:.2f} ms"
        return cls(fixed, (step - fixed) / batch, basis)

    @classmethod
    def fit(cls, plateaus: Sequence[tuple[int, float]], fixed_s: float = 0.0) -> StepModel:
        """Least squares over ``(batch, tok/s)`` plateaus at two or more batch sizes; with one batch
        size, :meth:`from_plateau` with ``fixed_s``. A fit with a negative part falls back too."""
        pts = [(b, b / tps) for b, tps in plateaus if b > 0 and tps > 0]
        if not pts:
            raise ValueError("no plateau to fit a step model to")
        xs = [b for b, _ in pts]
        if len(set(xs)) < 2:
            b, step = max(pts)
            return cls.from_plateau(b, b / step, fixed_s)
        n = len(pts)
        mx = sum(xs) / n
        my = sum(s for _, s in pts) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (s - my) for x, s in pts) / sxx
        intercept = my - slope * mx
        if slope <= 0 or intercept < 0:
            b, step = max(pts)
            one = cls.from_plateau(b, b / step, fixed_s)
            fell = f"the fit over {n} points had a negative part ({cls(intercept, slope).describe()})"
            return dataclasses.replace(one, basis=f"{one.basis}: {fell}")
        return cls(intercept, slope, f"least squares over {n} points at {len(set(xs))} batch sizes")


#: SGLang's flag that makes its sampling follow each request's seed (``sampling_batch_info``): only then does
#: a truncation retry, sent with the same seed, decode the first attempt's tokens again
DETERMINISTIC_FLAG = "--enable-deterministic-inference"


@dataclasses.dataclass(frozen=True, slots=True)
class Truncation:
    """What a request slot decodes for an answer the model would make ``n`` tokens long, under the
    truncation policy (``regen.generate.request.Requests.answer_turn``): an answer longer than
    ``limit`` stops there; with ``retry`` the same coroutine at once asks again at ``retry_limit``, so the
    slot stays busy for ``limit`` tokens plus the retry's answer. SGLang samples the retry anew (its seed
    counts only under :data:`DETERMINISTIC_FLAG`, ``replays``: then the retry is the first answer again)."""

    limit: int
    policy: str  # generate.truncation
    retry_factor: float  # generate.retry_max_tokens_factor
    replays: bool = False

    @property
    def retry_limit(self) -> int:
        return math.ceil(self.limit * self.retry_factor)

    def slot_tokens(self, lengths: Sequence[int], seed: int = 0) -> list[int]:
        """``lengths`` (answers as long as the model makes them, not capped) as the tokens their slots
        decode: each one over ``limit`` is ``limit`` (``keep``, ``drop``) or ``limit`` plus its retry's
        answer, at most ``retry_limit``: a fresh draw from ``lengths`` (seeded), or itself if ``replays``."""
        rng = random.Random(seed)
        out = []
        for n in lengths:
            if n <= self.limit:
                out.append(n)
            elif self.policy != "retry":
                out.append(self.limit)
            else:
                again = n if self.replays else rng.choice(lengths)
                out.append(self.limit + min(again, self.retry_limit))
        return out

    def retried(self, lengths: Sequence[int]) -> int:
        """How many of ``lengths`` end their first attempt at ``limit``."""
        return sum(1 for n in lengths if n > self.limit)


@dataclasses.dataclass(frozen=True, slots=True)
class RunEstimate:
    wall_s: float
    ramp_s: float  # the start burst (counted in wall_s)
    plateau_s: float  # from the end of the ramp until the last request was admitted
    drain_s: float  # from the last admission to the last completion
    output_tokens: int
    requests: int
    concurrency: int

    def to_json(self) -> dict[str, float | int]:
        return {
            "wall_s": round(self.wall_s, 2),
            "ramp_s": round(self.ramp_s, 2),
            "plateau_s": round(self.plateau_s, 2),
            "drain_s": round(self.drain_s, 2),
            "output_tokens": self.output_tokens,
            "requests": self.requests,
            "concurrency": self.concurrency,
        }


def closed_loop_wall_s(
    lengths: Sequence[int], concurrency: int, step: StepModel, ramp_s: float = 0.0
) -> RunEstimate:
    """Play out ``lengths`` (output tokens per request, in admission order) at ``concurrency``."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    todo = [max(1, int(n)) for n in lengths]
    running: list[int] = []  # heap of the step count at which each running request finishes
    steps = 0
    now = 0.0
    admitted = 0
    last_admission_s = 0.0
    while admitted < len(todo) or running:
        while admitted < len(todo) and len(running) < concurrency:
            heapq.heappush(running, steps + todo[admitted])
            admitted += 1
            last_admission_s = now
        next_done = running[0]
        now += (next_done - steps) * step.step_s(len(running))
        steps = next_done
        while running and running[0] == steps:
            heapq.heappop(running)
    return RunEstimate(
        wall_s=max(0.0, ramp_s) + now,
        ramp_s=max(0.0, ramp_s),
        plateau_s=last_admission_s,
        drain_s=now - last_admission_s,
        output_tokens=sum(todo),
        requests=len(todo),
        concurrency=concurrency,
    )


__all__ = ["DETERMINISTIC_FLAG", "RunEstimate", "StepModel", "Truncation", "closed_loop_wall_s"]
