"""The workflow as a test runs it: a copy of the checkout's workflow in a fresh directory, and Snakemake
run there (tests/workflow/test_workflow.py and the tests elsewhere that end with a real demo run)."""

from __future__ import annotations

import os
import random
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

ROOT = Path(__file__).resolve().parents[2]  # tests/support/workflow.py
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
WORKFLOW_PARTS = ("Snakefile", "rules", "scripts", "schemas", "report", "envs", "config", "resources", "data")


def copy_workflow(dest: Path) -> Path:
    return copy_parts(dest, WORKFLOW_PARTS)


def copy_parts(dest: Path, parts: Iterable[str], *, missing_ok: bool = False) -> Path:
    """Copy the checkout's ``parts`` (files or folders, no ``__pycache__``) into a new ``dest``."""
    dest.mkdir(parents=True)
    for part in parts:
        src = ROOT / part
        if src.is_dir():
            shutil.copytree(src, dest / part, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists() or not missing_ok:
            shutil.copy2(src, dest / part)
    return dest


def free_port_base(slots: int = 2) -> int:
    """A base port whose next ``slots`` ports are free now, below the ephemeral range (ports are
    operational: a range of our own keeps parallel runs on this machine from colliding)."""
    for _ in range(200):
        base = random.randrange(20000, 32000, slots)
        try:
            for port in range(base, base + slots):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port range")


def snakemake(wd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SNAKEMAKE, *args],
        cwd=wd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def regen(wd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The ``regen`` CLI in ``wd`` (its console captured)."""
    return subprocess.run(
        [sys.executable, "-m", "regen.cli", *args], cwd=wd, capture_output=True, text=True, timeout=120
    )


def job_counts(output: str) -> dict[str, int]:
    """The 'Job stats' table of a dry run: rule -> count."""
    table = output.split("Job stats:", 1)[1]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


def dataset_records(dataset: Path, *columns: str) -> list[dict[str, Any]]:
    """A merged dataset's records (``columns`` and ``messages``); ``answer`` is the regenerated assistant
    turn (the last message)."""
    table = ds.dataset(str(dataset), format="parquet").to_table(
        columns=list(dict.fromkeys([*columns, "messages"]))
    )
    return [r | {"answer": r["messages"][-1]["content"]} for r in table.to_pylist()]
