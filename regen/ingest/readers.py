"""Dataset containers: which files a path names (a file by its name; a folder by what it holds: a
``datasets`` ``save_to_disk`` folder, or shards as the Hub stores them, possibly under ``data/``) and the
readers that go through pyarrow (Parquet, Arrow IPC, CSV). Every reader yields ``(row, dict | BadRow)``
in file order."""

from __future__ import annotations

import contextlib
import csv
import io
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from regen.ingest.jsonscan import iter_json, iter_jsonl
from regen.ingest.rawfile import COMPRESSION_SUFFIXES, FILE_FIELD, UTF8_BOM, empty_file, open_input
from regen.types import BadRow

SUFFIXES: dict[str, str] = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".tsv": "tsv",
    ".arrow": "arrow",
}
PARQUET_BATCH_ROWS = 1024
CSV_BLOCK_BYTES = 1 << 20
# CSV cells holding JSON (a CSV has only text): decoded when they are strings
CSV_JSON_FIELDS: tuple[str, ...] = ("messages", "conversations", "input_ids", "loss_mask", "labels", "prompt")
# ``datasets.Dataset.save_to_disk``: Arrow IPC stream shards beside these
SAVE_TO_DISK_MARKERS: tuple[str, ...] = ("state.json", "dataset_info.json")
DATASET_DICT_MARKER = "dataset_dict.json"
# the Hub's shard names: ``train-00000-of-00003.parquet``, ``data-00000-of-00001.arrow``
SHARD_NAME = re.compile(r"^(?P<split>.+?)-\d{5}-of-\d{5}\.")
DEFAULT_SPLIT = "train"


@dataclass(frozen=True, slots=True)
class DatasetFiles:
    """What ``dataset.path`` names: the files to read, in order, and the layout they were found in."""

    path: Path
    #: ``file``, ``save_to_disk`` or ``shards`` (a folder of files of one kind)
    layout: str
    files: tuple[Path, ...]
    #: how the folder was read, in words (None for a single file)
    note: str | None = None


def file_kind(path: str | Path) -> str:
    """The container type of ``path`` from its name: ``jsonl``, ``json``, ``parquet``, ``csv``, ``tsv`` or
    ``arrow`` (a compression suffix such as ``.gz`` after it is allowed)."""
    name = Path(path).name.lower()
    stem = next((name[: -len(c)] for c in COMPRESSION_SUFFIXES if name.endswith(c)), name)
    for suffix, kind in sorted(SUFFIXES.items(), key=lambda kv: -len(kv[0])):
        if stem.endswith(suffix):
            return kind
    raise ValueError(
        f"{path}: cannot tell the file type from its name; expected one of: {', '.join(SUFFIXES)}"
        f" (optionally followed by {', '.join(COMPRESSION_SUFFIXES)}), or a folder of such files "
        "(a datasets save_to_disk folder, or Parquet shards as the Hub stores them)"
    )


def check_dataset_path(path: str | Path) -> DatasetFiles:
    """The files ``path`` names: one dataset file, a ``save_to_disk`` folder, or a folder of shards (directly
    in it or under ``data/``); a clear error when it is missing or holds no dataset file."""
    p = Path(path)
    if p.is_dir():
        return dataset_folder(p)
    if not p.is_file():
        raise FileNotFoundError(f"{path}: dataset file not found")
    file_kind(p)
    return DatasetFiles(p, "file", (p,))


