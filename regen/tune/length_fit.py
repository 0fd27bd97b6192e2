"""Output lengths from a pilot that stopped before its long answers ended: a log-normal fitted with
right-censoring.

A pilot window of 100 s at a batch of 265 on the H200 finished 248 of its 300 samples; the 52 still running
were the long ones, so the finished answers averaged 466 tokens where the run's averaged 632, and the
projection came out 27% short (``measurements/known-target-2026-12-02-n800.md``). Each unfinished
answer is known to be longer than the longest finished first attempt (every first attempt starts with the
window; one that started later is counted as if it had started with it). The log-normal that best explains
both (maximum likelihood: the density at each finished length, the survival at the censoring point for
each unfinished one) puts the unfinished answers back, each at a quantile of the fitted tail above that
point. Those past ``max_tokens`` are left long here: the projections count each as its request slot
decodes it under the truncation policy (the first attempt cut, then its retry:
``regen.tune.closedloop.Truncation``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

_NORMAL = NormalDist()
#: fewer finished lengths than this fit no law: the finished ones are used as they are
MIN_FINISHED_TO_FIT = 20
#: golden-section steps of each one-dimensional search (the bracket shrinks by 0.618 a step)
_SEARCH_STEPS = 60


@dataclass(frozen=True, slots=True)
class CensoredLogNormal:
    """ln(length) ~ Normal(mu, sigma), fitted to ``finished`` lengths and ``unfinished`` ones known only
    to exceed ``censored_at``."""

    mu: float
    sigma: float
    censored_at: int
    unfinished: int

    def tail_lengths(self, cap: int | None) -> list[int]:
        """One length per unfinished answer: evenly spaced quantiles of the fitted law above
        ``censored_at`` (deterministic), each at most ``cap``."""
        if not self.unfinished:
            return []
        floor = _NORMAL.cdf((math.log(max(1, self.censored_at)) - self.mu) / self.sigma)
        out = []
        for k in range(self.unfinished):
            u = min(1 - 1e-12, floor + (1 - floor) * (k + 0.5) / self.unfinished)
            length = max(self.censored_at, round(math.exp(self.mu + self.sigma * _NORMAL.inv_cdf(u))))
            out.append(min(cap, length) if cap else length)
        return out


def _log_likelihood(logs: Sequence[float], log_c: float, unfinished: int, mu: float, sigma: float) -> float:
    z = [(x - mu) / sigma for x in logs]
    finished = -len(logs) * math.log(sigma) - 0.5 * sum(v * v for v in z)
    survival = 1 - _NORMAL.cdf((log_c - mu) / sigma)
    return finished + unfinished * math.log(max(survival, 1e-300))


def _golden_max(f: Callable[[float], float], lo: float, hi: float) -> float:
    ratio = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    for _ in range(_SEARCH_STEPS):
        c, d = b - ratio * (b - a), a + ratio * (b - a)
        if f(c) >= f(d):
            b = d
        else:
            a = c
    return (a + b) / 2


def fit_censored_lognormal(finished: Sequence[int], unfinished: int) -> CensoredLogNormal | None:
    """The maximum-likelihood log-normal of ``finished`` lengths plus ``unfinished`` ones longer than the
    longest finished; None with nothing unfinished (the finished lengths are the whole distribution) or
    fewer than :data:`MIN_FINISHED_TO_FIT` positive finished lengths."""
    logs = [math.log(n) for n in finished if n > 0]
    if not unfinished or len(logs) < MIN_FINISHED_TO_FIT or len(set(logs)) < 2:
        return None
    top = max(n for n in finished if n > 0)
    log_c = math.log(top)
    mean = sum(logs) / len(logs)
    spread = max(1e-3, math.sqrt(sum((x - mean) ** 2 for x in logs) / len(logs)))

    def best_mu(sigma: float) -> float:
        def at(mu: float) -> float:
            return _log_likelihood(logs, log_c, unfinished, mu, sigma)

        return _golden_max(at, mean - 5, log_c + 5)

    sigma = _golden_max(
        lambda s: _log_likelihood(logs, log_c, unfinished, best_mu(s), s), spread / 4, spread * 4 + 1
    )
    return CensoredLogNormal(mu=best_mu(sigma), sigma=sigma, censored_at=top, unfinished=unfinished)


__all__ = ["MIN_FINISHED_TO_FIT", "CensoredLogNormal", "fit_censored_lognormal"]
