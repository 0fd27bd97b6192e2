"""``regen tune --sweep``: benchmark a few candidate server configs live, keep the fastest, project the run.

For each candidate (a complete SGLang launch-arg list, the tuner's recommendation first) the sweep starts
a server through :func:`regen.serving.lifecycle.acquire_server` (a private slot directory per candidate),
drives it with the real generation client (:func:`regen.generate.client.generate_shard_async`, concurrency
= the
server's effective running cap, a fresh journal) for a bounded time, cancels the client when the time
is up, stops the server and measures, from the journal:

- output tok/s and requests/s: completion tokens (and requests) that *finished* inside the measurement
  window ``[start + warmup, stop]``, divided by the window. In steady state the completion flow equals
  the generation flow; the warmup skips the ramp where no request has finished yet;
- the output-length distribution (p50/p90/p99 completion tokens, truncation rate) of completed requests.
  Requests still running at the stop are *censored* (not counted); their number is reported because
  many of them bias the lengths short;
- the server's own steady-state decode rate (:mod:`regen.serving.metrics`): the median ``gen throughput``
  of the server log's ``Decode batch`` lines at the ``#running-req`` plateau during the pilot (``/metrics``
  samples when the log has none). This is the rate candidates are ranked and the run projected by
  (:attr:`CandidateResult.rate_tok_s`); the client window rate stays as a fallback and a cross-check: with
  long outputs a short window sees few completions, while the server counts every generated token.

Each candidate's server listens on a port the OS reports free (not ``server.port_base + slot``), so a
sweep run while a generation holds its slots' ports cannot collide with them.

The pilot prompts are cycled (repeats get an id suffix ``~r{k}``, so a different seed) so the server
stays saturated for the whole window whatever the pilot size.

The best candidate (highest output tok/s) and the per-sample completion tokens then project the wall
time and GPU-hours of the remaining samples (``results/shards/*.parquet`` minus the ids finished in
``work/journal/*.jsonl``), written to ``results/plan/pilot.json`` and shown by ``regen status`` and the
report's ``server_plan.html``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import os
import random
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regen.generate.client import ProgressOptions, ShardFailedError, ShardJob, generate_shard_async
from regen.generate.journal import read_journal_entries
from regen.runconfig import GenerateConfig, ServerConfig
from regen.serving.base import ServerError
from regen.serving.lifecycle import acquire_server, build_server_command, stop_all_servers
from regen.serving.metrics import (
    DecodeSample,
    SteadyState,
    log_since,
    log_size,
    sample_metrics,
    server_steady_state,
)
from regen.serving.ports import any_free_port
from regen.serving.simulated_mode import build_simulated_command
from regen.sglang.config import PlanFile
from regen.sglang.flags import parse_flags
from regen.tune.closedloop import StepModel, closed_loop_wall_s
from regen.tune.projection import PROJECTION_ASSUMPTIONS, Remaining, project
from regen.types import Endpoint, Sample

log = logging.getLogger("regen.tune.sweep")

REPEAT_MARK = "~r"
DEFAULT_WARMUP_FRACTION = 0.2
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
) -> PilotMeasurement:
    """Throughput in ``[started_at + warmup_s, stopped_at]`` and lengths of every completed request."""
    entries = read_journal_entries(journal_path)
    records = [e for e in entries if e.get("kind") == "record"]
    failed = sum(1 for e in entries if e.get("kind") == "failed")
    window_start = started_at + warmup_s
    window_s = max(1e-9, stopped_at - window_start)
    tokens: list[int] = []
    latencies: list[float] = []
    truncated = 0
    window_requests = window_tokens = 0
    for rec in records:
        n = _completion_tokens(rec)
        tokens.append(n)
        truncated += bool(rec.get("truncated"))
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
    )


class _Counted:
    """An iterator that counts what it handed out."""

    def __init__(self, it: Iterator[Sample]) -> None:
        self.it = it
        self.count = 0

    def __iter__(self) -> _Counted:
        return self

    def __next__(self) -> Sample:
        item = next(self.it)
        self.count += 1
        return item


async def drive_pilot_async(
    endpoint: Endpoint,
    samples: Sequence[Sample],
    generate_cfg: GenerateConfig,
    seconds: float,
    journal_path: str | os.PathLike[str],
    warmup_s: float | None = None,
    metrics_every_s: float = 2.0,
) -> PilotMeasurement:
    """Drive ``endpoint`` with the real client for ``seconds``, then cancel it and measure the journal.

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
    records_out, failed_out = journal.with_suffix(".records.jsonl"), journal.with_suffix(".failed.jsonl")
    run = generate_shard_async(
        ShardJob(stream, journal, records_out, failed_out, gcfg, endpoint, SWEEP_SHARD, progress)
    )
    task = asyncio.create_task(run)
    polled: list[DecodeSample] = []
    poller = asyncio.create_task(poll_metrics(endpoint, polled, metrics_every_s))
    done, _ = await asyncio.wait({task}, timeout=seconds)
    stopped = time.time()
    poller.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await poller
    if done:  # only a failure ends a cycled pilot early
        task.result()
        raise SweepError("the pilot client stopped before its time was up")  # pragma: no cover
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    m = measure_journal(journal, started, stopped, warm, int(concurrency), stream.count)
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
) -> PilotMeasurement:
    """Blocking :func:`drive_pilot_async`."""
    return asyncio.run(
        drive_pilot_async(endpoint, samples, generate_cfg, seconds, journal_path, warmup_s, metrics_every_s)
    )


