"""The simulated server in virtual time, for run-level benchmarks (``bench/efficiency.py``).

Plugged into ``regen.simulated`` through its server hook: ``$REGEN_SIM_SERVER`` set to
``bench.sim_virtual:virtual_server`` and the clock's fields as JSON in ``$REGEN_SIM_VIRTUAL`` (a
subprocess or a workflow's servers inherit both), or in a thread ``start_simulated_server(
server_factory=functools.partial(VirtualSimulatedServer, clock=...))``. The decode step is
``regen.tune.closedloop.StepModel``, the one decode-step time model.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import math
import os
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import orjson
from aiohttp import web

from regen.simulated.completion import Ask, Completion
from regen.simulated.faults import unit_hash
from regen.simulated.options import SimOptions
from regen.simulated.requestlog import LogWriter, RequestLog
from regen.simulated.server import SimulatedServer
from regen.simulated.tokens import WORDS
from regen.tune.closedloop import StepModel

#: JSON object of VirtualTime fields for the servers of a process tree (with the hook set to virtual_server)
VIRTUAL_ENV = "REGEN_SIM_VIRTUAL"
#: the value of regen.simulated.launcher.SERVER_HOOK_ENV that runs servers in virtual time
VIRTUAL_HOOK = "bench.sim_virtual:virtual_server"


@dataclass(frozen=True, slots=True)
class VirtualTime:
    """A GPU-shaped server in virtual time, for run-level benchmarks (``bench/efficiency.py``).

    Virtual seconds = ``speed`` x (real seconds since the Unix time ``epoch``), the same on every server
    that gets the same ``epoch``. A decode step with N running requests takes ``step_ms +
    step_ms_per_running x N`` virtual ms and gives each running request one token (the H200 fit of
    issue #16 by default: 350 running decode 5,220 tok/s); requests beyond the running cap wait in a
    FIFO queue, as in SGLang. A request's output length is drawn per sample id from a lognormal of mean
    ``length_mean`` and shape ``length_sigma``, capped at ``length_cap`` and at the request's
    ``max_tokens``. Text is a few synthetic words (the usage counts the modelled tokens): the response
    keeps SGLang's shape, not its size.
    """

    speed: float
    epoch: float
    step_ms: float = 13.2
    step_ms_per_running: float = 0.154
    length_mean: float = 3000.0
    length_sigma: float = 1.0
    length_cap: int = 8192
    seed: int = 0
    #: a ``Decode batch`` line every this many virtual decode steps, as SGLang's ``decode_log_interval``
    #: (0.5.17 ``metrics_reporter.py``), so a line's tokens are its running count times the interval
    #: (``bench.gpu.serverlog.line_tokens``); 0: the simulated server's lines every ``log_interval_s``
    decode_log_steps: int = 0

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> VirtualTime:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(obj) - known)
        if unknown:
            raise ValueError(f"--virtual: unknown key(s) {unknown}; known: {sorted(known)}")
        out = cls(**obj)
        if out.speed <= 0 or out.step_ms <= 0 or out.step_ms_per_running < 0 or out.length_cap < 1:
            raise ValueError(f"--virtual: speed and step_ms must be > 0, length_cap >= 1: {obj}")
        return out

    def now(self) -> float:
        """Virtual seconds now."""
        return (time.time() - self.epoch) * self.speed

    def real_time(self, virtual_s: float) -> float:
        """The Unix time at which virtual time ``virtual_s`` is reached."""
        return self.epoch + virtual_s / self.speed

    @property
    def steps(self) -> StepModel:
        """The decode-step time model (``regen.tune.closedloop.StepModel``) in virtual seconds."""
        return StepModel(self.step_ms / 1000.0, self.step_ms_per_running / 1000.0)

    def step_s(self, running: int) -> float:
        """Virtual seconds of one decode step with ``running`` requests."""
        return self.steps.step_s(running)

    def full_batch_tokens_per_s(self, cap: int) -> float:
        """Decode tokens per virtual second of one server running ``cap`` requests."""
        return self.steps.tokens_per_s(cap)

    def output_tokens(self, sample_key: str, max_tokens: int) -> int:
        """The modelled output length of ``sample_key`` (deterministic), at most ``max_tokens``."""
        u1 = max(unit_hash(self.seed, "vlen1", sample_key), 1e-12)
        u2 = unit_hash(self.seed, "vlen2", sample_key)
        normal = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
        mu = math.log(self.length_mean) - self.length_sigma**2 / 2.0
        drawn = max(1, round(math.exp(mu + self.length_sigma * normal)))
        return min(drawn, self.length_cap, max_tokens)


class FluidBatch:
    """Continuous batching in virtual time: every running request gains one token per step, so one
    progress counter (tokens per request so far) orders all completions; the running set changes only
    at arrivals and completions, between which the step time is constant."""

    def __init__(
        self, clock: VirtualTime, cap: int, on_line: Callable[[int, float, float], None] | None = None
    ) -> None:
        self.clock = clock
        self.cap = cap
        self.progress = 0.0
        self.at = clock.now()
        #: (running, tokens, virtual seconds) of every ``clock.decode_log_steps`` steps
        self.on_line = on_line if clock.decode_log_steps > 0 else None
        self.next_line = float(clock.decode_log_steps)
        self.line_tokens = 0.0
        self.line_at = self.at
        self.running: list[
            tuple[float, int, asyncio.Future[float]]
        ] = []  # heap of (done at progress, seq, fut)
        self.waiting: deque[tuple[int, asyncio.Future[float]]] = deque()
        self.seq = 0

    def next_completion(self) -> float | None:
        """Virtual time of the next completion (None when nothing runs)."""
        if not self.running:
            return None
        return self.at + (self.running[0][0] - self.progress) * self.clock.step_s(len(self.running))

    def advance(self, now: float) -> None:
        """Complete every request due by virtual time ``now`` (each at its own virtual time)."""
        while (due := self.next_completion()) is not None and due <= now:
            self._decode_to(self.running[0][0], due)
            _, _, fut = heapq.heappop(self.running)
            if not fut.done():
                fut.set_result(due)
            self._admit()
        if self.running:
            self._decode_to(self.progress + (now - self.at) / self.clock.step_s(len(self.running)), now)
        self.at = max(self.at, now)

    def _decode_to(self, progress: float, at: float) -> None:
        """Run the current batch to ``progress`` (reached at virtual time ``at``), with a decode line at
        every ``decode_log_steps`` steps on the way."""
        running = len(self.running)
        while self.on_line is not None and self.next_line <= progress:
            t = self.at + (self.next_line - self.progress) * self.clock.step_s(running)
            self.line_tokens += (self.next_line - self.progress) * running
            self.progress, self.at = self.next_line, t
            self.on_line(running, self.line_tokens, t - self.line_at)
            self.line_tokens, self.line_at = 0.0, t
            self.next_line += self.clock.decode_log_steps
        self.line_tokens += (progress - self.progress) * running
        self.progress, self.at = progress, at

    def arrive(self, tokens: int, fut: asyncio.Future[float]) -> None:
        self.waiting.append((tokens, fut))
        self._admit()

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.cap:
            tokens, fut = self.waiting.popleft()
            if fut.done():  # the client went away while it waited
                continue
            self.seq += 1
            heapq.heappush(self.running, (self.progress + tokens, self.seq, fut))


#: the modelled virtual completion time of the request the current handler task serves
_DONE_AT: contextvars.ContextVar[float | None] = contextvars.ContextVar("regen_sim_done_at", default=None)


class VirtualRequestLog(RequestLog):
    """The request log with each event's virtual time ``vt`` (for ``completed``: the modelled
    completion time, not the later moment the handler got to answer)."""

    def __init__(self, path: str | None, clock: VirtualTime) -> None:
        super().__init__(path)
        self.clock = clock

    def __call__(self, event: str, sample_id: str | None, **extra: Any) -> None:
        done_at = _DONE_AT.get() if event == "completed" else None
        super().__call__(event, sample_id, vt=self.clock.now() if done_at is None else done_at, **extra)


class VirtualSimulatedServer(SimulatedServer):
    """The simulated server in virtual time: same HTTP surface and shapes, a batch-dependent decode step
    instead of a fixed token rate, modelled output lengths."""

    def __init__(
        self, opts: SimOptions, log: LogWriter, on_crash: Callable[[], None], clock: VirtualTime
    ) -> None:
        super().__init__(opts, log, on_crash)
        self.clock = clock
        self.request_log.close()
        self.request_log = VirtualRequestLog(opts.request_log, self.clock)
        self.batch = FluidBatch(self.clock, opts.running_cap, self._step_line)
        if clock.decode_log_steps > 0:  # its lines come by decode steps, as SGLang's, not every few seconds
            self.opts = replace(opts, log_interval_s=math.inf)
        self.timer: asyncio.TimerHandle | None = None
        self.tokens = None  # lengths are modelled, not tokenized (a tokenizer would recount the few words)

    def make_completion(self, ask: Ask, index: int, key: str) -> Completion:
        max_tokens, ignore_eos, thinking = ask.max_tokens, ask.ignore_eos, ask.thinking
        wanted = self.clock.output_tokens(f"{key}#{index}", 1 << 30)
        total = max_tokens if ignore_eos else min(wanted, max_tokens)
        finish = "length" if ignore_eos or wanted > max_tokens else "stop"
        rng = random.Random(unit_hash(self.clock.seed, "vtext", key, ask.seed, index))
        reasoning = " ".join(rng.choices(WORDS, k=4)) if thinking else None
        r_tokens = total * 3 // 4 if thinking else 0
        return Completion(reasoning, " ".join(rng.choices(WORDS, k=4)), r_tokens, total, finish)

    async def _schedule(self, n_tokens: int, request: web.Request | None = None) -> bool:
        """Decode in virtual time (a client that goes away is not checked for: the bench's never do)."""
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.batch.advance(self.clock.now())
        self.batch.arrive(n_tokens, fut)
        self._sync_counts()
        self._arm()
        try:
            _DONE_AT.set(await fut)
        finally:
            if not fut.done():
                fut.cancel()
                self.batch.running = [r for r in self.batch.running if r[2] is not fut]
                heapq.heapify(self.batch.running)
                self._sync_counts()
        return True

    def _step_line(self, running: int, tokens: float, virtual_s: float) -> None:
        """One ``Decode batch`` line of ``decode_log_steps`` steps, in the base server's format."""
        self.running, self.queued = running, len(self.batch.waiting)
        self.last_gen_throughput = tokens / virtual_s if virtual_s > 0 else 0.0
        self.log(self._decode_line())

    def _sync_counts(self) -> None:
        self.running = len(self.batch.running)
        self.queued = len(self.batch.waiting)

    def _arm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        due = self.batch.next_completion()
        if due is None:
            return
        loop = asyncio.get_running_loop()
        delay = max(0.0, self.clock.real_time(due) - time.time())
        self.timer = loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        self.batch.advance(self.clock.now())
        self._sync_counts()
        self._arm()


def virtual_server(opts: SimOptions, log: LogWriter, on_crash: Callable[[], None]) -> SimulatedServer:
    """The server hook: a VirtualSimulatedServer on the clock of ``$REGEN_SIM_VIRTUAL``."""
    raw = os.environ.get(VIRTUAL_ENV)
    if not raw:
        raise SystemExit(f"{VIRTUAL_HOOK} needs ${VIRTUAL_ENV} (a JSON object of VirtualTime fields)")
    return VirtualSimulatedServer(opts, log, on_crash, VirtualTime.from_json(orjson.loads(raw)))
