"""Training-ready Parquet: merge the validated shards into ``results/dataset/``.

It reads ``VALID_SCHEMA`` rows (``results/valid/{shard}.parquet``) and writes
``dataset_schema(include_token_ids)`` rows: one conversation each, whose ``messages`` end with the
regenerated assistant turn (``reasoning_content`` + ``content``); both schemas live in ``regen.records``.

The regenerated turn's parsed tool calls (``tool_calls_json``) go on that final assistant message.

``merge`` streams batch by batch (never the whole dataset in memory), writes bounded files
``part-00000.parquet …`` into a temporary directory, writes ``_manifest.json`` last and then
renames the directory into place, replacing ``out_dir`` as a whole.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from regen.io import file_sha256, read_json, shared_temp_dir, write_json
from regen.layout.names import MANIFEST_NAME, dataset_part, dataset_parts
from regen.observe.stage_progress import StageProgress, parquet_rows
from regen.output.provenance import build_provenance
from regen.output.reconcile import ExpectedCompletions
from regen.records import (
    DATASET_PASSTHROUGH,
    MESSAGE_TYPE,
    MESSAGES_TYPE,
    VALID_SCHEMA,
    dataset_schema,
    message_from_row,
)
from regen.runconfig import GenerateConfig, validated
from regen.types import Sample

SECRET_KEY_RE = re.compile(r"key|secret|token|password|credential", re.IGNORECASE)
SCRUBBED = "<scrubbed>"


class MergeError(RuntimeError):
    """The valid shards cannot be merged (duplicate ids, wrong schema)."""


@dataclass(frozen=True, slots=True)
class ManifestFile:
    """One output Parquet file."""

    path: str
    rows: int
    bytes: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "rows": self.rows, "bytes": self.bytes, "sha256": self.sha256}


@dataclass(frozen=True, slots=True)
class Manifest:
    """What ``_manifest.json`` holds."""

    files: tuple[ManifestFile, ...]
    total_rows: int
    schema: str
    schema_fields: tuple[dict[str, str], ...]
    provenance: dict[str, Any]
    created_at: float
    #: completions identical to an earlier one of the same prompt: how many, and whether left out
    duplicate_completions: dict[str, Any] | None = None
    #: the (variant, n) each sample was to be completed under: what ``regen reconcile`` expects
    completions: ExpectedCompletions | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "regen-dataset/1",
            "files": [f.to_json() for f in self.files],
            "total_rows": self.total_rows,
            "schema": self.schema,
            "schema_fields": list(self.schema_fields),
            "provenance": self.provenance,
            "created_at": self.created_at,
            "duplicate_completions": self.duplicate_completions,
            "completions": self.completions.to_json() if self.completions is not None else None,
        }


# ---------------------------------------------------------------------------------------------
# Valid batch -> dataset batch
# ---------------------------------------------------------------------------------------------


def _append_assistant_turn(
    messages: pa.ListArray, content: pa.Array, reasoning: pa.Array, tool_calls: pa.Array
) -> pa.ListArray:
    """Append ``{"role": "assistant", content, reasoning_content, tool_calls_json}`` to every row's list
    (vectorised)."""
    n = len(messages)
    offsets = messages.offsets.to_numpy().astype(np.int64)
    values = messages.values.slice(offsets[0], offsets[-1] - offsets[0])
    offsets = offsets - offsets[0]
    m = len(values)
    no_text = pa.nulls(n, pa.string())
    assistant = pa.StructArray.from_arrays(
        [pa.array(["assistant"] * n, pa.string()), content, reasoning, tool_calls, no_text, no_text],
        fields=list(MESSAGE_TYPE),
    )
    new_offsets = offsets + np.arange(n + 1, dtype=np.int64)
    take = np.empty(m + n, dtype=np.int64)
    is_new = np.zeros(m + n, dtype=bool)
    is_new[new_offsets[1:] - 1] = True
    take[is_new] = m + np.arange(n, dtype=np.int64)
    take[~is_new] = np.arange(m, dtype=np.int64)
    combined = pa.concat_arrays([values, assistant]).take(pa.array(take))
    if new_offsets[-1] < 2**31:
        return pa.ListArray.from_arrays(pa.array(new_offsets.astype(np.int32)), combined, type=MESSAGES_TYPE)
    raise MergeError("a batch holds more than 2**31 messages; lower rows_per_row_group")


class DuplicateCompletions:
    """Completions identical to an earlier completion of the same prompt (``sample_id``): the same
    reasoning, answer and tool calls, as when n completions at temperature 0 or a greedy variant repeat one
    another. Digests only, per prompt, over the whole merge (a prompt's completions may sit in any shard)."""

    def __init__(self) -> None:
        self._first: dict[str, dict[bytes, str]] = {}
        self.count = 0

    def of(self, valid: pa.RecordBatch) -> pa.Array:
        """The ``duplicate_of`` column of a valid batch: the earlier identical completion's id, or null."""
        out: list[str | None] = []
        columns = ("id", "sample_id", "reasoning_content", "content", "tool_calls_json")
        for rid, sid, reasoning, content, calls in zip(
            *(valid.column(c).to_pylist() for c in columns), strict=True
        ):
            digest = hashlib.blake2b(
                f"{reasoning or ''}\x00{content or ''}\x00{calls or ''}".encode(), digest_size=16
            ).digest()
            first = self._first.setdefault(sid, {}).setdefault(digest, rid)
            out.append(None if first == rid else first)
            self.count += first != rid
        return pa.array(out, pa.string())


def to_dataset_batch(
    valid: pa.RecordBatch, encoder: Any | None = None, duplicates: DuplicateCompletions | None = None
) -> pa.RecordBatch:
    """Turn a ``VALID_SCHEMA`` batch into a dataset batch (token ids when ``encoder`` is given).

    ``encoder`` maps a list of dataset rows (dicts) to ``(input_ids, loss_mask)`` pairs. ``duplicates``
    fills ``duplicate_of`` (None: all null); every row is kept (``export.drop_duplicate_completions``
    leaves them out of the exports).
    """
    if valid.schema.remove_metadata() != VALID_SCHEMA.remove_metadata():
        valid = _conform(valid)
    duplicate_of = duplicates.of(valid) if duplicates is not None else pa.nulls(valid.num_rows, pa.string())
    messages = _append_assistant_turn(
        valid.column("messages"),
        valid.column("content"),
        valid.column("reasoning_content"),
        valid.column("tool_calls_json"),
    )
    arrays: list[pa.Array] = [valid.column("id"), messages]
    arrays += [valid.column(name) for name in DATASET_PASSTHROUGH]
    arrays.append(duplicate_of)
    schema = dataset_schema(encoder is not None)
    if encoder is not None:
        plain = pa.RecordBatch.from_arrays(arrays, schema=dataset_schema(False))
        pairs = encoder(plain.to_pylist())
        arrays.append(pa.array([p[0] for p in pairs], schema.field("input_ids").type))
        arrays.append(pa.array([p[1] for p in pairs], schema.field("loss_mask").type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _conform(batch: pa.RecordBatch) -> pa.RecordBatch:
    missing = [n for n in VALID_SCHEMA.names if n not in batch.schema.names]
    if missing:
        raise MergeError(f"valid shard batch lacks columns {missing}")
    return pa.RecordBatch.from_arrays(
        [batch.column(f.name).cast(f.type) for f in VALID_SCHEMA], schema=VALID_SCHEMA
    )


def make_token_encoder(tokenizer_dir: str | os.PathLike[str]) -> Any:
    """Return ``encode(rows) -> [(input_ids, loss_mask), ...]`` under the one mask policy
    (``regen.output.masks``).

    Each row gets its last regenerated turn with the context the model saw, from the server's ids
    when it sent them; a truncated answer keeps its ids without an end-of-turn it did not produce.
    """
    from regen.chat import ChatTemplate  # late: only needed with include_token_ids
    from regen.output.masks import MaskBuilder, MaskPolicy

    builder = MaskBuilder(ChatTemplate.from_dir(tokenizer_dir), MaskPolicy(include_truncated=True))

    def encode(rows: list[dict[str, Any]]) -> list[tuple[list[int], list[int]]]:
        out = []
        for row in rows:
            made = builder.turn_row(row["id"], builder.turns(row)[-1])
            out.append((made.input_ids, made.loss_mask))
        return out

    return encode


# ---------------------------------------------------------------------------------------------
# Bounded file writer
# ---------------------------------------------------------------------------------------------


class _PartWriter:
    """Writes ``part-NNNNN.parquet`` files of at most ``max_rows`` rows, row groups of ``rg_rows``."""

    def __init__(self, out_dir: Path, schema: pa.Schema, rg_rows: int, max_rows: int) -> None:
        self.out_dir = out_dir
        self.schema = schema
        self.rg_rows = rg_rows
        self.max_rows = max_rows
        self.pending: list[pa.RecordBatch] = []
        self.pending_rows = 0
        self.writer: pq.ParquetWriter | None = None
        self.rows_in_file = 0
        self.files: list[tuple[Path, int]] = []

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        self.pending.append(batch)
        self.pending_rows += batch.num_rows
        while self.pending_rows >= self._next_group_rows():
            self._flush(self._next_group_rows())

    def _next_group_rows(self) -> int:
        room = self.max_rows - self.rows_in_file if self.writer is not None else self.max_rows
        return min(self.rg_rows, room)

    def _flush(self, rows: int) -> None:
        table = pa.Table.from_batches(self.pending, schema=self.schema)
        group, rest = table.slice(0, rows), table.slice(rows)
        self.pending = rest.to_batches()
        self.pending_rows = rest.num_rows
        if self.writer is None:
            path = dataset_part(self.out_dir, len(self.files))
            self.writer = pq.ParquetWriter(path, self.schema, compression="zstd")
            self.files.append((path, 0))
        self.writer.write_table(group, row_group_size=rows)
        self.rows_in_file += rows
        path, n = self.files[-1]
        self.files[-1] = (path, n + rows)
        if self.rows_in_file >= self.max_rows:
            self._close_file()

    def _close_file(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
            self.rows_in_file = 0

    def close(self) -> list[tuple[Path, int]]:
        while self.pending_rows:
            self._flush(min(self.pending_rows, self._next_group_rows()))
        self._close_file()
        if not self.files:  # an empty dataset is still a loadable dataset
            path = dataset_part(self.out_dir, 0)
            pq.write_table(self.schema.empty_table(), path, compression="zstd")
            self.files.append((path, 0))
        return self.files


# ---------------------------------------------------------------------------------------------
# Manifest helpers
# ---------------------------------------------------------------------------------------------


def scrub_secrets(obj: Any) -> Any:
    """Copy ``obj`` with every string value under a key matching key/secret/token/password/credential
    replaced by ``<scrubbed>`` (nested dicts and lists included).

    Non-string values (e.g. ``max_tokens: 2048``) are kept: they are not credentials.
    """
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            if isinstance(v, str) and SECRET_KEY_RE.search(str(k)):
                out[k] = SCRUBBED
            else:
                out[k] = scrub_secrets(v)
        return out
    if isinstance(obj, list | tuple):
        return [scrub_secrets(v) for v in obj]
    return obj


def _schema_fields(schema: pa.Schema) -> tuple[dict[str, str], ...]:
    return tuple({"name": f.name, "type": str(f.type), "nullable": str(f.nullable).lower()} for f in schema)


# ---------------------------------------------------------------------------------------------
# merge
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MergeConfig:
    """The ``merge`` config section (built by :meth:`from_dict`: the schema's defaults filled in and its
    rules applied, rows >= 1)."""

    rows_per_row_group: int
    max_rows_per_file: int
    include_token_ids: bool
    #: s3://bucket/prefix the publish rule uploads to; None keeps the dataset local
    output_prefix: str | None

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> MergeConfig:
        """Validate ``raw`` against the schema's ``merge`` section, fill its defaults, and type it."""
        m = validated("merge", raw)
        return cls(
            rows_per_row_group=int(m["rows_per_row_group"]),
            max_rows_per_file=int(m["max_rows_per_file"]),
            include_token_ids=bool(m["include_token_ids"]),
            output_prefix=m["output_prefix"],
        )


def merge(
    valid_paths: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    config: MergeConfig,
    provenance: dict[str, Any],
    tokenizer_dir: str | os.PathLike[str] | None = None,
    progress: StageProgress | None = None,
    completions: ExpectedCompletions | None = None,
) -> Manifest:
    """Merge valid shards into ``out_dir`` (replaced as a whole) and return its manifest; ``progress``
    counts the rows (rows/s and ETA on the console and in ``regen status``); ``completions`` (the run's
    variants) goes into the manifest, for ``regen reconcile`` to read.

    Raises ``MergeError`` on a duplicate id across shards; nothing is left at ``out_dir``
    changed in that case.
    """
    rg_rows = config.rows_per_row_group
    max_rows = config.max_rows_per_file
    include_ids = config.include_token_ids
    encoder = None
    if include_ids:
        if tokenizer_dir is None:
            raise ValueError("merge: include_token_ids needs tokenizer_dir")
        encoder = make_token_encoder(tokenizer_dir)
    schema = dataset_schema(include_ids)
    progress = progress or StageProgress.silent("merge")

    target = Path(out_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = shared_temp_dir(target.parent, prefix=f".{target.name}.")  # a trainer may run as another user
    try:
        seen: dict[str, str] = {}
        duplicates = DuplicateCompletions()
        writer = _PartWriter(tmp, schema, rg_rows, max_rows)
        for path in valid_paths:
            pf = pq.ParquetFile(path)
            for valid in pf.iter_batches(batch_size=min(rg_rows, 10000)):
                _check_unique(valid.column("id").to_pylist(), str(path), seen)
                writer.write(to_dataset_batch(valid, encoder, duplicates))
                progress.advance(valid.num_rows)
        files = writer.close()
        progress.finish()
        entries = tuple(ManifestFile(p.name, rows, p.stat().st_size, file_sha256(p)) for p, rows in files)
        manifest = Manifest(
            files=entries,
            total_rows=sum(f.rows for f in entries),
            schema=schema.to_string(show_schema_metadata=False),
            schema_fields=_schema_fields(schema),
            provenance=scrub_secrets(dict(provenance)),
            created_at=time.time(),
            duplicate_completions={"rows": duplicates.count, "column": "duplicate_of"},
            completions=completions,
        )
        write_json(tmp / MANIFEST_NAME, manifest.to_json())
        _replace_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _check_unique(ids: list[str], path: str, seen: dict[str, str]) -> None:
    for i in ids:
        first = seen.get(i)
        if first is not None:
            raise MergeError(f"duplicate id {i!r}: in {first} and again in {path}")
        seen[i] = path


def _replace_dir(tmp: Path, target: Path) -> None:
    """Move ``tmp`` to ``target``; an existing ``target`` is moved aside first and then removed."""
    old: Path | None = None
    if target.exists() or target.is_symlink():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
        os.rmdir(old)
        os.replace(target, old)
    try:
        os.replace(tmp, target)
    except BaseException:
        if old is not None:
            os.replace(old, target)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Re-audit glue: the output read back as Samples
# ---------------------------------------------------------------------------------------------


def iter_dataset_samples(dataset_dir: str | os.PathLike[str], batch_rows: int = 10000) -> Iterator[Sample]:
    """Yield every output row as a ``Sample`` (messages end with the regenerated assistant turn).

    ``source`` is ``{"file": part file, "row": row in that file, "format": "messages"}``, so the
    audit's per-sample flags point at the output file. Reads only ``id`` and ``messages``.
    """
    for part in dataset_parts(dataset_dir):
        row = 0
        for batch in pq.ParquetFile(part).iter_batches(batch_size=batch_rows, columns=["id", "messages"]):
            ids = batch.column("id").to_pylist()
            convs = batch.column("messages").to_pylist()
            for sid, msgs in zip(ids, convs, strict=True):
                yield Sample(
                    id=sid,
                    messages=tuple(message_from_row(m) for m in msgs),
                    source={"file": str(part), "row": row, "format": "messages"},
                )
                row += 1


def merge_for_workflow(
    *,
    valid_paths: list[str],
    plan_path: str,
    out_dir: str,
    config: MergeConfig,
    tokenizer_dir: str,
    generate: GenerateConfig,
) -> Manifest:
    """The ``merge`` rule: provenance from the records, the plan and the servers, then ``merge``; the
    manifest says which completions the run's ``generate`` section asked for."""
    provenance = build_provenance(
        plan=read_json(plan_path), tokenizer_dir=tokenizer_dir, valid_paths=valid_paths
    )
    progress = StageProgress.for_workflow("merge", parquet_rows(valid_paths))
    return merge(
        valid_paths,
        out_dir,
        config,
        provenance,
        tokenizer_dir=tokenizer_dir,
        progress=progress,
        completions=ExpectedCompletions.of_generate(generate),
    )
