"""The generation client: one shard of prompts against one SGLang server, journaled and resumable.

``generate_shard`` keeps the server saturated with a fixed pool of worker tasks pulling from
the sample iterator; each finished sample goes to the journal (``regen.generate.journal``) at once, so a
killed job resumes where it stopped and never re-sends a finished sample. A journaled sample is
replayed only when its generation fingerprint (``regen.fingerprint``: settings, id and prompt
content) equals the current one; otherwise it is generated again, so an output never mixes
settings. Journaled failures are retried unless ``retry_failed`` is off. At the end the shard
outputs are written atomically from the journal, from entries with the current fingerprints only.

The parts: ``generate_shard_async(job)`` (a :class:`ShardJob`) discovers the server and runs
``regen.generate.scheduler.ShardRun`` (pull the next sample, lend, circuit breaker, journal flushes), which
turns
each sample into its entry with ``regen.generate.sample_record`` through
``regen.generate.request.Requests`` (one turn's
request: body, POST, parsed answer, retries, restarts, truncation policy); ``_Reporter`` writes the
status file (``regen.records.ShardStatus``). ``generate_shard`` is the blocking wrapper.

Failure semantics
-----------------
- 4xx (except 408/429): no retry; the sample fails with reason ``client_error: <message>``.
- 5xx, 408, 429, connection errors, disconnects, truncated or malformed bodies, timeouts:
  retried with jittered exponential backoff (``backoff_base_s * 2**(k-1) * U(0.5, 1.5)``,
  capped at 60 s) up to ``max_attempts`` requests. A sample that still fails is a
  *server-level* failure.
- In flight: at most the server's window (``regen.generate.pacing``): the planned count within what the
  server finishes in ``request_timeout_s`` at its running cap, halved when timeouts or HTTP 503/429 pile up
  and grown back while answers come. A request waits for room *before* it is sent (no timeout runs). A
  timeout while the server answered other requests waited behind the client's own excess: it is sent
  again without using an attempt (up to ``regen.generate.request.EXCESS_TIMEOUTS_MAX`` times a sample).
- A request lost because the job's own server was restarted under it (it crashed, or its supervisor
  restarted it for a stall: ``regen.serving.progress``) waits for the restarted server and goes again,
  once per restart, without using an attempt; a supervisor that gave up fails the shard with its cause.
- Server-level failures are held back, not journaled, while the run goes on. The run aborts
  with ``ShardFailedError`` (outputs not written; the journal keeps every finished sample and a
  rerun retries the held ones) when ``breaker_threshold = clamp(concurrency, 3, 16)``
  server-level failures happen in a row with no success between them (the server is down), or
  when, at the end, no sample completed in this run, or more than half of the samples attempted
  in this run failed at server level. Otherwise the held failures are isolated poison samples:
  they are journaled as terminal failures and the shard is finalized.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import math
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from regen.fingerprint import RunSettings, server_numerics
from regen.generate.journal import Journal, JournalSink
from regen.generate.journal_writer import JournalWriter
from regen.generate.pacing import (
    InFlightPlan,
    RequestTime,
    longest_request_tokens,
    plan_in_flight,
    whole_shard_offer,
)
from regen.generate.request import Halt, Requests, ServerRestarts
from regen.generate.sample_record import RecordContext, hash64
from regen.generate.scheduler import Lenders, ShardRun, ShardStats
from regen.io import write_json
from regen.layout.run import RunLayout
from regen.records import ShardStatus
from regen.runconfig import GenerateConfig
from regen.serving.probes import radix_cache_on, server_running_cap
from regen.types import Endpoint, Sample

log = logging.getLogger(__name__)

DEFAULT_CONCURRENCY = 64


@dataclass(frozen=True, slots=True)
class ProgressOptions:
    """Progress reporting: log lines, a status JSON, and a ``\\r`` bar when stderr is a TTY."""

    log_every_s: float = 30.0
    status_path: Path | None = None
    status_every_s: float = 5.0
    bar: bool | None = None  # None: only when stderr is a TTY
    #: the rate (and so the ETA) is measured over the answers of this many last seconds, not since the
    #: shard started: after a burst collapsed the window the ETA follows the rate the shard goes at now
    rate_window_s: float = 60.0


class ShardFailedError(RuntimeError):
    """The server failed the shard (down, crashed, or failing most requests); outputs not written."""


@dataclass(frozen=True, slots=True)
class ShardJob:
    """One shard to generate: its samples (``regen.ingest.shards.read_shard`` of a shard file, or samples in
    memory), where its journal
    and outputs go, the generate config and the server, and what the job around it gives the client.

    ``settings`` is the run's part of what the fingerprint covers (``RunSettings.for_run`` in a workflow
    job); None: ``RunSettings.of`` the generate config. ``progress`` None: a status file at the run layout's
    place for the journal. ``total``: the samples' count when known (else a sized collection's length).
    ``lenders``: other GPU slots' servers this job may also use while they have room. ``on_exhausted``:
    called once when every sample has been sent (only answers are awaited from then on). ``restarts``:
    the own server's restarts, so requests lost to one are sent again (and a server that gave up names
    its cause). ``writer``: the job's claim on the journal (taken before its GPU slot, released after its
    outputs are written); None: ``Journal.open`` takes one and refuses if another process holds it.
    ``request_time``: the server's request time, which bounds the in-flight count (``pacing_of``).
    """

    samples: Iterable[Sample]
    journal: str | os.PathLike[str]
    records_out: str | os.PathLike[str]
    failed_out: str | os.PathLike[str]
    cfg: GenerateConfig
    endpoint: Endpoint
    shard: str
    progress: ProgressOptions | None = None
    total: int | None = None
    journal_sync: JournalSink | None = None
    lenders: Lenders | None = None
    on_exhausted: Callable[[], None] | None = None
    settings: RunSettings | None = None
    restarts: ServerRestarts | None = None
    writer: JournalWriter | None = None
    #: how long one request takes on the server (``regen.generate.pacing``): the in-flight count is kept
    #: within what it finishes in ``request_timeout_s``; None: the planned count, adapted as it runs
    request_time: RequestTime | None = None


# ------------------------------------------------------------------------------- progress


class _Reporter:
    """The shard's progress: its status file (``ShardStatus``), log lines and the TTY bar."""

    def __init__(self, run: ShardRun, endpoint: Endpoint, opts: ProgressOptions, t0: float) -> None:
        self.run = run
        self.endpoint = endpoint
        self.opts = opts
        self.t0 = t0
        self.bar = opts.bar if opts.bar is not None else sys.stderr.isatty()
        self.marks: collections.deque[tuple[float, int]] = collections.deque([(t0, 0)])  # (time, done)

    def recent_rate(self, now: float, done_now: int) -> float:
        """Answers a second over the last ``rate_window_s`` (since the start while shorter)."""
        marks = self.marks
        marks.append((now, done_now))
        while len(marks) > 2 and now - marks[1][0] >= self.opts.rate_window_s:
            marks.popleft()
        t_first, done_first = marks[0]
        return (done_now - done_first) / max(1e-9, now - t_first)

    def snapshot(self, finished: bool = False) -> ShardStatus:
        st = self.run.stats
        requests = self.run.requests
        now = time.monotonic()
        elapsed = max(1e-9, now - self.t0)
        done_now = st.completed + st.failed
        done = done_now + st.skipped_resumed
        req_s = self.recent_rate(now, done_now)
        total = st.total
        eta = (total - done) / req_s if total is not None and req_s > 0 else None
        return ShardStatus(
            shard=self.run.shard,
            server_id=self.endpoint.server_id,
            server_url=self.endpoint.url,
            done=done,
            total=total,
            failed=st.failed,
            truncated=st.truncated,
            req_s=round(req_s, 3),
            out_tok_s=round(st.output_tokens / elapsed, 1),
            eta_s=None if eta is None else round(eta, 1),
            updated_at=time.time(),
            finished=finished,
            in_flight=len(requests.in_flight),
            retrying=len(requests.retrying),
            retried_requests=requests.retried,
            oldest_in_flight_at=min(requests.in_flight.values(), default=None),
            completions_per_sample=self.run.cfg.completions_per_prompt,
        )

    def write_status(self, final: bool = False) -> None:
        if self.opts.status_path is not None:
            write_json(self.opts.status_path, self.snapshot(finished=final).to_json())

    def log_line(self) -> None:
        s = self.snapshot()
        log.info(
            "shard %s: %s/%s done, %d failed, %.1f req/s, %.0f out tok/s, ETA %s",
            s.shard,
            s.done,
            s.total if s.total is not None else "?",
            s.failed,
            s.req_s,
            s.out_tok_s,
            "?" if s.eta_s is None else f"{s.eta_s:.0f} s",
        )

    def draw_bar(self) -> None:
        s = self.snapshot()
        frac = s.done / s.total if s.total else 0.0
        filled = int(30 * frac)
        eta = "?" if s.eta_s is None else f"{s.eta_s:.0f}s"
        sys.stderr.write(
            f"\r[{'#' * filled}{'.' * (30 - filled)}] {s.done}/{s.total or '?'} "
            f"{s.req_s:.1f} req/s {s.out_tok_s:.0f} tok/s ETA {eta}   "
        )
        sys.stderr.flush()

    async def loop(self) -> None:
        tick = min(self.opts.log_every_s, self.opts.status_every_s, 0.5 if self.bar else math.inf)
        next_log = time.monotonic() + self.opts.log_every_s
        next_status = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= next_status:
                self.write_status()
                next_status = now + self.opts.status_every_s
            if now >= next_log:
                self.log_line()
                next_log = now + self.opts.log_every_s
            if self.bar:
                self.draw_bar()
            await asyncio.sleep(tick)


