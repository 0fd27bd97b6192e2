"""Streaming ingest of chat datasets into :class:`regen.types.Sample`.

Files: ``.jsonl``, ``.json`` (an array, or an object with a ``data``/``rows`` list), ``.parquet``,
``.csv``/``.tsv`` (a header row; every cell text, ``messages``/``conversations`` cells decoded from JSON)
and ``.arrow`` (Arrow IPC). A folder is read too, with no conversion step (``regen.ingest.readers``): a
``datasets`` ``save_to_disk`` folder (its ``data-*.arrow`` streams in ``state.json``'s order; of a saved
``DatasetDict``, the ``train`` split), or a folder of shards of one kind as the Hub stores them
(``train-00000-of-00003.parquet``, directly in it or under ``data/``; the ``train`` split where the names
carry several). Rows count from 0 in each file, and a bad row names its shard.

JSON and JSON Lines may be compressed (gzip, bz2, xz, zstd): recognised by content
as well as by name (``.jsonl.gz``, ``.json.gz``, ``.jsonl.zst`` ...). JSON Lines may end lines
with LF, CRLF or CR alone; a ``.jsonl`` file that holds one JSON array is read as that array.

Row formats, detected per row unless one is configured:

* ``messages``: OpenAI ``{"messages": [{"role", "content", "reasoning_content"?, "tool_calls"?,
  "tool_call_id"?, "name"?}], "tools"?}``. Content given as a list of text parts
  (``[{"type": "text", "text": ...}]``) is joined with spaces, as SGLang does for string-content
  templates; a list with other parts (images ...) is kept as read for the audit to exclude.
  The ``developer`` role becomes what the target chat template renders (``system`` unless the
  template knows ``developer``).
* ``sharegpt``: ``{"conversations": [{"from", "value"}], "system"?, "tools"?}``; speakers as LLaMA-Factory
  and Axolotl spell them, ``function_call`` turns as tool calls (``regen.ingest.sharegpt``)
* ``prompt``: ``{"prompt": str, "system"?: str}`` → one user turn
* ``alpaca``: ``{"instruction", "input"?, "output"?, "system"?, "history"?}`` (Alpaca, and LLaMA-Factory's
  alpaca with ``history`` as ``[user, assistant]`` pairs) → turns as LLaMA-Factory builds them
  (``regen.ingest.alpaca``)
* ``tokenized``: ``{"input_ids", "loss_mask" | "labels"}`` decoded with the tokenizer and split
  back into turns on the chat template's role markers.

Two kinds of trouble are kept apart. An *unreadable row* cannot become a Sample at all
(malformed JSON, a ``messages`` that is not a list, a role that is not a string, a bad id):
it becomes a :class:`BadRow` naming file, row and field, and ``on_bad_row`` decides
(``skip``: record it in ``bad_rows`` and go on; ``stop``: raise :class:`BadInputError`).
A *structure fault* (unknown role, empty or non-text content, no user turn, odd role order)
is kept in the Sample exactly as read, for the audit to flag. A file that becomes unreadable
part-way (a truncated compressed stream, an I/O error, broken JSON structure, a JSON Lines file whose
last line has no line end and is not complete JSON, a damaged Parquet row group) gives one BadRow with
``unread_tail`` set whose problem says how much was unread: those rows are lost input, and the audit
fails the run on it by default.

Ids: ``id_column`` names the field holding each row's id; ``null`` takes a hash of the content, and an
``id`` field the rows carry then is counted (``IdAccount``) so the audit says it was not used. Ids may
be strings or integers of any size; ``source["id_json"]`` keeps the id
as written (``1`` vs ``"1"``), while ``Sample.id`` is its text.

Memory stays flat in the dataset size: JSONL is read line by line, Parquet by record
batches, and a JSON array by an incremental scanner that holds one record at a time. The one
exception: a JSON object whose first key is not ``data``/``rows`` is read whole before its
``data``/``rows`` list is found.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from regen.ingest.alpaca import parse_alpaca
from regen.ingest.readers import check_dataset_path, iter_dataset_records
from regen.ingest.rows import (
    ROW_FIELD,
    UnreadableRow,
    content_id,
    parse_messages,
    parse_prompt,
    parse_tools,
    renamed,
    row_format,
    row_id,
    type_name,
)
from regen.ingest.sharegpt import has_spelled_roles, parse_sharegpt, spelled_turns
from regen.ingest.tokenized import LazyDecoder
from regen.runconfig import validated
from regen.types import DEVELOPER_ROLE, FORMATS, BadInputError, BadRow, Sample

log = logging.getLogger(__name__)

ON_BAD_ROW_CHOICES: tuple[str, ...] = ("skip", "stop")


#: fields that commonly hold a row's id (``IdAccount`` names one that is left unused)
ID_FIELDS: tuple[str, ...] = ("id", "uuid", "conversation_id", "sample_id")
FORMAT_CHOICES: tuple[str, ...] = ("auto", *FORMATS)


def check_format(fmt: str) -> str:
    """Return ``fmt`` if it is a known format (or ``auto``); raise a clear ValueError if not."""
    if fmt not in FORMAT_CHOICES:
        raise ValueError(f"unknown dataset format {fmt!r}; expected one of: {', '.join(FORMAT_CHOICES)}")
    return fmt


def check_on_bad_row(policy: str) -> str:
    if policy not in ON_BAD_ROW_CHOICES:
        raise ValueError(
            f"unknown on_bad_row policy {policy!r}; expected one of: {', '.join(ON_BAD_ROW_CHOICES)}"
        )
    return policy


@dataclass(frozen=True, slots=True)
class DatasetConfig:
    """The ``dataset`` config section (built by :meth:`from_dict`: the schema's defaults filled in and its
    rules applied)."""

    #: local path or s3:// URI as configured (a job reads the local copy Snakemake gives it)
    path: str
    format: str
    id_column: str | None
    on_bad_row: str

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> DatasetConfig:
        """Validate ``raw`` against the schema's ``dataset`` section, fill its defaults, and type it."""
        d = validated("dataset", raw)
        return cls(
            path=str(d["path"]),
            format=str(d["format"]),
            id_column=d["id_column"],
            on_bad_row=str(d["on_bad_row"]),
        )