# -------------------------------------------------------------------------------- sweep --
def sweep_server_cfg(cfg: ServerConfig) -> ServerConfig:
    """The server config each candidate runs with: the candidate's args are complete (user args are
    already in them), the plan is used, and the simulated cap follows the plan."""
    if cfg.simulated.max_running_requests:
        log.warning("sweep: server.simulated.max_running_requests ignored: each cap follows its plan")
    return dataclasses.replace(
        cfg,
        use_tuner=True,
        args=(),
        gpus=cfg.tp,  # one slot: the sweep measures one server at a time
        simulated=dataclasses.replace(cfg.simulated, max_running_requests=None),
    )


WARM_UP_MAX_TOKENS = 8


def warm_up(endpoint: Endpoint, sample: Sample, generate_cfg: GenerateConfig, workdir: Path) -> float:
    """One real request (the first pilot prompt, a few tokens) before the measurement window, so that a
    server's first-request costs stay out of it; its seconds. (SGLang 0.5.17 on a fresh H200 machine
    builds flashinfer's sampling kernels on the first top-k/top-p request, ~110 s with nothing served;
    the readiness probe now pays that, see ``one_token_generation``; this keeps any other first-use
    cost out of the window too.)"""
    sampling = dataclasses.replace(generate_cfg.sampling, max_tokens=WARM_UP_MAX_TOKENS)
    gcfg = dataclasses.replace(generate_cfg, sampling=sampling, concurrency=1)
    workdir.mkdir(parents=True, exist_ok=True)
    for name in ("journal.jsonl", "records.jsonl", "failed.jsonl"):
        (workdir / name).unlink(missing_ok=True)
    one = dataclasses.replace(sample, id=f"{sample.id}{REPEAT_MARK}warmup")
    t0 = time.monotonic()
    asyncio.run(
        generate_shard_async(ShardJob([one], workdir / "journal.jsonl", workdir / "records.jsonl",
                                      workdir / "failed.jsonl", gcfg, endpoint, "warmup",
                                      ProgressOptions(log_every_s=3600.0, status_path=None, bar=False)))
    )  # fmt: skip
    return time.monotonic() - t0


def sweep_command_builder(server_cfg: ServerConfig, plan: PlanFile | None, port: int,
                          model_path: str) -> list[str]:  # fmt: skip
    """The workflow's server command, plus the simulated batch model (``simulated.half_speed_running``)."""
    if server_cfg.mode != "simulated":
        return build_server_command(server_cfg, plan, port, model_path)
    argv = build_simulated_command(server_cfg, port, model_path, plan)
    half = server_cfg.simulated.half_speed_running
    if half and "--half-speed-running" not in argv:
        argv += ["--half-speed-running", str(int(half))]
    return with_speculative_steps(argv, list(plan.launch_args) if plan is not None else [])


def with_speculative_steps(argv: list[str], launch_args: list[str]) -> list[str]:
    """A simulated server's command with the candidate's speculative steps in its ``--options`` (a real
    SGLang reads them from its flags; the acceptance comes from ``SGLANG_SIMULATE_ACC_LEN``, as SGLang's)."""
    flags = parse_flags(launch_args)
    if not flags.speculative_algorithm:
        return argv
    steps = flags.speculative_num_steps or 3
    out = list(argv)
    if "--options" in out:
        i = out.index("--options")
        options = json.loads(out[i + 1])
        out[i + 1] = json.dumps({**options, "speculative_num_steps": steps}, sort_keys=True)
        return out
    return [*out, "--options", json.dumps({"speculative_num_steps": steps})]


def candidate_plan(candidate: SweepCandidate) -> PlanFile:
    """A plan with the candidate's args; its predicted cap drives the simulated server."""
    cap = int(candidate.predicted_running or 0)
    recommended = {"effective_max_running_requests": cap} if cap else {}
    return PlanFile(tuple(candidate.args), launched="recommended", given={}, recommended=recommended)


