"""A supervisor owned by a Slurm group job: its idle timeout counts only once the job is done (issue 58
item 2). The group job is a process named as Slurm names a job's batch step (``slurmstepd: [JOB.batch]``),
which is what the supervisor watches on its node; no Slurm needed."""

from __future__ import annotations

import io
import os
import subprocess
import time
from pathlib import Path

import pytest

from regen.serving.supervisor import Stop, Supervisor, SupervisorConfig

JOB = "987654321"


def supervisor(tmp_path: Path, owner_slurm_job: str | None, owner_pid: int = 1) -> Supervisor:
    cfg = SupervisorConfig(
        slot=0,
        url="http://127.0.0.1:1",
        url_file=tmp_path / "gpu0.url",
        lease_file=tmp_path / "gpu0.lease",
        log_file=tmp_path / "gpu0.log",
        idle_timeout_s=20.0,
        startup_timeout_s=10.0,
        max_restarts=0,
        owner_pid=owner_pid,
        model="m",
        host="127.0.0.1",
        port=1,
        api_key_env=None,
        command=["true"],
        poll_s=0.1,
        grace_s=1.0,
        owner_slurm_job=owner_slurm_job,
    )
    return Supervisor(cfg, io.StringIO())


@pytest.fixture
def group_job():
    """A stand-in for the group job's batch step, alive until the test ends it."""
    proc = subprocess.Popen(["bash", "-c", f"exec -a 'slurmstepd: [{JOB}.batch]' sleep 60"])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(b"slurmstepd"):
            break
        time.sleep(0.01)
    yield proc
    proc.kill()
    proc.wait()


def test_a_group_jobs_server_outlives_the_gap_between_members(tmp_path: Path, group_job) -> None:
    sup = supervisor(tmp_path, JOB)
    assert sup.owner_job is not None and sup.owner_job.local
    sup.last_busy = time.monotonic() - 41  # the gap measured between two members: past the demo's 20 s
    sup.check_exit()  # no Stop: the job has members left
    group_job.kill()
    group_job.wait()
    with pytest.raises(Stop, match="is gone"):  # the last member is done: it exits at once
        sup.check_exit()


def test_a_server_of_no_group_job_still_exits_when_idle(tmp_path: Path) -> None:
    sup = supervisor(tmp_path, None, owner_pid=os.getpid())  # its owner, this process, alive
    sup.last_busy = time.monotonic() - 21
    with pytest.raises(Stop, match="idle for"):
        sup.check_exit()


def test_an_unanswered_squeue_leaves_the_idle_timeout_on(tmp_path: Path, monkeypatch) -> None:
    sup = supervisor(tmp_path, "123")  # no slurmstepd of job 123 on this node: squeue is asked
    assert sup.owner_job is not None and not sup.owner_job.local
    monkeypatch.setattr("regen.serving.supervisor.squeue_running", lambda job: None)
    sup.owner_job.last_look = -1e9
    sup.last_busy = time.monotonic() - 21
    with pytest.raises(Stop, match="idle for"):
        sup.check_exit()
