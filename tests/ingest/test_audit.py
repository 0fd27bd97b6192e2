"""The pre-generation audit: flags, summary, gates, excluded list, CLI."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

from regen.chat import ChatTemplate
from regen.ingest.audit import (
    AuditConfig,
    AuditGateError,
    audit_records,
    cli,
    run_audit,
    structure_faults,
)
from regen.ingest.dataset import DatasetConfig
from regen.records import FLAGS_SCHEMA
from regen.types import BadRow, Message, Sample

LONG_PROMPT = " ".join(["lorem ipsum dolor sit amet"] * 40)


def msg(role: str, content: Any, reasoning: str | None = None) -> dict[str, Any]:
    out = {"role": role, "content": content}
    if reasoning is not None:
        out["reasoning_content"] = reasoning
    return out


def good(i: int) -> dict[str, Any]:
    return {
        "id": f"good-{i}",
        "messages": [msg("user", f"question number {i}?"), msg("assistant", f"answer {i}")],
    }


# id -> (row, expected flags)
ROWS: list[tuple[dict[str, Any] | str, tuple[str, ...]]] = [
    (good(0), ()),
    (good(1), ()),
    ({"id": "empty", "messages": [msg("user", "say nothing"), msg("assistant", "")]}, ("empty_response",)),
    (
        {"id": "think-only", "messages": [msg("user", "q"), msg("assistant", "<think>\n\n</think>\n\n")]},
        ("empty_response",),
    ),
    ({"id": "no-user", "messages": [msg("system", "s"), msg("assistant", "a")]}, ("structure_error",)),
    ({"id": "asst-first", "messages": [msg("assistant", "a"), msg("user", "q")]}, ("structure_error",)),
    (
        {"id": "two-users", "messages": [msg("user", "q1"), msg("user", "q2"), msg("assistant", "a")]},
        ("structure_error",),
    ),
    (
        {"id": "unknown-role", "messages": [msg("user", "q"), msg("narrator", "x"), msg("assistant", "a")]},
        ("structure_error",),
    ),
    (
        {"id": "image", "messages": [msg("user", [{"type": "image_url"}]), msg("assistant", "a")]},
        ("structure_error",),
    ),
    ({"id": "blank-user", "messages": [msg("user", "  "), msg("assistant", "a")]}, ("structure_error",)),
    (
        {"id": "late-system", "messages": [msg("user", "q"), msg("system", "s"), msg("assistant", "a")]},
        ("structure_error",),
    ),
    ({"id": "long", "messages": [msg("user", LONG_PROMPT), msg("assistant", "short")]}, ("over_length",)),
    (
        {"id": "dup-of-good-0", "messages": [msg("user", "question number 0?"), msg("assistant", "other")]},
        ("duplicate_prompt",),
    ),
    ({"id": "prompt-only", "messages": [msg("user", "only a prompt")]}, ()),
    (
        {
            "id": "tools",
            "messages": [
                msg("user", "q"),
                msg("assistant", "call"),
                msg("tool", "res"),
                msg("assistant", "ok"),
            ],
        },
        (),
    ),
    ("{not json", ("bad_row",)),
    ({"id": "bad-messages", "messages": "not a list"}, ("bad_row",)),
]
CONTEXT_LIMIT = 64
LOOSE_GATES = {
    "max_empty_response_fraction": 1.0,
    "max_structure_error_fraction": 1.0,
    "max_over_length_fraction": 1.0,
}


def write_jsonl(path: Path, rows: list[dict[str, Any] | str]) -> Path:
    with open(path, "wb") as fh:
        for r in rows:
            fh.write((r.encode() if isinstance(r, str) else orjson.dumps(r)) + b"\n")
    return path


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "data.jsonl", [r for r, _ in ROWS])


def cfg(**overrides: Any) -> AuditConfig:
    return AuditConfig.from_dict({"context_limit": CONTEXT_LIMIT, "gates": LOOSE_GATES, **overrides})


def test_each_row_gets_its_flags(dataset: Path, tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    out = tmp_path / "audit"
    summary = run_audit(
        dataset,
        out,
        cfg(),
        demo_tokenizer_dir,
        DatasetConfig.from_dict({"path": str(dataset), "id_column": "id"}),
    )
    table = pq.read_table(out / "flags.parquet")
    assert table.schema.equals(FLAGS_SCHEMA)
    by_row = {r["row"]: r for r in table.to_pylist()}
    assert len(by_row) == len(ROWS) == summary.total
    for row, (_data, expected) in enumerate(ROWS):
        assert tuple(by_row[row]["flags"]) == expected, (row, by_row[row])


def audit_with_ids(dataset: Path, out: Path, tokenizer_dir: Path) -> None:
    run_audit(
        dataset, out, cfg(), tokenizer_dir, DatasetConfig.from_dict({"path": str(dataset), "id_column": "id"})
    )


def test_summary_counts_and_keys(dataset: Path, tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    out = tmp_path / "audit"
    audit_with_ids(dataset, out, demo_tokenizer_dir)
    s = orjson.loads((out / "summary.json").read_bytes())
    expect = {
        f: sum(f in flags for _, flags in ROWS) for f in ("empty_response", "structure_error", "bad_row")
    }
    assert s["total"] == len(ROWS)
    assert s["flagged_empty_response"] == expect["empty_response"]
    assert s["flagged_empty_response_fraction"] == pytest.approx(expect["empty_response"] / len(ROWS))
    assert s["structure_errors"] == expect["structure_error"]
    assert s["bad_rows"] == expect["bad_row"]
    assert s["duplicate_prompts"] == 1
    assert s["over_length"] == 1
    assert set(s["gates"]) == {
        "max_empty_response_fraction",
        "max_structure_error_fraction",
        "max_over_length_fraction",
        "max_unread_tail_files",
    }
    assert all({"limit", "value", "passed"} <= set(g) for g in s["gates"].values())
    assert s["passed"] is True
    kinds = s["structure_error_kinds"]
    for kind in (
        "no_user_turn",
        "bad_role_order",
        "unknown_role",
        "non_text_content",
        "empty_content",
        "system_not_first",
    ):
        assert kinds.get(kind, 0) >= 1, kind
    hist = s["histograms"]["supervised_tokens"]
    assert sum(b["count"] for b in hist["buckets"]) == len(ROWS) - expect["bad_row"]
    assert (out / "supervised_tokens.svg").read_text().lstrip().startswith("<?xml")
    assert (out / "prompt_tokens.svg").is_file()


def test_excluded_lists_reasons(dataset: Path, tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    out = tmp_path / "audit"
    audit_with_ids(dataset, out, demo_tokenizer_dir)
    lines = [orjson.loads(line) for line in (out / "excluded.jsonl").read_bytes().splitlines()]
    reasons = {e["row"]: e["reason"] for e in lines}
    for row, (_data, flags) in enumerate(ROWS):
        excluded_flags = [f for f in flags if f != "empty_response"]
        if excluded_flags:
            assert reasons[row] == excluded_flags[0]
        else:
            assert row not in reasons
    bad = [e for e in lines if e["reason"] == "bad_row"]
    assert all(e["id"] == f"row/{e['row']}:{dataset}" for e in bad)
    assert all({"id", "reason", "file", "row"} <= set(e) for e in lines)


def test_exclude_empty_response_when_configured(
    dataset: Path, tmp_path: Path, demo_tokenizer_dir: Path
) -> None:
    out = tmp_path / "audit"
    summary = run_audit(
        dataset,
        out,
        cfg(exclude=["empty_response"]),
        demo_tokenizer_dir,
        DatasetConfig.from_dict({"path": str(dataset), "id_column": "id"}),
    )
    lines = [orjson.loads(line) for line in (out / "excluded.jsonl").read_bytes().splitlines()]
    assert {e["id"] for e in lines} == {"empty", "think-only"}
    assert summary.excluded == 2


def test_gate_failure_names_gate_and_override(
    dataset: Path, tmp_path: Path, demo_tokenizer_dir: Path
) -> None:
    out = tmp_path / "audit"
    strict = {"max_structure_error_fraction": 0.01}
    with pytest.raises(AuditGateError) as err:
        run_audit(
            dataset,
            out,
            cfg(gates=strict),
            demo_tokenizer_dir,
            DatasetConfig.from_dict({"path": str(dataset), "id_column": "id"}),
        )
    text = str(err.value)
    assert "max_structure_error_fraction" in text
    assert "override_gates: true" in text
    assert "max_empty_response_fraction" not in text  # that gate passed
    s = orjson.loads((out / "summary.json").read_bytes())  # written before raising
    assert s["passed"] is False
    assert s["gates"]["max_structure_error_fraction"]["passed"] is False


def test_override_gates_warns_and_returns(dataset: Path, tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    out = tmp_path / "audit"
    summary = run_audit(
        dataset,
        out,
        cfg(gates={"max_empty_response_fraction": 0.0}, override_gates=True),
        demo_tokenizer_dir,
        DatasetConfig.from_dict({"path": str(dataset)}),
    )
    assert not summary.passed
    assert orjson.loads((out / "summary.json").read_bytes())["overridden"] is True


def test_duplicate_ids_are_structure_errors(demo_tokenizer_dir: Path) -> None:
    a = Sample("same", (Message("user", "q1"), Message("assistant", "a")))
    b = Sample("same", (Message("user", "q2"), Message("assistant", "a")))
    audits, summary = audit_records([a, b], cfg(), ChatTemplate.from_dir(demo_tokenizer_dir))
    assert audits[0].flags == ()
    assert audits[1].flags == ("structure_error",)
    assert summary.structure_error_kinds == {"duplicate_id": 1}


def test_tokenized_rows_use_the_row_mask(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    chat = ChatTemplate.from_dir(demo_tokenizer_dir)
    rows = []
    for i, answer in enumerate(
        ["Yes.", "A much longer answer that clearly has more than eight tokens in it."]
    ):
        ids, mask = chat.encode_with_loss_mask([msg("user", f"q{i}"), msg("assistant", answer)])
        rows.append({"id": f"t{i}", "input_ids": ids, "loss_mask": mask})
    path = write_jsonl(tmp_path / "tok.jsonl", rows)
    out = tmp_path / "audit"
    run_audit(
        path,
        out,
        cfg(scaffolding_max_tokens=8),
        demo_tokenizer_dir,
        DatasetConfig.from_dict({"path": str(path), "format": "tokenized", "id_column": "id"}),
    )
    table = {r["id"]: r for r in pq.read_table(out / "flags.parquet").to_pylist()}
    assert table["t0"]["flags"] == ["empty_response"]
    assert table["t1"]["flags"] == []
    assert table["t1"]["supervised_tokens"] == sum(rows[1]["loss_mask"])


def test_audit_records_without_files(demo_tokenizer_dir: Path) -> None:
    samples = [
        Sample("a", (Message("user", "q"), Message("assistant", "real answer"))),
        Sample("b", (Message("user", "q2"), Message("assistant", ""))),
    ]
    bad = [BadRow("f.jsonl", 7, "messages", "not a list")]
    audits, summary = audit_records(samples, cfg(), ChatTemplate.from_dir(demo_tokenizer_dir), bad_rows=bad)
    assert [a.flags for a in audits] == [(), ("empty_response",), ("bad_row",)]
    assert summary.total == 3
    assert audits[2].id == "row/7:f.jsonl"  # '/' never occurs in a real id: no collision possible


def test_structure_rules() -> None:
    def kinds(*roles: str) -> set[str]:
        return {f.split(":")[0] for f in structure_faults([Message(r, "x") for r in roles])}

    assert kinds("system", "user", "assistant", "user", "assistant") == set()
    assert kinds("user", "assistant", "tool", "tool", "assistant") == set()
    assert kinds("user") == set()
    assert kinds("user", "tool") == {"bad_role_order"}
    assert kinds("user", "assistant", "assistant") == {"bad_role_order"}
    assert kinds() == {"no_turns"}


def test_cli_prints_table_and_writes_summary(
    dataset: Path, tmp_path: Path, demo_tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cli"
    argv = [
        str(dataset),
        "--tokenizer",
        str(demo_tokenizer_dir),
        "--context-limit",
        "64",
        "--id-column",
        "id",
    ]
    rc = cli([*argv, "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 1  # default gates: 9 of 17 rows are structure errors or bad rows
    assert "max_structure_error_fraction" in captured.err
    assert "--override-gates" in captured.err
    assert "structure_error" in captured.out
    assert (out / "summary.json").is_file()
    rc = cli([*argv, "--override-gates", "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 0
    assert "verdict: FAILED" in captured.out
    assert orjson.loads((out / "summary.json").read_bytes())["total"] == len(ROWS)


def test_cli_stop_on_bad_row_names_file_and_row(
    dataset: Path, tmp_path: Path, demo_tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "stop"
    rc = cli(
        [str(dataset), "--tokenizer", str(demo_tokenizer_dir), "--on-bad-row", "stop", "--out", str(out)]
    )
    err = capsys.readouterr().err
    bad_row = next(i for i, (_r, flags) in enumerate(ROWS) if flags == ("bad_row",))
    assert rc == 2
    assert str(dataset) in err and f"row {bad_row}" in err
    assert not (out / "flags.parquet").exists()  # nothing half-written


def test_summary_has_exact_prompt_percentiles_of_kept_samples(demo_tokenizer_dir: Path) -> None:
    """The planner sizes KV for running x (p99 + max_tokens): p50/p99 are exact, over kept samples only."""
    from regen.chat import ChatTemplate
    from regen.ingest.audit import AuditConfig, audit_records
    from regen.types import Message, Sample

    chat = ChatTemplate.from_dir(demo_tokenizer_dir)
    samples = [
        Sample(f"s{i}", (Message("user", " ".join(["word"] * (i + 1))), Message("assistant", "ok")))
        for i in range(200)
    ]
    huge = Sample("huge", (Message("user", "word " * 5000), Message("assistant", "ok")))
    audits, summary = audit_records([*samples, huge], AuditConfig.from_dict({"context_limit": 2048}), chat)
    kept = sorted(a.prompt_tokens for a in audits if not a.excluded)
    assert len(kept) == 200  # the over-length prompt is excluded and does not count
    doc = summary.to_json()
    # the observed value at or above each quantile: index ceil(q * (n - 1)) of the sorted values
    assert doc["prompt_tokens_p50"] == kept[math.ceil(0.50 * (len(kept) - 1))]
    assert doc["prompt_tokens_p99"] == kept[math.ceil(0.99 * (len(kept) - 1))]
    assert doc["prompt_tokens_p99"] < 2048 < max(a.prompt_tokens for a in audits)
