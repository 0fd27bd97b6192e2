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

import bz2
import contextlib
import functools
import gzip
import hashlib
import json
import logging
import lzma
import os
import re
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from regen.chat import compile_template
from regen.runconfig import validated
from regen.types import DEVELOPER_ROLE, FORMATS, BadInputError, BadRow, Message, Sample

log = logging.getLogger(__name__)

FILE_FIELD = "<file>"
ROW_FIELD = "<row>"
ON_BAD_ROW_CHOICES: tuple[str, ...] = ("skip", "stop")
FORMAT_CHOICES: tuple[str, ...] = ("auto", *FORMATS)
SUFFIXES: dict[str, str] = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".pq": "parquet",
}
# a compression suffix after the container suffix (``.jsonl.gz``); the content decides in the end
COMPRESSION_SUFFIXES: dict[str, str] = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".zst": "zstd"}
COMPRESSION_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bz2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
)
TEXT_PART_TYPES = frozenset({"text", "input_text"})
# SGLang flattens text parts this way for templates that take string content
TEXT_PART_SEPARATOR = " "
# the field whose presence identifies each row format, in auto-detection order
FORMAT_FIELDS: tuple[tuple[str, str], ...] = (
    ("messages", "messages"),
    ("conversations", "sharegpt"),
    ("input_ids", "tokenized"),
    ("prompt", "prompt"),
)
SHAREGPT_ROLES: dict[str, str] = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "tool": "tool",
    "observation": "tool",
    "developer": DEVELOPER_ROLE,
}
JSON_CONTAINER_KEYS: tuple[str, ...] = ("data", "rows")
PARQUET_BATCH_ROWS = 1024
JSON_CHUNK_BYTES = 1 << 20
LABEL_IGNORE = -100
UTF8_BOM = b"\xef\xbb\xbf"


