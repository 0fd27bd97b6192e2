"""The slot host of a Slurm group job (regen.serving.slothost), without Slurm: it starts supervisors on a
member's request as its own children, answers nobody else's requests, and a member finds no host where
none runs. (On the two-node Slurm under cgroup tracking: tests/workflow/test_slurm_multinode.py.)"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from regen.serving import slothost
from regen.serving.procfs import is_supervisor, pid_alive, proc_stat, read_url_state
from regen.serving.slothost import SlotHost, ask_host, launch, socket_address, start_hosted


def fresh_job() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def host() -> Iterator[tuple[str, SlotHost]]:
    """A host serving in a thread of this process, its job taken as alive."""
    job = fresh_job()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_address(job))
    listener.listen(8)
    served = SlotHost(listener, job)
    served.watch.alive = lambda: True  # type: ignore[method-assign]
    thread = threading.Thread(target=served.serve, kwargs={"poll_s": 0.1}, daemon=True)
    thread.start()
    yield job, served
    served.stopped = True
    thread.join(5)
    listener.close()
    for child in served.children:
        child.kill()
        child.wait(5)


def supervisor_args(tmp_path: Path) -> list[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [
        "--slot", "0", "--url", f"http://127.0.0.1:{port}", "--url-file", str(tmp_path / "gpu0.url"),
        "--lease-file", str(tmp_path / "gpu0.lease"), "--log-file", str(tmp_path / "gpu0.log"),
        "--idle-timeout", "60", "--startup-timeout", "60", "--max-restarts", "0",
        "--owner-pid", str(os.getpid()), "--model", "m", "--host", "127.0.0.1", "--port", str(port),
        "--", "sleep", "60",
    ]  # fmt: skip


def test_no_host_means_the_member_starts_the_supervisor_itself(tmp_path: Path) -> None:
    files = (tmp_path / "gpu0.log", tmp_path / "gpu0.url")
    assert start_hosted(fresh_job(), ["--slot", "0"], {}, *files) is None


def test_the_host_starts_a_supervisor_as_its_own_child(tmp_path: Path, host: tuple[str, SlotHost]) -> None:
    job, served = host
    url = tmp_path / "gpu0.url"
    started = start_hosted(job, supervisor_args(tmp_path), dict(os.environ), tmp_path / "gpu0.log", url)
    assert started is not None
    # answered once /proc shows it as the supervisor of this slot: a member can tell it is alive at once
    assert started.poll() is None and is_supervisor(started.pid, url)
    stat = proc_stat(started.pid)
    assert stat is not None and stat[1] == os.getpid()  # the host's child (the host runs in this process)
    assert [c.pid for c in served.children] == [started.pid]
    deadline = time.monotonic() + 10
    while (state := read_url_state(url)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert state is not None and state.supervisor_pid == started.pid
    started.terminate()
    assert started.wait(20) == 0
    assert not pid_alive(started.pid)


def test_the_host_runs_nothing_but_a_supervisor(host: tuple[str, SlotHost], tmp_path: Path) -> None:
    job, served = host
    assert "unknown request" in (ask_host(job, {"op": "run", "argv": ["sh", "-c", "true"]}) or {})["error"]
    bad = ask_host(job, {"op": "start", "args": "sleep 60", "env": {}, "log": str(tmp_path / "x.log")})
    assert "list of strings" in (bad or {})["error"]
    assert served.children == []


def test_the_launched_host_listens_before_the_precommand_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = fresh_job()
    # no slurmstepd of this job here: the host asks squeue, which says the job runs until told otherwise
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    squeue.write_text(f"#!/bin/sh\ncat {tmp_path / 'job-state'}\n")
    squeue.chmod(0o755)
    (tmp_path / "job-state").write_text("RUNNING\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    pid = launch(job, tmp_path / "host.log")
    assert pid is not None
    try:
        answer = ask_host(job, {"op": "ping"})  # at once: the socket was bound before launch returned
        assert answer == {"pid": pid, "job": job, "children": []}
        assert launch(job, tmp_path / "host.log") is None  # one host per job on a node
        (tmp_path / "job-state").write_text("COMPLETED\n")  # the job ends: the host goes (squeue every 10 s)
        deadline = time.monotonic() + 30
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pid_alive(pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    log = (tmp_path / "host.log").read_text()
    assert "serving Slurm job" in log and "the job is gone; exiting" in log


def test_outside_a_slurm_job_the_precommand_does_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert slothost.main([]) == 0
    assert "not in a Slurm job" in capsys.readouterr().err
