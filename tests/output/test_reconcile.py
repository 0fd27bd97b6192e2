"""regen.output.reconcile: every input id in exactly one bucket."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from regen.ingest.audit import AuditConfig, run_audit
from regen.ingest.dataset import DatasetConfig
from regen.io import atomic_lines_writer
from regen.output.reconcile import ReconcileError, cli, reconcile, reconcile_results
from regen.records import dataset_schema


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    with atomic_lines_writer(path) as fh:  # compressed where the name ends in .zst, as the workflow writes
        fh.write(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def _dataset(path: Path, ids: list[str]) -> Path:
    """A dataset dir holding a part file with the given ids (other columns minimal but typed)."""
    path.mkdir(parents=True, exist_ok=True)
    schema = dataset_schema(False)
    n = len(ids)
    cols: dict[str, Any] = {f.name: [None] * n for f in schema}
    cols["id"] = cols["sample_id"] = ids
    cols["variant"], cols["k"] = ["default"] * n, [0] * n
    cols["messages"] = [[{"role": "assistant", "content": "a", "reasoning_content": None}]] * n
    for name, v in (("model", "m"), ("finish_reason", "stop"), ("truncated", False), ("thinking", True),
                    ("prompt_tokens", 1), ("completion_tokens", 1), ("temperature", 0.6), ("top_p", 0.9),
                    ("top_k", 20), ("max_tokens", 8), ("seed", 1), ("shard", "00000"),
                    ("fingerprint", "0" * 16), ("settings_fingerprint", "1" * 16)):  # fmt: skip
        cols[name] = [v] * n
    pq.write_table(pa.table(cols, schema=schema), path / "part-00000.parquet")
    return path


def make_results(
    root: Path,
    output: list[str],
    quarantine: list[tuple[str | None, str]],
    excluded: list[tuple[str, str]],
    failed: list[tuple[str, str]],
    inputs: list[str],
) -> Path:
    pq.write_table(
        pa.table({"id": inputs, "flags": [[] for _ in inputs]}), _mk(root / "audit" / "flags.parquet")
    )
    _jsonl(
        root / "audit" / "excluded.jsonl",
        [{"id": i, "reason": r, "file": "in.jsonl", "row": 0} for i, r in excluded],
    )
    _jsonl(root / "generations" / "00000.failed.jsonl",
           [{"id": i, "reason": r, "attempts": 5, "error": "x"} for i, r in failed])  # fmt: skip
    _jsonl(
        root / "quarantine" / "00000.jsonl.zst",
        [{"id": i, "reason": r, "detail": "", "record": {}} for i, r in quarantine],
    )
    _dataset(root / "dataset", output)
    return root


def _mk(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


INPUTS = [f"id{i}" for i in range(10)] + ["row:in.jsonl:10"]
GOOD: dict[str, Any] = {
    "output": ["id0", "id1", "id2", "id3", "id4"],
    "quarantine": [("id5", "schema"), ("id6", "think_tag_in_answer"), ("id1", "duplicate_id")],
    "excluded": [("id7", "over_length"), ("row:in.jsonl:10", "bad_row")],
    "failed": [("id8", "http_500"), ("id9", "truncated_drop")],
    "inputs": INPUTS,
}


def test_consistent_set_passes_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = make_results(tmp_path / "results", **GOOD)
    result = reconcile_results(root)
    assert result.ok
    assert result.counts == {"output": 5, "quarantine": 2, "excluded": 2, "failed": 2}
    assert sum(result.counts.values()) == result.input_count == 11
    assert result.reasons["quarantine"] == {"duplicate_id": 1, "schema": 1, "think_tag_in_answer": 1}
    assert result.extra_copies == 1
    on_disk = json.loads((root / "reconcile.json").read_text())
    assert on_disk["ok"] is True and on_disk["counts"]["failed"] == 2
    assert cli(["--results", str(root)]) == 0
    out = capsys.readouterr().out
    assert "quarantine" in out and "OK" in out


@pytest.mark.parametrize(
    ("change", "kind", "bad_id"),
    [
        ({"failed": [("id8", "http_500")]}, "lost", "id9"),
        ({"output": [*GOOD["output"], "id7"]}, "duplicated", "id7"),
        ({"output": [*GOOD["output"], "zz"]}, "unknown", "zz"),
        ({"quarantine": [*GOOD["quarantine"], ("id8", "schema")]}, "duplicated", "id8"),
        ({"inputs": [*INPUTS, "id3"]}, "input_duplicates", "id3"),
    ],
)
def test_detects_problems(tmp_path: Path, change: dict[str, Any], kind: str, bad_id: str) -> None:
    root = make_results(tmp_path / "results", **{**GOOD, **change})
    with pytest.raises(ReconcileError) as err:
        reconcile_results(root)
    result = err.value.result
    assert not result.ok
    found = getattr(result, kind)
    assert bad_id in found
    others = {"lost", "duplicated", "unknown", "input_duplicates"} - {kind}
    assert all(not getattr(result, o) for o in others)
    on_disk = json.loads((root / "reconcile.json").read_text())  # written even on failure
    assert on_disk["ok"] is False and on_disk[f"{kind}_count"] == 1
    assert cli(["--results", str(root), "--json"]) == 1


def test_unattributed_quarantine_leaves_the_id_lost(tmp_path: Path) -> None:
    change = {"quarantine": [(None, "unparsable_json"), ("id6", "schema")]}
    root = make_results(tmp_path / "results", **{**GOOD, **change})
    quarantine = root / "quarantine" / "00000.jsonl.zst"
    result = reconcile(root / "audit" / "flags.parquet", root / "audit" / "excluded.jsonl",
                       [root / "generations" / "00000.failed.jsonl"], [quarantine],
                       root / "dataset", strict=False)  # fmt: skip
    assert result.lost == ("id5",)
    assert result.unattributed == {"quarantine": 1}


def test_bad_side_file_names_file_and_line(tmp_path: Path) -> None:
    root = make_results(tmp_path / "results", **GOOD)
    with open(root / "generations" / "00000.failed.jsonl", "ab") as fh:
        fh.write(b'{"id": "id9"}\n')
    with pytest.raises(ValueError, match=r"00000\.failed\.jsonl: line 3: field 'reason' missing"):
        reconcile_results(root)


def _audited_results(tmp_path: Path, rows: list[dict[str, Any]], tokenizer: Path) -> tuple[Path, list[str]]:
    """Audit ``rows`` into results/audit and put every kept id in the output dataset."""
    data = _jsonl(tmp_path / "in.jsonl", rows)
    root = tmp_path / "results"
    run_audit(
        data,
        root / "audit",
        AuditConfig.from_dict({"override_gates": True}),
        tokenizer,
        DatasetConfig.from_dict({"path": str(data), "id_column": "id"}),
    )
    flags = pq.read_table(root / "audit" / "flags.parquet").to_pylist()
    kept = [f["id"] for f in flags if not f["excluded"]]
    _dataset(root / "dataset", kept)
    return root, kept


def _row(rid: Any, text: str) -> dict[str, Any]:
    return {"id": rid, "messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "a"}]}


def test_string_and_integer_id_reconcile_as_audited(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    """ "1" then 1: the audit keeps the first and excludes the second as a duplicate id; reconcile agrees."""
    root, kept = _audited_results(tmp_path, [_row("1", "first"), _row(1, "second"), _row(2, "third")],
                                  demo_tokenizer_dir)  # fmt: skip
    assert kept == ["1", "2"]
    flags = pq.read_table(root / "audit" / "flags.parquet").to_pylist()
    assert [f["id_json"] for f in flags] == ['"1"', "1", "2"]  # the type as written is kept
    excluded = [orjson.loads(x) for x in (root / "audit" / "excluded.jsonl").read_bytes().splitlines()]
    assert [(e["row"], e["reason"], e["id_json"]) for e in excluded] == [(1, "structure_error", "1")]
    assert "ids compare as text" in excluded[0]["detail"]
    result = reconcile_results(root)
    assert result.ok and result.input_count == 3
    assert result.counts == {"output": 2, "quarantine": 0, "excluded": 1, "failed": 0}


def test_placeholder_ids_never_collide_with_real_ids(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    """A real id spelled like the old placeholder (row:<file>:<n>) and the unreadable row it names."""
    data_name = "in.jsonl"
    rows = [_row("a", "q"), "not json", _row(f"row:{data_name}:1", "q2")]
    path = tmp_path / data_name
    path.write_bytes(b"".join((r.encode() if isinstance(r, str) else orjson.dumps(r)) + b"\n" for r in rows))
    root = tmp_path / "results"
    cwd = os.getcwd()
    os.chdir(tmp_path)  # a relative file name, as a user would give it
    try:
        run_audit(
            data_name,
            root / "audit",
            AuditConfig.from_dict({"override_gates": True}),
            demo_tokenizer_dir,
            DatasetConfig.from_dict({"path": str(data_name), "id_column": "id"}),
        )
    finally:
        os.chdir(cwd)
    flags = pq.read_table(root / "audit" / "flags.parquet").to_pylist()
    ids = [f["id"] for f in flags]
    placeholder = next(f["id"] for f in flags if f["flags"] == ["bad_row"])
    assert len(set(ids)) == 3 and "/" in placeholder  # the placeholder holds '/', which no real id may
    _dataset(root / "dataset", ["a", f"row:{data_name}:1"])
    assert reconcile_results(root).ok


def test_reconcile_before_the_audit_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["--results", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert "flags.parquet: not found" in err and "audit" in err and "Traceback" not in err