class UnreadableRow(Exception):
    """A row that cannot become a Sample (``field`` and ``problem`` go into its BadRow)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


# --------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------


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


def compression_of(path: str | Path) -> str | None:
    """The compression of ``path`` judged by its first bytes (gzip, bz2, xz, zstd); None if plain."""
    with open(path, "rb") as fh:
        head = fh.read(8)
    return next((kind for magic, kind in COMPRESSION_MAGIC if head.startswith(magic)), None)


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


def row_format(record: dict[str, Any]) -> str | None:
    """The row format a record looks like, from the fields present; None if none fits."""
    for field_name, fmt in FORMAT_FIELDS:
        if field_name in record:
            return fmt
    return None


def detect_format(path: str | Path, max_rows: int = 100) -> str:
    """The row format of the first readable record among the first ``max_rows`` of ``path``."""
    for n, (_row, item) in enumerate(_iter_records(Path(path), None)):
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


# --------------------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------------------


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
    return _iter_samples(p, str(path), fmt, id_column, policy, _LazyDecoder(tokenizer_dir), developer_role)


def _iter_samples(
    p: Path,
    file: str,
    fmt: str,
    id_column: str | None,
    policy: _BadRowPolicy,
    decoder: _LazyDecoder,
    developer_role: str,
) -> Iterator[Sample]:
    for row, item in _iter_records(p, id_column):
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
    decoder: _LazyDecoder | None = None,
    developer_role: str = "system",
) -> Sample:
    """Turn one parsed record into a Sample; raises ``UnreadableRow`` for an unreadable row."""
    if not isinstance(record, dict):
        raise UnreadableRow(ROW_FIELD, f"expected a JSON object, got {_type_name(record)}")
    row_fmt = fmt if fmt != "auto" else row_format(record)
    if row_fmt is None:
        keys = ", ".join(sorted(map(str, record))[:10]) or "none"
        raise UnreadableRow(
            ROW_FIELD,
            f"no messages, conversations, input_ids or prompt field (keys: {keys}); cannot tell the format",
        )
    source: dict[str, Any] = {"file": file, "row": row, "format": row_fmt}
    if row_fmt == "messages":
        messages = _parse_messages(record)
    elif row_fmt == "sharegpt":
        messages = _parse_sharegpt(record)
    elif row_fmt == "prompt":
        messages = _parse_prompt(record)
    else:
        if decoder is None:
            decoder = _LazyDecoder(None)
        messages, stats = decoder.get().decode_record(record)
        source.update(stats)
    if developer_role != DEVELOPER_ROLE and DEVELOPER_ROLE in {m.role for m in messages}:
        messages = tuple(_renamed(m, developer_role) if m.role == DEVELOPER_ROLE else m for m in messages)
        source["developer_as"] = developer_role
    tools = _parse_tools(record.get("tools")) if row_fmt in ("messages", "sharegpt") else None
    if id_column:
        sample_id, source["id_json"] = _row_id(record, id_column)
    else:
        sample_id = content_id(messages, tools)
    return Sample(id=sample_id, messages=messages, source=source, tools=tools)


def _renamed(m: Message, role: str) -> Message:
    return Message(role, m.content, m.reasoning_content, m.tool_calls, m.tool_call_id, m.name)


# --------------------------------------------------------------------------------------
# Row formats
# --------------------------------------------------------------------------------------


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _require(record: dict[str, Any], field_name: str, fmt: str) -> Any:
    if field_name not in record:
        keys = ", ".join(sorted(map(str, record))[:10]) or "none"
        raise UnreadableRow(field_name, f"missing (format {fmt!r} needs it; row has keys: {keys})")
    return record[field_name]


def _check_text(value: Any, field_name: str) -> None:
    if isinstance(value, str) and "\x00" in value:
        raise UnreadableRow(field_name, "contains a NUL character")


def _optional_str(value: Any, field_name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise UnreadableRow(field_name, f"expected a string or null, got {_type_name(value)}")
    _check_text(value, field_name)
    return value


def _message(
    role: Any,
    content: Any,
    reasoning: Any,
    where: str,
    role_key: str,
    content_key: str,
    turn: dict[str, Any] | None = None,
) -> Message:
    if not isinstance(role, str):
        raise UnreadableRow(f"{where}.{role_key}", f"expected a string role, got {_type_name(role)}")
    _check_text(role, f"{where}.{role_key}")
    if isinstance(content, list):
        content = joined_text_parts(content)
    _check_text(content, f"{where}.{content_key}")
    tool_calls = tool_call_id = name = None
    if turn is not None and len(turn) > 2 and not _TOOL_KEYS.isdisjoint(turn):
        tool_calls = _parse_tool_calls(turn.get("tool_calls"), f"{where}.tool_calls")
        tool_call_id = _optional_str(turn.get("tool_call_id"), f"{where}.tool_call_id")
        name = _optional_str(turn.get("name"), f"{where}.name")
    if content is None and tool_calls:  # OpenAI's content: null beside tool calls means no text
        content = ""
    return Message(
        role=role,
        content=content,
        reasoning_content=_optional_str(reasoning, f"{where}.reasoning_content"),
        tool_calls=tool_calls,
        tool_call_id=tool_call_id,
        name=name,
    )


_TOOL_KEYS = frozenset({"tool_calls", "tool_call_id", "name"})


def joined_text_parts(content: Any) -> Any:
    """OpenAI content parts that are all text, joined into one string; any other content as given.

    A list holding other parts (images, audio ...) stays a list, for the audit to exclude with the
    part types named.
    """
    if not isinstance(content, list) or not content:
        return content
    texts: list[str] = []
    for part in content:
        if not (isinstance(part, dict) and part.get("type") in TEXT_PART_TYPES):
            return content
        text = part.get("text")
        if not isinstance(text, str):
            return content
        texts.append(text)
    return TEXT_PART_SEPARATOR.join(texts)


def _parse_tool_calls(value: Any, field_name: str) -> tuple[Any, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(c, dict) for c in value):
        raise UnreadableRow(field_name, f"expected a list of tool-call objects, got {_type_name(value)}")
    for i, call in enumerate(value):
        function = call.get("function", call)
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise UnreadableRow(f"{field_name}[{i}]", "a tool call needs function.name (a string)")
    return tuple(value) if value else None


def _parse_tools(value: Any) -> tuple[Any, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):  # some exports store the tool list as a JSON string
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise UnreadableRow("tools", f"a string that is not a JSON list of tools: {exc}") from None
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise UnreadableRow("tools", f"expected a list of tool objects, got {_type_name(value)}")
    return tuple(value) if value else None


def _turn_list(record: dict[str, Any], field_name: str, fmt: str) -> list[Any]:
    turns = _require(record, field_name, fmt)
    if not isinstance(turns, list):
        raise UnreadableRow(field_name, f"expected a list of turns, got {_type_name(turns)}")
    return turns


def _parse_messages(record: dict[str, Any]) -> tuple[Message, ...]:
    out: list[Message] = []
    for i, turn in enumerate(_turn_list(record, "messages", "messages")):
        where = f"messages[{i}]"
        if not isinstance(turn, dict):
            raise UnreadableRow(where, f"expected an object with role and content, got {_type_name(turn)}")
        if "role" not in turn:
            raise UnreadableRow(f"{where}.role", "missing")
        out.append(
            _message(
                turn["role"],
                turn.get("content"),
                turn.get("reasoning_content"),
                where,
                "role",
                "content",
                turn,
            )
        )
    return tuple(out)


def _parse_sharegpt(record: dict[str, Any]) -> tuple[Message, ...]:
    out: list[Message] = []
    system = record.get("system")
    if system is not None:
        if not isinstance(system, str):
            raise UnreadableRow("system", f"expected a string, got {_type_name(system)}")
        _check_text(system, "system")
    for i, turn in enumerate(_turn_list(record, "conversations", "sharegpt")):
        where = f"conversations[{i}]"
        if not isinstance(turn, dict):
            raise UnreadableRow(where, f"expected an object with from and value, got {_type_name(turn)}")
        if "from" not in turn:
            raise UnreadableRow(f"{where}.from", "missing")
        speaker = turn["from"]
        role = SHAREGPT_ROLES.get(speaker.strip().lower(), speaker) if isinstance(speaker, str) else speaker
        out.append(_message(role, turn.get("value"), turn.get("reasoning_content"), where, "from", "value"))
    if system and not (out and out[0].role == "system"):
        out.insert(0, Message(role="system", content=system))
    return tuple(out)


def _parse_prompt(record: dict[str, Any]) -> tuple[Message, ...]:
    prompt = _require(record, "prompt", "prompt")
    system = _optional_str(record.get("system"), "system")
    head = (Message(role="system", content=system),) if system is not None else ()
    if isinstance(prompt, list) and all(isinstance(t, dict) and "role" in t for t in prompt):
        # a prompt given as a list of chat turns (common in preference datasets)
        return head + _parse_messages({"messages": prompt})
    _check_text(prompt, "prompt")
    return (*head, Message(role="user", content=prompt))


# --------------------------------------------------------------------------------------
# Ids
# --------------------------------------------------------------------------------------


def content_id(messages: Iterable[Message], tools: Iterable[Any] | None = None) -> str:
    """blake2b-128 hex of the canonical JSON of the conversation (independent of key order)."""
    payload: Any = [m.to_json() for m in messages]
    if tools is not None:
        payload = {"messages": payload, "tools": list(tools)}
    canonical = orjson.dumps(payload, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=repr)
    return hashlib.blake2b(canonical, digest_size=16).hexdigest()


def check_id(value: str, field_name: str) -> str:
    """Reject ids that could escape an output directory when used in a file name."""
    if value in (".", "..") or any(ch in value for ch in ("/", "\\", "\x00")):
        raise UnreadableRow(field_name, f"id {value!r} contains '/', '\\\\' or NUL, or is '.'/'..'")
    return value


def _row_id(record: dict[str, Any], id_column: str) -> tuple[str, str]:
    """The row's id as text, and as written (JSON: ``1`` or ``"1"``)."""
    if id_column not in record:
        raise UnreadableRow(id_column, "missing (configured as id_column)")
    raw = record[id_column]
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        raise UnreadableRow(id_column, f"id must be a non-empty string or an integer, got {_type_name(raw)}")
    value = str(raw)
    if not value:
        raise UnreadableRow(id_column, "id is empty")
    as_written = str(raw) if isinstance(raw, int) else orjson.dumps(raw).decode()
    return check_id(value, id_column), as_written