def dataset_folder(folder: Path) -> DatasetFiles:
    """The shards of a dataset folder, in order (see :func:`check_dataset_path`)."""
    if (folder / DATASET_DICT_MARKER).is_file():
        splits = sorted(c.name for c in folder.iterdir() if c.is_dir())
        if DEFAULT_SPLIT in splits:
            inner = dataset_folder(folder / DEFAULT_SPLIT)
            note = f"split {DEFAULT_SPLIT!r} of the saved DatasetDict (splits: {', '.join(splits)})"
            return DatasetFiles(folder, inner.layout, inner.files, note)
        raise ValueError(
            f"{folder}: a saved DatasetDict with splits {', '.join(splits) or 'none'} and no "
            f"{DEFAULT_SPLIT!r}; point dataset.path at one split's folder (e.g. {folder / splits[0]})"
            if splits
            else f"{folder}: a saved DatasetDict with no split folders"
        )
    if any((folder / m).is_file() for m in SAVE_TO_DISK_MARKERS):
        arrows = _save_to_disk_files(folder)
        if arrows:
            return DatasetFiles(
                folder, "save_to_disk", arrows, f"datasets save_to_disk folder, {_count(arrows)}"
            )
    for where in (folder, folder / "data"):
        found = _shards_in(where) if where.is_dir() else None
        if found is not None:
            return found
    raise IsADirectoryError(
        f"{folder}: a folder with no dataset file in it or under data/ (files in it: {_listing(folder)}); "
        "point dataset.path at a .jsonl/.json/.parquet/.csv file, a datasets save_to_disk folder, or a "
        "folder of Parquet shards"
    )


def _count(files: tuple[Path, ...]) -> str:
    return f"{len(files)} file{'s' * (len(files) != 1)}"


def _save_to_disk_files(folder: Path) -> tuple[Path, ...]:
    """The Arrow shards ``state.json`` lists (in its order), else every ``*.arrow`` by name."""
    state = folder / "state.json"
    if state.is_file():
        with contextlib.suppress(ValueError, OSError, TypeError, KeyError):
            listed = [folder / f["filename"] for f in orjson.loads(state.read_bytes())["_data_files"]]
            if listed and all(f.is_file() for f in listed):
                return tuple(listed)
    return tuple(sorted(folder.glob("*.arrow")))


def _shards_in(folder: Path) -> DatasetFiles | None:
    """The dataset files directly in ``folder`` (one kind), the ``train`` split's when names carry splits."""
    files = sorted(c for c in folder.iterdir() if c.is_file() and not c.name.startswith((".", "_")))
    kinds: dict[str, list[Path]] = {}
    for f in files:
        with contextlib.suppress(ValueError):
            kinds.setdefault(file_kind(f), []).append(f)
    if not kinds:
        return None
    if len(kinds) > 1:
        mixed = ", ".join(f"{len(v)} {k}" for k, v in sorted(kinds.items()))
        raise ValueError(f"{folder}: dataset files of several kinds ({mixed}); keep one kind in the folder")
    ((kind, found),) = kinds.items()
    splits = sorted({m["split"] for f in found if (m := SHARD_NAME.match(f.name))})
    if len(splits) > 1:
        if DEFAULT_SPLIT not in splits:
            raise ValueError(
                f"{folder}: {kind} shards of splits {', '.join(splits)} and no {DEFAULT_SPLIT!r}; "
                "move one split's files into their own folder and point dataset.path at it"
            )
        found = [f for f in found if (m := SHARD_NAME.match(f.name)) and m["split"] == DEFAULT_SPLIT]
        count = _count(tuple(found))
        note = f"{kind} shards of split {DEFAULT_SPLIT!r} ({count}; splits: {', '.join(splits)})"
    else:
        note = f"{kind} shards, {_count(tuple(found))}"
    return DatasetFiles(folder, "shards", tuple(found), f"{note} in {folder}")


def _listing(directory: Path, limit: int = 5) -> str:
    names = sorted(c.name for c in directory.iterdir())
    if not names:
        return "none"
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def known_row_count(dataset: DatasetFiles) -> int | None:
    """The dataset's row count when its files say it without being read (Parquet footers); else None."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not dataset.files or any(file_kind(f) != "parquet" for f in dataset.files):
        return None
    try:
        return sum(pq.ParquetFile(f).metadata.num_rows for f in dataset.files)
    except (pa.ArrowException, OSError):
        return None  # the reader reports the damage, row by row


def iter_dataset_records(
    dataset: DatasetFiles, id_column: str | None, as_given: str
) -> Iterator[tuple[str, int, Any]]:
    """Every record of the dataset as ``(file, row, dict | BadRow)``: ``file`` is ``as_given`` (the path as
    configured) for a single file, the shard's path in a folder; rows count from 0 in each file."""
    for path in dataset.files:
        file = as_given if dataset.layout == "file" else str(path)
        for row, item in iter_records(path, id_column):
            yield file, row, item


