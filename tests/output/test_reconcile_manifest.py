"""A dataset says itself what reconciling it needs (issue 58 item 4): the merge writes the run's (variant,
n) into the dataset's manifest, and ``regen reconcile --results X`` with no other argument is exact on a
variants dataset, on the copy kept in ``work/earlier-runs/`` by the command the console prints, and says
when a config given disagrees with the dataset."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.valid_shards import make_record

from regen.io import atomic_lines_writer
from regen.layout.run import RunLayout
from regen.output.kept_runs import keep_run, kept_line
from regen.output.merge import MergeConfig, merge
from regen.output.reconcile import ExpectedCompletions, cli
from regen.output.validate import ValidateConfig, validate_shard
from regen.run_marker import ResultsOf
from regen.runconfig import GenerateConfig

VARIANTS = [{"name": "cold", "temperature": 0.0, "n": 1}, {"name": "hot", "temperature": 1.0, "n": 2}]
SAMPLES = ["s0", "s1", "s2", "s3"]
FAILED = "s3/hot/1"
QUARANTINED = "s2/cold/0"


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_lines_writer(path) as fh:
        fh.write(b"".join(orjson.dumps(r) + b"\n" for r in rows))


def variants_run(root: Path, completions: ExpectedCompletions | None) -> RunLayout:
    """A results tree of a run with two variants (cold n=1, hot n=2) over 4 kept samples and one the audit
    excluded: one completion failed, one quarantined, the rest merged by the real merge."""
    layout = RunLayout.under(root)
    ids = [*SAMPLES, "s4"]
    flags = pa.table(
        {
            "id": ids,
            "flags": [[] for _ in ids],
            "excluded": [False] * 4 + [True],
            "file": ["in"] * 5,
            "row": list(range(5)),
        }
    )
    layout.audit_flags.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(flags, layout.audit_flags)
    _jsonl(layout.audit_excluded, [{"id": "s4", "reason": "over_length", "file": "in", "row": 4}])
    _jsonl(layout.failed("00000"), [{"id": FAILED, "reason": "http_500", "attempts": 4, "error": "x"}])
    _jsonl(layout.quarantine("00000"), [{"id": QUARANTINED, "reason": "schema", "detail": "", "record": {}}])
    records = [
        make_record(i, "00000", id=f"{sid}/{v['name']}/{k}", sample_id=sid, variant=v["name"], k=k)
        for i, sid in enumerate(SAMPLES)
        for v in VARIANTS
        for k in range(v["n"])
        if f"{sid}/{v['name']}/{k}" not in (FAILED, QUARANTINED)
    ]
    gen = root / "gen.jsonl"
    gen.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    valid = layout.valid("00000")
    valid.parent.mkdir(parents=True, exist_ok=True)
    validate_shard(gen, valid, root / "q.jsonl", ValidateConfig.from_dict({}))
    merge([valid], layout.dataset_dir, MergeConfig.from_dict({}), {}, completions=completions)
    return layout


def made_with() -> ExpectedCompletions:
    return ExpectedCompletions.of_generate(GenerateConfig.from_dict({"variants": VARIANTS}))


def test_a_variants_dataset_reconciles_with_no_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = variants_run(tmp_path, made_with())
    manifest = json.loads(layout.dataset_manifest.read_text())
    assert manifest["completions"] == {
        "variants": [{"name": "cold", "n": 1}, {"name": "hot", "n": 2}],
        "record_ids": "{sample_id}/{variant}/{k}",
    }
    assert cli(["--results", str(layout.results), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    # 4 kept samples x 3 completions, one excluded row
    assert result["input"] == 13 and result["ok"]
    assert result["counts"] == {"output": 10, "quarantine": 1, "excluded": 1, "failed": 1}


def test_a_manifest_that_does_not_say_fails_with_the_way_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same dataset with a manifest written before it said (the state issue 58 found): exit 1, naming
    --configfile; with the run's config it reconciles."""
    layout = variants_run(tmp_path, None)
    assert cli(["--results", str(layout.results)]) == 1
    err = capsys.readouterr().err
    assert "lost" in err and "no manifest under" in err and "--configfile" in err
    config = tmp_path / "run.yaml"
    config.write_text(f"dataset: {{path: x}}\ngenerate: {{variants: {json.dumps(VARIANTS)}}}\n")
    assert cli(["--results", str(layout.results), "--configfile", str(config)]) == 0


def test_a_config_that_disagrees_with_the_dataset_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = variants_run(tmp_path, made_with())
    config = tmp_path / "other.yaml"
    config.write_text("dataset: {path: x}\ngenerate: {sampling: {n: 2}}\n")
    assert cli(["--results", str(layout.results), "--configfile", str(config)]) == 1
    err = capsys.readouterr().err
    assert "made with cold n=1, hot n=2; the config given says default n=2" in err


def test_the_command_the_console_prints_for_a_kept_run_works_as_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = variants_run(tmp_path, made_with())
    of = ResultsOf("variants", "id-v")
    kept = keep_run(layout, of, now=0)
    line = kept_line(kept, of, layout)
    command = line.split("`")[1]
    argv = shlex.split(command)
    assert argv[:2] == ["regen", "reconcile"]
    # the live results then go (a run of another config remakes them): the kept copy stands alone
    for path in (layout.dataset_dir, layout.audit_dir, layout.generations_dir):
        for f in sorted(path.rglob("*"), reverse=True):
            f.unlink() if f.is_file() else f.rmdir()
    capsys.readouterr()
    assert cli([*argv[2:], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"]["output"] == 10
