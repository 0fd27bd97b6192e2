"""A job whose Snakemake controller dies stops as Ctrl-C would (issue 47 item 4): ``regen.runlog.log_to``
watches the controller's pid. A stand-in controller (a process with ``snakemake`` in its argv) starts a
job that calls ``log_to`` and sleeps; the controller is SIGKILLed; the job ends within seconds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

JOB = """
import sys, time
from regen.runlog import log_to
log_to(sys.argv[1])
open(sys.argv[2], "w").write("started")
time.sleep(60)
"""

CONTROLLER = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]])
time.sleep(60)
"""


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_a_job_stops_when_its_controller_is_killed(tmp_path: Path, sigint: str) -> None:
    """Also when the controller runs as a shell script's background job (``snakemake ... &``, nohup),
    whose children start with SIGINT ignored."""
    log, started = tmp_path / "logs" / "generate" / "00000.log", tmp_path / "started"

    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    controller = subprocess.Popen(
        [sys.executable, "-c", CONTROLLER, JOB, str(log), str(started), "snakemake-stand-in"],
        start_new_session=True,
        preexec_fn=ignore_sigint if sigint == "ignored" else None,
    )
    try:
        deadline = time.monotonic() + 30
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert started.exists(), "the job started"
        job = int(subprocess.run(["pgrep", "-P", str(controller.pid)], capture_output=True, text=True).stdout)
        os.kill(controller.pid, signal.SIGKILL)
        controller.wait()
        deadline = time.monotonic() + 10
        while Path(f"/proc/{job}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not Path(f"/proc/{job}").exists() or "Z" in Path(f"/proc/{job}/stat").read_text().split()[2]
        text = log.read_text()
        assert "Snakemake controller (pid" in text and "is gone" in text, text
        assert "stopped (Ctrl-C); what finished is kept" in text, text
    finally:
        if controller.poll() is None:
            os.killpg(controller.pid, signal.SIGKILL)
