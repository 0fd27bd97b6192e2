"""The run marker (``RunLayout.run_marker``, ``work/run.json``): which run of the workflow is, or was last,
under way in this directory.

The workflow's ``onstart`` writes it (config name, its identity, the controller's pid and process start
time, host, start time, phase), a thread in the controller refreshes its heartbeat every
``HEARTBEAT_S`` seconds, and ``onsuccess``/``onerror`` write how it ended. Three readers:

- ``regen status`` says which run it shows and whether that run is alive, ended, or dead (its
  controller's pid gone or reused on this host; on another host no heartbeat for ``DEAD_AFTER_S``);
- a rerun releases the Snakemake lock of a provably dead controller (same host, pid gone or reused)
  with one console line, instead of stopping with ``LockException`` until ``--unlock``;
- ``regen.output.stale`` compares the identity of the config whose outputs lie in ``results/``
  (``results_of``) with the starting run's, to keep an earlier config's finished run aside as a whole.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from regen.io import read_json, write_json

#: how often a live controller refreshes the marker's heartbeat
HEARTBEAT_S = 2.0
#: a run on another host whose heartbeat is older than this is dead
DEAD_AFTER_S = 10.0
#: how far a process's start time may differ from the recorded one and still be the same process
START_TIME_SLACK_S = 1.0


def config_name(configfiles: Sequence[str | os.PathLike[str]]) -> str:
    """A run's name: its config files' stems, joined with ``+`` (``demo+small``)."""
    stems = [Path(f).stem for f in configfiles]
    return "+".join(dict.fromkeys(stems)) or "config"


def config_identity(config: Mapping[str, Any], gpu_slots: int) -> str:
    """What tells two configs apart: a hash of the validated config (defaults filled in) and the GPU slot
    count (which settles ``shards.count: auto``)."""
    text = json.dumps({"config": config, "gpu_slots": gpu_slots}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def process_start_time(pid: int) -> float | None:
    """When process ``pid`` started (None: no such process)."""
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return None


def same_process_alive(pid: int, started: float | None) -> bool:
    """Process ``pid`` lives and is the one that started at ``started`` (not a reuse of its pid)."""
    now_started = process_start_time(pid)
    if now_started is None:
        return False
    return started is None or abs(now_started - started) <= START_TIME_SLACK_S


@dataclass(frozen=True, slots=True)
class ResultsOf:
    """The config whose outputs lie in ``results/``: its name and identity."""

    config: str
    config_id: str


@dataclass(frozen=True, slots=True)
class RunMarker:
    """One run of the workflow: who runs it, where, since when, in which phase, and how it ended."""

    config: str
    config_id: str
    pid: int
    pid_started: float | None
    host: str
    started_at: float
    phase: str  # check | settle | running | ended
    heartbeat_at: float
    #: None while running; "finished" or "failed" (a failed job, Ctrl-C) once it ended
    outcome: str | None = None
    ended_at: float | None = None
    #: the config whose outputs lie in results/ (this run's once it has settled them)
    results_of: ResultsOf | None = None
    configfiles: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> RunMarker | None:
        try:
            obj = read_json(path)
            of = obj.get("results_of")
            return cls(**{**obj, "results_of": ResultsOf(**of) if of else None})
        except (OSError, ValueError, TypeError, AttributeError):
            return None

    def write(self, path: str | os.PathLike[str]) -> None:
        write_json(path, asdict(self))

    def liveness(self, now: float | None = None, host: str | None = None) -> str:
        """``running``, ``ended`` or ``dead`` (its controller gone: on this host its pid gone or
        reused, elsewhere no heartbeat for ``DEAD_AFTER_S``)."""
        if self.outcome is not None:
            return "ended"
        if self.host == (host or socket.gethostname()):
            return "running" if same_process_alive(self.pid, self.pid_started) else "dead"
        t = time.time() if now is None else now
        return "running" if t - self.heartbeat_at <= DEAD_AFTER_S else "dead"

    def describe(self) -> str:
        """``demo+small (pid 123 on node1, started 2026-12-04 06:10:02)``"""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started_at))
        return f"{self.config} (pid {self.pid} on {self.host}, started {when})"


def new_marker(
    name: str,
    config_id: str,
    configfiles: Sequence[str],
    previous: RunMarker | None,
    now: float | None = None,
) -> RunMarker:
    """The marker of a run starting now in this process; ``results/`` still holds what ``previous`` said."""
    t = time.time() if now is None else now
    pid = os.getpid()
    return RunMarker(
        config=name,
        config_id=config_id,
        pid=pid,
        pid_started=process_start_time(pid),
        host=socket.gethostname(),
        started_at=t,
        phase="check",
        heartbeat_at=t,
        results_of=previous.results_of if previous is not None else None,
        configfiles=[str(f) for f in configfiles],
    )


class MarkerWriter:
    """The controller's hold on its marker: phase changes, the heartbeat thread, the end."""

    def __init__(self, path: Path, marker: RunMarker, every_s: float = HEARTBEAT_S) -> None:
        self.path = path
        self.marker = marker
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._every_s = every_s
        self._thread: threading.Thread | None = None
        self._write()

    def _write(self) -> None:
        with contextlib.suppress(OSError):  # a status aid: never fail a run for it
            self.marker.write(self.path)

    def update(self, **changes: Any) -> None:
        """Change the marker (and beat); a marker a later run wrote over ours (a second Snakemake after
        ``--unlock``) is left to it."""
        with self._lock:
            self.marker = replace(self.marker, heartbeat_at=time.time(), **changes)
            on_disk = RunMarker.read(self.path)
            if (
                on_disk is not None
                and on_disk.pid != self.marker.pid
                and on_disk.started_at > self.marker.started_at
            ):
                self._stop.set()
                return
            self._write()

    def start_heartbeat(self) -> None:
        def loop() -> None:
            while not self._stop.wait(self._every_s):
                self.update()

        self._thread = threading.Thread(target=loop, name="run-marker-heartbeat", daemon=True)
        self._thread.start()

    def end(self, outcome: str) -> None:
        self._stop.set()
        self.update(phase="ended", outcome=outcome, ended_at=time.time())


