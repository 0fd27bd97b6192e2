"""The pilot's measurement for ``regen tune --sweep``: the candidate and result types, and driving a
pilot shard through the generation client against one server, read back from its journal
(:mod:`regen.tune.sweep` starts the servers, ranks them and projects the run)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regen.generate.client import ProgressOptions, ShardJob, generate_shard_async
from regen.generate.journal import read_journal_entries
from regen.layout.beside import ScratchShardFiles
from regen.runconfig import GenerateConfig
from regen.serving.metrics import (
    DecodeSample,
    SteadyState,
    sample_metrics,
)
from regen.sglang.flags import parse_flags
from regen.types import Endpoint, Sample

log = logging.getLogger("regen.tune.sweep")

REPEAT_MARK = "~r"
DEFAULT_WARMUP_FRACTION = 0.2
#: after its window a pilot sends nothing new for this share of its seconds and lets its batch fall: the
#: server's decode lines at the falling batch give the decode step its batch-independent part (the drain's
#: cost, which a plateau alone cannot show: regen.tune.sweep.step_model_of), and long answers still running
#: get to finish. Cancelled at its window's end, a pilot's server log has no falling batch: the candidate's
#: server is stopped right after, and SGLang 0.5.17 aborts a disconnected request within 4 s anyway
#: (``SGLANG_REQUEST_STATE_WAIT_TIMEOUT``, ``tokenizer_manager._wait_one_response``)
DEFAULT_DRAIN_FRACTION = 0.25
SWEEP_SHARD = "pilot"


class SweepError(RuntimeError):
    """No candidate could be measured, or the sweep's inputs are unusable."""


# ------------------------------------------------------------------------------------ types --
@dataclass(frozen=True, slots=True)
class SweepCandidate:
    """One config to benchmark: complete launch args plus the tuner's predicted running cap."""

    args: tuple[str, ...]
    predicted_running: int | None = None
    label: str = ""


@dataclass(frozen=True, slots=True)
class LengthStats:
    """Completion tokens per finished sample."""

    count: int
    mean: float
    p50: int
    p90: int
    p99: int
    max: int
    truncation_rate: float

    @classmethod
    def of(cls, tokens: Sequence[int], truncated: int) -> LengthStats:
        if not tokens:
            return cls(0, 0.0, 0, 0, 0, 0, 0.0)
        ordered = sorted(tokens)
        return cls(
            count=len(ordered),
            mean=sum(ordered) / len(ordered),
            p50=percentile(ordered, 0.50),
            p90=percentile(ordered, 0.90),
            p99=percentile(ordered, 0.99),
            max=ordered[-1],
            truncation_rate=truncated / len(ordered),
        )


@dataclass(frozen=True, slots=True)
class PilotMeasurement:
    """What one bounded client run against one server measured (from its journal)."""

    concurrency: int
    started_at: float
    stopped_at: float
    window_s: float  # measurement window: stop - (start + warmup)
    sent: int  # samples handed to the client
    completed: int  # records in the journal
    failed: int  # terminal failures in the journal
    unfinished_at_stop: int  # in flight when the time was up (censored)
    window_requests: int
    window_output_tokens: int
    out_tok_s: float
    req_s: float
    lengths: LengthStats
    latency_p50_s: float
    latency_p90_s: float
    completion_tokens: tuple[int, ...] = dataclasses.field(default=(), repr=False)
    truncated: int = 0
    polled: tuple[DecodeSample, ...] = dataclasses.field(default=(), repr=False)  # /metrics samples
    server: SteadyState | None = None  # the server's steady decode rate during the pilot
    first_request_s: float | None = None  # the warm-up request before the window (see warm_up)
    #: distinct samples sent (first attempts, not the cycled repeats) and how many of them had not
    #: finished when the time was up: the length distribution's censored share
    first_attempts: int = 0
    first_attempts_unfinished: int = 0


