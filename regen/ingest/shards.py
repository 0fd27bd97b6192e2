"""Deterministic prompt shards: which generate job gets which sample.

A sample goes to shard ``blake2b(id) mod n`` (never Python's salted ``hash``), and within a
shard samples keep their input order, so the same input and config always give the same
files. Every one of the ``n`` shard files is written, empty or not, and all of them are
renamed into place only after every sample has been written.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Collection, Iterable, Iterator, Sequence
from pathlib import Path

import orjson
import pyarrow.parquet as pq

from regen.chat import ChatTemplate
from regen.ingest.dataset import iter_samples
from regen.layout import shard_name as shard_name  # the shard-name format's home is the layout
from regen.records import SHARD_SCHEMA, SampleRows, message_from_row
from regen.types import Sample

ROWS_PER_BATCH = 4096


def shard_index(sample_id: str, n: int) -> int:
    """The shard of ``sample_id`` among ``n``: blake2b-64 of the UTF-8 id, mod n."""
    if n < 1:
        raise ValueError(f"shard count must be at least 1, got {n}")
    digest = hashlib.blake2b(sample_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % n


def write_shards(
    samples: Iterable[Sample],
    excluded_ids: Collection[str],
    out_paths: Sequence[str | os.PathLike[str]],
    excluded_rows: Collection[tuple[str, int]] = frozenset(),
) -> list[int]:
    """Stream ``samples`` into ``len(out_paths)`` shard files; return the row count of each shard.

    A sample is left out when its id is in ``excluded_ids`` or its source ``(file, row)`` is in
    ``excluded_rows`` (a folder dataset counts rows per file). Shard ``k`` is written to
    ``out_paths[k]``; all files appear together at the end (temp files + rename), none on failure.
    """
    n = len(out_paths)
    if n < 1:
        raise ValueError("write_shards needs at least one output path")
    targets = [Path(p) for p in out_paths]
    temps: list[Path] = []
    try:
        for target in targets:
            target.parent.mkdir(parents=True, exist_ok=True)
            temps.append(target.with_name(f".{target.name}.{os.getpid()}.tmp"))
        with contextlib.ExitStack() as stack:
            buffers = [
                SampleRows(stack.enter_context(pq.ParquetWriter(tmp, SHARD_SCHEMA, compression="zstd")))
                for tmp in temps
            ]
            for sample in samples:
                where = (sample.source.get("file"), sample.source.get("row"))
                if sample.id in excluded_ids or where in excluded_rows:
                    continue
                buffers[shard_index(sample.id, n)].add(sample)
            for buf in buffers:
                buf.flush()
        for tmp, target in zip(temps, targets, strict=True):
            os.replace(tmp, target)
        return [b.rows for b in buffers]
    finally:
        for tmp in temps:
            if tmp.exists():
                tmp.unlink()


def shard_audited(
    samples_parquet: str | os.PathLike[str], out_paths: Sequence[str | os.PathLike[str]]
) -> list[int]:
    """Shard the samples the audit kept (``results/audit/samples.parquet``, already normalized and
    filtered): the dataset is parsed once, by the audit."""
    return write_shards(read_shard(samples_parquet), frozenset(), out_paths)


def read_shard(path: str | os.PathLike[str]) -> Iterator[Sample]:
    """Stream the samples of one shard file, in order."""
    pf = pq.ParquetFile(path)
    for batch in pf.iter_batches(batch_size=ROWS_PER_BATCH):
        for row in batch.to_pylist():
            messages = tuple(message_from_row(m) for m in (row["messages"] or ()))
            source = {"file": row["source_file"], "row": row["source_row"], "format": row["source_format"]}
            tools = row.get("tools_json")
            yield Sample(
                id=row["id"],
                messages=messages,
                source=source,
                tools=tuple(orjson.loads(tools)) if tools else None,
            )


def read_excluded(excluded_jsonl: str | os.PathLike[str]) -> tuple[frozenset[str], frozenset[int]]:
    """Ids and source rows listed in the audit's ``excluded.jsonl``."""
    ids: set[str] = set()
    rows: set[int] = set()
    with open(excluded_jsonl, "rb") as fh:
        for lineno, line in enumerate(fh):
            if not line.strip():
                continue
            try:
                entry = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise ValueError(f"{excluded_jsonl}: line {lineno}: malformed JSON: {exc}") from exc
            if isinstance(entry.get("id"), str):
                ids.add(entry["id"])
            if isinstance(entry.get("row"), int):
                rows.add(entry["row"])
    return frozenset(ids), frozenset(rows)


def read_excluded_places(excluded_jsonl: str | os.PathLike[str]) -> frozenset[tuple[str, int]]:
    """The ``(file, row)`` of every row in the audit's ``excluded.jsonl`` (rows count per file)."""
    places: set[tuple[str, int]] = set()
    with open(excluded_jsonl, "rb") as fh:
        for line in fh:
            if line.strip():
                entry = orjson.loads(line)
                if isinstance(entry.get("row"), int):
                    places.add((entry.get("file"), entry["row"]))
    return frozenset(places)


def make_shards(
    input_path: str | os.PathLike[str],
    excluded_jsonl: str | os.PathLike[str],
    out_paths: Sequence[str | os.PathLike[str]],
    fmt: str,
    id_column: str | None,
    on_bad_row: str,
    tokenizer_dir: str | os.PathLike[str] | None = None,
) -> list[int]:
    """Read the dataset again and shard every sample the audit did not exclude.

    Exclusion matches the audit's ``excluded.jsonl`` by source file and row (unique in the input, while
    content-derived ids repeat for exact duplicates, whose first occurrence must stay).
    """
    rows = read_excluded_places(excluded_jsonl)
    developer_role = ChatTemplate.from_dir(tokenizer_dir).developer_role if tokenizer_dir else "system"
    samples = iter_samples(
        input_path, fmt, id_column, on_bad_row, tokenizer_dir, bad_rows=None, developer_role=developer_role
    )
    return write_shards(samples, frozenset(), out_paths, excluded_rows=rows)
