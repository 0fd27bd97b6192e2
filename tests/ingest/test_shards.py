"""Deterministic prompt shards."""

from __future__ import annotations

import hashlib
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from regen.ingest.audit import AuditConfig, run_audit
from regen.ingest.dataset import DatasetConfig
from regen.ingest.shards import make_shards, read_shard, shard_index, write_shards
from regen.layout.names import shard_name
from regen.records import SHARD_SCHEMA
from regen.types import Message, Sample


def samples(n: int) -> list[Sample]:
    return [
        Sample(
            f"s{i}",
            (Message("user", f"question {i}"), Message("assistant", f"answer {i}", reasoning_content="r")),
            {"file": "in.jsonl", "row": i, "format": "messages"},
        )
        for i in range(n)
    ]


def paths(d: Path, n: int) -> list[Path]:
    return [d / f"{shard_name(k)}.parquet" for k in range(n)]


def test_shard_name_and_index() -> None:
    assert shard_name(3) == "00003"
    expected = int.from_bytes(hashlib.blake2b(b"abc", digest_size=8).digest(), "big") % 7
    assert shard_index("abc", 7) == expected
    assert {shard_index(f"id{i}", 4) for i in range(200)} == {0, 1, 2, 3}
    with pytest.raises(ValueError):
        shard_index("x", 0)


def test_same_input_gives_identical_shards(tmp_path: Path) -> None:
    data = samples(300)
    a, b = paths(tmp_path / "a", 5), paths(tmp_path / "b", 5)
    counts_a = write_shards(data, {"s1"}, a)
    counts_b = write_shards(data, {"s1"}, b)
    assert counts_a == counts_b
    for pa_, pb in zip(a, b, strict=True):
        assert [s.to_json() for s in read_shard(pa_)] == [s.to_json() for s in read_shard(pb)]
        assert pq.read_table(pa_).equals(pq.read_table(pb))


def test_every_id_in_exactly_one_shard_in_input_order(tmp_path: Path) -> None:
    data = samples(200)
    excluded = {"s3", "s50", "s199"}
    out = paths(tmp_path, 4)
    counts = write_shards(data, excluded, out)
    seen: list[str] = []
    for k, p in enumerate(out):
        shard = list(read_shard(p))
        assert pq.read_schema(p).equals(SHARD_SCHEMA)
        assert all(shard_index(s.id, 4) == k for s in shard)
        rows = [s.source["row"] for s in shard]
        assert rows == sorted(rows)
        assert len(shard) == counts[k]
        seen.extend(s.id for s in shard)
    assert sorted(seen) == sorted(s.id for s in data if s.id not in excluded)
    assert len(seen) == len(set(seen))


def test_round_trip_keeps_messages(tmp_path: Path) -> None:
    sample = Sample(
        "x",
        (
            Message("system", "s"),
            Message("user", ["part", 1]),
            Message("assistant", "a", reasoning_content="why"),
        ),
        {"file": "f", "row": 9, "format": "messages"},
    )
    (out,) = paths(tmp_path, 1)
    write_shards([sample], set(), [out])
    (back,) = read_shard(out)
    assert back.id == "x"
    assert back.messages[1].content == '["part",1]'
    assert back.messages[2] == Message("assistant", "a", reasoning_content="why")
    assert back.source == {"file": "f", "row": 9, "format": "messages"}


def test_all_shard_files_exist_even_when_empty(tmp_path: Path) -> None:
    out = paths(tmp_path, 16)
    counts = write_shards(samples(3), set(), out)
    assert sum(counts) == 3 and counts.count(0) >= 13
    assert all(p.is_file() for p in out)
    assert all(list(read_shard(p)) == [] for p, c in zip(out, counts, strict=True) if c == 0)


def test_failure_leaves_no_shard_files(tmp_path: Path) -> None:
    def broken():
        yield from samples(5)
        raise RuntimeError("input broke")

    out = paths(tmp_path, 3)
    with pytest.raises(RuntimeError):
        write_shards(broken(), set(), out)
    assert list(tmp_path.iterdir()) == []


def test_make_shards_drops_audit_exclusions_but_keeps_first_duplicate(
    tmp_path: Path, demo_tokenizer_dir: Path
) -> None:
    rows = [
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},  # exact dup
        {"messages": [{"role": "assistant", "content": "no user"}]},
        {"messages": [{"role": "user", "content": "other"}, {"role": "assistant", "content": ""}]},
        "{broken",
    ]
    data = tmp_path / "in.jsonl"
    data.write_bytes(b"".join((r.encode() if isinstance(r, str) else orjson.dumps(r)) + b"\n" for r in rows))
    loose = {"gates": {"max_structure_error_fraction": 1.0}}
    dataset = DatasetConfig.from_dict({"path": str(data)})
    run_audit(data, tmp_path / "audit", AuditConfig.from_dict(loose), demo_tokenizer_dir, dataset)
    how = (dataset.format, dataset.id_column, dataset.on_bad_row, demo_tokenizer_dir)
    out = paths(tmp_path / "shards", 2)
    counts = make_shards(data, tmp_path / "audit" / "excluded.jsonl", out, *how)
    got = sorted(s.source["row"] for p in out for s in read_shard(p))
    assert got == [0, 3]  # the duplicate, the structure error and the bad row are gone
    assert sum(counts) == 2
    again = paths(tmp_path / "again", 2)
    make_shards(data, tmp_path / "audit" / "excluded.jsonl", again, *how)
    assert [p.read_bytes() for p in out] == [p.read_bytes() for p in again]
