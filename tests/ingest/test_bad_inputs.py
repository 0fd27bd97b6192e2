"""The bad-input corpus (tests/data/bad/, made by make_bad.py): every kind gets a clear message naming
file, row and field, the skip-or-stop policy applies, and nothing bad reaches a prompt shard."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from regen.ingest.audit import AuditConfig, NothingToGenerateError, run_audit
from regen.ingest.dataset import DatasetConfig, iter_samples
from regen.ingest.shards import make_shards, read_shard
from regen.types import BadInputError, BadRow

BAD_DIR = Path(__file__).parents[1] / "data" / "bad"
_spec = importlib.util.spec_from_file_location("make_bad", BAD_DIR / "make_bad.py")
assert _spec and _spec.loader
make_bad = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_bad)
EXPECTED: dict[str, tuple[str, int | None]] = make_bad.EXPECTED
UNREADABLE = {"bad_row", "file", "tail"}
NOTHING_LEFT = {"file", "empty"}


def test_corpus_is_complete() -> None:
    on_disk = {p.name for p in BAD_DIR.iterdir() if p.suffix in {".jsonl", ".json", ".parquet", ".gz"}}
    assert on_disk == set(EXPECTED)
    assert len(EXPECTED) >= 35


@pytest.mark.parametrize("name", sorted(n for n, (kind, _) in EXPECTED.items() if kind in UNREADABLE))
def test_unreadable_rows_are_named_and_skipped(name: str) -> None:
    kind, row = EXPECTED[name]
    bad: list[BadRow] = []
    samples = list(iter_samples(BAD_DIR / name, "auto", "id", "skip", bad_rows=bad))
    assert [b.row for b in bad] == [row]
    message = str(bad[0])
    assert name in message and f"row {row}" in message and re.search(r"field '[^']+'", message)
    assert bad[0].field == "<file>" or kind == "bad_row"
    # the rest of the file is lost input, except when there was nothing to read at all
    assert bad[0].unread_tail == (kind == "tail" or (kind == "file" and name != "empty_file.jsonl"))
    assert all(s.source["row"] != row for s in samples)  # the good rows around it are kept
    if kind == "tail":  # every complete row before the cut is read
        assert [s.source["row"] for s in samples] == list(range(row))


@pytest.mark.parametrize("name", sorted(n for n, (kind, _) in EXPECTED.items() if kind in UNREADABLE))
def test_stop_policy_raises_with_the_same_message(name: str) -> None:
    _, row = EXPECTED[name]
    with pytest.raises(BadInputError) as info:
        list(iter_samples(BAD_DIR / name, "auto", "id", "stop"))
    assert info.value.bad.row == row and name in str(info.value)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_nothing_bad_reaches_a_prompt_shard(name: str, tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    """Audit then shard, as the workflow does: the bad row is excluded with its reason, the rest go on."""
    kind, row = EXPECTED[name]
    cfg = {"context_limit": 4096, "override_gates": True}  # tiny files: gate fractions are meaningless
    dataset = DatasetConfig.from_dict({"path": str(BAD_DIR / name), "id_column": "id"})
    audit_args = (BAD_DIR / name, tmp_path / "audit", AuditConfig.from_dict(cfg), demo_tokenizer_dir, dataset)
    if kind in NOTHING_LEFT:  # nothing to generate: the audit stops the run, whatever the gates say
        with pytest.raises(NothingToGenerateError, match="nothing to generate"):
            run_audit(*audit_args)
    else:
        run_audit(*audit_args)
    excluded = [
        orjson.loads(line) for line in (tmp_path / "audit" / "excluded.jsonl").read_bytes().splitlines()
    ]
    if kind in NOTHING_LEFT:
        assert [(e["row"], e["reason"]) for e in excluded] == ([(row, "bad_row")] if kind == "file" else [])
        return
    shards = [tmp_path / f"{k:05d}.parquet" for k in range(2)]
    make_shards(
        BAD_DIR / name,
        tmp_path / "audit" / "excluded.jsonl",
        shards,
        "auto",
        "id",
        "skip",
        demo_tokenizer_dir,
    )
    rows_in_shards = {s.source["row"] for p in shards for s in read_shard(p)}
    if kind == "ok":
        assert not excluded and rows_in_shards == {0, 1, 2}
        return
    if kind.startswith("kept:"):  # flagged, named, and still generated
        flags = pq.read_table(tmp_path / "audit" / "flags.parquet").to_pylist()
        assert [f["row"] for f in flags if kind.removeprefix("kept:") in f["flags"]] == [row]
        assert not excluded and rows_in_shards == {0, 1, 2}
        return
    assert [e["row"] for e in excluded] == [row]
    assert excluded[0]["reason"] == ("bad_row" if kind in UNREADABLE else kind)
    assert row not in rows_in_shards
    assert rows_in_shards  # the good rows still go on