def as_candidates(candidates: Iterable[SweepCandidate | Sequence[str]]) -> list[SweepCandidate]:
    """Candidates from SweepCandidate or plain arg lists; duplicates (same args) dropped, order kept."""
    out: list[SweepCandidate] = []
    seen: set[tuple[str, ...]] = set()
    for i, c in enumerate(candidates):
        cand = c if isinstance(c, SweepCandidate) else SweepCandidate(tuple(str(a) for a in c))
        if not cand.label:
            cand = dataclasses.replace(cand, label=f"candidate {i}")
        if cand.args in seen:
            continue
        seen.add(cand.args)
        out.append(cand)
    if not out:
        raise SweepError("no candidate configs to sweep")
    return out


def run_sweep(
    server_cfg: ServerConfig,
    candidates: Iterable[SweepCandidate | Sequence[str]],
    samples: Sequence[Sample],
    generate_cfg: GenerateConfig,
    seconds_per_candidate: float,
    workdir: str | os.PathLike[str],
    *,
    warmup_s: float | None = None,
    stop_grace_s: float = 30.0,
    budget_s: float | None = None,
) -> SweepResult:
    """Benchmark each candidate for ``seconds_per_candidate`` (plus its server's startup) and keep the best.

    A candidate whose server does not start or fails the pilot is a row with ``ok=False`` (e.g. an
    aggressive config that runs out of memory); the sweep raises :class:`SweepError` only when no
    candidate could be measured. Every candidate's server is stopped before the next one starts.
    With ``budget_s``, no candidate after the first starts once that many seconds have passed since the
    sweep began: the rest are rows with ``ok=False`` saying so (order candidates by priority).
    """
    if seconds_per_candidate <= 0:
        raise SweepError(f"seconds per candidate must be > 0, got {seconds_per_candidate}")
    samples = list(samples)
    if not samples:
        raise SweepError("the pilot has no samples")
    cands = as_candidates(candidates)
    cfg = sweep_server_cfg(server_cfg)
    warm = seconds_per_candidate * DEFAULT_WARMUP_FRACTION if warmup_s is None else warmup_s
    root = Path(workdir)
    rows: list[CandidateResult] = []
    began = time.monotonic()
    for i, cand in enumerate(cands):
        if i > 0 and budget_s is not None and time.monotonic() - began > budget_s:
            why = f"not started: the sweep's {budget_s:g} s budget was spent"
            log.warning("sweep: %s %s", cand.label, why)
            rows.append(CandidateResult(cand.label, cand.args, cand.predicted_running, False, why))
            continue
        cand_dir = root / f"cand{i:02d}"
        servers = cand_dir / "servers"
        log.info("sweep: %s (%s), predicted cap %s", cand.label, " ".join(cand.args), cand.predicted_running)
        # a port the kernel picks from its ephemeral range: never one of the ``server.port_base + slot``
        # ports a running generation holds or is about to take
        cand_cfg = dataclasses.replace(cfg, port_base=any_free_port(cfg.host))
        server_log = cand_dir / "logs" / "gpu0.log"
        try:
            with acquire_server(
                cand_cfg, candidate_plan(cand), servers, cand_dir / "logs",
                owner_pid=os.getpid(), command_builder=sweep_command_builder,
            ) as endpoint:  # fmt: skip
                first = warm_up(endpoint, samples[0], generate_cfg, cand_dir / "warmup")
                offset = log_size(server_log)
                m = drive_pilot(endpoint, samples, generate_cfg, seconds_per_candidate,
                                cand_dir / "journal.jsonl", warm)  # fmt: skip
                m = dataclasses.replace(
                    m,
                    server=server_steady_state(log_since(server_log, offset), m.polled),
                    first_request_s=first,
                )
            rows.append(CandidateResult(cand.label, cand.args, cand.predicted_running, True, None, m))
            log.info(
                "sweep: %s: steady decode %s tok/s (%s running); client %.1f out tok/s, %.2f req/s at "
                "concurrency %d (%d unfinished at stop)",
                cand.label, f"{m.server.median_tps:.1f}" if m.server else "-",
                m.server.plateau_running if m.server else "-", m.out_tok_s, m.req_s, m.concurrency,
                m.unfinished_at_stop,
            )  # fmt: skip
            if m.server is None and m.window_s < 3 * m.latency_p90_s:
                log.warning(
                    "sweep: %s: the %.0f s window is shorter than 3x the p90 latency (%.1f s): tok/s and "
                    "lengths are biased low; raise --seconds",
                    cand.label, m.window_s, m.latency_p90_s,
                )  # fmt: skip
        except (ServerError, ShardFailedError) as exc:
            log.warning("sweep: %s failed: %s", cand.label, exc)
            rows.append(CandidateResult(cand.label, cand.args, cand.predicted_running, False, str(exc)))
        finally:
            stop_all_servers(servers, grace_s=stop_grace_s)
    measured = [i for i, r in enumerate(rows) if r.ok and r.measurement is not None]
    if not measured:
        errors = "; ".join(f"{r.label}: {r.error}" for r in rows)
        raise SweepError(f"no candidate could be measured: {errors}")
    best = measured[choose([rows[i].rate_tok_s for i in measured])]
    return SweepResult(tuple(rows), best, float(seconds_per_candidate), float(warm), len(samples))


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


