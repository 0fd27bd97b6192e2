"""Inputs as people have them (issue 34 done-item 5): ShareGPT tool calls, an unused id field, and the
dataset layouts of the Hub and ``datasets`` (save_to_disk, Parquet shard folders, CSV) read through pyarrow.
Every file here is made by the test, the Arrow and Parquet ones with pyarrow itself."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from regen.ingest.audit import AuditConfig, run_audit
from regen.ingest.dataset import DatasetConfig, IdAccount, detect_format, iter_samples
from regen.ingest.progress import RowProgress
from regen.ingest.readers import check_dataset_path
from regen.types import BadRow, Sample


def _read(
    path: Path, id_column: str | None = None, ids: IdAccount | None = None
) -> tuple[list[Sample], list[BadRow]]:
    bad: list[BadRow] = []
    return list(iter_samples(path, "auto", id_column, "skip", None, bad, ids=ids)), bad


def _rows(n: int) -> list[dict[str, Any]]:
    return [
        {
            "id": f"conv-{i:03d}",
            "messages": [
                {"role": "user", "content": f"question {i}"},
                {"role": "assistant", "content": f"answer {i}"},
            ],
        }
        for i in range(n)
    ]


# ------------------------------------------------------------------------------ ShareGPT tool calls

WEATHER = {
    "conversations": [
        {"from": "human", "value": "What is the weather in Jinan?"},
        {"from": "function_call", "value": '{"name": "get_weather", "arguments": {"location": "Jinan"}}'},
        {"from": "observation", "value": '{"temperature": 20, "condition": "sunny"}'},
        {"from": "gpt", "value": "It is sunny and 20 degrees in Jinan."},
    ],
    "tools": '[{"name": "get_weather", "description": "weather", "parameters": {"type": "object"}}]',
}


def test_function_call_turns_are_tool_calls_and_observations_answer_them(tmp_path: Path) -> None:
    path = tmp_path / "glaive.json"
    path.write_bytes(orjson.dumps([WEATHER]))
    (sample,), bad = _read(path)
    assert bad == []
    roles = [m.role for m in sample.messages]
    assert roles == ["user", "assistant", "tool", "assistant"]
    call = sample.messages[1]
    assert call.content == "" and call.tool_calls is not None
    (tc,) = call.tool_calls
    assert tc["function"]["name"] == "get_weather"
    assert json.loads(tc["function"]["arguments"]) == {"location": "Jinan"}  # a JSON string, as OpenAI sends
    answer = sample.messages[2]
    assert (answer.tool_call_id, answer.name) == (tc["id"], "get_weather")
    assert sample.tools is not None and sample.tools[0]["name"] == "get_weather"


def test_a_list_of_calls_is_answered_in_order(tmp_path: Path) -> None:
    row = {
        "conversations": [
            {"from": "user", "value": "two cities"},
            {
                "from": "function_call",
                "value": '[{"name": "w", "arguments": {"c": "A"}}, {"name": "t", "arguments": "{}"}]',
            },
            {"from": "observation", "value": "A: 1"},
            {"from": "observation", "value": "B: 2"},
            {"from": "chatgpt", "value": "done"},
        ]
    }
    path = tmp_path / "two.jsonl"
    path.write_bytes(orjson.dumps(row) + b"\n")
    (sample,), bad = _read(path)
    calls = sample.messages[1].tool_calls
    assert bad == [] and [c["function"]["name"] for c in calls] == ["w", "t"]
    assert [m.tool_call_id for m in sample.messages[2:4]] == [calls[0]["id"], calls[1]["id"]]
    assert sample.messages[4].role == "assistant"  # the original ShareGPT dumps' speaker names


@pytest.mark.parametrize(
    ("value", "field", "words"),
    [
        ("get_weather(Jinan)", "conversations[1].value", "not JSON"),
        ('{"arguments": {}}', "conversations[1].value.name", "has no name"),
        ('{"name": "f", "arguments": "{oops"}', "conversations[1].value.arguments", "not JSON"),
        ("[]", "conversations[1].value", "empty list"),
    ],
)
def test_a_function_call_that_is_not_a_json_call_names_row_and_field(
    tmp_path: Path, value: str, field: str, words: str
) -> None:
    row = {"conversations": [{"from": "human", "value": "hi"}, {"from": "function_call", "value": value}]}
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(r) for r in [WEATHER, row]) + b"\n")
    samples, bad = _read(path)
    assert len(samples) == 1
    (b,) = bad
    assert (b.file, b.row, b.field) == (str(path), 1, field) and words in b.problem


def test_the_audit_keeps_a_sharegpt_tool_conversation(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    path = tmp_path / "glaive.jsonl"
    path.write_bytes(orjson.dumps(WEATHER) + b"\n")
    summary = run_audit(
        path,
        tmp_path / "audit",
        AuditConfig.from_dict({}),
        demo_tokenizer_dir,
        DatasetConfig.from_dict({"path": str(path)}),
    )
    assert summary.excluded == 0 and summary.structure_error_kinds == {}


# ------------------------------------------------------------------------------ ids


def test_the_audit_says_the_id_field_it_did_not_use(
    tmp_path: Path, demo_tokenizer_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "own.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in _rows(3)))
    with caplog.at_level(logging.INFO):
        summary = run_audit(
            path,
            tmp_path / "a",
            AuditConfig.from_dict({}),
            demo_tokenizer_dir,
            DatasetConfig.from_dict({"path": str(path)}),
        )
    ids = json.loads((tmp_path / "a" / "summary.json").read_text())["ids"]
    assert (
        ids["source"] == "content_hash" and ids["unused_field"] == "id" and ids["rows_with_unused_field"] == 3
    )
    assert ids["example"] == "conv-000" and "dataset.id_column: id" in ids["in_words"]
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "conv-000" in r.getMessage()]
    assert warned, "the console says which id was taken"
    assert summary.total == 3
    run_audit(
        path,
        tmp_path / "b",
        AuditConfig.from_dict({}),
        demo_tokenizer_dir,
        DatasetConfig.from_dict({"path": str(path), "id_column": "id"}),
    )
    flags = pq.read_table(tmp_path / "b" / "flags.parquet").to_pylist()
    assert [f["id"] for f in flags] == ["conv-000", "conv-001", "conv-002"]
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["ids"]["source"] == "field"


# ------------------------------------------------------------------------------ layouts


def _save_to_disk_folder(folder: Path, rows: list[dict[str, Any]], shards: int = 2) -> None:
    """A folder laid out as ``datasets.Dataset.save_to_disk`` writes it: Arrow IPC streams + state.json."""
    folder.mkdir()
    table = pa.Table.from_pylist(rows)
    per = -(-len(rows) // shards)
    names = []
    for k in range(shards):
        name = f"data-{k:05d}-of-{shards:05d}.arrow"
        with pa.OSFile(str(folder / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table.slice(k * per, per))
        names.append({"filename": name})
    (folder / "state.json").write_text(json.dumps({"_data_files": names, "_split": "train"}))
    (folder / "dataset_info.json").write_text("{}")


def test_a_save_to_disk_folder_reads_through_arrow_streams(tmp_path: Path) -> None:
    folder = tmp_path / "saved"
    _save_to_disk_folder(folder, _rows(5))
    assert detect_format(folder) == "messages"
    samples, bad = _read(folder, id_column="id")
    assert bad == [] and [s.id for s in samples] == [f"conv-{i:03d}" for i in range(5)]
    assert {Path(s.source["file"]).name for s in samples} == {
        "data-00000-of-00002.arrow",
        "data-00001-of-00002.arrow",
    }
    assert check_dataset_path(folder).layout == "save_to_disk"


def test_a_real_save_to_disk_folder(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(_rows(4)).save_to_disk(str(tmp_path / "real"))
    samples, bad = _read(tmp_path / "real", id_column="id")
    assert bad == [] and len(samples) == 4


def test_parquet_shards_under_data_read_the_train_split(tmp_path: Path) -> None:
    data = tmp_path / "hub" / "data"
    data.mkdir(parents=True)
    rows = _rows(7)
    for k, part in enumerate((rows[:3], rows[3:5], rows[5:])):
        pq.write_table(pa.Table.from_pylist(part), data / f"train-{k:05d}-of-00003.parquet")
    pq.write_table(pa.Table.from_pylist(_rows(2)), data / "test-00000-of-00001.parquet")
    files = check_dataset_path(tmp_path / "hub")
    assert [f.name for f in files.files] == [f"train-{k:05d}-of-00003.parquet" for k in range(3)]
    assert "test" in (files.note or "")
    samples, bad = _read(tmp_path / "hub", id_column="id")
    assert bad == [] and [s.id for s in samples] == [r["id"] for r in rows]
    assert samples[3].source["row"] == 0 and samples[3].source["file"].endswith(
        "train-00001-of-00003.parquet"
    )


def test_a_bad_row_in_a_shard_names_the_shard(tmp_path: Path) -> None:
    folder = tmp_path / "shards"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(_rows(2)), folder / "part-0.parquet")
    pq.write_table(
        pa.Table.from_pylist([{"id": "x", "messages": [{"role": 5, "content": "c"}]}]),
        folder / "part-1.parquet",
    )
    samples, bad = _read(folder, id_column="id")
    (b,) = bad
    assert len(samples) == 2 and (b.file, b.row, b.field) == (
        str(folder / "part-1.parquet"),
        0,
        "messages[0].role",
    )


def test_a_csv_with_messages_as_json_and_prompt_columns(tmp_path: Path) -> None:
    path = tmp_path / "chat.csv"
    pacsv.write_csv(
        pa.table(
            {
                "id": ["001", "002", "003"],
                "messages": [json.dumps(r["messages"]) for r in _rows(2)]
                + ['[{"role": "user", "content": "x"'],
            }
        ),
        path,
    )
    samples, bad = _read(path, id_column="id")
    assert [s.id for s in samples] == ["001", "002"]  # ids stay text: "001" is not 1
    assert samples[1].messages[1].content == "answer 1"
    (b,) = bad
    assert (b.file, b.row, b.field) == (str(path), 2, "messages") and "not JSON" in b.problem
    prompts = tmp_path / "prompts.csv"
    pacsv.write_csv(pa.table({"prompt": ["Hello, there", "two\nlines"], "system": ["be brief", ""]}), prompts)
    samples, bad = _read(prompts)
    assert bad == [] and [[m.role for m in s.messages] for s in samples] == [["system", "user"], ["user"]]
    assert samples[1].messages[0].content == "two\nlines"


def test_a_folder_with_no_dataset_file_says_what_it_holds(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "README.md").write_text("hi")
    with pytest.raises(IsADirectoryError, match=r"README\.md.*save_to_disk"):
        check_dataset_path(tmp_path / "empty")


# ------------------------------------------------------------------------------ progress


def test_progress_lines_give_rows_rate_and_eta(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    seen = []
    progress = RowProgress("audit", 10_000, every_s=5.0, clock=lambda: now[0], on_count=seen.append)
    with caplog.at_level(logging.INFO, logger="regen.ingest.progress"):
        for _ in range(5):
            now[0] += 2.5  # 2,048 rows per 2.5 s
            progress.advance(2048)
        final = progress.finish()
    lines = [r.getMessage() for r in caplog.records]
    assert len(seen) == len(lines) >= 2
    assert "rows/s" in lines[0] and "% of 10,000" in lines[0] and "left" in lines[0]
    assert final.rows == 10_240 and final.rate == pytest.approx(10_240 / 12.5)
    assert final.in_words() == "audit: all 10,000 rows read in 12 s (819 rows/s)"
    assert (
        RowProgress("audit", None, clock=lambda: 1.0).finish().in_words().endswith("total not known ahead)")
    )


def test_regen_check_accepts_the_layouts_and_names_an_empty_folder(tmp_path: Path) -> None:
    from regen.check import Host, Sections, check_dataset

    saved, shards, table = tmp_path / "saved", tmp_path / "hub" / "data", tmp_path / "t.csv"
    _save_to_disk_folder(saved, _rows(3))
    shards.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(_rows(2)), shards / "train-00000-of-00001.parquet")
    pacsv.write_csv(pa.table({"prompt": ["hi"]}), table)
    for path in (saved, tmp_path / "hub", table):
        assert check_dataset(Sections.of({"dataset": {"path": str(path)}}), Host()) == [], path
    (tmp_path / "nothing").mkdir()
    (problem,) = check_dataset(Sections.of({"dataset": {"path": str(tmp_path / "nothing")}}), Host())
    assert problem.key == "dataset.path" and "no dataset file" in problem.message


def test_messages_with_llama_factory_role_names_read_the_same(tmp_path: Path) -> None:
    turns = [{"role": t["from"], "content": t["value"]} for t in WEATHER["conversations"]]
    path = tmp_path / "lf.jsonl"
    path.write_bytes(orjson.dumps({"messages": turns, "tools": WEATHER["tools"]}) + b"\n")
    (sample,), bad = _read(path)
    sharegpt = tmp_path / "sg.jsonl"
    sharegpt.write_bytes(orjson.dumps(WEATHER) + b"\n")
    (same,), _ = _read(sharegpt)
    assert bad == [] and sample.messages == same.messages
    assert [m.role for m in sample.messages] == ["user", "assistant", "tool", "assistant"]