# --------------------------------------------------------------------------------------
# Tokenized rows
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChatMarkers:
    """The strings that frame a turn in the rendered chat: ``{start}{role}{sep}...{end}``."""

    turn_start: str
    role_sep: str
    turn_end: str
    think_open: str | None
    think_close: str | None


CHATML_MARKERS = ChatMarkers("<|im_start|>", "\n", "<|im_end|>", "<think>", "</think>")
_PROBE_USER = "\ue000U"
_PROBE_REASONING = "\ue001R"
_PROBE_CONTENT = "\ue002C"


def markers_from_template(template: str, added_tokens: Iterable[str]) -> ChatMarkers:
    """Find the turn markers by rendering probe conversations through ``template``."""
    tokens = sorted(set(added_tokens), key=len, reverse=True)
    tpl = compile_template(template)
    text = tpl.render(messages=[{"role": "user", "content": _PROBE_USER}], add_generation_prompt=False)
    head, _, tail = text.partition(_PROBE_USER)
    before_role, found_role, role_sep = head.rpartition("user")
    start = next((t for t in tokens if found_role and before_role.endswith(t)), None)
    end = next((t for t in tokens if tail.startswith(t)), None)
    if start is None or end is None or not role_sep:
        raise ValueError(
            "cannot find the turn markers: the chat template does not frame turns with added tokens"
        )
    think_open = think_close = None
    convo = [
        {"role": "user", "content": _PROBE_USER},
        {"role": "assistant", "content": _PROBE_CONTENT, "reasoning_content": _PROBE_REASONING},
    ]
    text = tpl.render(messages=convo, add_generation_prompt=False)
    if _PROBE_REASONING in text:
        before, _, after = text.partition(_PROBE_REASONING)
        opener = before.rpartition(f"assistant{role_sep}")[2].strip()
        closer = after.partition(_PROBE_CONTENT)[0].strip()
        think_open, think_close = opener or None, closer or None
    return ChatMarkers(start, role_sep, end, think_open, think_close)