# ---------------------------------------------------------------------------- entry points


async def _discover(session: aiohttp.ClientSession, endpoint: Endpoint, cfg: GenerateConfig) -> Endpoint:
    """Fill model, max_running_requests, version, numerics and the radix cache from the server when
    unknown."""
    headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    base = endpoint.url.rstrip("/")
    timeout = aiohttp.ClientTimeout(total=30)
    model, mrr, version = endpoint.model, endpoint.max_running_requests, endpoint.version
    server_cap = endpoint.server_running_cap
    numerics, radix_cache = endpoint.numerics, endpoint.radix_cache
    if model is None:
        try:
            async with session.get(base + "/v1/models", headers=headers, timeout=timeout) as r:
                model = orjson.loads(await r.read())["data"][0]["id"]
        except (
            aiohttp.ClientError,
            TimeoutError,
            KeyError,
            IndexError,
            TypeError,
            orjson.JSONDecodeError,
        ) as exc:
            log.warning("could not read the model name from %s/v1/models (%s); sending 'default'", base, exc)
    if (mrr is None and cfg.concurrency is None) or version is None or numerics is None:
        info = await _server_info(session, base, headers, timeout)
        version = version or info.get("version")
        if numerics is None:  # a server without /server_info (not SGLang) reports none: {} every run
            numerics = server_numerics(info) if info else {}
        server_cap = server_cap or server_running_cap(info, None)
        mrr = mrr or server_cap
        radix_cache = radix_cache if radix_cache is not None else radix_cache_on(info)
    return dataclasses.replace(
        endpoint,
        max_running_requests=mrr,
        server_running_cap=server_cap,
        version=version,
        model=model,
        numerics=numerics,
        radix_cache=radix_cache,
    )


