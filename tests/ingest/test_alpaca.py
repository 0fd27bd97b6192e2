"""Issue 47 item 7: Alpaca rows (instruction/input/output) and LLaMA-Factory's alpaca (system, history of
[user, assistant] pairs) read as conversations under ``format: auto`` and ``format: alpaca``; a failed
audit keeps its per-row reasons beside its log; the prestart starts no server when the audit would
exclude every row it looked at."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from regen.ingest.audit import AuditConfig, AuditGateError, NothingToGenerateError, run_audit
from regen.ingest.audit_run import first_rows
from regen.ingest.dataset import DatasetConfig, iter_samples
from regen.types import BadRow, Message

ALPACA = {"instruction": "Name a colour.", "input": "", "output": "Blue."}
WITH_INPUT = {"instruction": "Translate to French.", "input": "cat", "output": "chat"}
NO_OUTPUT = {"instruction": "Count to three."}
LLAMA_FACTORY = {
    "system": "You are terse.",
    "instruction": "And four?",
    "input": "",
    "output": "Four.",
    "history": [["One?", "One."], ["Two and three?", "Two. Three."]],
}


def _write(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _turns(messages: tuple[Message, ...]) -> list[tuple[str, str | None]]:
    return [(m.role, m.content) for m in messages]


@pytest.mark.parametrize("fmt", ["auto", "alpaca"])
def test_alpaca_rows_read_as_conversations(tmp_path: Path, fmt: str) -> None:
    rows = [dict(r, id=f"r{i}") for i, r in enumerate([ALPACA, WITH_INPUT, NO_OUTPUT, LLAMA_FACTORY])]
    bad: list[BadRow] = []
    samples = list(iter_samples(_write(tmp_path / "a.jsonl", rows), fmt, "id", "skip", bad_rows=bad))
    assert bad == []
    assert [s.id for s in samples] == ["r0", "r1", "r2", "r3"]
    assert {s.source["format"] for s in samples} == {"alpaca"}
    assert _turns(samples[0].messages) == [("user", "Name a colour."), ("assistant", "Blue.")]
    # instruction and input joined by a newline, as LLaMA-Factory builds the user turn
    assert _turns(samples[1].messages) == [("user", "Translate to French.\ncat"), ("assistant", "chat")]
    assert _turns(samples[2].messages) == [("user", "Count to three.")]  # answered by generation
    assert _turns(samples[3].messages) == [
        ("system", "You are terse."),
        ("user", "One?"),
        ("assistant", "One."),
        ("user", "Two and three?"),
        ("assistant", "Two. Three."),
        ("user", "And four?"),
        ("assistant", "Four."),
    ]


def test_ids_follow_the_dataset_rules(tmp_path: Path) -> None:
    """``id_column`` names the id; ``null`` hashes the content (the same conversation, the same id); a row
    without the configured id is an unreadable row naming the field, as for every format."""
    same = {
        "messages": [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}]
    }
    path = _write(tmp_path / "a.jsonl", [dict(ALPACA, id="x"), ALPACA, same])
    hashed = list(iter_samples(path, "auto", None, "skip"))
    assert len({s.id for s in hashed}) == 1  # alpaca and messages spellings of one conversation
    bad: list[BadRow] = []
    by_id = list(iter_samples(path, "auto", "id", "skip", bad_rows=bad))
    assert [s.id for s in by_id] == ["x"]
    assert [(b.row, b.field) for b in bad] == [(1, "id"), (2, "id")]


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({"instruction": 3, "output": "a"}, "instruction"),
        ({"instruction": "q", "input": ["x"], "output": "a"}, "input"),
        ({"instruction": "q", "output": ["a", "b"]}, "output"),
        ({"instruction": "q", "output": "a", "history": "hi"}, "history"),
        ({"instruction": "q", "output": "a", "history": [["only one"]]}, "history[0]"),
        ({"instruction": "q", "output": "a", "history": [["u", 5]]}, "history[0][1]"),
    ],
)
def test_a_malformed_alpaca_row_names_its_field(tmp_path: Path, row: dict[str, Any], field: str) -> None:
    path = _write(tmp_path / "a.jsonl", [dict(ALPACA, id="ok"), dict(row, id="bad")])
    bad: list[BadRow] = []
    assert [s.id for s in iter_samples(path, "auto", "id", "skip", bad_rows=bad)] == ["ok"]
    assert [(b.row, b.field) for b in bad] == [(1, field)]
    assert str(path) in str(bad[0]) and "row 1" in str(bad[0])


def test_alpaca_rows_pass_the_audit(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    rows = [dict(LLAMA_FACTORY if i % 2 else WITH_INPUT, id=f"r{i}", instruction=f"q{i}") for i in range(40)]
    path = _write(tmp_path / "a.jsonl", rows)
    summary = run_audit(
        path,
        tmp_path / "audit",
        AuditConfig.from_dict({}),
        demo_tokenizer_dir,
        DatasetConfig.from_dict({"path": str(path), "id_column": "id"}),
    )
    assert (summary.total, summary.kept) == (40, 40)


def test_a_failed_audit_keeps_its_per_row_reasons(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    """``format: prompt`` over alpaca rows: every row excluded; the reasons are kept beside the log (the
    workflow deletes the failed job's excluded.jsonl) and the message names where."""
    path = _write(tmp_path / "a.jsonl", [dict(ALPACA, id=f"r{i}") for i in range(60)])
    kept = tmp_path / "logs" / "audit.excluded.jsonl"
    dataset = DatasetConfig.from_dict({"path": str(path), "id_column": "id", "format": "prompt"})
    with pytest.raises(NothingToGenerateError) as err:
        run_audit(path, tmp_path / "audit", AuditConfig.from_dict({}), demo_tokenizer_dir, dataset,
                  verdict_out=tmp_path / "logs" / "audit.verdict.json", excluded_out=kept)  # fmt: skip
    assert f"each row with its reason: {kept}" in str(err.value) and "before any server starts" in str(
        err.value
    )
    rows = [orjson.loads(line) for line in kept.read_bytes().splitlines()]
    assert [r["row"] for r in rows] == list(range(60))
    assert all(r["reason"] == "bad_row" and "field 'prompt': missing" in r["detail"] for r in rows)
    assert "looks like 'alpaca'" in rows[0]["detail"]
    # a gate failure keeps them too; a passing audit's copy holds its own excluded rows
    mixed = _write(
        tmp_path / "m.jsonl",
        [dict(ALPACA, id=f"r{i}", instruction=f"{i}?") for i in range(8)] + [{"id": "x"}] * 2,
    )
    auto = DatasetConfig.from_dict({"path": str(mixed), "id_column": "id"})
    with pytest.raises(AuditGateError, match=f"each excluded row with its reason: {kept}"):
        strict = AuditConfig.from_dict({"gates": {"max_structure_error_fraction": 0.05}})
        run_audit(mixed, tmp_path / "audit2", strict, demo_tokenizer_dir, auto, excluded_out=kept)
    assert sorted(orjson.loads(line)["row"] for line in kept.read_bytes().splitlines()) == [8, 9]
    clean = _write(tmp_path / "c.jsonl", [dict(ALPACA, id=f"r{i}", instruction=f"{i}?") for i in range(8)])
    clean_cfg = DatasetConfig.from_dict({"path": str(clean), "id_column": "id"})
    run_audit(
        clean, tmp_path / "a3", AuditConfig.from_dict({}), demo_tokenizer_dir, clean_cfg, excluded_out=kept
    )
    assert kept.read_bytes() == b""


def test_first_rows_reads_only_that_many_rows(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    """Every row unreadable: the first look stops after its rows, not at its first readable sample."""
    path = _write(tmp_path / "a.jsonl", [dict(ALPACA, id=f"r{i}") for i in range(500)])
    dataset = DatasetConfig.from_dict({"path": str(path), "id_column": "id", "format": "prompt"})
    first = first_rows(path, AuditConfig.from_dict({}), demo_tokenizer_dir, dataset, 50)
    assert (first.rows, first.whole, first.excludes_all()) == (50, False, True)
    assert len(first.excluded) == 50 and "row 0: field 'prompt'" in first.in_words()


def test_the_prestart_starts_no_server_when_the_first_rows_are_all_excluded(
    tmp_path: Path, demo_tokenizer_dir: Path
) -> None:
    from regen.layout.run import RunLayout
    from regen.runconfig import RunConfig
    from regen.tune.prestart import NothingToServe, PrestartRequest, starting_plan

    root = Path(__file__).resolve().parents[2]
    path = _write(tmp_path / "a.jsonl", [dict(ALPACA, id=f"r{i}") for i in range(60)])
    from regen.configfile import load_config

    config = load_config([str(root / "config" / "demo.yaml")])
    config["dataset"].update(path=str(path), format="prompt")
    config["tokenizer"] = str(demo_tokenizer_dir)
    request = PrestartRequest(config, 2, 1, 4, False, str(path))
    run = RunConfig.from_config(dict(config), 2)
    with pytest.raises(
        NothingToServe, match=r"rows are excluded \(bad_row=\d+\); e.g. .*row 0: field .prompt."
    ):
        starting_plan(request, run, RunLayout(results=tmp_path / "results"))
    config["dataset"]["format"] = "auto"
    _plan, source, _ = starting_plan(request, run, RunLayout(results=tmp_path / "results"))
    assert "first pass" in source
