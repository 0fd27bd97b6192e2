"""The dataset is parsed once: the audit keeps the samples it read, and the shard step shards those."""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow.parquet as pq

from regen.ingest.audit import AuditConfig, run_audit
from regen.ingest.dataset import DatasetConfig
from regen.ingest.shards import (
    expected_answer_tokens,
    make_shards,
    read_send_order,
    read_shard,
    shard_audited,
)
from regen.records import SHARD_SCHEMA

DEMO_DATASET = Path(__file__).resolve().parents[2] / "data" / "demo" / "dataset.jsonl"


def test_shards_from_the_audits_samples_equal_shards_from_parsing_the_dataset_again(
    tmp_path: Path, demo_tokenizer_dir: Path
) -> None:
    loose = {"gates": {"max_structure_error_fraction": 1.0, "max_over_length_fraction": 1.0}}
    dataset = DatasetConfig.from_dict({"path": str(DEMO_DATASET)})
    summary = run_audit(
        DEMO_DATASET, tmp_path / "audit", AuditConfig.from_dict(loose), demo_tokenizer_dir, dataset
    )
    kept = tmp_path / "audit" / "samples.parquet"
    assert pq.read_schema(kept).equals(SHARD_SCHEMA)
    assert pq.ParquetFile(kept).metadata.num_rows == summary.kept
    excluded_lines = (tmp_path / "audit" / "excluded.jsonl").read_bytes().splitlines()
    excluded = [orjson.loads(line) for line in excluded_lines]
    excluded_rows = {s.source["row"] for s in read_shard(kept)} & {e.get("row") for e in excluded}
    assert not excluded_rows, "no excluded row reaches the kept samples"

    once = [tmp_path / "once" / f"{k:05d}.parquet" for k in range(4)]
    twice = [tmp_path / "twice" / f"{k:05d}.parquet" for k in range(4)]
    how = (dataset.format, dataset.id_column, dataset.on_bad_row, demo_tokenizer_dir)
    flags = tmp_path / "audit" / "flags.parquet"
    assert shard_audited(kept, once, flags) == make_shards(
        DEMO_DATASET, tmp_path / "audit" / "excluded.jsonl", twice, *how
    )
    expected = expected_answer_tokens(flags)
    for a, b in zip(once, twice, strict=True):
        # the same rows; the audit's shards send the longest expected answer first (ties: input order)
        by_length = sorted(
            pq.read_table(b).to_pylist(), key=lambda r: -expected[(r["source_file"], r["source_row"])].tokens
        )
        assert pq.read_table(a).to_pylist() == by_length
        order = read_send_order(a)
        assert order is not None and order["by_old_answers"] + order["by_prompt"] == len(by_length)
    moved = [read_ids(a) != read_ids(b) for a, b in zip(once, twice, strict=True)]
    assert any(moved), "the demo's lengths vary: some shard's order changes"
    assert read_send_order(twice[0]) is None  # a shard made without lengths keeps the input order


def read_ids(path: Path) -> list[str]:
    return pq.read_table(path, columns=["id"])["id"].to_pylist()