def detect_format(path: str | Path, max_rows: int = 100) -> str:
    """The row format of the first readable record among the first ``max_rows`` of ``path``."""
    records = iter_dataset_records(check_dataset_path(path), None, str(path))
    for n, (_file, _row, item) in enumerate(records):
        if n >= max_rows:
            break
        if isinstance(item, dict):
            fmt = row_format(item)
            if fmt is not None:
                return fmt
    raise ValueError(
        f"{path}: no record among the first {max_rows} has a messages, conversations, input_ids, "
        "prompt or instruction field; cannot detect the dataset format"
    )


@dataclass(slots=True)
class _BadRowPolicy:
    on_bad_row: str
    sink: list[BadRow] | None

    def handle(self, bad: BadRow) -> None:
        if self.on_bad_row == "stop":
            raise BadInputError(bad)
        if self.sink is not None:
            self.sink.append(bad)


def iter_samples(
    path: str | Path,
    fmt: str,
    id_column: str | None,
    on_bad_row: str,
    tokenizer_dir: str | Path | None = None,
    bad_rows: list[BadRow] | None = None,
    developer_role: str = "system",
    ids: IdAccount | None = None,
    max_rows: int | None = None,
) -> Iterator[Sample]:
    """Stream the samples of one dataset (a file, or a folder of shards: ``regen.ingest.readers``);
    unreadable rows go to ``bad_rows`` or raise.

    ``fmt``, ``id_column`` and ``on_bad_row`` are the ``dataset`` section's (:class:`DatasetConfig`;
    no default here: the schema is their one home). Arguments, the file's existence and its extension
    are checked at the call, before iteration starts. With ``on_bad_row="skip"`` each unreadable row
    is appended to ``bad_rows`` (when given) and skipped; with ``"stop"`` the first one raises
    :class:`BadInputError`. Samples come in file order; ``Sample.source`` holds file, row
    and format (tokenized rows add ``mask_supervised_tokens`` and ``input_tokens``).
    ``developer_role`` is the role ``developer`` turns become (``ChatTemplate.developer_role``);
    ``ids`` (when given) counts an id field the rows carry that ``id_column: null`` leaves unused.
    ``max_rows`` (when given) stops after that many rows, readable or not (a first look at the dataset).
    """
    check_format(fmt)
    policy = _BadRowPolicy(check_on_bad_row(on_bad_row), bad_rows)
    files = check_dataset_path(path)
    if files.note:
        log.info("%s: reading the %s", path, files.note)
    decoder = LazyDecoder(tokenizer_dir)
    records = iter_dataset_records(files, id_column, str(path))
    if max_rows is not None:
        records = islice(records, max_rows)
    return _iter_samples(records, fmt, id_column, policy, decoder, developer_role, ids)