def release_dead_lock(marker_path: Path, locks_dir: Path, host: str | None = None) -> str | None:
    """Remove the Snakemake lock a provably dead controller left (the marker's run, on this host, its pid
    gone or reused, and no lock file newer than its last heartbeat); the console line saying so, or
    None when nothing was released (no lock, a live owner, another host, or not provably dead)."""
    marker = RunMarker.read(marker_path)
    locks = sorted(locks_dir.glob("*.lock")) if locks_dir.is_dir() else []
    if marker is None or not locks or marker.outcome is not None:
        return None
    if marker.host != (host or socket.gethostname()) or marker.liveness(host=host) != "dead":
        return None
    try:
        if any(p.stat().st_mtime > marker.heartbeat_at + START_TIME_SLACK_S for p in locks):
            return None  # taken after the dead run's last heartbeat: another run's
        for p in locks:
            p.unlink(missing_ok=True)
    except OSError:
        return None
    return (
        f"regen: released the Snakemake lock left by the run of {marker.describe()}: its controller is "
        "gone (killed); resuming"
    )


def lock_refused_line(marker_path: Path, locks_dir: Path, host: str | None = None) -> str | None:
    """When a lock stays (its run alive, or on another host): who holds it and what to do before
    ``--unlock`` (README step 10); None without a lock or a running marker."""
    marker = RunMarker.read(marker_path)
    locks = sorted(locks_dir.glob("*.lock")) if locks_dir.is_dir() else []
    if marker is None or not locks or marker.outcome is not None:
        return None
    here = marker.host == (host or socket.gethostname())
    state = marker.liveness(host=host)
    if here and state == "dead":
        return None
    why = "is alive" if state == "running" else "ran on another host (its heartbeat stopped)"
    return (
        f"regen: this directory is locked by the run of {marker.describe()}, which {why}: make sure no run "
        "is alive in it (`regen status`) before `snakemake --unlock` (README, step 10)"
    )