class TokenizedDecoder:
    """Decodes tokenized rows with one tokenizer directory and splits them into turns."""

    def __init__(self, tokenizer_dir: str | Path) -> None:
        from tokenizers import Tokenizer

        tdir = Path(tokenizer_dir)
        tok_file = tdir / "tokenizer.json"
        if not tok_file.is_file():
            raise FileNotFoundError(f"{tok_file}: tokenizer.json not found (needed to decode tokenized rows)")
        self.tokenizer = Tokenizer.from_file(str(tok_file))
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        cfg_file = tdir / "tokenizer_config.json"
        cfg = json.loads(cfg_file.read_text(encoding="utf-8")) if cfg_file.is_file() else {}
        added = [t.content for t in self.tokenizer.get_added_tokens_decoder().values()]
        template = cfg.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
        self.markers = markers_from_template(template, added) if isinstance(template, str) else CHATML_MARKERS
        pad = cfg.get("pad_token")
        pad = pad.get("content") if isinstance(pad, dict) else pad
        pad_id = self.tokenizer.token_to_id(pad) if isinstance(pad, str) else None
        self.pad_id: int | None = pad_id

    def decode_record(self, record: dict[str, Any]) -> tuple[tuple[Message, ...], dict[str, Any]]:
        ids = _int_list(_require(record, "input_ids", "tokenized"), "input_ids")
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise UnreadableRow(
                "input_ids", f"token id {bad} outside the tokenizer's vocabulary (0..{self.vocab_size - 1})"
            )
        supervised = _supervised_count(record, len(ids))
        kept = [t for t in ids if t != self.pad_id]
        text = self.tokenizer.decode(kept, skip_special_tokens=False)
        messages = split_turns(text, self.markers)
        stats = {"mask_supervised_tokens": supervised, "input_tokens": len(ids)}
        return messages, stats


def _int_list(value: Any, field_name: str) -> list[int]:
    if hasattr(value, "tolist"):  # numpy arrays from some Parquet readers
        value = value.tolist()
    if not isinstance(value, list):
        raise UnreadableRow(field_name, f"expected a list of integers, got {_type_name(value)}")
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int):
            raise UnreadableRow(field_name, f"element {i} is {_type_name(v)}, expected an integer")
    return value