@dataclass(frozen=True, slots=True)
class CandidateResult:
    """One row of the sweep table."""

    label: str
    args: tuple[str, ...]
    predicted_running: int | None
    ok: bool
    error: str | None = None
    measurement: PilotMeasurement | None = None

    @property
    def out_tok_s(self) -> float:
        """Client-side: completion tokens finished inside the measurement window, per second."""
        return self.measurement.out_tok_s if self.measurement is not None else 0.0

    @property
    def decode_tok_s(self) -> float | None:
        """Server-side steady decode rate (None when the server gave no reading)."""
        m = self.measurement
        return m.server.median_tps if m is not None and m.server is not None else None

    @property
    def ramp_s(self) -> float | None:
        """From the pilot's first request to the server's first decode line at the running plateau."""
        m = self.measurement
        if m is None or m.server is None or m.server.plateau_from is None:
            return None
        return max(0.0, m.server.plateau_from - m.started_at)

    @property
    def rate_tok_s(self) -> float:
        """What candidates are ranked and runs projected by: the server's steady rate, else the client's
        (both count accepted tokens under speculative decoding: see :func:`choose`)."""
        decode = self.decode_tok_s
        return decode if decode else self.out_tok_s

    @property
    def accept_len(self) -> float | None:
        """The accept length SGLang reported at the plateau (speculative decoding), else None."""
        m = self.measurement
        return m.server.accept_len if m is not None and m.server is not None else None

    @property
    def speculative(self) -> str | None:
        """``NEXTN 3 steps``-style description of the candidate's speculative decoding, None without."""
        flags = parse_flags(list(self.args))
        if not flags.speculative_algorithm:
            return None
        steps = flags.speculative_num_steps or 3
        return f"{flags.speculative_algorithm} {steps} step{'s' if steps != 1 else ''}"

    def to_json(self) -> dict[str, Any]:
        m = self.measurement
        out: dict[str, Any] = {
            "label": self.label,
            "args": list(self.args),
            "predicted_running": self.predicted_running,
            "ok": self.ok,
            "error": self.error,
        }
        if m is not None:
            out.update(
                {
                    "concurrency": m.concurrency,
                    "out_tok_s": round(m.out_tok_s, 2),
                    "req_s": round(m.req_s, 3),
                    "window_s": round(m.window_s, 3),
                    "window_requests": m.window_requests,
                    "window_output_tokens": m.window_output_tokens,
                    "sent": m.sent,
                    "completed": m.completed,
                    "failed": m.failed,
                    "unfinished_at_stop": m.unfinished_at_stop,
                    "first_attempts": m.first_attempts,
                    "first_attempts_unfinished": m.first_attempts_unfinished,
                    "lengths": dataclasses.asdict(m.lengths),
                    "latency_p50_s": round(m.latency_p50_s, 3),
                    "latency_p90_s": round(m.latency_p90_s, 3),
                    "decode_tok_s": None if self.decode_tok_s is None else round(self.decode_tok_s, 1),
                    "rate_tok_s": round(self.rate_tok_s, 2),
                    "accept_len": self.accept_len,
                    "ramp_s": None if self.ramp_s is None else round(self.ramp_s, 1),
                    "server_steady_state": None if m.server is None else m.server.to_json(),
                    "first_request_s": None if m.first_request_s is None else round(m.first_request_s, 2),
                }
            )
        return out


