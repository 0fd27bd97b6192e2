"""Streaming ingest of chat datasets into :class:`regen.types.Sample`.

Files: ``.jsonl``, ``.json`` (an array, or an object with a ``data``/``rows`` list) and
``.parquet``. JSON and JSON Lines may be compressed (gzip, bz2, xz, zstd): recognised by content
as well as by name (``.jsonl.gz``, ``.json.gz``, ``.jsonl.zst`` ...). JSON Lines may end lines
with LF, CRLF or CR alone; a ``.jsonl`` file that holds one JSON array is read as that array.

Row formats, detected per row unless one is configured:

* ``messages``: OpenAI ``{"messages": [{"role", "content", "reasoning_content"?, "tool_calls"?,
  "tool_call_id"?, "name"?}], "tools"?}``. Content given as a list of text parts
  (``[{"type": "text", "text": ...}]``) is joined with spaces, as SGLang does for string-content
  templates; a list with other parts (images ...) is kept as read for the audit to exclude.
  The ``developer`` role becomes what the target chat template renders (``system`` unless the
  template knows ``developer``).
* ``sharegpt``: ``{"conversations": [{"from", "value"}], "system"?}``
* ``prompt``: ``{"prompt": str, "system"?: str}`` → one user turn
* ``tokenized``: ``{"input_ids", "loss_mask" | "labels"}`` decoded with the tokenizer and split
  back into turns on the chat template's role markers.

Two kinds of trouble are kept apart. An *unreadable row* cannot become a Sample at all
(malformed JSON, a ``messages`` that is not a list, a role that is not a string, a bad id):
it becomes a :class:`BadRow` naming file, row and field, and ``on_bad_row`` decides
(``skip``: record it in ``bad_rows`` and go on; ``stop``: raise :class:`BadInputError`).
A *structure fault* (unknown role, empty or non-text content, no user turn, odd role order)
is kept in the Sample exactly as read, for the audit to flag. A file that becomes unreadable
part-way (a truncated compressed stream, an I/O error, broken JSON structure, a damaged Parquet
row group) gives one BadRow with ``unread_tail`` set whose problem says how much was unread:
those rows are lost input, and the audit fails the run on it by default.

Ids (``id_column``) may be strings or integers of any size; ``source["id_json"]`` keeps the id
as written (``1`` vs ``"1"``), while ``Sample.id`` is its text.

Memory stays flat in the dataset size: JSONL is read line by line, Parquet by record
batches, and a JSON array by an incremental scanner that holds one record at a time. The one
exception: a JSON object whose first key is not ``data``/``rows`` is read whole before its
``data``/``rows`` list is found.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regen.ingest.readers import check_dataset_path, iter_records
from regen.ingest.rows import (
    ROW_FIELD,
    UnreadableRow,
    content_id,
    parse_messages,
    parse_prompt,
    parse_sharegpt,
    parse_tools,
    renamed,
    row_format,
    row_id,
    type_name,
)
from regen.ingest.tokenized import LazyDecoder
from regen.runconfig import validated
from regen.types import DEVELOPER_ROLE, FORMATS, BadInputError, BadRow, Sample

ON_BAD_ROW_CHOICES: tuple[str, ...] = ("skip", "stop")


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
    for n, (_row, item) in enumerate(iter_records(Path(path), None)):
        if n >= max_rows:
            break
        if isinstance(item, dict):
            fmt = row_format(item)
            if fmt is not None:
                return fmt
    raise ValueError(
        f"{path}: no record among the first {max_rows} has a messages, conversations, input_ids "
        "or prompt field; cannot detect the dataset format"
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
) -> Iterator[Sample]:
    """Stream the samples of one dataset file; unreadable rows go to ``bad_rows`` or raise.

    ``fmt``, ``id_column`` and ``on_bad_row`` are the ``dataset`` section's (:class:`DatasetConfig`;
    no default here: the schema is their one home). Arguments, the file's existence and its extension
    are checked at the call, before iteration starts. With ``on_bad_row="skip"`` each unreadable row
    is appended to ``bad_rows`` (when given) and skipped; with ``"stop"`` the first one raises
    :class:`BadInputError`. Samples come in file order; ``Sample.source`` holds file, row
    and format (tokenized rows add ``mask_supervised_tokens`` and ``input_tokens``).
    ``developer_role`` is the role ``developer`` turns become (``ChatTemplate.developer_role``).
    """
    check_format(fmt)
    policy = _BadRowPolicy(check_on_bad_row(on_bad_row), bad_rows)
    p = check_dataset_path(path)
    return _iter_samples(p, str(path), fmt, id_column, policy, LazyDecoder(tokenizer_dir), developer_role)


def _iter_samples(
    p: Path,
    file: str,
    fmt: str,
    id_column: str | None,
    policy: _BadRowPolicy,
    decoder: LazyDecoder,
    developer_role: str,
) -> Iterator[Sample]:
    for row, item in iter_records(p, id_column):
        if isinstance(item, BadRow):
            policy.handle(item)
            continue
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
            f"no messages, conversations, input_ids or prompt field (keys: {keys}); cannot tell the format",
        )
    source: dict[str, Any] = {"file": file, "row": row, "format": row_fmt}
    if row_fmt == "messages":
        messages = parse_messages(record)
    elif row_fmt == "sharegpt":
        messages = parse_sharegpt(record)
    elif row_fmt == "prompt":
        messages = parse_prompt(record)
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
