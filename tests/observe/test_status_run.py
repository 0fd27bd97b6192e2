"""Which run ``regen status`` describes (issue 47 item 3) and when a dead controller's Snakemake lock is
released (item 4): the run marker (``regen.run_marker``) on run trees the test makes."""

from __future__ import annotations

import dataclasses
import io
import os
import subprocess
import sys
import time
from pathlib import Path

from test_status import write_status

from regen.generate.replay import ShardReplay
from regen.layout.run import RunLayout
from regen.observe.status import status_report, watch
from regen.run_marker import (
    DEAD_AFTER_S,
    MarkerWriter,
    RunMarker,
    lock_refused_line,
    new_marker,
    release_dead_lock,
)


def gone_pid() -> int:
    """The pid of a process that has ended."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def marker_of(pid: int, host: str | None = None, **changes: object) -> RunMarker:
    m = new_marker("demo+small", "id-demo", ["config/demo.yaml"], None)
    fields = {"pid": pid, "pid_started": None if pid != os.getpid() else m.pid_started, "phase": "running"}
    if host is not None:
        fields["host"] = host
    return _replace(m, **{**fields, **changes})


def _replace(m: RunMarker, **changes: object) -> RunMarker:
    return dataclasses.replace(m, **changes)  # type: ignore[arg-type]


def earlier_run_tree(layout: RunLayout) -> None:
    """An earlier run's two finished shards, and one in flight."""
    write_status(layout.work, "00000", "gpu0", 100, 100, 0.0, finished=True)
    write_status(
        layout.work, "00001", "gpu0", 40, 100, 5.0, in_flight=10, oldest_in_flight_at=time.time() - 5
    )


def test_a_run_in_its_check_phase_shows_no_earlier_shards(tmp_path: Path) -> None:
    layout = RunLayout.under(tmp_path)
    earlier_run_tree(layout)
    writer = MarkerWriter(layout.run_marker, new_marker("mine", "id-mine", ["config/mine.yaml"], None))
    text = status_report(layout.work, layout.results)
    assert text.startswith("run: mine (pid ") and "running, phase check" in text
    assert "samples:" not in text and "00001" not in text
    writer.update(phase="running")
    text = status_report(layout.work, layout.results)
    assert "running, phase " in text and "40/100" in text
    writer.end("finished")
    assert "ended " in status_report(layout.work, layout.results) and ", finished" in status_report(
        layout.work, layout.results
    )


def test_a_dead_run_shows_dead_with_nothing_in_flight_and_watch_exits(tmp_path: Path) -> None:
    layout = RunLayout.under(tmp_path)
    earlier_run_tree(layout)
    marker_of(gone_pid()).write(layout.run_marker)
    text = status_report(layout.work, layout.results)
    assert "DEAD (its controller is gone" in text and "rerun the same snakemake command" in text
    assert "0 in flight" in text and "ETA ?" in text, text
    out = io.StringIO()
    t0 = time.monotonic()
    assert watch(layout.work, layout.results, 5.0, out, max_frames=100) == 0
    assert time.monotonic() - t0 < 2 and out.getvalue().count("regen status ") == 1


def test_on_another_host_a_run_is_dead_once_its_heartbeat_is_old() -> None:
    now = time.time()
    fresh = marker_of(12345, host="elsewhere", heartbeat_at=now - 1)
    assert fresh.liveness(now) == "running"
    assert _replace(fresh, heartbeat_at=now - DEAD_AFTER_S - 1).liveness(now) == "dead"
    # a pid reused by another process is dead, not alive
    assert marker_of(os.getpid(), pid_started=1.0).liveness() == "dead"
    assert marker_of(os.getpid()).liveness() == "running"


def locks(layout: RunLayout, mtime: float) -> Path:
    layout.snakemake_locks.mkdir(parents=True, exist_ok=True)
    for name in ("0.input.lock", "0.output.lock"):
        (layout.snakemake_locks / name).write_text("results/READY.json\n")
        os.utime(layout.snakemake_locks / name, (mtime, mtime))
    return layout.snakemake_locks


def test_the_lock_of_a_dead_controller_on_this_host_is_released_with_one_line(tmp_path: Path) -> None:
    layout = RunLayout.under(tmp_path)
    now = time.time()
    marker_of(gone_pid(), heartbeat_at=now).write(layout.run_marker)
    lock_dir = locks(layout, now - 30)
    line = release_dead_lock(layout.run_marker, lock_dir)
    assert line is not None and line.startswith(
        "regen: released the Snakemake lock left by the run of demo+small"
    )
    assert not list(lock_dir.glob("*.lock"))


def test_a_live_owner_another_host_or_a_newer_lock_still_refuse(tmp_path: Path) -> None:
    layout = RunLayout.under(tmp_path)
    now = time.time()
    lock_dir = locks(layout, now - 30)
    marker_of(os.getpid(), heartbeat_at=now).write(layout.run_marker)  # alive
    assert release_dead_lock(layout.run_marker, lock_dir) is None
    assert "which is alive" in (lock_refused_line(layout.run_marker, lock_dir) or "")
    marker_of(gone_pid(), host="elsewhere", heartbeat_at=now - 600).write(layout.run_marker)
    assert release_dead_lock(layout.run_marker, lock_dir) is None
    assert "README, step 10" in (lock_refused_line(layout.run_marker, lock_dir) or "")
    marker_of(gone_pid(), heartbeat_at=now - 300).write(layout.run_marker)  # a lock taken after it died
    assert release_dead_lock(layout.run_marker, lock_dir) is None
    marker_of(gone_pid(), heartbeat_at=now, outcome="failed").write(layout.run_marker)  # ended: not its lock
    assert release_dead_lock(layout.run_marker, lock_dir) is None
    assert len(list(lock_dir.glob("*.lock"))) == 2


def test_status_shows_what_each_generate_job_replays_and_generates(tmp_path: Path) -> None:
    layout = RunLayout.under(tmp_path)
    write_status(layout.work, "00001", "gpu0", 80, 180, 5.0)
    ShardReplay("00001", 74, 106, "abc").write(layout)
    ShardReplay("00000", 180, 0, "abc").write(layout)
    text = status_report(layout.work, layout.results)
    assert "journals: 254 replayed, 106 to generate" in text and "00001 74+106" in text, text
    assert (
        ShardReplay("00001", 74, 106, "abc")
        .line()
        .startswith("regen: shard 00001: 74 replayed from the journal, 106 to generate")
    )


def test_a_rerun_still_building_its_plan_is_followed_not_called_dead(tmp_path: Path) -> None:
    """Issue 58 item 6: between a rerun's start and its ``onstart`` (which writes the marker) the marker
    still names the killed run; a live Snakemake working here that started after it is the run shown."""
    import subprocess
    import sys

    layout = RunLayout.under(tmp_path)
    earlier_run_tree(layout)
    marker_of(gone_pid(), started_at=time.time() - 60).write(layout.run_marker)
    assert "DEAD" in status_report(layout.work, layout.results)
    rerun = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)", "snakemake"], cwd=layout.work.parent
    )
    try:
        time.sleep(0.3)
        text = status_report(layout.work, layout.results)
        assert "a new run is starting here" in text and "DEAD" not in text, text
        out = io.StringIO()
        assert watch(layout.work, layout.results, 0.5, out, max_frames=2) == 0
        assert out.getvalue().count("regen status ") == 2  # --watch follows it, does not exit at once
    finally:
        rerun.kill()
        rerun.wait()
    assert "DEAD" in status_report(layout.work, layout.results)
