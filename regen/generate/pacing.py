"""How many requests the client keeps in flight on one server: no more than the server finishes within the
request timeout, queue included, and adapted while the run goes on (issue 48).

A server runs at most ``running_cap`` requests at once; the rest wait in its queue. With ``n`` in flight and
every request as long as the answer budget allows (``max_tokens``), the last one sent waits for ``n /
running_cap`` rounds of the batch, each as long as one worst-case request (:meth:`RequestTime.worst_s`), so it
is answered within ``request_timeout_s`` only while ``n <= running_cap * timeout / worst_s``: the *timeout
window*. The client plans ``min(planned in flight, timeout window)`` (:func:`plan_in_flight`) and starts its
:class:`AimdWindow` there: the window halves on a burst of overload signals and grows back while answers
come clean (see :class:`AimdWindow` for how overload is told from faults). A request waits for room in the
window *before* it is sent: that wait is the client's own and no request timeout runs during it.

:class:`RequestTime` is the worst-case time of one request from a decode-step line (the pilot's measured line,
``results/plan/pilot.json``, or :data:`ESTIMATED_GPU_STEP`, a conservative estimate that says it is one) or
from the stand-in's measured speed (``regen.serving.simulated_mode``). :func:`timeout_conflict` says when the
timeout is shorter than one worst-case request at the planned batch, with the number and the fix
(``regen check`` prints it).
"""

from __future__ import annotations

import asyncio
import collections
import math
from dataclasses import dataclass, field

from regen.runconfig import GenerateConfig

#: a window's overload signals are judged over at least this many answers (a small window on enough of them)
MIN_EPOCH = 20
#: the background share of overload-like signals (503s, timeouts behind other answers) is measured over
#: about this many answers of windows that did not shrink, and never taken above MAX_BACKGROUND (a server
#: failing more than that at any load is broken, not busy: the breaker and the attempts handle it)
BACKGROUND_ANSWERS = 500
MAX_BACKGROUND = 0.1
#: a burst: more signals in one window's answers than the background explains by this many standard
#: deviations (binomial), and at least ``MIN_BURST``
BURST_SIGMAS = 3.0
MIN_BURST = 4
#: the factor a window shrinks by on overload, and the share of the planned count it grows by per clean
#: window once back at half its plan (below that it doubles per clean window)
DECREASE = 0.5
INCREASE_SHARE = 0.05
#: the planned window is this share of the timeout window (the rest is room for prefills and slow steps)
TIMEOUT_MARGIN = 0.8


@dataclass(frozen=True, slots=True)
class RequestTime:
    """How long one request takes on a server: ``max_tokens`` decode steps of ``fixed_s + per_request_s *
    batch`` each, plus ``admit_s`` for each request admitted to the batch meanwhile (the prefills between the
    steps: over one request's life the whole batch turns over once). ``estimate``: not measured."""

    fixed_s: float
    per_request_s: float
    admit_s: float
    basis: str
    estimate: bool

    def step_s(self, batch: int) -> float:
        return self.fixed_s + self.per_request_s * batch

    def worst_s(self, batch: int, max_tokens: int) -> float:
        """Seconds of one request decoding ``max_tokens`` tokens with ``batch`` running."""
        return max_tokens * self.step_s(batch) + batch * self.admit_s

    def describe(self) -> str:
        what = "an estimate" if self.estimate else "measured"
        return (
            f"{self.fixed_s * 1000:.2f} ms + {self.per_request_s * 1000:.4f} ms a request per decode step, "
            f"{self.admit_s * 1000:.2f} ms a prefill ({what}: {self.basis})"
        )


#: the decode-step line assumed when none was measured (no ``regen tune --sweep`` pilot): the slowest line
#: measured on an H200 so far, Qwen3.6-27B hybrid at 607 running, 90.9 ms a step (measurements, 2026-11-30),
#: is 30 ms + 0.1 ms a request; Llama-3.1-8B at 671 running took ~47 ms (dense-2026-12-02-pages), half of it.
#: A prefill of a few hundred prompt tokens between the steps: 2 ms.
ESTIMATED_GPU_STEP = RequestTime(
    0.030, 0.0001, 0.002, "no measured step line: the slowest line measured on an H200 (90.9 ms at 607)", True
)