#: how long the client waits for a server that does not answer ``/server_info`` (restarting after a
#: crash): its numerics decide which journaled answers replay, so they are worth waiting for
SERVER_INFO_WAIT_S = 60.0


async def _server_info(
    session: aiohttp.ClientSession, base: str, headers: dict[str, str], timeout: aiohttp.ClientTimeout
) -> dict[str, Any]:
    """``/server_info``; retried while the server cannot be reached; {} when it has none (not SGLang)."""
    deadline = time.monotonic() + SERVER_INFO_WAIT_S
    while True:
        try:
            async with session.get(base + "/server_info", headers=headers, timeout=timeout) as r:
                if r.status >= 400:
                    log.warning("%s/server_info answered HTTP %d: no server numerics", base, r.status)
                    return {}
                info = orjson.loads(await r.read())
            return info if isinstance(info, dict) else {}
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            if time.monotonic() > deadline:
                log.warning("could not reach %s/server_info for %.0f s (%s)", base, SERVER_INFO_WAIT_S, exc)
                return {}
            await asyncio.sleep(0.5)
        except (aiohttp.ClientError, orjson.JSONDecodeError) as exc:
            log.warning("could not read %s/server_info (%s)", base, exc)
            return {}


def _samples_and_total(samples: Iterable[Sample], total: int | None) -> tuple[Iterator[Sample], int | None]:
    """The samples as an iterator, and their count: ``total``, else a sized collection's length."""
    if total is None and hasattr(samples, "__len__"):
        total = len(samples)  # type: ignore[arg-type]
    return iter(samples), total


