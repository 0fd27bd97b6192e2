"""The output re-audit: READY only when the merged dataset passes its gates; loud failure otherwise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from stamped import fingerprint_fields

from regen.ingest.audit import AuditConfig
from regen.io import read_json
from regen.output.export import ExportConfig
from regen.output.merge import MergeConfig, merge
from regen.output.reaudit import OutputGateError, ReauditGates, reaudit_dataset
from regen.records import VALID_SCHEMA, ValidColumns

GATES = {
    "max_empty_answer_fraction": 0.05,
    "max_truncated_fraction": 0.2,
    "max_duplicate_fraction": 0.05,
    "min_rows": 1,
    "override_gates": False,
}


def record(i: int, content: str, reasoning: str | None, finish: str = "stop") -> dict[str, Any]:
    return {
        "id": f"r{i}",
        "shard": "00000",
        "messages": [{"role": "user", "content": f"question number {i}?"}],
        "reasoning_content": reasoning,
        "content": content,
        "finish_reason": finish,
        "truncated": finish == "length",
        "thinking": reasoning is not None,
        "usage": {"prompt_tokens": 12, "completion_tokens": 30, "reasoning_tokens": 10},
        "sampling": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 512},
        "seed": i,
        "model": "demo-model",
        "server": {"id": "gpu0", "url": "http://127.0.0.1:1", "version": "0.5.23"},
        "attempts": 1,
        "timings": {"started_at": 1.7e9 + i, "latency_s": 0.2},
        **fingerprint_fields(i),
    }


def merged(tmp_path: Path, records: list[dict[str, Any]]) -> Path:
    """Valid-shard Parquet written directly (as if validation let these through), then merged."""
    cols = ValidColumns()
    for rec in records:
        cols.append(rec)
    valid = tmp_path / "valid" / "00000.parquet"
    valid.parent.mkdir(parents=True)
    with pq.ParquetWriter(valid, VALID_SCHEMA) as writer:
        writer.write_batch(cols.to_batch())
    out = tmp_path / "dataset"
    merge([valid], out, MergeConfig.from_dict({}), {"test": True})
    return out


def run(tmp_path: Path, dataset: Path, tokenizer: Path, **gates: Any) -> tuple[Path, Path]:
    summary, ready = tmp_path / "reaudit.json", tmp_path / "READY.json"
    reaudit_dataset(
        dataset_dir=str(dataset),
        summary_out=str(summary),
        ready_out=str(ready),
        gates=ReauditGates.from_dict({**GATES, **gates}),
        audit=AuditConfig.from_dict({"context_limit": 4096}),
        tokenizer_dir=str(tokenizer),
        export=ExportConfig.from_dict({}),
    )
    return summary, ready


def test_good_output_is_marked_ready(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    records = [record(i, f"The answer is {i}.", f"thinking about {i}") for i in range(40)]
    records[0] = record(0, "Cut short", "thinking", finish="length")
    summary, ready = run(tmp_path, merged(tmp_path, records), demo_tokenizer_dir)
    doc = read_json(summary)
    assert doc["passed"] and doc["rows"] == 40 and doc["truncated"] == 1
    assert doc["finish_reasons"] == {"stop": 39, "length": 1}
    assert read_json(ready)["ready"] is True


def test_mostly_empty_answers_fail_loudly(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    """The failure this product exists to prevent must not be possible at its output."""
    records = [record(i, "", "") if i % 10 else record(i, f"Real answer {i}.", "why") for i in range(40)]
    dataset = merged(tmp_path, records)
    with pytest.raises(OutputGateError, match="max_empty_answer_fraction") as info:
        run(tmp_path, dataset, demo_tokenizer_dir)
    assert "override_gates" in str(info.value)
    assert not (tmp_path / "READY.json").exists()
    doc = read_json(tmp_path / "reaudit.json")  # the summary explains the failure
    assert doc["empty_answers"] == 36 and doc["gates"]["max_empty_answer_fraction"]["passed"] is False
    assert doc["duplicate_answers"] == 35  # 36 identical empty answers: 35 repeats


def test_override_marks_ready_but_says_so(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    records = [record(i, "same answer", "same reasoning") for i in range(10)]
    _, ready = run(tmp_path, merged(tmp_path, records), demo_tokenizer_dir, override_gates=True)
    assert read_json(ready)["ready"] is True and read_json(ready)["overridden"] is True
    assert read_json(tmp_path / "reaudit.json")["gates"]["max_duplicate_fraction"]["passed"] is False


def test_tool_call_cuts_are_counted_by_kind(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    """Rows the client ended at a turn whose tool calls differ from the dataset's are counted by kind."""
    records = [record(i, f"The answer is {i}.", f"thinking about {i}") for i in range(8)]
    for i, kind in ((0, "name"), (1, "arguments"), (2, "arguments"), (3, "count")):
        records[i]["tool_call_mismatch"] = {"turn": 0, "kind": kind}
    summary, _ = run(tmp_path, merged(tmp_path, records), demo_tokenizer_dir)
    cut = read_json(summary)["tool_call_mismatch"]
    assert cut["rows"] == 4 and cut["by_kind"] == {"count": 1, "name": 1, "arguments": 2}