def _supervised_count(record: dict[str, Any], n_ids: int) -> int:
    if "loss_mask" in record:
        mask = _int_list(record["loss_mask"], "loss_mask")
        if len(mask) != n_ids:
            raise UnreadableRow("loss_mask", f"has {len(mask)} entries for {n_ids} input_ids")
        if any(v not in (0, 1) for v in mask):
            raise UnreadableRow("loss_mask", "entries must be 0 or 1")
        return sum(mask)
    if "labels" in record:
        labels = _int_list(record["labels"], "labels")
        if len(labels) != n_ids:
            raise UnreadableRow("labels", f"has {len(labels)} entries for {n_ids} input_ids")
        return sum(1 for v in labels if v != LABEL_IGNORE)
    raise UnreadableRow("loss_mask", "missing: a tokenized row needs loss_mask or labels")


def split_turns(text: str, markers: ChatMarkers) -> tuple[Message, ...]:
    """Split rendered chat text back into turns; an assistant think block becomes reasoning."""
    pieces = text.split(markers.turn_start)
    if len(pieces) < 2:
        raise UnreadableRow("input_ids", f"decoded text has no {markers.turn_start!r} turn marker")
    out: list[Message] = []
    for k, piece in enumerate(pieces[1:]):
        role, sep, rest = piece.partition(markers.role_sep)
        if not sep or not role:
            raise UnreadableRow("input_ids", f"turn {k} has no role line after {markers.turn_start!r}")
        body = rest.partition(markers.turn_end)[0]
        reasoning: str | None = None
        if role == "assistant" and markers.think_open and markers.think_close:
            stripped = body.lstrip("\n")
            if stripped.startswith(markers.think_open) and markers.think_close in stripped:
                inner, _, after = stripped[len(markers.think_open) :].partition(markers.think_close)
                reasoning, body = inner.strip("\n"), after.lstrip("\n")
        out.append(Message(role=role, content=body, reasoning_content=reasoning))
    return tuple(out)


@functools.lru_cache(maxsize=4)
def _decoder_for(tokenizer_dir: str) -> TokenizedDecoder:
    return TokenizedDecoder(tokenizer_dir)


class _LazyDecoder:
    """Loads the tokenizer on the first tokenized row only."""

    def __init__(self, tokenizer_dir: str | Path | None) -> None:
        self.tokenizer_dir = tokenizer_dir

    def get(self) -> TokenizedDecoder:
        if self.tokenizer_dir is None:
            raise ValueError("the dataset has tokenized rows (input_ids); set tokenizer_dir to decode them")
        return _decoder_for(str(Path(self.tokenizer_dir).resolve()))


# --------------------------------------------------------------------------------------
# Record readers: yield (row, dict | BadRow)
# --------------------------------------------------------------------------------------


def _iter_records(path: Path, id_column: str | None) -> Iterator[tuple[int, Any]]:
    kind = file_kind(path)
    if kind == "parquet":
        yield from _iter_parquet(path)
    elif kind == "json":
        yield from _iter_json(path, id_column)
    else:
        yield from _iter_jsonl(path, id_column)


def _empty(path: Path) -> tuple[int, BadRow]:
    return 0, BadRow(str(path), 0, FILE_FIELD, "file is empty")


@dataclass(slots=True)
class _Input:
    """An open dataset file: ``stream`` yields its (decompressed) bytes, ``raw`` is the file itself."""

    stream: IO[bytes]
    raw: IO[bytes]
    compression: str | None
    size: int
    read_bytes: int = 0  # bytes taken from ``stream`` so far

    def unread_problem(self, exc: BaseException, rows_read: int) -> str:
        """How much of the file could not be read, for the unread-tail BadRow."""
        what = f"{type(exc).__name__}: {exc}"
        if self.compression is None:
            unread = max(0, self.size - self.read_bytes)
            return (
                f"file unreadable after {self.read_bytes:,} of {self.size:,} bytes ({unread:,} bytes, "
                f"every row after row {rows_read - 1}, unread): {what}"
            )
        with contextlib.suppress(OSError, ValueError):
            consumed = self.raw.tell()
            if consumed < self.size:
                return (
                    f"{self.compression} data unreadable after {consumed:,} of {self.size:,} compressed "
                    f"bytes ({self.size - consumed:,} unread; {self.read_bytes:,} bytes decompressed, rows 0-"
                    f"{rows_read - 1}): {what}"
                )
        return (
            f"the {self.compression} stream is cut off: all {self.size:,} compressed bytes gave only "
            f"{self.read_bytes:,} bytes (rows 0-{rows_read - 1}) before it ended early; the rest of the "
            f"original file is missing, its size unknown: {what}"
        )


