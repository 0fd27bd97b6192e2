"""Is a server making progress? A stall watch from the server's own signals, and what its restarts leave.

A server can stay up and stop generating: its process lives, ``/health`` answers, and every request in
flight waits for ``generate.request_timeout_s`` (an hour). SGLang #30314 (the scheduler blocked on
mamba-state eviction for minutes) and PR #34705 (two hybrid-model servers on one node deadlocked with
``mamba usage: 1.00`` and no decode batches) are exactly our setup. So the supervisor
(``regen.serving.supervisor``) watches progress, not liveness, while requests are in flight:

* ``sglang:generation_tokens_total`` of ``/metrics`` rising, or a ``Decode batch`` line of the server's
  log with a non-zero ``gen throughput``, is progress (SGLang counts generated tokens when a request
  finishes, so the decode lines carry the signal while long answers are still running);
* ``sglang:num_running_reqs`` + ``sglang:num_queue_reqs`` (else the last decode line's ``#running-req``
  and ``#queue-req``) say whether requests are in flight; an idle server is never stalled;
* no progress for ``server.stall_timeout_s`` with requests in flight is a stall, and its cause is named
  (``no tokens generated for 130 s with 412 requests in flight; mamba usage 1.00``);
* the gauges come from the scheduler, so a scheduler that stalled while idle keeps showing none in flight
  while requests pile up unseen: after half of ``stall_timeout_s`` with no sign of life and none in
  flight, a one-token generation (what readiness uses) must answer within the other half, or that too
  is a stall. An idle healthy server answers it in milliseconds.

The supervisor writes :class:`ProgressState` (``gpu{k}.progress.json``, for ``regen status``) and one
:func:`record_restart` line per restart or give-up (``gpu{k}.restarts.jsonl``, for the report and for a
job whose server gave up). :class:`SlotRestarts` is a job's view of its own server's restarts: a request
that failed because the server was restarted under it is sent again, once per restart, without using
one of its attempts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from regen.io import read_json, write_json
from regen.layout.slots import SlotFiles
from regen.serving.metrics import fetch_metrics
from regen.serving.probes import NO_ANSWER, one_token_generation
from regen.serving.procfs import is_supervisor, pid_alive, read_url_state
from regen.types import Endpoint

GEN_TOKENS = "sglang:generation_tokens_total"
RUNNING, QUEUED = "sglang:num_running_reqs", "sglang:num_queue_reqs"
MAMBA_USAGE = "sglang:mamba_usage"
#: a server with requests in flight and no progress for this long (or half the stall timeout, if less) is
#: shown as stalled by ``regen status`` before its supervisor restarts it
SHOW_STALLED_AFTER_S = 15.0

_DECODE = re.compile(
    r"Decode batch[^\n]*?#running-req: (?P<running>\d+)[^\n]*?"
    r"gen throughput \(token/s\): (?P<tps>[0-9.]+), #queue-req: (?P<queue>\d+)"
)
_MAMBA = re.compile(r"mamba usage: (?P<usage>[0-9.]+)")


def stall_cause(idle_s: float, in_flight: int, mamba_usage: float | None) -> str:
    """``no tokens generated for 130 s with 412 requests in flight; mamba usage 1.00``."""
    text = f"no tokens generated for {idle_s:.0f} s with {in_flight} requests in flight"
    return text + (f"; mamba usage {mamba_usage:.2f}" if mamba_usage is not None else "")


@dataclass(frozen=True, slots=True)
class ProgressState:
    """``gpu{k}.progress.json``: the supervisor's latest look at its server."""

    server_pid: int
    in_flight: int
    last_progress_at: float  # epoch seconds
    stalled_since: float | None  # epoch seconds of the last progress, once it is overdue
    stall_timeout_s: float
    mamba_usage: float | None
    updated_at: float

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> ProgressState | None:
        try:
            obj = read_json(path)
            return cls(**{k: obj.get(k) for k in cls.__dataclass_fields__})
        except (OSError, ValueError, TypeError, AttributeError):
            return None