@dataclass(frozen=True, slots=True)
class SweepResult:
    rows: tuple[CandidateResult, ...]
    best_index: int
    seconds_per_candidate: float
    warmup_s: float
    pilot_samples: int

    @property
    def best(self) -> CandidateResult:
        return self.rows[self.best_index]

    @property
    def rate_method(self) -> str:
        m = self.best.measurement
        if m is not None and m.server is not None:
            return m.server.method
        return "client: completion tokens finished in the window / window"

    @property
    def best_args(self) -> tuple[str, ...]:
        return self.best.args

    def pooled_lengths(self) -> LengthStats:
        """Output lengths over every measured candidate (the server config does not change them)."""
        tokens: list[int] = []
        truncated = 0
        for row in self.rows:
            if row.measurement is not None:
                tokens += row.measurement.completion_tokens
                truncated += row.measurement.truncated
        return LengthStats.of(tokens, truncated)

    def to_json(self) -> dict[str, Any]:
        return {
            "best_index": self.best_index,
            "best_label": self.best.label,
            "best_args": list(self.best_args),
            "best_out_tok_s": round(self.best.out_tok_s, 2),
            "best_rate_tok_s": round(self.best.rate_tok_s, 2),
            "rate_method": self.rate_method,
            "seconds_per_candidate": self.seconds_per_candidate,
            "warmup_s": self.warmup_s,
            "pilot_samples": self.pilot_samples,
            "candidates": [r.to_json() | {"speculative": r.speculative} for r in self.rows],
            "lengths": dataclasses.asdict(self.pooled_lengths()),
            "mtp": mtp_decision(self),
        }


# ------------------------------------------------------------------------------ helpers --
def percentile(ordered: Sequence[float], q: float) -> Any:
    """Nearest-rank percentile of an ascending sequence (an element of it)."""
    if not ordered:
        raise ValueError("percentile of an empty sequence")
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def cycled(samples: Sequence[Sample]) -> Iterator[Sample]:
    """The samples over and over; the k-th repeat of an id is ``{id}~r{k}`` (a fresh seed)."""
    if not samples:
        raise SweepError("the pilot has no samples")
    rnd = 0
    while True:
        for s in samples:
            yield s if rnd == 0 else dataclasses.replace(s, id=f"{s.id}{REPEAT_MARK}{rnd}")
        rnd += 1


def _completion_tokens(entry: Mapping[str, Any]) -> int:
    turns = entry.get("turns")
    if turns:
        return sum(int((t.get("usage") or {}).get("completion_tokens") or 0) for t in turns)
    return int((entry.get("usage") or {}).get("completion_tokens") or 0)


def measure_journal(
    journal_path: str | os.PathLike[str],
    started_at: float,
    stopped_at: float,
    warmup_s: float,
    concurrency: int,
    sent: int,
    first_ids: Collection[str] | None = None,
) -> PilotMeasurement:
    """Throughput in ``[started_at + warmup_s, stopped_at]`` (every completed request) and lengths of the
    completed first attempts: the entries whose id is one of ``first_ids``, the samples the pilot cycles
    (None: every request sent was a first attempt)."""
    entries = read_journal_entries(journal_path)

    def is_first(entry: Mapping[str, Any]) -> bool:
        return first_ids is None or entry.get("id") in first_ids

    records = [e for e in entries if e.get("kind") == "record"]
    failed = sum(1 for e in entries if e.get("kind") == "failed")
    first_failed = sum(1 for e in entries if e.get("kind") == "failed" and is_first(e))
    first_sent = sent if first_ids is None else min(sent, len(first_ids))
    window_start = started_at + warmup_s
    window_s = max(1e-9, stopped_at - window_start)
    tokens: list[int] = []
    latencies: list[float] = []
    truncated = 0
    window_requests = window_tokens = 0
    first_done = 0
    for rec in records:
        n = _completion_tokens(rec)
        if is_first(rec):
            # lengths from each sample's first attempt only: in the cycled closed loop a slot finishes
            # several short answers in the time of one long one, so the repeats over-represent short ones
            tokens.append(n)
            truncated += bool(rec.get("truncated"))
            first_done += 1
        timings = rec.get("timings") or {}
        latency = float(timings.get("latency_s") or 0.0)
        latencies.append(latency)
        finished_at = float(timings.get("started_at") or 0.0) + latency
        if window_start <= finished_at <= stopped_at:
            window_requests += 1
            window_tokens += n
    lat = sorted(latencies)
    return PilotMeasurement(
        concurrency=concurrency,
        started_at=started_at,
        stopped_at=stopped_at,
        window_s=window_s,
        sent=sent,
        completed=len(records),
        failed=failed,
        unfinished_at_stop=max(0, sent - len(records) - failed),
        window_requests=window_requests,
        window_output_tokens=window_tokens,
        out_tok_s=window_tokens / window_s,
        req_s=window_requests / window_s,
        lengths=LengthStats.of(tokens, truncated),
        latency_p50_s=percentile(lat, 0.5) if lat else 0.0,
        latency_p90_s=percentile(lat, 0.9) if lat else 0.0,
        completion_tokens=tuple(tokens),
        truncated=truncated,
        first_attempts=first_sent,
        first_attempts_unfinished=max(0, first_sent - first_done - first_failed),
    )