def _concurrency(cfg: GenerateConfig, ep: Endpoint) -> int:
    """The requests planned in flight: ``concurrency``, else the server's cap plus the queue headroom, which
    SGLang queues. A plan's client concurrency below the cap (the KV filled at the expected context) is kept
    as it is: where the KV has room SGLang runs every request it is sent, and requests past the decode
    graphs the plan captured for that count step without them (measurements/race-2026-12-07d-h100-n4-p1024:
    495 running on graphs to 396 decoded at 8.5k tok/s, 388 on graphs at 14k)."""
    if cfg.concurrency:
        return cfg.concurrency
    running = ep.max_running_requests
    if running and ep.server_running_cap and running < ep.server_running_cap:
        return running
    if running:
        return math.ceil(running * (1 + cfg.queue_headroom))
    return DEFAULT_CONCURRENCY


def pacing_of(
    cfg: GenerateConfig, ep: Endpoint, time: RequestTime | None, requests_left: int | None = None
) -> InFlightPlan:
    """The in-flight plan on ``ep``: the planned count (``_concurrency``; every request left when they fit
    under the server's own cap and ``concurrency`` is not set: ``whole_shard_offer``) within what the server
    finishes in ``request_timeout_s`` at its running cap (``regen.generate.pacing.plan_in_flight``)."""
    planned, whole = _concurrency(cfg, ep), None
    if not cfg.concurrency:
        planned, whole = whole_shard_offer(planned, ep.server_running_cap, requests_left)
    running = planned if whole else (ep.max_running_requests or planned)
    return plan_in_flight(planned, running, cfg.request_timeout_s, longest_request_tokens(cfg), time, whole)


def _log_pacing(shard: str, requests: Requests) -> None:
    """How the in-flight windows ended, and the retries sent elsewhere or again."""
    for url, window in requests.windows.items():
        log.info("shard %s: %s: window %.0f of %d in flight at the end, %d decreases, background "
                 "%.1f %% of answers 503/429 or timeouts", shard, url, window.limit, window.ceiling,
                 window.decreases, 100 * window.background)  # fmt: skip
    if requests.rerouted:
        log.info("shard %s: %d retries sent to another server with room", shard, requests.rerouted)
    log.info("shard %s: %d timeouts behind the client's own excess sent again without an attempt",
             shard, requests.excess_timeouts)  # fmt: skip


