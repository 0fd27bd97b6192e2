"""Issue 47 item 7: ``regen check`` reads the dataset's first rows with the audit's own reader and
verdicts, so a format that would exclude every row fails before any job (no server prestarted) with the
row-level reason; a failed audit's per-row reasons survive Snakemake deleting the job's outputs."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from support.workflow import copy_workflow, snakemake

from regen.check import FIRST_ROWS, Sections, check_first_rows, cli

ROOT = Path(__file__).resolve().parents[1]


def _alpaca(path: Path, n: int, bad_from: int | None = None) -> Path:
    rows = [
        {"id": f"a{i}", "instruction": f"Name colour {i}.", "input": "", "output": "Blue."} for i in range(n)
    ]
    for row in rows[bad_from:] if bad_from is not None else ():
        row["history"] = "not pairs"  # an unreadable row: history must be a list of pairs
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _config(tmp_path: Path, dataset: Path, **keys: str) -> Path:
    extra = "".join(f", {k}: {v}" for k, v in keys.items())
    path = tmp_path / "alpaca.yaml"
    path.write_text(f"dataset: {{path: {dataset}{extra}}}\n")
    return path


def test_check_fails_a_format_that_excludes_every_row(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(ROOT)
    data = _alpaca(tmp_path / "a.jsonl", 60)
    assert cli(["--configfile", "config/demo.yaml", str(_config(tmp_path, data, format="prompt"))]) == 1
    err = capsys.readouterr().err
    assert f"dataset.format ({data})" in err and "the audit would exclude every row" in err
    assert f"all of the first {FIRST_ROWS} rows are excluded (bad_row={FIRST_ROWS})" in err
    assert f"{data}: row 0: field 'prompt': missing" in err and "set dataset.format: auto or alpaca" in err
    # auto (and alpaca) read them
    for fmt in ("auto", "alpaca"):
        assert cli(["--configfile", "config/demo.yaml", str(_config(tmp_path, data, format=fmt))]) == 0, fmt


def test_check_reads_only_the_first_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows past the first ones are the audit's to judge: a bad tail does not fail the check; a short
    dataset whose rows are all excluded does, whatever the reason."""
    monkeypatch.chdir(ROOT)
    config = {"dataset": {"path": str(_alpaca(tmp_path / "a.jsonl", 80, bad_from=FIRST_ROWS))},
              "tokenizer": "resources/demo-tokenizer"}  # fmt: skip
    assert check_first_rows(Sections.of(config)) == []
    config["dataset"]["path"] = str(_alpaca(tmp_path / "b.jsonl", 5, bad_from=0))
    (problem,) = check_first_rows(Sections.of(config))
    assert problem.key == "dataset.format" and "all 5 rows are excluded" in problem.message
    assert "row 0: field 'history'" in problem.message


def test_the_workflow_stops_at_check_before_any_job_or_server(tmp_path: Path) -> None:
    wd = copy_workflow(tmp_path / "wf")
    data = _alpaca(wd / "data" / "alpaca.jsonl", 60)
    (wd / "config" / "alpaca.yaml").write_text(f"dataset: {{path: {data.relative_to(wd)}, format: prompt}}\n")
    run = snakemake(wd, "--cores", "2", "--configfile", "config/demo.yaml", "config/alpaca.yaml")
    out = run.stdout + run.stderr
    assert run.returncode != 0
    assert "dataset.format (data/alpaca.jsonl)" in out and "row 0: field 'prompt': missing" in out, out[
        -3000:
    ]
    assert not any(p.is_file() for p in (wd / "results").rglob("*")), "no job ran"
    assert not (wd / "logs" / "prestart.log").exists() and not (wd / "logs" / "audit.log").exists()
    assert not (wd / "work" / "servers").exists()


def test_a_failed_audit_keeps_its_per_row_reasons_beside_its_log(tmp_path: Path) -> None:
    """The first rows read, the later ones not: check passes, the audit's gate fails, Snakemake deletes
    results/audit/excluded.jsonl, and logs/audit.excluded.jsonl keeps every excluded row's reason."""
    wd = copy_workflow(tmp_path / "wf")
    data = _alpaca(wd / "data" / "alpaca.jsonl", 70, bad_from=FIRST_ROWS)
    (wd / "config" / "alpaca.yaml").write_text(f"dataset: {{path: {data.relative_to(wd)}}}\n")
    run = snakemake(wd, "--cores", "2", "--configfile", "config/demo.yaml", "config/alpaca.yaml",
                    "--until", "audit")  # fmt: skip
    out = run.stdout + run.stderr + (wd / "logs" / "audit.log").read_text()
    assert run.returncode != 0 and "max_structure_error_fraction" in out, out[-3000:]
    kept = wd / "logs" / "audit.excluded.jsonl"
    assert f"each excluded row with its reason: {kept.relative_to(wd)}" in out, out[-3000:]
    assert not (wd / "results" / "audit" / "excluded.jsonl").exists()  # the failed job's output: deleted
    rows = [orjson.loads(line) for line in kept.read_bytes().splitlines()]
    assert sorted(r["row"] for r in rows) == list(range(FIRST_ROWS, 70))
    assert all(r["reason"] == "bad_row" and "field 'history'" in r["detail"] for r in rows)