def iter_records(path: Path, id_column: str | None) -> Iterator[tuple[int, Any]]:
    """The records of one dataset file as ``(row, dict | BadRow)``, rows counted from 0 in that file."""
    kind = file_kind(path)
    if kind == "parquet":
        yield from _iter_parquet(path)
    elif kind == "json":
        yield from iter_json(path, id_column)
    elif kind in ("csv", "tsv"):
        yield from _iter_csv(path, "\t" if kind == "tsv" else ",")
    elif kind == "arrow":
        yield from _iter_arrow(path)
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


def _iter_arrow(path: Path) -> Iterator[tuple[int, Any]]:
    """An Arrow IPC stream (what ``save_to_disk`` writes), or an Arrow IPC file, batch by batch."""
    import pyarrow as pa

    file = str(path)
    if path.stat().st_size == 0:
        yield empty_file(path)
        return
    with pa.OSFile(file) as src:
        try:
            batches: Iterator[Any] = iter(pa.ipc.open_stream(src))
        except pa.ArrowInvalid:
            try:
                reader = pa.ipc.open_file(file)
            except (pa.ArrowException, OSError) as exc:
                problem = (
                    f"not a readable Arrow stream or file (all {path.stat().st_size:,} bytes unread): {exc}"
                )
                yield 0, BadRow(file, 0, FILE_FIELD, problem, unread_tail=True)
                return
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        yield from _batch_rows(path, batches, "Arrow data")


def _iter_csv(path: Path, delimiter: str) -> Iterator[tuple[int, Any]]:
    """A CSV (or TSV) file with a header row, every column read as text; empty cells are absent fields and
    cells of ``CSV_JSON_FIELDS`` holding JSON are decoded. Rows count data rows from 0 (the header is not a
    row)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    file = str(path)
    with open_input(path) as probe:
        names = _csv_header(probe.stream.read(CSV_BLOCK_BYTES), delimiter)
    if not names:
        yield empty_file(path)
        return
    with open_input(path) as src:
        try:
            reader = pacsv.open_csv(
                src.stream,
                read_options=pacsv.ReadOptions(block_size=CSV_BLOCK_BYTES),
                parse_options=pacsv.ParseOptions(delimiter=delimiter, newlines_in_values=True),
                convert_options=pacsv.ConvertOptions(column_types={n: pa.string() for n in names}),
            )
        except (pa.ArrowException, OSError) as exc:
            yield 0, BadRow(file, 0, FILE_FIELD, f"not a readable CSV file: {exc}", unread_tail=True)
            return
        batches = iter(reader.read_next_batch, None)  # read_next_batch raises StopIteration at the end
        for row, record in _batch_rows(path, batches, "CSV data"):
            yield row, record if isinstance(record, BadRow) else _csv_record(record, file, row)


def _batch_rows(path: Path, batches: Iterator[Any], what: str) -> Iterator[tuple[int, Any]]:
    """The rows of record batches, in order; a batch that cannot be read ends the file with one unread-tail
    BadRow, and a file without rows gives the empty-file one."""
    import pyarrow as pa

    file, row = str(path), 0
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            break
        except (pa.ArrowException, OSError) as exc:
            problem = f"{what} unreadable from row {row} on (the rest of the file unread): {exc}"
            yield row, BadRow(file, row, FILE_FIELD, problem, unread_tail=True)
            return
        for record in batch.to_pylist():
            yield row, record
            row += 1
    if row == 0:
        yield empty_file(path)


def _csv_header(head: bytes, delimiter: str) -> list[str]:
    text = head.removeprefix(UTF8_BOM).decode("utf-8", "replace")
    first = next(csv.reader(io.StringIO(text), delimiter=delimiter), [])
    return [n for n in first if n]


def _csv_record(record: dict[str, Any], file: str, row: int) -> dict[str, Any] | BadRow:
    out = {k: v for k, v in record.items() if v not in (None, "")}
    for name in CSV_JSON_FIELDS:
        value = out.get(name)
        if not isinstance(value, str) or not value.lstrip().startswith(("[", "{")):
            continue
        try:
            out[name] = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            return BadRow(file, row, name, f"a CSV cell that starts like JSON but is not JSON: {exc}")
    return out
