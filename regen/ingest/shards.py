"""Deterministic prompt shards: which generate job gets which sample.

A sample goes to shard ``blake2b(id) mod n`` (never Python's salted ``hash``), so a shard's
membership is known at plan time and never depends on lengths. Within a shard the samples are in
their send order: the workflow's shard step (:func:`shard_audited`) puts the longest expected
answer first (:func:`expected_answer_tokens`, from the audit's counts), so the shard's last minutes
decode short answers at a full batch instead of a few long ones at a falling batch (issue 37); ties,
and :func:`write_shards` without expected lengths, keep the input order. The same input and config
always give the same files. Every one of the ``n`` shard files is written, empty or not, and all of
them are renamed into place only after every sample has been written.

The order decides nothing of an answer: a sample's seed, thinking switch and fingerprint derive from
its id, the settings and its request content (``regen.generate.sample_record.derive_seed``,
``regen.fingerprint.request_fingerprint``), and the journal replays by fingerprint, not by position.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow.parquet as pq

from regen.ingest.dataset import iter_samples
from regen.layout.names import shard_name as shard_name  # the shard-name format's home is the layout
from regen.records import SHARD_SCHEMA, SampleRows, message_from_row
from regen.types import Sample

log = logging.getLogger(__name__)

ROWS_PER_BATCH = 4096

#: a sample's place in the input: (source file, row), unique where content-derived ids repeat
Place = tuple[str | None, int | None]
#: what a sample's expected answer length was read from (:func:`expected_answer_tokens`)
BY_OLD_ANSWERS = "old_answers"
BY_PROMPT = "prompt"
#: the shard file's key-value metadata holding its :class:`SendOrder`
SEND_ORDER_KEY = b"regen.send_order"


@dataclass(frozen=True, slots=True)
class Expected:
    """A sample's expected answer length in tokens, and what it was read from."""

    tokens: int
    basis: str  # BY_OLD_ANSWERS or BY_PROMPT


@dataclass(frozen=True, slots=True)
class SendOrder:
    """How one shard's samples are ordered (kept in the shard file's metadata and logged)."""

    order: str
    by_old_answers: int  # samples ranked by their old answers' tokens
    by_prompt: int  # samples with no old answer counted, ranked by their prompt tokens
    first_expected_tokens: int | None
    last_expected_tokens: int | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def expected_answer_tokens(flags_parquet: str | os.PathLike[str]) -> dict[Place, Expected]:
    """Each kept sample's expected answer length, from the audit's ``flags.parquet``: the supervised
    tokens of its old answers (every assistant turn; with ``regenerate: last`` a multi-turn sample is
    ranked by all its answers, a proxy); where it has none counted (no assistant turn, empty answers, a
    row too long to tokenize), its prompt tokens, a documented fallback that ranks a dataset without
    answers by prompt length. Both are token counts and compare as such."""
    cols = ("file", "row", "supervised_tokens", "prompt_tokens", "excluded")
    table = pq.read_table(flags_parquet, columns=list(cols))
    out: dict[Place, Expected] = {}
    for file, row, supervised, prompt, excluded in zip(*(table[c].to_pylist() for c in cols), strict=True):
        if excluded:
            continue
        if supervised:
            out[(file, row)] = Expected(int(supervised), BY_OLD_ANSWERS)
        else:
            out[(file, row)] = Expected(int(prompt or 0), BY_PROMPT)
    return out


def order_longest_first(path: Path, expected: Mapping[Place, Expected]) -> SendOrder:
    """Rewrite the shard file ``path`` with its samples by expected answer length, longest first (a stable
    sort: ties keep the file's order); the :class:`SendOrder` goes into its metadata. Holds the one shard
    in memory as Arrow columns."""
    table = pq.read_table(path)
    places = zip(table["source_file"].to_pylist(), table["source_row"].to_pylist(), strict=True)
    found: list[Expected] = []
    for file, row in places:
        got = expected.get((file, row))
        if got is None:
            raise ValueError(
                f"{path}: sample at file {file!r} row {row}: not in the audit's flags (stale audit?)"
            )
        found.append(got)
    tokens = np.array([e.tokens for e in found], dtype=np.int64)
    order = np.argsort(-tokens, kind="stable")
    by_old = sum(e.basis == BY_OLD_ANSWERS for e in found)
    summary = SendOrder(
        order="longest expected answer first",
        by_old_answers=by_old,
        by_prompt=len(found) - by_old,
        first_expected_tokens=int(tokens[order[0]]) if len(found) else None,
        last_expected_tokens=int(tokens[order[-1]]) if len(found) else None,
    )
    ordered = table.take(order).replace_schema_metadata({SEND_ORDER_KEY: orjson.dumps(summary.to_json())})
    pq.write_table(ordered, path, compression="zstd", row_group_size=ROWS_PER_BATCH)
    return summary