@contextlib.contextmanager
def _open_input(path: Path) -> Iterator[_Input]:
    """Open ``path``, decompressing by content (gzip, bz2, xz, zstd) whatever its name says."""
    compression = compression_of(path)
    with open(path, "rb") as raw:
        size = os.fstat(raw.fileno()).st_size
        if compression is None:
            yield _Input(raw, raw, None, size)
            return
        with _decompressing(raw, compression) as stream:
            yield _Input(stream, raw, compression, size)


def _decompressing(raw: IO[bytes], compression: str) -> IO[bytes]:
    if compression == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if compression == "bz2":
        return bz2.BZ2File(raw, mode="rb")
    if compression == "xz":
        return lzma.LZMAFile(raw, mode="rb")
    import pyarrow as pa

    return pa.CompressedInputStream(pa.PythonFile(raw, mode="r"), "zstd")  # type: ignore[return-value]


# what a failing decompressor or disk raises part-way through a file
_STREAM_ERRORS: tuple[type[BaseException], ...] = (OSError, EOFError, ValueError, lzma.LZMAError, zlib.error)


_LINE_END = frozenset(b"\r\n")


def _blank(piece: bytes | memoryview) -> bool:
    """True for an empty or all-whitespace line (copies only a line that starts with whitespace)."""
    return not piece or (bytes(piece[:1]).isspace() and not bytes(piece).strip())


def _parse_json_bytes(raw: bytes | memoryview, file: str, row: int, id_column: str | None = None) -> Any:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        try:
            bytes(raw).decode("utf-8")
        except UnicodeDecodeError as uexc:
            return BadRow(file, row, ROW_FIELD, f"invalid UTF-8 at byte {uexc.start}")
        return BadRow(file, row, ROW_FIELD, f"malformed JSON: {exc}")
    if id_column and isinstance(value, dict) and isinstance(value.get(id_column), float):
        # orjson reads integers wider than 64 bits as floats; the standard parser keeps every digit
        exact = json.loads(bytes(raw))
        if isinstance(exact, dict):
            value[id_column] = exact.get(id_column)
    return value


def _split_cr(body: bytes) -> list[bytes]:
    """One physical line that still holds CRs: old-Mac line ends (split) or CR as JSON whitespace (kept)."""
    try:
        orjson.loads(body)
        return [body]
    except orjson.JSONDecodeError:
        return body.split(b"\r")


def _first_byte(path: Path) -> int | None:
    """The first non-whitespace byte of the (decompressed) file, None when there is none."""
    with _open_input(path) as src:
        while chunk := src.stream.read(1 << 16):
            stripped = chunk.lstrip(UTF8_BOM).lstrip() if chunk.startswith(UTF8_BOM) else chunk.lstrip()
            if stripped:
                return stripped[0]
    return None


def _iter_jsonl(path: Path, id_column: str | None) -> Iterator[tuple[int, Any]]:
    file = str(path)
    try:
        first = _first_byte(path)
    except _STREAM_ERRORS:
        first = None  # the line reader below reports it with the amounts
    if first == ord("["):
        log.warning("%s: holds one JSON array, not JSON Lines: reading it as a JSON array", file)
        yield from _iter_json(path, id_column, note=" (the .jsonl file holds a JSON array)")
        return
    seen_any = False
    row = -1
    with _open_input(path) as src:
        try:
            for line in src.stream:
                src.read_bytes += len(line)
                if row < 0 and line.startswith(UTF8_BOM):
                    line = line[len(UTF8_BOM) :]
                end = len(line)
                while end and line[end - 1] in _LINE_END:
                    end -= 1
                if line.find(b"\r", 0, end) >= 0:
                    pieces: Iterable[bytes | memoryview] = _split_cr(line[:end])
                else:  # a view, not a copy: one huge line is held once
                    pieces = (memoryview(line)[:end],)
                for piece in pieces:
                    row += 1
                    if _blank(piece):
                        continue
                    seen_any = True
                    yield row, _parse_json_bytes(piece, file, row, id_column)
        except _STREAM_ERRORS as exc:  # a truncated compressed stream, an I/O error
            problem = src.unread_problem(exc, row + 1)
            yield row + 1, BadRow(file, row + 1, FILE_FIELD, problem, unread_tail=True)
            return
    if not seen_any:
        yield _empty(path)


