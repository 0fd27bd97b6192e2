"""Dataset containers: which reader a path takes (a file by its name, a folder by what it holds), and
the readers that go through pyarrow. Every reader yields ``(row, dict | BadRow)`` in file order."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from regen.ingest.jsonscan import iter_json, iter_jsonl
from regen.ingest.rawfile import COMPRESSION_SUFFIXES, FILE_FIELD, empty_file
from regen.types import BadRow

SUFFIXES: dict[str, str] = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".pq": "parquet",
}


PARQUET_BATCH_ROWS = 1024


def file_kind(path: str | Path) -> str:
    """The container type of ``path`` from its name: ``jsonl``, ``json`` or ``parquet``
    (a compression suffix such as ``.gz`` after it is allowed)."""
    name = Path(path).name.lower()
    stem = next((name[: -len(c)] for c in COMPRESSION_SUFFIXES if name.endswith(c)), name)
    for suffix, kind in sorted(SUFFIXES.items(), key=lambda kv: -len(kv[0])):
        if stem.endswith(suffix):
            return kind
    raise ValueError(
        f"{path}: cannot tell the file type from its name; expected one of: {', '.join(SUFFIXES)}"
        f" (optionally followed by {', '.join(COMPRESSION_SUFFIXES)})"
    )


def check_dataset_path(path: str | Path) -> Path:
    """``path`` as a Path if it is a readable dataset file; a clear error if it is missing or a directory."""
    p = Path(path)
    if p.is_dir():
        raise IsADirectoryError(
            f"{path}: is a directory, not a dataset file; point dataset.path at one "
            f".jsonl/.json/.parquet file (files in it: {_listing(p)})"
        )
    if not p.is_file():
        raise FileNotFoundError(f"{path}: dataset file not found")
    file_kind(p)
    return p


def _listing(directory: Path, limit: int = 5) -> str:
    names = sorted(c.name for c in directory.iterdir())
    if not names:
        return "none"
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def iter_records(path: Path, id_column: str | None) -> Iterator[tuple[int, Any]]:
    kind = file_kind(path)
    if kind == "parquet":
        yield from _iter_parquet(path)
    elif kind == "json":
        yield from iter_json(path, id_column)
    else:
        yield from iter_jsonl(path, id_column)


def _iter_parquet(path: Path) -> Iterator[tuple[int, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    file = str(path)
    if path.stat().st_size == 0:
        yield empty_file(path)
        return
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        size = path.stat().st_size
        problem = f"not a readable Parquet file (all {size:,} bytes unread): {exc}"
        yield 0, BadRow(file, 0, FILE_FIELD, problem, unread_tail=True)
        return
    row = 0
    # one row group at a time (the reader would otherwise read ahead into later groups, and
    # a damaged group would hide the good rows before it)
    for group in range(pf.num_row_groups):
        batches = pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, row_groups=[group])
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                break
            except (pa.ArrowException, OSError) as exc:
                total = pf.metadata.num_rows
                problem = (
                    f"Parquet data unreadable from row {row} on (row group {group} of {pf.num_row_groups}): "
                    f"{total - row:,} of the file's {total:,} rows unread"
                )
                yield row, BadRow(file, row, FILE_FIELD, f"{problem}: {str(exc).strip()}", unread_tail=True)
                return
            for record in batch.to_pylist():
                yield row, record
                row += 1