def read_send_order(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The :class:`SendOrder` a shard file carries; None when it keeps the input order."""
    meta = pq.read_schema(path).metadata or {}
    raw = meta.get(SEND_ORDER_KEY)
    return orjson.loads(raw) if raw else None


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
    expected: Mapping[Place, Expected] | None = None,
) -> list[int]:
    """Stream ``samples`` into ``len(out_paths)`` shard files; return the row count of each shard.

    A sample is left out when its id is in ``excluded_ids`` or its source ``(file, row)`` is in
    ``excluded_rows`` (a folder dataset counts rows per file). Shard ``k`` is written to
    ``out_paths[k]``; all files appear together at the end (temp files + rename), none on failure.
    With ``expected`` each shard is then ordered longest expected answer first
    (:func:`order_longest_first`); without, samples keep their input order.
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
        if expected is not None:
            for k, tmp in enumerate(temps):
                log.info("shard %s: %s", targets[k].name, order_longest_first(tmp, expected).to_json())
        for tmp, target in zip(temps, targets, strict=True):
            os.replace(tmp, target)
        return [b.rows for b in buffers]
    finally:
        for tmp in temps:
            if tmp.exists():
                tmp.unlink()


def shard_audited(
    samples_parquet: str | os.PathLike[str],
    out_paths: Sequence[str | os.PathLike[str]],
    flags_parquet: str | os.PathLike[str],
) -> list[int]:
    """Shard the samples the audit kept (``results/audit/samples.parquet``, already normalized and
    filtered): the dataset is parsed once, by the audit. Each shard is ordered longest expected answer
    first, from the lengths the audit counted (``flags_parquet``: :func:`expected_answer_tokens`)."""
    expected = expected_answer_tokens(flags_parquet)
    return write_shards(read_shard(samples_parquet), frozenset(), out_paths, expected=expected)


def _sample_from_row(row: dict[str, Any]) -> Sample:
    messages = tuple(message_from_row(m) for m in (row["messages"] or ()))
    source = {"file": row["source_file"], "row": row["source_row"], "format": row["source_format"]}
    tools = row.get("tools_json")
    return Sample(
        id=row["id"],
        messages=messages,
        source=source,
        tools=tuple(orjson.loads(tools)) if tools else None,
    )


def read_shard(path: str | os.PathLike[str]) -> Iterator[Sample]:
    """Stream the samples of one shard file, in order."""
    pf = pq.ParquetFile(path)
    for batch in pf.iter_batches(batch_size=ROWS_PER_BATCH):
        for row in batch.to_pylist():
            yield _sample_from_row(row)


def read_shard_spread(path: str | os.PathLike[str], limit: int) -> list[Sample]:
    """Up to ``limit`` samples spread evenly over the shard file (every k-th row, from the first), read
    without building the rest."""
    table = pq.read_table(path)
    stride = max(1, table.num_rows // max(1, limit))
    picks = list(range(0, table.num_rows, stride))[:limit]
    return [_sample_from_row(row) for row in table.take(picks).to_pylist()]


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
    from regen.chat import ChatTemplate  # jinja2's sandbox and tokenizers: the shard job's, not the DAG's

    rows = read_excluded_places(excluded_jsonl)
    developer_role = ChatTemplate.from_dir(tokenizer_dir).developer_role if tokenizer_dir else "system"
    samples = iter_samples(
        input_path, fmt, id_column, on_bad_row, tokenizer_dir, bad_rows=None, developer_role=developer_role
    )
    return write_shards(samples, frozenset(), out_paths, excluded_rows=rows)
