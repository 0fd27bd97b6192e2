"""Token-exact ids: the simulated server answers ``return_token_ids`` as SGLang does, and the client
keeps the server's ids in the journal (additive fields) for every regenerated turn."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
from conversations import two_turn_samples

from regen.chat import ChatTemplate
from regen.generate.client import Endpoint, ShardJob, generate_shard
from regen.runconfig import GenerateConfig
from regen.simulated.launcher import start_simulated_server
from regen.simulated.parsers import completion_ids_field, parse_qwen3_reasoning
from regen.types import Sample

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = str(ROOT / "resources" / "demo-tokenizer")
SCHEMA = json.loads((ROOT / "schemas" / "record.schema.json").read_text())
FAST = {"backoff_base_s": 0.001, "request_timeout_s": 5, "sampling": {"max_tokens": 300}}


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    return ChatTemplate.from_dir(TOKENIZER)


def samples(n: int) -> list[Sample]:
    return two_turn_samples(n, id_prefix="s")


def run_shard(tmp_path: Path, url: str, items: list[Sample], **cfg: Any) -> list[dict[str, Any]]:
    out = tmp_path / "gen.jsonl"
    generate_shard(
        ShardJob(
            items,
            tmp_path / "journal.jsonl",
            out,
            tmp_path / "failed.jsonl",
            GenerateConfig.from_dict({**FAST, **cfg}),
            Endpoint(url, "gpu0"),
            "00000",
        )
    )
    return [orjson.loads(line) for line in out.read_bytes().splitlines()]


@pytest.fixture
def token_sim() -> Iterator[str]:
    url, stop = start_simulated_server(
        inline=True, tokenizer_path=TOKENIZER, mean_reasoning_tokens=40, mean_answer_tokens=20
    )
    yield url
    stop()


def test_completion_ids_field_follows_the_sglang_version() -> None:
    assert completion_ids_field("0.5.23") == "response_token_ids"
    assert completion_ids_field("0.5.17") == "token_ids"
    assert completion_ids_field("0.6.0") == "response_token_ids"


def test_reasoning_parser_keeps_newlines_like_sglang_0_5_23() -> None:
    assert parse_qwen3_reasoning("<think>\nr\n</think>\n\nA", True) == ("\nr\n", "\n\nA")
    assert parse_qwen3_reasoning("<think>\nr still", True) == ("\nr still", "")
    assert parse_qwen3_reasoning("plain answer", False) == (None, "plain answer")


@pytest.mark.parametrize("thinking", ["on", "off"])
def test_last_turn_ids_are_the_servers_and_decode_to_the_text(
    token_sim: str, tmp_path: Path, template: ChatTemplate, thinking: str
) -> None:
    records = run_shard(tmp_path, token_sim, samples(12), thinking=thinking)
    assert len(records) == 12
    eos = template.tokenizer.token_to_id(template.end_of_turn)
    for rec in records:
        jsonschema.validate(rec, SCHEMA)
        prompt_text = template.render(rec["messages"], True, rec["thinking"])
        assert rec["prompt_token_ids"] == template.tokenizer.encode(prompt_text, add_special_tokens=False).ids
        ids = rec["completion_token_ids"]
        assert len(ids) == rec["usage"]["completion_tokens"]
        assert len(rec["prompt_token_ids"]) == rec["usage"]["prompt_tokens"]
        # raw ids before reasoning parsing: the think block and the answer, end-of-turn on a stop
        raw = template.tokenizer.decode(ids, skip_special_tokens=True)
        if rec["thinking"]:
            assert raw.startswith("<think>\n")
            assert raw == "<think>" + (rec["reasoning_content"] or "") + (
                "</think>" + rec["content"] if "</think>" in raw else ""
            )
        else:
            assert raw == rec["content"]
        assert (ids[-1] == eos) == (rec["finish_reason"] == "stop")
        if rec["finish_reason"] == "length":
            assert len(ids) == rec["sampling"]["max_tokens"]


def test_regenerate_all_keeps_each_turns_ids(token_sim: str, tmp_path: Path, template: ChatTemplate) -> None:
    records = run_shard(tmp_path, token_sim, samples(6), regenerate="all")
    for rec in records:
        jsonschema.validate(rec, SCHEMA)
        turns = rec["turns"]
        assert len(turns) == 2
        first, second = turns
        # the second turn's prompt holds the first answer as the template keeps it (its thinking dropped)
        seen = template.tokenizer.decode(second["prompt_token_ids"], skip_special_tokens=False)
        assert first["content"].strip() in seen
        assert first["reasoning_content"].strip() not in seen
        assert seen == template.render(rec["messages"], True, True)
        assert rec["prompt_token_ids"] == second["prompt_token_ids"]
        assert rec["completion_token_ids"] == second["completion_token_ids"]


def test_token_ids_off_sends_no_flag_and_keeps_no_ids(token_sim: str, tmp_path: Path) -> None:
    records = run_shard(tmp_path, token_sim, samples(3), return_token_ids=False)
    assert all("prompt_token_ids" not in r and "completion_token_ids" not in r for r in records)


def test_older_sglang_field_name_is_read_too(tmp_path: Path) -> None:
    url, stop = start_simulated_server(inline=True, tokenizer_path=TOKENIZER, version="0.5.17")
    try:
        records = run_shard(tmp_path, url, samples(3))
    finally:
        stop()
    assert all(len(r["completion_token_ids"]) == r["usage"]["completion_tokens"] for r in records)


def test_server_without_ids_leaves_the_fields_out(tmp_path: Path) -> None:
    url, stop = start_simulated_server(inline=True)  # no tokenizer: words stand in for tokens, no ids
    try:
        records = run_shard(tmp_path, url, samples(2))
    finally:
        stop()
    assert records and all("completion_token_ids" not in r for r in records)


def test_noncanonical_ids_decode_to_the_same_text_but_retokenize_differently(
    tmp_path: Path, template: ChatTemplate
) -> None:
    url, stop = start_simulated_server(
        inline=True, tokenizer_path=TOKENIZER, faults={"noncanonical_rate": 1.0}, mean_answer_tokens=20
    )
    try:
        records = run_shard(tmp_path, url, samples(4), thinking="off")
    finally:
        stop()
    tok = template.tokenizer
    for rec in records:
        ids = rec["completion_token_ids"]
        text = tok.decode(ids, skip_special_tokens=True)
        assert text == rec["content"]
        body = ids[:-1] if rec["finish_reason"] == "stop" else ids
        assert tok.encode(text, add_special_tokens=False).ids != body


def test_ids_reach_the_parquet_and_the_dataset_is_readable_by_others(
    token_sim: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    import pyarrow.parquet as pq

    from regen.output.merge import MergeConfig, merge
    from regen.output.validate import ValidateConfig, validate_shard

    records = run_shard(tmp_path, token_sim, samples(5), regenerate="all")
    valid = tmp_path / "valid.parquet"
    stats = validate_shard(
        tmp_path / "gen.jsonl", valid, tmp_path / "quarantine.jsonl", ValidateConfig.from_dict({})
    )
    assert stats.valid == 5
    old = os.umask(0o022)
    try:
        merge([valid], tmp_path / "dataset", MergeConfig.from_dict({}), {})
    finally:
        os.umask(old)
    assert (tmp_path / "dataset").stat().st_mode & 0o777 == 0o755
    rows = {r["id"]: r for r in pq.read_table(tmp_path / "dataset").to_pylist()}
    for rec in records:
        row = rows[rec["id"]]
        assert row["prompt_token_ids"] == rec["prompt_token_ids"]
        assert row["completion_token_ids"] == rec["completion_token_ids"]
        assert [t["completion_token_ids"] for t in row["turns"]] == [
            t["completion_token_ids"] for t in rec["turns"]
        ]
