"""A job orphaned before its watch began stops before work (issue 58 item 3): with no Snakemake above it,
``regen.runlog.controller_gone`` reads the run marker; a dead or ended run, or one newer than the job,
stops it (``stop_if_controller_gone``, which the generate job calls before it starts a server and before
its first request); a live run older than the job lets it go on."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from regen.run_marker import RunMarker, process_start_time
from regen.runlog import controller_gone, stop_if_controller_gone


def marker(path: Path, pid: int, started_at: float, outcome: str | None = None) -> Path:
    RunMarker(
        config="demo",
        config_id="x",
        pid=pid,
        pid_started=process_start_time(pid),
        host=socket.gethostname(),
        started_at=started_at,
        phase="running",
        heartbeat_at=started_at,
        outcome=outcome,
    ).write(path)
    return path


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_an_orphan_of_a_dead_run_stops_before_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    path = marker(tmp_path / "run.json", dead_pid(), started_at=1.0)
    assert "is dead" in (controller_gone(path) or "")
    with pytest.raises(KeyboardInterrupt):
        stop_if_controller_gone(path)
    ended = marker(tmp_path / "ended.json", os.getppid(), started_at=1.0, outcome="failed")
    assert "is ended" in (controller_gone(ended) or "")


def test_a_newer_run_means_this_jobs_controller_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    path = marker(tmp_path / "run.json", os.getppid(), started_at=time.time() + 5)
    assert "newer run" in (controller_gone(path) or "")


def test_a_live_run_older_than_the_job_or_no_marker_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    path = marker(tmp_path / "run.json", os.getppid(), started_at=1.0)
    assert controller_gone(path) is None
    stop_if_controller_gone(path)
    assert controller_gone(tmp_path / "none.json") is None