def measured_step(step_model: object) -> RequestTime | None:
    """The pilot's measured decode-step line (``pilot.json``'s ``projection_closed_loop.step_model``), or
    None when it holds none."""
    if not isinstance(step_model, dict):
        return None
    try:
        fixed, per = float(step_model["fixed_s"]), float(step_model["per_request_s"])
    except (KeyError, TypeError, ValueError):
        return None
    if per <= 0 or fixed < 0:
        return None
    basis = str(step_model.get("basis") or "the pilot's step line")
    return RequestTime(
        fixed, per, ESTIMATED_GPU_STEP.admit_s, f"regen tune --sweep: {basis}; prefill estimated", False
    )


@dataclass(frozen=True, slots=True)
class InFlightPlan:
    """The client's in-flight count on one server: ``start`` (where its window begins) and ``ceiling`` (the
    planned count it never exceeds), with the timeout window and what it came from."""

    ceiling: int
    start: int
    timeout_window: int | None
    worst_s: float | None
    running_cap: int | None
    #: why the ceiling is above the plan's count: every request left fits under the server's own cap
    whole_shard: str | None = None

    def describe(self) -> str:
        why = f"; {self.whole_shard}" if self.whole_shard else ""
        if self.timeout_window is None or self.worst_s is None:
            return f"{self.start} in flight (no request time known: the planned count{why})"
        return (
            f"{self.start} in flight (planned {self.ceiling}; within the timeout {self.timeout_window}: "
            f"a {self.worst_s:.2f}-s worst-case request at {self.running_cap} running{why})"
        )


def whole_shard_offer(
    planned: int, server_cap: int | None, requests_left: int | None
) -> tuple[int, str | None]:
    """The count to plan in flight, and why when it is not ``planned``: every request left when they all fit
    under the server's own running cap (the plan's count fills the KV at the expected length; with the whole
    shard in the queue SGLang's scheduler admits by free KV itself, as its offline engine does with a whole
    dataset: on the H100 at 2,000 prompts, 1,024 in flight took 26.1 s and all 2,000 24.3 s,
    ``measurements/race-2026-12-06-h100-pilot``)."""
    if not server_cap or not requests_left or not planned < requests_left <= server_cap:
        return planned, None
    return requests_left, (
        f"all {requests_left:,} requests left offered at once: they fit under the server's cap of "
        f"{server_cap:,}, and SGLang admits them by free KV"
    )


def longest_request_tokens(cfg: GenerateConfig) -> int:
    """The most tokens one request may ask for: ``max_tokens``, or its truncation retry's."""
    limit = cfg.sampling.max_tokens
    return math.ceil(limit * cfg.retry_max_tokens_factor) if cfg.truncation.retries_bigger else limit


def timeout_window(
    running_cap: int, timeout_s: float, max_tokens: int, time: RequestTime
) -> tuple[int, float]:
    """(in flight the server finishes within ``timeout_s``, the worst-case request's seconds at its cap)."""
    worst = time.worst_s(running_cap, max_tokens)
    window = math.floor(TIMEOUT_MARGIN * running_cap * timeout_s / worst) if worst > 0 else running_cap
    return max(1, window), worst


def plan_in_flight(
    planned: int,
    running_cap: int | None,
    timeout_s: float,
    max_tokens: int,
    time: RequestTime | None,
    whole_shard: str | None = None,
) -> InFlightPlan:
    """``min(planned, timeout window)`` (at least 1): where the client's window starts; ``planned`` stays
    its ceiling (the window grows back to it while nothing times out)."""
    planned = max(1, planned)
    if time is None or not running_cap:
        return InFlightPlan(planned, planned, None, None, running_cap, whole_shard)
    batch = min(running_cap, planned)
    window, worst = timeout_window(batch, timeout_s, max_tokens, time)
    return InFlightPlan(planned, min(planned, window), window, worst, batch, whole_shard)


