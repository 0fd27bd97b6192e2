"""The held-out eval split (issue 24, item 1): chosen by the normalized opening prompt, written beside the
training files, recorded in the manifest, checked by the re-audit, the same on every rerun."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest
from test_reaudit import merged, record
from test_reaudit import run as run_reaudit

import regen.output.split
from regen.io import read_json
from regen.layout.beside import eval_split_beside
from regen.output.export import ExportConfig, export_dataset
from regen.output.reaudit import OutputGateError
from regen.output.split import EVAL, TRAIN, SplitCounts, row_side, side_of, split_key

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = str(ROOT / "resources" / "demo-tokenizer")


def conv(user: str, *more: str) -> list[dict[str, Any]]:
    out = [{"role": "system", "content": "be brief"}, {"role": "user", "content": user}]
    for text in more:
        out += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": text}]
    return out


def test_whitespace_variants_repeats_and_shared_openings_land_on_one_side() -> None:
    prompts = [f"question number {i} about things" for i in range(400)]
    sides = {p: row_side(conv(p), 0.3) for p in prompts}
    assert 0.2 < sum(s == EVAL for s in sides.values()) / len(prompts) < 0.4
    for p, side in sides.items():
        assert row_side(conv("  " + p.replace(" ", "\n\t ") + " "), 0.3) == side  # whitespace variant
        assert row_side(conv(p, "and then?"), 0.3) == side  # a conversation that opens alike
        assert row_side([{"role": "user", "content": p}], 0.3) == side  # another system prompt
    assert split_key(conv("a b\tc")) == "abc"
    assert all(side_of(p, 0.0) == TRAIN for p in prompts) and all(side_of(p, 1.0) == EVAL for p in prompts)


def test_leak_check_sees_a_prompt_on_both_sides(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [conv("same prompt")] * 4
    assert SplitCounts(0.5).add_all(rows).prompts_on_both_sides == 0
    flip = iter([TRAIN, EVAL, TRAIN, EVAL])
    monkeypatch.setattr(regen.output.split, "row_side", lambda messages, fraction: next(flip))
    assert SplitCounts(0.5).add_all(rows).prompts_on_both_sides == 1


def records(n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        rec = record(i, f"The answer is {i}.", f"thinking about {i}")
        # every fifth prompt repeats an earlier one with other whitespace
        text = f"question number {i - 1 if i % 5 == 4 else i}?"
        rec["messages"] = [{"role": "user", "content": text if i % 5 != 4 else " " + text.replace(" ", "  ")}]
        out.append(rec)
    return out


def export(tmp_path: Path, dataset: Path, name: str, fraction: float) -> tuple[dict[str, Any], Path]:
    out = tmp_path / name
    manifest = export_dataset(
        dataset_dir=str(dataset),
        specforge_out=str(out / "specforge.jsonl"),
        tokenized_out=str(out / "tokenized.jsonl"),
        manifest_out=str(out / "manifest.json"),
        config=ExportConfig.from_dict({"eval_fraction": fraction}),
        tokenizer_dir=TOKENIZER,
        regenerate="last",
    )
    return manifest, out


def user_turns(path: Path) -> list[str]:
    lines = [orjson.loads(x) for x in path.read_bytes().splitlines()]
    return ["".join(m["content"].split()) for x in lines for m in x["conversations"] if m["role"] == "user"]


def test_export_writes_the_eval_split_beside_the_training_files(tmp_path: Path) -> None:
    dataset = merged(tmp_path, records(60))
    manifest, out = export(tmp_path, dataset, "a", 0.3)
    assert eval_split_beside(out / "tokenized.jsonl") == out / "tokenized.eval.jsonl"
    train, held = user_turns(out / "specforge.jsonl"), user_turns(out / "specforge.eval.jsonl")
    assert train and held and not set(train) & set(held)  # no prompt on both sides
    assert len(train) + len(held) == 60
    split = manifest["eval_split"]
    assert split["dataset_rows"] == {"train": len(train), "eval": len(held)}
    assert split["prompts_on_both_sides"] == 0 and split["eval_fraction"] == 0.3
    assert split["tokenized_rows"] == len((out / "tokenized.eval.jsonl").read_bytes().splitlines())
    assert manifest["tokenized"]["rows"] == len((out / "tokenized.jsonl").read_bytes().splitlines())
    written = [orjson.loads(line) for line in (out / "tokenized.jsonl").read_bytes().splitlines()]
    assert manifest["tokenized"]["tokens"] == sum(len(r["input_ids"]) for r in written) > 0
    # a rerun, and a rerun over the rows in another order (another shard layout), give the same split
    again, out_b = export(tmp_path, dataset, "b", 0.3)
    assert {**again["eval_split"], "files": None} == {**split, "files": None}
    assert (out_b / "specforge.eval.jsonl").read_bytes() == (out / "specforge.eval.jsonl").read_bytes()
    shuffled = records(60)
    random.Random(3).shuffle(shuffled)
    _, out_c = export(tmp_path / "c", merged(tmp_path / "c", shuffled), "x", 0.3)
    assert sorted(user_turns(out_c / "specforge.eval.jsonl")) == sorted(held)


def test_reaudit_records_the_split_and_fails_on_a_leak(
    tmp_path: Path, demo_tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset = merged(tmp_path, records(40))
    rows = pq.read_table(dataset).to_pylist()
    summary, _ = run_reaudit(tmp_path, dataset, demo_tokenizer_dir)
    split = read_json(summary)["eval_split"]
    assert split["rows"]["eval"] == sum(row_side(r["messages"], 0.05) == EVAL for r in rows)
    assert split["prompts_on_both_sides"] == 0 and read_json(summary)["gates"]["eval_split_leaks"]["passed"]
    # a split that let a repeated prompt across would be caught
    monkeypatch.setattr(
        regen.output.split, "row_side", lambda messages, fraction: random.choice([TRAIN, EVAL])
    )
    random.seed(1)
    with pytest.raises(OutputGateError, match="eval_split_leaks"):
        run_reaudit(tmp_path, dataset, demo_tokenizer_dir)
