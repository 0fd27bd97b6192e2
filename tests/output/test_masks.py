"""The one mask policy (regen.output.masks) and the trainer exports (regen.output.export), on records made
by the
generation client against the simulated server in token mode."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest
from conversations import two_turn_samples

from regen.chat import ChatTemplate
from regen.generate.client import Endpoint, ShardJob, generate_shard
from regen.output.export import ExportConfig, export_dataset
from regen.output.masks import RETOKENIZED, SERVER_IDS, MaskBuilder, MaskPolicy
from regen.output.merge import MergeConfig, merge
from regen.output.validate import ValidateConfig, validate_shard
from regen.runconfig import GenerateConfig
from regen.simulated.launcher import start_simulated_server
from regen.types import Sample

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = str(ROOT / "resources" / "demo-tokenizer")


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    return ChatTemplate.from_dir(TOKENIZER)


def conversations(n: int) -> list[Sample]:
    return two_turn_samples(n, id_prefix="c")


def make_dataset(root: Path, n: int, *, sim: dict[str, Any] | None = None, **cfg: Any) -> Path:
    """Generate with the simulated server, validate and merge: a real dataset directory."""
    url, stop = start_simulated_server(
        inline=True,
        tokenizer_path=TOKENIZER,
        mean_reasoning_tokens=30,
        mean_answer_tokens=15,
        long_fraction=0.2,
        **(sim or {}),
    )
    gen = root / "gen.jsonl"
    try:
        generate_shard(
            ShardJob(
                conversations(n),
                root / "journal.jsonl",
                gen,
                root / "failed.jsonl",
                GenerateConfig.from_dict(
                    {"backoff_base_s": 0.001, "request_timeout_s": 5, "sampling": {"max_tokens": 160}, **cfg}
                ),
                Endpoint(url, "gpu0"),
                "00000",
            )
        )
    finally:
        stop()
    valid = root / "valid.parquet"
    validate_shard(gen, valid, root / "quarantine.jsonl", ValidateConfig.from_dict({}))
    merge([valid], root / "dataset", MergeConfig.from_dict({}), {})
    return root / "dataset"


def dataset_rows(path: Path) -> list[dict[str, Any]]:
    return pq.read_table(path).to_pylist()


def test_last_supervises_only_the_regenerated_turn_with_the_newline(
    tmp_path: Path, template: ChatTemplate
) -> None:
    rows = dataset_rows(make_dataset(tmp_path, 20))
    builder = MaskBuilder(template)
    eos = template.tokenizer.token_to_id(template.end_of_turn)
    newline = template.tokenizer.encode("\n", add_special_tokens=False).ids
    stopped = truncated = 0
    for row in rows:
        out = builder.rows(row)
        if row["finish_reason"] == "length":
            truncated += 1
            assert out == []  # left out by default
            continue
        stopped += 1
        (r,) = out
        assert r.source == SERVER_IDS
        prompt, completion = row["prompt_token_ids"], row["completion_token_ids"]
        assert r.input_ids == prompt + completion + newline
        assert r.loss_mask == [0] * len(prompt) + [1] * (len(completion) + len(newline))
        assert completion[-1] == eos
        # the old dataset's earlier answer is in the context, unsupervised
        assert "old answer one" in template.tokenizer.decode(prompt, skip_special_tokens=False)
    assert stopped and truncated


def test_truncated_answers_get_no_end_of_turn_when_included(tmp_path: Path, template: ChatTemplate) -> None:
    rows = [r for r in dataset_rows(make_dataset(tmp_path, 20)) if r["finish_reason"] == "length"]
    assert rows
    builder = MaskBuilder(template, MaskPolicy(include_truncated=True))
    eos = template.tokenizer.token_to_id(template.end_of_turn)
    for row in rows:
        (r,) = builder.rows(row)
        assert r.input_ids == row["prompt_token_ids"] + row["completion_token_ids"]
        assert eos not in r.input_ids[len(row["prompt_token_ids"]) :]
        assert sum(r.loss_mask) == len(row["completion_token_ids"])


def test_opt_in_supervises_earlier_turns_as_the_trainers_do(tmp_path: Path, template: ChatTemplate) -> None:
    rows = [r for r in dataset_rows(make_dataset(tmp_path, 6)) if r["finish_reason"] == "stop"]
    builder = MaskBuilder(template, MaskPolicy(supervise_context_turns=True))
    plain = MaskBuilder(template)
    tok = template.tokenizer
    for row in rows:
        (r,) = builder.rows(row)
        (p,) = plain.rows(row)
        assert r.input_ids == p.input_ids
        extra = [i for i, (a, b) in enumerate(zip(r.loss_mask, p.loss_mask, strict=True)) if a != b]
        assert extra
        assert (
            tok.decode([r.input_ids[i] for i in extra], skip_special_tokens=False)
            == "old answer one<|im_end|>\n"
        )


def test_regenerate_all_gives_one_row_per_turn_with_the_context_the_model_saw(
    tmp_path: Path, template: ChatTemplate
) -> None:
    rows = dataset_rows(make_dataset(tmp_path, 8, regenerate="all", sampling={"max_tokens": 400}))
    builder = MaskBuilder(template, MaskPolicy(include_truncated=True))
    for row in rows:
        out = builder.rows(row)
        assert [r.id for r in out] == [f"{row['id']}#0", f"{row['id']}#1"]
        for r, turn in zip(out, row["turns"], strict=True):
            n = len(turn["prompt_token_ids"])
            assert r.input_ids[:n] == turn["prompt_token_ids"]
            assert r.loss_mask[:n] == [0] * n
            assert r.input_ids[n : n + len(turn["completion_token_ids"])] == turn["completion_token_ids"]
            assert all(r.loss_mask[n:])
        # the second row's context is what the server rendered: the first answer without its thinking
        first, second = row["turns"]
        context = template.tokenizer.decode(
            out[1].input_ids[: len(second["prompt_token_ids"])], skip_special_tokens=False
        )
        assert first["content"].strip() in context and first["reasoning_content"].strip() not in context


def test_rows_without_server_ids_fall_back_to_the_template(tmp_path: Path, template: ChatTemplate) -> None:
    rows = dataset_rows(make_dataset(tmp_path, 10, return_token_ids=False))
    builder = MaskBuilder(template, MaskPolicy(include_truncated=True))
    eos = template.tokenizer.token_to_id(template.end_of_turn)
    for row in rows:
        (r,) = builder.rows(row)
        assert r.source == RETOKENIZED
        answer = [t for t, m in zip(r.input_ids, r.loss_mask, strict=True) if m]
        assert (eos in answer) == (row["finish_reason"] == "stop")
        assert r.input_ids[-1] != eos or row["finish_reason"] == "stop"


def test_export_files_manifest_and_permissions(tmp_path: Path) -> None:
    dataset = make_dataset(tmp_path, 20, sim={"faults": {"noncanonical_rate": 0.3}})
    out = tmp_path / "export"
    old = os.umask(0o022)
    try:
        manifest = export_dataset(
            dataset_dir=str(dataset),
            specforge_out=str(out / "specforge.jsonl"),
            tokenized_out=str(out / "tokenized.jsonl"),
            manifest_out=str(out / "manifest.json"),
            config=ExportConfig.from_dict({"eval_fraction": 0}),  # the eval split: tests/output/test_split.py
            tokenizer_dir=TOKENIZER,
            regenerate="last",
        )
    finally:
        os.umask(old)
    rows = dataset_rows(dataset)
    truncated = sum(r["truncated"] for r in rows)
    assert truncated
    assert manifest["left_out"] == {"truncated": truncated}
    assert manifest["specforge"]["chat_template"] == "qwen3-thinking"
    assert manifest["specforge"]["train_only_last_turn"] is True
    for name in ("specforge.jsonl", "tokenized.jsonl", "manifest.json", "specforge.eval.jsonl"):
        assert (out / name).stat().st_mode & 0o777 == 0o644
    sf = [orjson.loads(x) for x in (out / "specforge.jsonl").read_bytes().splitlines()]
    tk = [orjson.loads(x) for x in (out / "tokenized.jsonl").read_bytes().splitlines()]
    assert len(sf) == len(tk) == len(rows) - truncated == manifest["tokenized"]["rows"]
    first = sf[0]["conversations"]
    assert [m["role"] for m in first] == ["system", "user", "assistant", "user", "assistant"]
    assert "reasoning_content" in first[-1] and "reasoning_content" not in first[0]
    assert set(tk[0]) == {"id", "sample_id", "variant", "k", "fingerprint", "input_ids", "loss_mask"}
    # each token row names the answer it came from (the features' resume reads it: regen.features.store)
    fingerprints = {r["id"]: r["fingerprint"] for r in rows}
    assert all(t["fingerprint"] == fingerprints[t["id"]] for t in tk)