async def generate_shard_async(job: ShardJob) -> ShardStats:
    """Generate one shard (see the module docstring); returns its stats or raises ShardFailedError."""
    cfg, shard = job.cfg, job.shard
    settings = job.settings if job.settings is not None else RunSettings.of(cfg)
    progress = job.progress
    if progress is None:
        progress = ProgressOptions(status_path=RunLayout.of_journal(Path(job.journal)).status(shard))
    it, total = _samples_and_total(job.samples, job.total)
    t0 = time.monotonic()
    # every count is of records: each sample makes one per completion of each variant
    stats = ShardStats(total=None if total is None else total * cfg.completions_per_prompt)
    journal = Journal.open(job.journal, job.journal_sync, writer=job.writer)
    try:
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(
            connector=connector, json_serialize=lambda o: orjson.dumps(o).decode()
        ) as sess:
            ep = await _discover(sess, job.endpoint, cfg)
            left = None if total is None else (total - len(journal.finished_ids)) * cfg.completions_per_prompt
            pacing = pacing_of(cfg, ep, job.request_time, left)
            concurrency = pacing.ceiling
            model = ep.model or "default"
            requests = Requests(
                cfg,
                sess,
                server=ep,
                model=model,
                shard=shard,
                rng=random.Random(hash64("backoff", shard)),
                halt=Halt(),
                restarts=job.restarts,
                pacing=pacing,
            )
            record = RecordContext(shard, model, {"id": ep.server_id, "url": ep.url, "version": ep.version})
            run = ShardRun(
                cfg=cfg,
                # the answers come from this server: its numerics are part of what decides them
                settings=settings.served_by(ep.numerics or {}),
                journal=journal,
                samples=it,
                requests=requests,
                record=record,
                stats=stats,
                breaker_threshold=max(3, min(concurrency, 16)),
                on_exhausted=job.on_exhausted,
            )
            log.info(
                "shard %s: %s samples, %d in the journal, settings %s, %s against %s (%s)",
                shard,
                total if total is not None else "?",
                len(journal.finished_ids),
                run.settings_fingerprint,
                pacing.describe(),
                ep.url,
                ep.server_id,
            )
            reporter = _Reporter(run, ep, progress, t0)
            rep_task = asyncio.create_task(reporter.loop())
            try:
                lending = [run.lend(job.lenders)] if job.lenders is not None else []
                await asyncio.gather(*(run.worker() for _ in range(concurrency)), *lending)
            finally:
                run.drop_prefills()
                rep_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await rep_task
                if reporter.bar:
                    sys.stderr.write("\n")
        journal.flush()
        stats.retried_requests = requests.retried
        _log_pacing(shard, requests)
        failure = run.failure()
        stats.wall_s = time.monotonic() - t0
        if failure is not None:
            reporter.write_status()
            raise ShardFailedError(f"shard {shard} on {ep.server_id} ({ep.url}): {failure}")
        for entry in run.held:
            journal.append(entry, flush=False)
            stats.failed += 1
        journal.close()
        counts = journal.finalize(job.records_out, job.failed_out, run.current, run.identities)
        stats.wall_s = time.monotonic() - t0
        stats.prefill = requests.prefill
        reporter.write_status(final=True)
        reporter.log_line()
        log.info(
            "shard %s: %d replayed from the journal, %d regenerated (changed since journaled), "
            "%d earlier failures retried; %d stale journal entries left out",
            shard,
            stats.skipped_resumed,
            stats.regenerated_changed,
            stats.retried_failed,
            counts.stale_ignored,
        )
        log.info("shard %s: wrote %d records, %d failures; %s; %s", shard, counts.records, counts.failed,
                 stats.prefill.in_words(), stats)  # fmt: skip
        return stats
    finally:
        journal.close()


def generate_shard(job: ShardJob) -> ShardStats:
    """Blocking wrapper of ``generate_shard_async``; SIGTERM cancels cleanly (journal flushed)."""

    async def main() -> ShardStats:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        in_main = threading.current_thread() is threading.main_thread()
        if in_main and task is not None:
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
        try:
            return await generate_shard_async(job)
        finally:
            if in_main:
                loop.remove_signal_handler(signal.SIGTERM)

    return asyncio.run(main())
