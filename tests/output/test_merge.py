"""regen.output.merge: training-ready Parquet and its manifest."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import datasets
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from support.valid_shards import make_valid_shards

from regen.output.merge import MergeConfig, MergeError, iter_dataset_samples, merge, scrub_secrets
from regen.records import VALID_SCHEMA, dataset_schema

PROVENANCE = {
    "model_path": "/models/demo",
    "sglang_version": "0.5.0",
    "server_flags": ["--tp", "1"],
    "api_key": "sk-should-not-appear",
    "nested": {"HF_TOKEN": "hf_secret_value", "max_tokens": 128, "aws_secret_access_key": "AKIA-SECRET"},
    "endpoints": [{"password": "hunter2", "url": "http://127.0.0.1:1"}],
    "Credential_file": "/home/u/.aws/credentials",
}


def test_merge_rows_schema_and_messages(tmp_path: Path) -> None:
    valid = make_valid_shards(tmp_path, [7, 0, 5])
    out = tmp_path / "dataset"
    manifest = merge(
        valid, out, MergeConfig.from_dict({"rows_per_row_group": 4, "max_rows_per_file": 100}), PROVENANCE
    )
    assert manifest.total_rows == 12
    table = ds.dataset(out, format="parquet").to_table()
    assert table.schema.remove_metadata() == dataset_schema(False).remove_metadata()
    assert table.schema.field("prompt_tokens").type == pa.int64()
    assert table.schema.field("temperature").type == pa.float64()
    assert table.num_rows == 12
    rows = {r["id"]: r for r in table.to_pylist()}
    r = rows["s00002-3"]
    no_tools = {"tool_calls_json": None, "tool_call_id": None, "name": None}
    assert r["messages"] == [
        {"role": "system", "content": "be brief", "reasoning_content": None, **no_tools},
        {"role": "user", "content": "q3?", "reasoning_content": None, **no_tools},
        {
            "role": "assistant",
            "content": "the answer is 3",
            "reasoning_content": "let me think about 3",
            **no_tools,
        },
    ]
    assert (r["shard"], r["prompt_tokens"], r["seed"], r["finish_reason"]) == ("00002", 13, 21, "stop")
    assert rows["s00000-0"]["truncated"] is True
    # row groups are bounded
    meta = pq.ParquetFile(out / "part-00000.parquet").metadata
    assert max(meta.row_group(i).num_rows for i in range(meta.num_row_groups)) == 4


def test_many_small_files_and_manifest_checksums(tmp_path: Path) -> None:
    valid = make_valid_shards(tmp_path, [9, 8])
    out = tmp_path / "dataset"
    manifest = merge(
        valid, out, MergeConfig.from_dict({"rows_per_row_group": 2, "max_rows_per_file": 3}), PROVENANCE
    )
    parts = sorted(p.name for p in out.glob("part-*.parquet"))
    assert parts == [f"part-{i:05d}.parquet" for i in range(6)]
    on_disk = json.loads((out / "_manifest.json").read_text())
    assert on_disk["total_rows"] == 17
    assert [f["rows"] for f in on_disk["files"]] == [3, 3, 3, 3, 3, 2]
    for f in on_disk["files"]:
        data = (out / f["path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == f["sha256"]
        assert len(data) == f["bytes"]
        assert pq.ParquetFile(out / f["path"]).metadata.num_rows == f["rows"]
    assert "messages: list<item: struct<role: string not null" in on_disk["schema"]
    assert manifest.to_json()["files"] == on_disk["files"]


def test_provenance_is_scrubbed(tmp_path: Path) -> None:
    valid = make_valid_shards(tmp_path, [2])
    merge(valid, tmp_path / "dataset", MergeConfig.from_dict({}), PROVENANCE)
    text = (tmp_path / "dataset" / "_manifest.json").read_text()
    for secret in ("sk-should-not-appear", "hf_secret_value", "AKIA-SECRET", "hunter2", ".aws/credentials"):
        assert secret not in text
    prov = json.loads(text)["provenance"]
    assert prov["model_path"] == "/models/demo" and prov["nested"]["max_tokens"] == 128
    assert prov["endpoints"][0]["url"] == "http://127.0.0.1:1"
    assert scrub_secrets({"token_count": 5, "tokenizer": "x"}) == {
        "token_count": 5,
        "tokenizer": "<scrubbed>",
    }


def test_loads_with_pyarrow_pandas_and_datasets(tmp_path: Path) -> None:
    valid = make_valid_shards(tmp_path, [6, 4])
    out = tmp_path / "dataset"
    merge(valid, out, MergeConfig.from_dict({"max_rows_per_file": 4}), PROVENANCE)
    assert ds.dataset(out, format="parquet").count_rows() == 10
    df = pd.read_parquet(out)
    assert len(df) == 10 and set(df["shard"]) == {"00000", "00001"}
    files = sorted(str(p) for p in out.glob("*.parquet"))
    hf = datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=str(tmp_path / "hf"))
    assert hf.num_rows == 10
    assert hf[0]["messages"][-1]["role"] == "assistant"


def test_duplicate_id_across_shards_fails_and_keeps_old_output(tmp_path: Path) -> None:
    valid = make_valid_shards(tmp_path, [3])
    out = tmp_path / "dataset"
    merge(valid, out, MergeConfig.from_dict({}), {"run": 1})
    before = (out / "_manifest.json").read_bytes()
    with pytest.raises(MergeError, match="duplicate id 's00000-0'"):
        merge([valid[0], valid[0]], out, MergeConfig.from_dict({}), {"run": 2})
    assert (out / "_manifest.json").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".dataset")] == []


def test_merge_replaces_out_dir_as_a_whole(tmp_path: Path) -> None:
    valid = make_valid_shards(tmp_path, [5])
    out = tmp_path / "dataset"
    merge(valid, out, MergeConfig.from_dict({"max_rows_per_file": 1}), {})
    assert len(list(out.glob("part-*"))) == 5
    merge(valid, out, MergeConfig.from_dict({"max_rows_per_file": 10}), {})
    assert sorted(p.name for p in out.iterdir()) == ["_manifest.json", "part-00000.parquet"]


def test_empty_input_writes_loadable_empty_dataset(tmp_path: Path) -> None:
    valid = make_valid_shards(tmp_path, [0])
    out = tmp_path / "dataset"
    manifest = merge(valid, out, MergeConfig.from_dict({}), {})
    assert manifest.total_rows == 0
    assert ds.dataset(out, format="parquet").count_rows() == 0


def test_include_token_ids_loss_on_assistant_only(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    from tokenizers import Tokenizer

    valid = make_valid_shards(tmp_path, [4])
    out = tmp_path / "dataset"
    merge(
        valid, out, MergeConfig.from_dict({"include_token_ids": True}), {}, tokenizer_dir=demo_tokenizer_dir
    )
    table = pq.read_table(out)
    assert table.schema.field("input_ids").type == pa.list_(pa.field("item", pa.int32(), nullable=False))
    assert table.schema.field("loss_mask").type == pa.list_(pa.field("item", pa.int8(), nullable=False))
    tok = Tokenizer.from_file(str(demo_tokenizer_dir / "tokenizer.json"))
    for row in table.to_pylist():
        ids, mask = row["input_ids"], row["loss_mask"]
        assert len(ids) == len(mask) and 0 < sum(mask) < len(mask)
        assert set(mask) == {0, 1}
        first, end = mask.index(1), len(mask) - mask[::-1].index(1)
        assert all(mask[first:end])  # one assistant turn: one contiguous masked run
        prompt_text = tok.decode(ids[:first], skip_special_tokens=False)
        supervised = tok.decode(ids[first:end], skip_special_tokens=False)
        assert tok.decode(ids[end:], skip_special_tokens=False).strip() == ""
        assert row["messages"][1]["content"] in prompt_text
        assert prompt_text.rstrip().endswith("assistant")
        assert row["messages"][-1]["content"] in supervised
        assert row["messages"][-1]["reasoning_content"] in supervised
        assert "q" + row["id"].split("-")[1] + "?" not in supervised


def test_iter_dataset_samples_reads_output_back(tmp_path: Path) -> None:
    valid = make_valid_shards(tmp_path, [3, 2])
    out = tmp_path / "dataset"
    merge(valid, out, MergeConfig.from_dict({"max_rows_per_file": 2}), {})
    samples = list(iter_dataset_samples(out))
    assert [s.id for s in samples] == ["s00000-0", "s00000-1", "s00000-2", "s00001-0", "s00001-1"]
    assert samples[2].source == {"file": str(out / "part-00001.parquet"), "row": 0, "format": "messages"}
    last = samples[0].messages[-1]
    assert (last.role, last.content, last.reasoning_content) == (
        "assistant",
        "the answer is 0",
        "let me think about 0",
    )


def test_valid_schema_is_what_validate_writes(tmp_path: Path) -> None:
    valid = make_valid_shards(tmp_path, [1])
    assert pq.read_schema(valid[0]).remove_metadata() == VALID_SCHEMA.remove_metadata()
