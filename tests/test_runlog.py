"""A job stopped by Ctrl-C says so in one line (its log and Snakemake's console), with no traceback,
and still ends by SIGINT so Snakemake sees a job the user stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from regen.runlog import job_name

ROOT = Path(__file__).resolve().parents[1]


def test_ctrl_c_in_a_job_is_one_line_not_two_tracebacks(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "generate" / "00003.log"
    code = (
        "import asyncio\n"
        "from regen.runlog import log_to\n"
        f"log_to({str(log)!r})\n"
        "async def work():\n"
        "    await asyncio.sleep(0.05)\n"
        "    raise KeyboardInterrupt\n"  # as asyncio.run re-raises it after cancelling the tasks
        "asyncio.run(work())\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)  # fmt: skip
    assert run.returncode == -signal.SIGINT
    assert run.stderr.splitlines() == ["regen: generate 00003: stopped (Ctrl-C); what finished is kept"]
    text = log.read_text()
    assert "Traceback" not in text and text.count("stopped (Ctrl-C)") == 1


def test_any_other_error_keeps_its_traceback(tmp_path: Path) -> None:
    log = tmp_path / "merge.log"
    code = f"from regen.runlog import log_to\nlog_to({str(log)!r})\nraise ValueError('bad row 7')\n"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)  # fmt: skip
    assert run.returncode == 1 and "Traceback" in log.read_text() and "bad row 7" in log.read_text()


def test_job_names() -> None:
    assert job_name("logs/generate/00003.log") == "generate 00003"
    assert job_name("logs/merge.log") == "merge" and job_name("/wf/logs/merge.log") == "merge"
    assert job_name("/tmp/x/export.log") == "export"
