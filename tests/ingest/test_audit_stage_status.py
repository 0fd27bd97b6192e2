"""The workflow's audit job reports its progress where ``regen status`` reads it (issue 34 item 7)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from regen.layout.run import RUN, RunLayout
from regen.observe.status import status_report

ROOT = Path(__file__).resolve().parents[2]
DATASET = ROOT / "data" / "demo" / "dataset.jsonl"


@pytest.mark.timeout(300)
def test_the_workflow_audit_writes_its_stage_file_and_status_shows_it(tmp_path: Path) -> None:
    for part in ("data", "resources", "config"):
        (tmp_path / part).symlink_to(ROOT / part)
    snakemake = str(Path(sys.executable).with_name("snakemake"))
    argv = [snakemake, "-s", str(ROOT / "Snakefile"), str(RUN.audit.summary), "--cores", "1",
            "--configfile", "config/demo.yaml"]  # fmt: skip
    run = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=280)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = sum(1 for line in DATASET.read_bytes().splitlines() if line.strip())
    layout = RunLayout.under(tmp_path)
    state = json.loads(layout.stage_progress("audit").read_text())
    assert (state["done"], state["total"], state["finished"]) == (rows, rows, True)
    assert f"regen: audit: done, {rows:,} rows in " in run.stderr  # the console line Snakemake shows
    text = status_report(layout.work, layout.results, now=state["updated_at"] + 5)
    assert f"audit: done, {rows:,} rows in " in text
