"""The workflow as a user runs it: plan, bad config, the demo end to end, partial-run resume, report."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import pytest
from support.workflow import copy_workflow, job_counts, snakemake

from regen.io import open_lines
from regen.layout.run import RunLayout


@pytest.fixture
def wd(tmp_path: Path) -> Path:
    return copy_workflow(tmp_path / "wf")


def test_dry_run_lists_every_gpu_job(wd: Path) -> None:
    demo_shards = 4  # config/demo.yaml shards.count
    run = snakemake(wd, "-n", "--configfile", "config/demo.yaml")
    assert run.returncode == 0, run.stderr + run.stdout
    counts = job_counts(run.stdout + run.stderr)
    assert counts["generate"] == demo_shards
    assert counts["validate"] == demo_shards
    for rule in ("audit", "shard", "tune", "merge", "reaudit", "reconcile", "report_assets"):
        assert counts[rule] == 1, rule


def test_shard_count_is_config(wd: Path) -> None:
    (wd / "config" / "nine.yaml").write_text("shards: {count: 9}\n")
    run = snakemake(wd, "-n", "--configfile", "config/demo.yaml", "config/nine.yaml")
    assert run.returncode == 0, run.stderr + run.stdout
    assert job_counts(run.stdout + run.stderr)["generate"] == 9


@pytest.mark.parametrize(
    ("override", "names"),
    [
        ("shards: {count: 0}\n", ["count", "minimum"]),
        ("generate: {truncation: sometimes}\n", ["truncation", "sometimes"]),
        ("server: {port_base: eighty}\n", ["port_base", "eighty"]),
        ("shard: {count: 3}\n", ["shard (config/bad.yaml): unknown key; did you mean shards?"]),
    ],
)
def test_bad_config_stops_before_any_job(wd: Path, override: str, names: list[str]) -> None:
    (wd / "config" / "bad.yaml").write_text(override)
    run = snakemake(wd, "--cores", "1", "--configfile", "config/demo.yaml", "config/bad.yaml")
    out = run.stdout + run.stderr
    assert run.returncode != 0
    for name in names:
        assert name in out, out[-2000:]
    assert not (wd / "results").exists(), "a job ran despite the bad config"


def read_jsonl_ids(path: Path) -> list[str]:
    with open_lines(path) as lines:  # the generation records are zstd-compressed
        return [json.loads(line)["id"] for line in lines if line.strip()]


def test_demo_end_to_end_resume_and_report(wd: Path) -> None:
    # First only two shards' generations: a partial run.
    partial = snakemake(
        wd,
        "results/generations/00000.jsonl.zst",
        "results/generations/00001.jsonl.zst",
        "--cores",
        "2",
        "--configfile",
        "config/demo.yaml",
    )
    assert partial.returncode == 0, partial.stderr[-3000:]
    dry = snakemake(wd, "-n", "--configfile", "config/demo.yaml")
    counts = job_counts(dry.stdout + dry.stderr)
    assert counts["generate"] == 2, "only the two remaining shards should be listed"
    assert "audit" not in counts and "shard" not in counts

    full = snakemake(wd, "--cores", "2", "--configfile", "config/demo.yaml")
    assert full.returncode == 0, full.stderr[-3000:]
    ready = json.loads((wd / "results" / "READY.json").read_text())
    assert ready["ready"] is True and ready["rows"] > 0
    reconcile = json.loads((wd / "results" / "reconcile.json").read_text())
    assert reconcile["ok"] and reconcile["lost_count"] == 0 and reconcile["duplicated_count"] == 0
    assert sum(reconcile["counts"].values()) == reconcile["input"]
    # the demo's planted benchmark prompts (config/demo.yaml audit.decontamination) are kept out
    audit = json.loads((wd / "results" / "audit" / "summary.json").read_text())
    assert audit["contaminated"] == 3 and audit["contaminated_by"] == {"demo-bench": 3}
    assert reconcile["reasons"]["excluded"]["contaminated"] == 3

    # Exactly one record per generated sample across shards.
    records = RunLayout.under(wd).record_files()
    ids = [i for p in records for i in read_jsonl_ids(p)]
    assert len(records) == 4 and ids and len(ids) == len(set(ids))

    # No server outlives the run that started it (onsuccess stops them).
    assert not [p for p in _live_regen_servers() if str(wd) in p]

    # Nothing left to do.
    again = snakemake(wd, "-n", "--configfile", "config/demo.yaml")
    assert "Nothing to be done" in again.stdout + again.stderr

    report = snakemake(wd, "--configfile", "config/demo.yaml", "--report", "report.html")
    assert report.returncode == 0, report.stderr[-3000:]
    html = (wd / "report.html").read_text(errors="replace")
    assert len(html) > 10_000 and "throughput" in html
    zipped = snakemake(wd, "--configfile", "config/demo.yaml", "--report", "report.zip")
    assert zipped.returncode == 0, zipped.stderr[-3000:]
    with zipfile.ZipFile(wd / "report.zip") as archive:
        names = archive.namelist()
    assert any(n.endswith("throughput.svg") for n in names) and any(n.endswith("summary.json") for n in names)


def _live_regen_servers() -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "regen.serving.supervisor" in cmd or "regen.simulated" in cmd:
            found.append(cmd)
    return found