class _Counted:
    """An iterator that counts what it handed out, and ends when told to (:meth:`stop`)."""

    def __init__(self, it: Iterator[Sample]) -> None:
        self.it = it
        self.count = 0
        self.stopped = False

    def __iter__(self) -> _Counted:
        return self

    def __next__(self) -> Sample:
        if self.stopped:
            raise StopIteration
        item = next(self.it)
        self.count += 1
        return item

    def stop(self) -> None:
        self.stopped = True


async def drive_pilot_async(
    endpoint: Endpoint,
    samples: Sequence[Sample],
    generate_cfg: GenerateConfig,
    seconds: float,
    journal_path: str | os.PathLike[str],
    warmup_s: float | None = None,
    metrics_every_s: float = 2.0,
    drain_s: float | None = None,
) -> PilotMeasurement:
    """Drive ``endpoint`` with the real client for ``seconds``, then send nothing new for up to ``drain_s``
    (default :data:`DEFAULT_DRAIN_FRACTION` of ``seconds``) while the requests in flight finish, then cancel
    it and measure the journal: throughput over the window, lengths over every finished first attempt.

    Concurrency is the endpoint's effective running cap (``generate.concurrency`` when the server does
    not say). Raises :class:`ShardFailedError` when the server fails the pilot before the time is up.
    """
    concurrency = endpoint.max_running_requests or generate_cfg.concurrency
    if not concurrency:
        raise SweepError(f"{endpoint.url}: the server reports no running cap; set generate.concurrency")
    gcfg = dataclasses.replace(generate_cfg, concurrency=int(concurrency))
    journal = Path(journal_path)
    journal.parent.mkdir(parents=True, exist_ok=True)
    journal.unlink(missing_ok=True)
    stream = _Counted(cycled(samples))
    warm = seconds * DEFAULT_WARMUP_FRACTION if warmup_s is None else warmup_s
    progress = ProgressOptions(log_every_s=max(5.0, seconds), status_path=None, bar=False)
    started = time.time()
    _, records_out, failed_out = ScratchShardFiles.beside(journal).all()
    run = generate_shard_async(
        ShardJob(stream, journal, records_out, failed_out, gcfg, endpoint, SWEEP_SHARD, progress)
    )
    task = asyncio.create_task(run)
    polled: list[DecodeSample] = []
    poller = asyncio.create_task(poll_metrics(endpoint, polled, metrics_every_s))
    done, _ = await asyncio.wait({task}, timeout=seconds)
    stopped = time.time()
    if done:  # only a failure ends a cycled pilot early
        poller.cancel()
        task.result()
        raise SweepError("the pilot client stopped before its time was up")  # pragma: no cover
    stream.stop()
    drain = seconds * DEFAULT_DRAIN_FRACTION if drain_s is None else drain_s
    if drain > 0:
        await asyncio.wait({task}, timeout=drain)
    poller.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await poller
    if task.done():
        task.result()  # the drain ended with every request finished; a failure is the server's
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    first_ids = {s.id for s in samples}
    m = measure_journal(journal, started, stopped, warm, int(concurrency), stream.count, first_ids)
    return dataclasses.replace(m, polled=tuple(polled))