class ProgressWatch:
    """One server lifetime's progress, looked at every supervisor poll (:meth:`look`)."""

    def __init__(
        self,
        url: str,
        log_path: str | os.PathLike[str],
        timeout_s: float,
        server_pid: int,
        model: str,
        api_key: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.log_path = Path(log_path)
        self.timeout_s = timeout_s
        self.server_pid = server_pid
        self.model = model
        self.api_key = api_key
        self.offset = _size(self.log_path)
        self.tokens: float | None = None
        self.in_flight = 0
        self.mamba_usage: float | None = None
        self.last_progress = time.monotonic()  # or the last look with nothing in flight: nothing was owed
        self.last_progress_at = time.time()
        self.last_sign = self.last_progress  # the last progress or answered probe

    def look(self) -> str | None:
        """Read the server's signals once; the stall's cause once no progress has been made for
        ``timeout_s`` while requests were in flight, else None."""
        progressed = self._read_metrics()
        progressed = self._read_log() or progressed
        now = time.monotonic()
        if progressed or self.in_flight == 0:
            self.last_progress, self.last_progress_at = now, time.time()
        if progressed:
            self.last_sign = now
            return None
        if self.in_flight > 0:
            idle = now - self.last_progress
            return stall_cause(idle, self.in_flight, self.mamba_usage) if idle >= self.timeout_s else None
        idle = now - self.last_sign
        if idle < self.timeout_s / 2:  # the probe's own wait makes up the rest of the timeout
            return None
        wait = min(self.timeout_s / 2, 60.0)
        problem = one_token_generation(self.url, self.model, self.api_key, timeout=wait)
        if problem is None:
            self.last_sign = time.monotonic()
            return None
        return f"no tokens generated for {idle:.0f} s; a one-token generation failed in {wait:g} s: {problem}"

    def state(self) -> ProgressState:
        idle = time.monotonic() - self.last_progress
        overdue = self.in_flight > 0 and idle >= min(SHOW_STALLED_AFTER_S, self.timeout_s / 2)
        return ProgressState(
            server_pid=self.server_pid,
            in_flight=self.in_flight,
            last_progress_at=self.last_progress_at,
            stalled_since=self.last_progress_at if overdue else None,
            stall_timeout_s=self.timeout_s,
            mamba_usage=self.mamba_usage,
            updated_at=time.time(),
        )

    def _read_metrics(self) -> bool:
        try:
            values = fetch_metrics(self.url, self.api_key, timeout_s=max(0.5, min(5.0, self.timeout_s / 4)))
        except NO_ANSWER:
            return False  # unreachable: the log and the last known load decide
        progressed = False
        tokens = values.get(GEN_TOKENS)
        if tokens is not None:
            progressed = self.tokens is not None and tokens > self.tokens
            self.tokens = tokens
        if RUNNING in values:
            self.in_flight = int(values[RUNNING] + values.get(QUEUED, 0.0))
        if MAMBA_USAGE in values:
            self.mamba_usage = values[MAMBA_USAGE]
        return progressed

    def _read_log(self) -> bool:
        """Decode lines the log gained since the last look (whole lines only)."""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read(4 << 20)
        except OSError:
            return False
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        progressed = False
        for line in chunk[:end].decode("utf-8", errors="replace").splitlines():
            m = _DECODE.search(line)
            if m is None:
                continue
            progressed = progressed or float(m["tps"]) > 0
            self.in_flight = int(m["running"]) + int(m["queue"])
            mamba = _MAMBA.search(line)
            if mamba is not None:
                self.mamba_usage = float(mamba["usage"])
        return progressed


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def write_progress(path: str | os.PathLike[str], state: ProgressState) -> None:
    write_json(path, asdict(state))


# -------------------------------------------------------------------------------------------- restarts


def record_restart(path: str | os.PathLike[str], **entry: Any) -> None:
    """Append one restart (or give-up) to ``gpu{k}.restarts.jsonl``: ``at``, ``kind`` (stall, crash,
    port, gave_up), ``cause``, ``restart`` and ``max_restarts``, ``server_pid``."""
    line = orjson.dumps({"at": time.time(), **entry}) + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_restarts(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every readable line of a restarts file ([] when absent)."""
    try:
        raw = Path(path).read_bytes()
    except OSError:
        return []
    out = []
    for line in raw.splitlines():
        with contextlib.suppress(orjson.JSONDecodeError):
            obj = orjson.loads(line)
            if isinstance(obj, dict):
                out.append(obj)
    return out


class SlotRestarts:
    """A generate job's view of its own slot's server across restarts
    (``regen.generate.client.ServerRestarts``).

    ``generation`` counts the server starts this job has seen. After a failed request,
    :meth:`lost_to_restart` waits while the server is being restarted (url file ``starting``, or its
    server process gone) and returns the server's URL when a new server process took over since the
    request was sent: the request was lost to the restart and goes again, once per restart. When the
    supervisor gave up, ``failure`` holds its cause.
    """

    def __init__(self, files: SlotFiles, url: str, server_pid: int | None, poll_s: float = 0.25) -> None:
        self.files = files
        self.url = url
        self.server_pid = server_pid
        self.poll_s = poll_s
        self.generation = 0
        self.failure: str | None = None
        self._settling: asyncio.Task[None] | None = None

    @classmethod
    def of(cls, workdir: str | os.PathLike[str], endpoint: Endpoint) -> SlotRestarts | None:
        """For the server of ``endpoint``'s GPU slot of ``workdir`` (None for an external server)."""
        if endpoint.slot is None:
            return None
        files = SlotFiles.of(endpoint.slot, workdir, workdir)
        state = read_url_state(files.url)
        return cls(files, endpoint.url, state.server_pid if state is not None else None)

    async def lost_to_restart(self, generation: int) -> str | None:
        if self._settling is None or self._settling.done():
            self._settling = asyncio.ensure_future(self._settle())
        await asyncio.shield(self._settling)
        return self.url if self.generation > generation else None

    async def _settle(self) -> None:
        while True:
            state = read_url_state(self.files.url)
            if state is not None and state.failed:
                self.failure = last_cause(self.files.restarts) or "the server supervisor gave up"
                return
            if state is None or not is_supervisor(state.supervisor_pid, self.files.url):
                return
            if state.url is not None and (state.server_pid is None or pid_alive(state.server_pid)):
                if state.server_pid != self.server_pid:
                    self.server_pid, self.url = state.server_pid, state.url
                    self.generation += 1
                return
            await asyncio.sleep(self.poll_s)


def last_cause(path: str | os.PathLike[str]) -> str | None:
    entries = read_restarts(path)
    return str(entries[-1].get("cause")) if entries else None