def timeout_conflict(running_cap: int, timeout_s: float, max_tokens: int, time: RequestTime) -> str | None:
    """Why ``request_timeout_s`` and the plan disagree (one worst-case request at the planned batch takes
    longer than the timeout), with the fix; None when they agree."""
    worst = time.worst_s(running_cap, max_tokens)
    if worst <= timeout_s:
        return None
    # worst_s is a line in the batch: the largest batch whose worst-case request fits the timeout
    per_batch = max_tokens * time.per_request_s + time.admit_s
    lower = math.floor((timeout_s - max_tokens * time.fixed_s) / per_batch) if per_batch > 0 else 0
    fits = 1 <= lower < running_cap
    alone = f" (one such request alone takes {time.worst_s(1, max_tokens):,.0f} s)"
    lower_fix = f" or lower --max-running-requests to {lower}" if fits else alone
    return (
        f"generate.request_timeout_s {timeout_s:g} s is shorter than one worst-case request at the planned "
        f"batch: {max_tokens} tokens (the longest request's max_tokens) at {running_cap} running take "
        f"{worst:,.0f} s (step {time.step_s(running_cap) * 1000:.1f} ms: {time.describe()}); every answer "
        f"that long times out and is sent again. Raise request_timeout_s to {math.ceil(worst * 1.25)}"
        f"{lower_fix}"
    )


# ------------------------------------------------------------------------------------ the window


OK, OVERLOAD, OTHER = "ok", "overload", "other"


def burst_threshold(answers: int, background: float) -> float:
    """The most overload signals among ``answers`` that random faults at ``background`` share explain:
    their binomial mean plus :data:`BURST_SIGMAS` deviations, and below :data:`MIN_BURST`."""
    mean = background * answers
    spread = BURST_SIGMAS * math.sqrt(max(mean * (1.0 - background), 1.0))
    return max(float(MIN_BURST - 1), mean + spread)