def _iter_parquet(path: Path) -> Iterator[tuple[int, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    file = str(path)
    if path.stat().st_size == 0:
        yield _empty(path)
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


class _ScanError(Exception):
    """The JSON structure is broken: no further record can be found. ``row`` is the first lost one."""

    def __init__(self, problem: str, row: int = 0) -> None:
        super().__init__(problem)
        self.problem = problem
        self.row = row


# a whole string, a string cut off by the end of the buffer, or a bracket
_JSON_TOKEN = re.compile(
    rb'(?P<string>"[^"\\]*(?:\\.[^"\\]*)*")|(?P<open_string>"[^"\\]*(?:\\.[^"\\]*)*\\?\Z)|[\[\]{}]', re.S
)
_SCALAR_END = re.compile(rb"[,\]}\s]")
_WHITESPACE = frozenset(b" \t\r\n")


class _JsonScanner:
    """Reads a JSON document piecewise: whole values as raw bytes, one at a time."""

    def __init__(self, fh: IO[bytes], chunk_bytes: int | None = None) -> None:
        self._fh = fh
        self._chunk = chunk_bytes or JSON_CHUNK_BYTES
        self._buf = b""
        self.pos = 0
        self._eof = False
        self.consumed = 0  # bytes read from the file so far

    def _more(self, keep_from: int) -> int:
        """Read another chunk, dropping bytes before ``keep_from``; return how far positions moved."""
        if self._eof:
            return -1
        data = self._fh.read(self._chunk)
        self.consumed += len(data)
        if not data:
            self._eof = True
            return -1
        self._buf = self._buf[keep_from:] + data
        self.pos -= keep_from
        return keep_from

    def peek(self) -> int | None:
        """The next non-whitespace byte (not consumed), or None at the end of the file."""
        while True:
            buf, n = self._buf, len(self._buf)
            while self.pos < n and buf[self.pos] in _WHITESPACE:
                self.pos += 1
            if self.pos < n:
                return buf[self.pos]
            if self._more(self.pos) < 0:
                return None

    def skip_bom(self) -> None:
        """Skip a UTF-8 byte-order mark at the start of the file."""
        while len(self._buf) - self.pos < len(UTF8_BOM) and self._more(self.pos) >= 0:
            pass
        if self._buf.startswith(UTF8_BOM, self.pos):
            self.pos += len(UTF8_BOM)

    def take(self) -> None:
        self.pos += 1

    def value(self) -> bytes:
        """Consume one JSON value (after optional whitespace) and return its raw bytes.

        Only the structure is scanned (brackets, and strings as whole tokens); the caller
        parses the bytes, so a malformed record still has a known extent and the next one
        is found.
        """
        first = self.peek()
        if first is None:
            raise _ScanError("file ends where a value was expected")
        if first in b",]}:":
            raise _ScanError(f"expected a value, found {chr(first)!r}")
        start = self.pos
        end = self._scalar_end(start) if first not in b'[{"' else self._container_end(start)
        start = self.pos  # _more() may have moved the buffer under us
        self.pos = end
        return self._buf[start:end]

    def _scalar_end(self, start: int) -> int:
        while True:
            m = _SCALAR_END.search(self._buf, start)
            if m is not None:
                return m.start()
            if self._more(start) < 0:
                return len(self._buf)
            start = self.pos

    def _container_end(self, start: int) -> int:
        """End of the string, array or object starting at ``start`` (== self.pos)."""
        i, depth = start, 0
        while True:
            resume = len(self._buf)
            for m in _JSON_TOKEN.finditer(self._buf, i):
                kind = m.lastgroup
                if kind == "string":
                    if depth == 0:
                        return m.end()
                elif kind == "open_string":
                    resume = m.start()
                    break
                elif self._buf[m.start()] in b"[{":
                    depth += 1
                else:
                    depth -= 1
                    if depth == 0:
                        return m.end()
            shift = self._more(start)
            if shift < 0:
                raise _ScanError(
                    "file ends inside a string" if resume < len(self._buf) else "file ends inside a record"
                )
            start, i = start - shift, resume - shift


def _iter_json(path: Path, id_column: str | None = None, note: str = "") -> Iterator[tuple[int, Any]]:
    file = str(path)
    with _open_input(path) as src:
        scanner = _JsonScanner(src.stream)
        rows = _RowCounter()
        try:
            scanner.skip_bom()
            first = scanner.peek()
            if first is None:
                yield _empty(path)
                return
            if first == ord("["):
                scanner.take()
                for row, raw in _iter_array(scanner):
                    rows.next = row + 1
                    yield row, _parse_json_bytes(raw, file, row, id_column)
                if scanner.peek() is not None:
                    raise _ScanError("more data after the array's closing ']'", rows.next)
                return
            if first != ord("{"):
                raise _ScanError(f"expected a JSON array or object, found {chr(first)!r}")
            for row, item in _iter_json_object(scanner, file, id_column):
                rows.next = row + 1
                yield row, item
        except _ScanError as exc:
            problem = f"{exc.problem}{note} (the records from here on are lost)"
            yield exc.row, BadRow(file, exc.row, FILE_FIELD, problem, unread_tail=True)
        except _STREAM_ERRORS as exc:
            src.read_bytes = scanner.consumed
            problem = src.unread_problem(exc, rows.next) + note
            yield rows.next, BadRow(file, rows.next, FILE_FIELD, problem, unread_tail=True)


@dataclass(slots=True)
class _RowCounter:
    next: int = 0


def _iter_array(scanner: _JsonScanner) -> Iterator[tuple[int, bytes]]:
    """Yield (index, raw value) for the elements of an array whose '[' was just consumed."""
    row = 0
    if scanner.peek() == ord("]"):
        scanner.take()
        return
    while True:
        try:
            raw = scanner.value()
        except _ScanError as exc:
            raise _ScanError(exc.problem, row) from None
        yield row, raw
        row += 1
        nxt = scanner.peek()
        if nxt == ord(","):
            scanner.take()
        elif nxt == ord("]"):
            scanner.take()
            return
        elif nxt is None:
            raise _ScanError(f"file ends after row {row - 1} without the closing ']'", row)
        else:
            raise _ScanError(f"expected ',' or ']' after row {row - 1}, found {chr(nxt)!r}", row)


def _iter_json_object(
    scanner: _JsonScanner, file: str, id_column: str | None = None
) -> Iterator[tuple[int, Any]]:
    """A top-level object: stream its data/rows list; a lone row object is one record."""
    scanner.take()  # '{'
    skipped: dict[str, Any] = {}
    while True:
        nxt = scanner.peek()
        if nxt == ord("}"):
            scanner.take()
            break
        key = orjson.loads(scanner.value())
        if not isinstance(key, str) or scanner.peek() != ord(":"):
            raise _ScanError("malformed top-level object")
        scanner.take()
        if key in JSON_CONTAINER_KEYS and scanner.peek() == ord("["):
            scanner.take()
            for row, raw in _iter_array(scanner):
                yield row, _parse_json_bytes(raw, file, row, id_column)
            return
        raw_value = scanner.value()
        skipped[key] = _parse_json_bytes(raw_value, file, 0)
        nxt = scanner.peek()
        if nxt == ord(","):
            scanner.take()
        elif nxt != ord("}"):
            raise _ScanError("malformed top-level object")
    if scanner.peek() == ord("{"):
        raise _ScanError("several top-level objects: this looks like JSON Lines; name the file .jsonl")
    if row_format(skipped) is not None:
        yield 0, skipped  # a single record stored as a .json object
        return
    raise _ScanError(f"top-level object has no {' or '.join(JSON_CONTAINER_KEYS)} list of records")
