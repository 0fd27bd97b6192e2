"""A reused checkout tells the truth (issue 34 items 1 and 2): one directory runs a config, then another
with fewer shards and no exports, then that config with a failed output gate, then with a failed input
gate. After each run ``regen status``, ``regen reconcile``, the report and ``READY.json`` speak of the
current config alone; after a failed gate ``snakemake --report`` still writes a report, whose first page
says NOT READY and why, and no earlier READY, export or report is left standing.

One sequence of runs for the module (simulated servers, 40 conversations the test writes)."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.workflow import copy_workflow, free_port_base, regen, snakemake

from bench.workflow import write_chats
from regen.layout.run import RunLayout

ROWS = 40
BASE = ("--configfile", "config/demo.yaml", "config/small.yaml")
SECOND = (*BASE, "config/second.yaml")  # 2 shards, no exports
THIRD = (*BASE, "config/two_shards.yaml")  # 2 shards, exports


@dataclass(frozen=True)
class Seen:
    """What a user finds after one run: its console, and status, reconcile, report and READY."""

    run: subprocess.CompletedProcess[str]
    report: subprocess.CompletedProcess[str]
    status: str
    reconcile: dict
    landing: str
    report_html: str
    ready: dict | None
    exported: bool
    stale: list[str]
    kept: list[Path]  # the earlier runs kept whole (work/earlier-runs/*/results)
    wd: Path


def look(wd: Path, configs: tuple[str, ...], run: subprocess.CompletedProcess[str]) -> Seen:
    layout = RunLayout.under(wd)
    report = snakemake(wd, *configs, "--report", str(layout.report_html.relative_to(wd)))
    regen(wd, "reconcile")  # writes results/reconcile.json, whatever it finds
    landing = layout.failed_run_landing
    if not landing.is_file():
        landing = layout.report_asset("landing.rst")
    return Seen(
        run=run,
        report=report,
        status=regen(wd, "status").stdout,
        reconcile=json.loads(layout.reconcile.read_text()) if layout.reconcile.is_file() else {},
        landing=landing.read_text() if landing.is_file() else "",
        report_html=layout.report_html.read_text(errors="replace") if layout.report_html.is_file() else "",
        ready=json.loads(layout.ready.read_text()) if layout.ready.is_file() else None,
        exported=layout.export_dir.exists(),
        stale=sorted(str(p.relative_to(wd)) for p in layout.stale_dir.rglob("*") if p.is_file()),
        kept=sorted(layout.earlier_runs_dir.glob("*/results")),
        wd=wd,
    )


KEPT_LINE = re.compile(r"regen: the earlier READY run of config (\S+) is kept whole in (\S+) ")


def kept_from_console(wd: Path, console: str) -> tuple[str, Path]:
    """The config and folder the console named for the earlier run it kept whole."""
    found = KEPT_LINE.findall(console)
    assert len(found) == 1, console[-4000:]
    return found[0][0], wd / found[0][1]


def assert_reconciles(wd: Path, kept: Path, rows: int) -> None:
    """The earlier run, where the console said: READY, and `regen reconcile --results` there agrees."""
    ready = json.loads((kept / "READY.json").read_text())
    assert ready["ready"] and ready["rows"] == rows
    check = regen(wd, "reconcile", "--results", str(kept), "--json")
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]
    assert json.loads(check.stdout)["ok"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Seen]:
    wd = copy_workflow(tmp_path_factory.mktemp("reused") / "wf")
    write_chats(
        wd / "data" / "small.jsonl",
        (
            (f"small-{i:03d}", f"Question {i}: what is {i} times {i + 3}, and why?", f"It is {i * (i + 3)}.")
            for i in range(ROWS)
        ),
    )
    faults = "{error_rate: 0, think_leak_rate: 0, empty_answer_rate: 0, noncanonical_rate: 0}"
    (wd / "config" / "small.yaml").write_text(
        "dataset: {path: data/small.jsonl}\n"
        "audit: {decontamination: {benchmarks: []}}\n"
        "export: {enabled: true, eval_fraction: 0.1}\n"
        f"server: {{port_base: {free_port_base()}, simulated: {{faults: {faults}}}}}\n"
    )
    (wd / "config" / "second.yaml").write_text("shards: {count: 2}\nexport: {enabled: false}\n")
    (wd / "config" / "two_shards.yaml").write_text("shards: {count: 2}\n")
    (wd / "config" / "min_rows.yaml").write_text("reaudit: {min_rows: 1000}\n")
    (wd / "config" / "audit_gate.yaml").write_text("audit: {context_limit: 8}\n")
    seen = {}
    first = snakemake(wd, "--cores", "2", *BASE, timeout=600)
    assert first.returncode == 0, first.stderr[-4000:]
    seen["first"] = look(wd, BASE, first)
    second = snakemake(wd, "--cores", "2", *SECOND, timeout=600)
    seen["second"] = look(wd, SECOND, second)
    for name in ("min_rows", "audit_gate"):
        # a READY run with exports and its report first, then the same config with a failed gate
        ready = snakemake(wd, "--cores", "2", *THIRD, timeout=600)
        assert ready.returncode == 0, ready.stderr[-4000:]
        seen[f"before_{name}"] = look(wd, THIRD, ready)
        configs = (*THIRD, f"config/{name}.yaml")
        seen[name] = look(wd, configs, snakemake(wd, "--cores", "2", *configs, timeout=600))
    return seen


@pytest.mark.timeout(1800)
def test_a_second_config_sees_only_its_own_outputs(runs: dict[str, Seen]) -> None:
    first, second = runs["first"], runs["second"]
    assert first.ready and first.ready["rows"] == ROWS and first.exported
    assert second.run.returncode == 0, second.run.stderr[-4000:]
    # the first config's READY run is kept whole where the console says, and reconciles there
    config, kept = kept_from_console(second.wd, second.run.stderr)
    assert config == "demo+small" and kept.is_relative_to(second.wd / "work" / "earlier-runs")
    assert (kept / "shards" / "00003.parquet").is_file() and (kept / "export" / "manifest.json").is_file()
    assert_reconciles(second.wd, kept, ROWS)
    assert not second.exported
    # status, reconcile, the report and READY all count the second config's 40 samples in 2 shards
    assert re.search(r"shards: \d/2 finished", second.status), second.status
    assert f"samples: {ROWS}/{ROWS} (100.0%)" in second.status, second.status
    assert second.reconcile["ok"], second.reconcile
    assert second.reconcile["input"] == ROWS and second.reconcile["counts"]["output"] == ROWS
    assert second.ready == {**second.ready, "ready": True, "rows": ROWS}
    assert second.landing.startswith(f"**READY**: {ROWS} training-ready rows"), second.landing
    assert "in 2 shards" in second.landing
    # export.enabled false: nothing claims an eval split that was not written
    assert "no trainer files written" in second.landing and "rows held out" not in second.landing
    assert second.report.returncode == 0, second.report.stderr[-3000:]


@pytest.mark.timeout(1800)
@pytest.mark.parametrize(
    ("gate", "why"),
    [
        # the landing page is rst: its underscores escaped
        ("min_rows", "reaudit.min\\_rows = 40 < limit 1000"),
        # `regen check` reads the first rows with the audit's own reader: stopped there, before any job
        ("audit_gate", "all 40 rows are excluded (over_length=40)"),
    ],
)
def test_a_failed_gate_leaves_a_not_ready_report_and_nothing_current(
    runs: dict[str, Seen], gate: str, why: str
) -> None:
    before, seen = runs[f"before_{gate}"], runs[gate]
    assert before.ready and before.exported and "training-ready rows in" in before.report_html
    assert seen.run.returncode != 0
    assert "NOT READY" in seen.run.stderr, seen.run.stderr[-3000:]
    # snakemake --report writes a report, and its first page says NOT READY and why
    assert seen.report.returncode == 0, seen.report.stderr[-3000:]
    assert seen.landing.startswith("**NOT READY**"), seen.landing
    assert why in seen.landing or why in seen.run.stderr, seen.landing
    assert "NOT READY" in seen.report_html and "training-ready rows in" not in seen.report_html
    # no earlier READY or export survives the failed run as if current: the earlier READY run is kept
    # whole where the console said, and still reconciles there
    assert seen.ready is None and not seen.exported
    config, kept = kept_from_console(seen.wd, seen.run.stderr)
    assert config == "demo+small+two_shards" and (kept / "export" / "manifest.json").is_file()
    assert_reconciles(seen.wd, kept, ROWS)