def _iter_samples(
    records: Iterator[tuple[str, int, Any]],
    fmt: str,
    id_column: str | None,
    policy: _BadRowPolicy,
    decoder: LazyDecoder,
    developer_role: str,
    ids: IdAccount | None,
) -> Iterator[Sample]:
    for file, row, item in records:
        if isinstance(item, BadRow):
            policy.handle(item)
            continue
        if ids is not None:
            ids.note(item)
        try:
            sample = record_to_sample(
                item,
                file=file,
                row=row,
                fmt=fmt,
                id_column=id_column,
                decoder=decoder,
                developer_role=developer_role,
            )
        except UnreadableRow as exc:
            policy.handle(BadRow(file, row, exc.field, exc.problem))
            continue
        yield sample


@dataclass(slots=True)
class IdAccount:
    """Which id the samples got, and an id field the dataset carries that was not used.

    The rule: ``dataset.id_column`` names the field that holds each row's id; with ``null`` the id is a
    hash of the content (:func:`regen.ingest.rows.content_id`), whatever fields the rows carry. So that a
    dataset's own ids are never dropped without a word, rows that carry one of ``ID_FIELDS`` while
    ``id_column`` is null are counted here, and the audit's summary and console say so
    (:meth:`in_words`)."""

    id_column: str | None
    #: the unused id field found, the rows that carry it, and the first row's value
    field: str | None = None
    rows_with_field: int = 0
    example: str | None = None

    def note(self, record: Any) -> None:
        if self.id_column is not None or not isinstance(record, dict):
            return
        name = self.field or next((f for f in ID_FIELDS if f in record), None)
        if name is None or record.get(name) in (None, ""):
            return
        self.field = name
        self.rows_with_field += 1
        if self.example is None:
            self.example = str(record[name])

    def in_words(self) -> str:
        if self.id_column is not None:
            return f"ids: the {self.id_column!r} field (dataset.id_column)"
        if self.field is None:
            return "ids: a hash of each row's content (dataset.id_column: null; no row has an id field)"
        n = self.rows_with_field
        carriers = "1 row carries" if n == 1 else f"{n:,} rows carry"
        return (
            f"ids: a hash of each row's content, not the {self.field!r} field that {carriers} "
            f"(e.g. {self.example!r}), because dataset.id_column is null; set dataset.id_column: "
            f"{self.field} to keep the dataset's own ids"
        )

    def to_json(self) -> dict[str, Any]:
        source = "content_hash" if self.id_column is None else "field"
        out: dict[str, Any] = {"source": source, "id_column": self.id_column, "in_words": self.in_words()}
        if self.field is not None:
            out.update(
                unused_field=self.field, rows_with_unused_field=self.rows_with_field, example=self.example
            )
        return out


def record_to_sample(
    record: Any,
    *,
    file: str,
    row: int,
    fmt: str,
    id_column: str | None,
    decoder: LazyDecoder | None = None,
    developer_role: str = "system",
) -> Sample:
    """Turn one parsed record into a Sample; raises ``UnreadableRow`` for an unreadable row."""
    if not isinstance(record, dict):
        raise UnreadableRow(ROW_FIELD, f"expected a JSON object, got {type_name(record)}")
    row_fmt = fmt if fmt != "auto" else row_format(record)
    if row_fmt is None:
        keys = ", ".join(sorted(map(str, record))[:10]) or "none"
        raise UnreadableRow(
            ROW_FIELD,
            f"no messages, conversations, input_ids, prompt or instruction field (keys: {keys}); "
            "cannot tell the format",
        )
    source: dict[str, Any] = {"file": file, "row": row, "format": row_fmt}
    if row_fmt == "messages" and has_spelled_roles(record.get("messages")):
        messages = tuple(spelled_turns(record["messages"], "messages", "role", "content"))
    elif row_fmt == "messages":
        messages = parse_messages(record)
    elif row_fmt == "sharegpt":
        messages = parse_sharegpt(record)
    elif row_fmt == "prompt":
        messages = parse_prompt(record)
    elif row_fmt == "alpaca":
        messages = parse_alpaca(record)
    else:
        if decoder is None:
            decoder = LazyDecoder(None)
        messages, stats = decoder.get().decode_record(record)
        source.update(stats)
    if developer_role != DEVELOPER_ROLE and DEVELOPER_ROLE in {m.role for m in messages}:
        messages = tuple(renamed(m, developer_role) if m.role == DEVELOPER_ROLE else m for m in messages)
        source["developer_as"] = developer_role
    tools = parse_tools(record.get("tools")) if row_fmt in ("messages", "sharegpt") else None
    if id_column:
        sample_id, source["id_json"] = row_id(record, id_column)
    else:
        sample_id = content_id(messages, tools)
    return Sample(id=sample_id, messages=messages, source=source, tools=tools)
