"""The workflow as a test runs it: a copy of the checkout's workflow in a fresh directory, and Snakemake
run there (tests/workflow/test_workflow.py and the tests elsewhere that end with a real demo run)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # tests/support/workflow.py
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
WORKFLOW_PARTS = ("Snakefile", "rules", "scripts", "schemas", "report", "envs", "config", "resources", "data")


def copy_workflow(dest: Path) -> Path:
    dest.mkdir(parents=True)
    for part in WORKFLOW_PARTS:
        src = ROOT / part
        if src.is_dir():
            shutil.copytree(src, dest / part)
        else:
            shutil.copy2(src, dest / part)
    return dest


def snakemake(wd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SNAKEMAKE, *args],
        cwd=wd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def job_counts(output: str) -> dict[str, int]:
    """The 'Job stats' table of a dry run: rule -> count."""
    table = output.split("Job stats:", 1)[1]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}