@dataclass(slots=True)
class AimdWindow:
    """The requests in flight on one server, at most ``limit`` (``floor`` <= limit <= ``ceiling``).

    :meth:`acquire` waits for room and hands out a ticket (the send's sequence number); :meth:`release` takes
    it back with the outcome: ``OK`` (an answer), ``OVERLOAD`` (a signal that may mean too many in flight: a
    429 or 503, or a timeout while the server answered others) or ``OTHER`` (not about load: a 500, a refused
    connection, a timeout of a server that answers nobody). Only requests sent since the last decrease are
    judged (those sent before it belong to the window that overloaded).

    Overload or fault: a server returns 503s and drops requests at some share at any load (a proxy, a flaky
    node, the stand-in's injected faults); what overload adds is a *burst*, signals beyond that share that
    come with the load. So the window keeps the *background* share of signals, measured over the windows that
    did not shrink (about :data:`BACKGROUND_ANSWERS` answers, at most :data:`MAX_BACKGROUND`), and halves only
    when the last window's worth of answers (at least :data:`MIN_EPOCH`) holds more signals than that share
    explains (:func:`burst_threshold`: its binomial mean plus 3 deviations, at least :data:`MIN_BURST`). A
    2 % fault rate thus never shrinks it; a window of requests that time out together does at once.

    Recovery: a window of answers (``limit`` of them) that comes clean (no more signals than the background
    share explains, rounded) doubles the limit up to half the plan's start (slow start: after a burst
    collapsed it, the window is back at half its plan after a handful of request times, not hundreds of
    answers), then grows it by :data:`INCREASE_SHARE` of the ceiling per clean window. At the floor a burst
    changes nothing and is not counted as a decrease. ``completed`` counts answers, so a timed-out request
    can tell whether the server answered others while it waited.
    """

    ceiling: int
    limit: float
    floor: int = 1
    #: where the plan starts the window (``InFlightPlan.start``); slow start runs up to half of it
    start: int | None = None
    in_flight: int = 0
    completed: int = 0
    sent: int = 0
    decreases: int = 0
    epoch_from: int = 0  # the first ticket judged: those sent after the last decrease
    background: float = 0.0  # the share of overload signals outside bursts
    recent: collections.deque[bool] = field(default_factory=collections.deque)  # signal or not, newest last
    recent_bad: int = 0
    grow_n: int = 0  # answers judged since the limit last changed
    grow_bad: int = 0
    seen_n: float = 0.0  # answers behind ``background`` (decayed to BACKGROUND_ANSWERS)
    waiters: collections.deque[asyncio.Future[None]] = field(default_factory=collections.deque)

    @classmethod
    def of(cls, plan: InFlightPlan) -> AimdWindow:
        return cls(ceiling=plan.ceiling, limit=float(plan.start), start=plan.start)

    @property
    def room(self) -> int:
        """Requests that may be sent now without waiting."""
        return max(0, math.floor(self.limit) - self.in_flight)

    async def acquire(self) -> int:
        """Wait for room (first come, first served), then count the request in flight; its ticket."""
        if self.in_flight >= math.floor(self.limit) or self.waiters:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.waiters.append(fut)
            try:
                await fut  # _wake counted it in flight when it gave it the room
            except BaseException:
                if fut.done() and not fut.cancelled():
                    self.in_flight -= 1  # woken, then cancelled: its room goes to the next one
                    self._wake()
                elif fut in self.waiters:
                    self.waiters.remove(fut)
                raise
        else:
            self.in_flight += 1
        self.sent += 1
        return self.sent

    def release(self, ticket: int, outcome: str) -> None:
        self.in_flight -= 1
        if outcome == OK:
            self.completed += 1
        if ticket > self.epoch_from and outcome in (OK, OVERLOAD):
            self._judge(outcome == OVERLOAD)
        self._wake()

    def _judge(self, bad: bool) -> None:
        epoch = max(MIN_EPOCH, math.ceil(self.limit))
        self.recent.append(bad)
        self.recent_bad += bad
        while len(self.recent) > epoch:
            self.recent_bad -= self.recent.popleft()
        self.grow_n += 1
        self.grow_bad += bad
        if self.recent_bad > burst_threshold(len(self.recent), self.background):
            self._decrease()
        elif self.grow_n >= math.ceil(self.limit):
            self._learn_background(self.grow_n, self.grow_bad)
            if self.grow_bad <= self.background * self.grow_n + 0.5:
                self._grow()
            self.grow_n = self.grow_bad = 0

    def _learn_background(self, answers: int, bad: int) -> None:
        """Fold a window that did not shrink into the background share (a running mean over about
        BACKGROUND_ANSWERS answers)."""
        kept = min(self.seen_n, BACKGROUND_ANSWERS - answers) if answers < BACKGROUND_ANSWERS else 0.0
        share = (self.background * kept + bad) / (kept + answers)
        self.background = min(MAX_BACKGROUND, share)
        self.seen_n = kept + answers

    def _grow(self) -> None:
        recover_to = max(float(self.floor), (self.start or self.ceiling) / 2)
        if self.limit < recover_to:
            self.limit = min(recover_to, self.limit * 2)
        else:
            self.limit = min(float(self.ceiling), self.limit + max(1.0, INCREASE_SHARE * self.ceiling))

    def _decrease(self) -> None:
        if self.limit > self.floor:  # at the floor a burst has nothing left to shrink: not a decrease
            self.limit = max(float(self.floor), self.limit * DECREASE)
            self.decreases += 1
        self.epoch_from = self.sent
        self.recent.clear()
        self.recent_bad = self.grow_n = self.grow_bad = 0

    def _wake(self) -> None:
        free = math.floor(self.limit) - self.in_flight
        while free > 0 and self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                self.in_flight += 1
                free -= 1