# --------------------------------------------------------------------------- projection --
def step_model_of(result: SweepResult, fixed_step_s: float = 0.0) -> StepModel | None:
    """The decode-step cost line: through the best candidate's plateau with ``fixed_step_s`` as its
    batch-independent part (e.g. the weights over the memory bandwidth) when given, else fitted to the
    plateaus of the candidates that share the best one's state dtype. None without a server reading."""
    best = result.best
    m = best.measurement
    if m is None or m.server is None:
        return None
    if fixed_step_s > 0:
        return StepModel.from_plateau(m.server.plateau_running, m.server.median_tps, fixed_step_s)

    def dtype(args: Sequence[str]) -> str | None:
        a = list(args)
        return a[a.index("--mamba-ssm-dtype") + 1] if "--mamba-ssm-dtype" in a[:-1] else None

    points = [
        (r.measurement.server.plateau_running, r.measurement.server.median_tps)
        for r in result.rows
        if r.ok and r.measurement is not None and r.measurement.server is not None
        and dtype(r.args) == dtype(best.args)
    ]  # fmt: skip
    return StepModel.fit(points)


def closed_loop_projection(
    result: SweepResult, remaining: int, gpus: int, tp: int, *, lengths: Sequence[int] | None = None,
    fixed_step_s: float = 0.0, seed: int = 0,
) -> dict[str, Any] | None:  # fmt: skip
    """Wall time and GPU-hours with the start burst and the drain (:mod:`regen.tune.closedloop`): each server
    takes an equal share of ``remaining`` samples whose output lengths are ``lengths`` (default: drawn from
    the pilot's completed lengths) at the best candidate's concurrency, after the ramp its pilot measured.
    None without a server reading."""
    step = step_model_of(result, fixed_step_s)
    best = result.best.measurement
    if step is None or best is None or remaining <= 0:
        return None
    servers = max(1, gpus // tp)
    if lengths is None:
        pool = list(best.completion_tokens) or [
            t for r in result.rows if r.measurement is not None for t in r.measurement.completion_tokens
        ]
        if not pool:
            return None
        rng = random.Random(seed)
        lengths = [rng.choice(pool) for _ in range(remaining)]
    per_server = list(lengths)[::servers] if servers > 1 else list(lengths)
    est = closed_loop_wall_s(per_server, best.concurrency, step, result.best.ramp_s or 0.0)
    return {
        **est.to_json(),
        "servers": servers,
        "gpu_hours": est.wall_s * servers * tp / 3600,
        "step_model": {"fixed_s": step.fixed_s, "per_request_s": step.per_request_s},
    }


def pilot_report(
    result: SweepResult, remaining: Remaining, gpus: int, tp: int, *, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The content of ``results/plan/pilot.json``."""
    lengths = result.pooled_lengths()
    proj = project(remaining.remaining, lengths.mean, result.best.rate_tok_s, gpus, tp)
    assumptions = list(PROJECTION_ASSUMPTIONS)
    censored = sum(r.measurement.unfinished_at_stop for r in result.rows if r.measurement is not None)
    if censored:
        assumptions.append(
            f"{censored} pilot requests were still running when their time was up and are not in the "
            "length distribution (long outputs are under-represented when this is large)"
        )
    closed = closed_loop_projection(result, remaining.remaining, gpus, tp)
    whole = project(remaining.samples, lengths.mean, result.best.rate_tok_s, gpus, tp)
    return {
        "created_at": time.time(),
        **result.to_json(),
        "remaining": {**dataclasses.asdict(remaining), "remaining": remaining.remaining},
        "projection": proj.to_json(),
        "projection_whole_run": whole.to_json(),
        "projection_closed_loop": closed,
        "assumptions": assumptions,
        **dict(extra or {}),
    }


__all__ = [
    "CandidateResult",
    "LengthStats",
    "PilotMeasurement",
    "SweepCandidate",
    "SweepError",
    "SweepResult",
    "choose",
    "drive_pilot",
    "mtp_decision",
    "pilot_report",
    "run_sweep",
]