async def poll_metrics(endpoint: Endpoint, into: list[DecodeSample], every_s: float) -> None:
    """Append a ``/metrics`` reading every ``every_s`` seconds until cancelled."""
    while True:
        await asyncio.sleep(every_s)
        found = await asyncio.to_thread(sample_metrics, endpoint.url, endpoint.api_key)
        if found is not None:
            into.append(found)


def drive_pilot(
    endpoint: Endpoint,
    samples: Sequence[Sample],
    generate_cfg: GenerateConfig,
    seconds: float,
    journal_path: str | os.PathLike[str],
    warmup_s: float | None = None,
    metrics_every_s: float = 2.0,
    drain_s: float | None = None,
) -> PilotMeasurement:
    """Blocking :func:`drive_pilot_async`."""
    return asyncio.run(
        drive_pilot_async(
            endpoint, samples, generate_cfg, seconds, journal_path, warmup_s, metrics_every_s, drain_s
        )
    )


def mtp_decision(result: SweepResult) -> dict[str, Any] | None:
    """Why the sweep kept MTP on or off (None when it measured no speculative candidate nor tried one):
    the best measured with and without speculative decoding, their ratio, the accept length SGLang
    reported, and a sentence for ``regen tune``."""
    spec = [r for r in result.rows if r.speculative]
    if not spec:
        return None
    ok = [r for r in result.rows if r.ok and r.measurement is not None]
    on = max((r for r in ok if r.speculative), key=lambda r: r.rate_tok_s, default=None)
    off = max((r for r in ok if not r.speculative), key=lambda r: r.rate_tok_s, default=None)
    best = result.best
    out: dict[str, Any] = {
        "on": best.speculative is not None,
        "best_on": None if on is None else _row_brief(on),
        "best_off": None if off is None else _row_brief(off),
    }
    ratio = on.rate_tok_s / off.rate_tok_s if on is not None and off is not None and off.rate_tok_s else None
    out["on_over_off"] = None if ratio is None else round(ratio, 3)
    if on is None:
        errors = "; ".join(f"{r.label}: {r.error}" for r in spec if r.error)
        out["why"] = f"MTP off: no speculative candidate could be measured ({errors or 'none ran'})"
    elif off is None:
        out["why"] = f"MTP on: nothing without speculative decoding could be measured ({on.label})"
    else:
        acc = f"accept length {on.accept_len:.2f}" if on.accept_len is not None else "accept length unknown"
        if best.speculative is not None:
            out["why"] = (
                f"MTP on: measured {ratio:.2f}x the best without it ({best.label}, {best.speculative}, "
                f"{best.rate_tok_s:.0f} vs {off.rate_tok_s:.0f} accepted tok/s, {acc})"
            )
        else:
            out["why"] = (
                f"MTP off: the best MTP candidate ({on.label}, {on.speculative}, {acc}) measured "
                f"{ratio:.2f}x the best without it ({on.rate_tok_s:.0f} vs {off.rate_tok_s:.0f} accepted "
                "tok/s)"
            )
    return out


def _row_brief(row: CandidateResult) -> dict[str, Any]:
    rate = round(row.rate_tok_s, 1)
    brief = {"label": row.label, "speculative": row.speculative, "rate_tok_s": rate}
    return {**brief, "accept_len": row.accept_len}


def choose(rates: Sequence[float]) -> int:
    """The index of the candidate the sweep keeps among measured ones, by their :attr:`CandidateResult.
    rate_tok_s`: the highest rate; ties go to the earlier (the tuner's recommendation comes first).

    The rate is SGLang's ``gen throughput``, which counts every token a request gains (a speculative
    verify step adds each request's accepted drafts and its bonus token: ``batch_result_processor`` and
    ``MetricsReporter.update_spec_metrics``, 0.5.17 and 0.5.23), so MTP candidates rank by accepted
    tokens per second, not by verify steps."""
    if not rates:
        raise SweepError("no measured candidate to choose from")
    return max(range(len(rates)), key=lambda i: (rates[i], -i))
