"""Row adapters: one parsed record (OpenAI messages, prompt; ShareGPT: ``regen.ingest.sharegpt``) into
the conversation's turns, and the row's id. An unreadable row raises :class:`UnreadableRow` naming
its field."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import orjson

from regen.types import Message

ROW_FIELD = "<row>"


TEXT_PART_TYPES = frozenset({"text", "input_text"})


# SGLang flattens text parts this way for templates that take string content
TEXT_PART_SEPARATOR = " "


# the field whose presence identifies each row format, in auto-detection order
FORMAT_FIELDS: tuple[tuple[str, str], ...] = (
    ("messages", "messages"),
    ("conversations", "sharegpt"),
    ("input_ids", "tokenized"),
    ("prompt", "prompt"),
    ("instruction", "alpaca"),
)


class UnreadableRow(Exception):
    """A row that cannot become a Sample (``field`` and ``problem`` go into its BadRow)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def row_format(record: dict[str, Any]) -> str | None:
    """The row format a record looks like, from the fields present; None if none fits."""
    for field_name, fmt in FORMAT_FIELDS:
        if field_name in record:
            return fmt
    return None


def renamed(m: Message, role: str) -> Message:
    return Message(role, m.content, m.reasoning_content, m.tool_calls, m.tool_call_id, m.name)


def type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def require(record: dict[str, Any], field_name: str, fmt: str) -> Any:
    if field_name not in record:
        keys = ", ".join(sorted(map(str, record))[:10]) or "none"
        looks = row_format(record)
        hint = f"; the row looks like {looks!r}: set dataset.format: auto or {looks}" if looks else ""
        raise UnreadableRow(field_name, f"missing (format {fmt!r} needs it; row has keys: {keys}){hint}")
    return record[field_name]


def check_text(value: Any, field_name: str) -> None:
    if isinstance(value, str) and "\x00" in value:
        raise UnreadableRow(field_name, "contains a NUL character")


def optional_str(value: Any, field_name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise UnreadableRow(field_name, f"expected a string or null, got {type_name(value)}")
    check_text(value, field_name)
    return value


def make_message(
    role: Any,
    content: Any,
    reasoning: Any,
    where: str,
    role_key: str,
    content_key: str,
    turn: dict[str, Any] | None = None,
) -> Message:
    if not isinstance(role, str):
        raise UnreadableRow(f"{where}.{role_key}", f"expected a string role, got {type_name(role)}")
    check_text(role, f"{where}.{role_key}")
    if isinstance(content, list):
        content = joined_text_parts(content)
    check_text(content, f"{where}.{content_key}")
    tool_calls = tool_call_id = name = None
    if turn is not None and len(turn) > 2 and not _TOOL_KEYS.isdisjoint(turn):
        tool_calls = _parse_tool_calls(turn.get("tool_calls"), f"{where}.tool_calls")
        tool_call_id = optional_str(turn.get("tool_call_id"), f"{where}.tool_call_id")
        name = optional_str(turn.get("name"), f"{where}.name")
    if content is None and tool_calls:  # OpenAI's content: null beside tool calls means no text
        content = ""
    return Message(
        role=role,
        content=content,
        reasoning_content=optional_str(reasoning, f"{where}.reasoning_content"),
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
        raise UnreadableRow(field_name, f"expected a list of tool-call objects, got {type_name(value)}")
    for i, call in enumerate(value):
        function = call.get("function", call)
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise UnreadableRow(f"{field_name}[{i}]", "a tool call needs function.name (a string)")
    return tuple(value) if value else None


def parse_tools(value: Any) -> tuple[Any, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):  # some exports store the tool list as a JSON string
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise UnreadableRow("tools", f"a string that is not a JSON list of tools: {exc}") from None
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise UnreadableRow("tools", f"expected a list of tool objects, got {type_name(value)}")
    return tuple(value) if value else None


def turn_list(record: dict[str, Any], field_name: str, fmt: str) -> list[Any]:
    turns = require(record, field_name, fmt)
    if not isinstance(turns, list):
        raise UnreadableRow(field_name, f"expected a list of turns, got {type_name(turns)}")
    return turns


def parse_messages(record: dict[str, Any]) -> tuple[Message, ...]:
    out: list[Message] = []
    for i, turn in enumerate(turn_list(record, "messages", "messages")):
        where = f"messages[{i}]"
        if not isinstance(turn, dict):
            raise UnreadableRow(where, f"expected an object with role and content, got {type_name(turn)}")
        if "role" not in turn:
            raise UnreadableRow(f"{where}.role", "missing")
        out.append(
            make_message(
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


def parse_prompt(record: dict[str, Any]) -> tuple[Message, ...]:
    prompt = require(record, "prompt", "prompt")
    system = optional_str(record.get("system"), "system")
    head = (Message(role="system", content=system),) if system is not None else ()
    if isinstance(prompt, list) and all(isinstance(t, dict) and "role" in t for t in prompt):
        # a prompt given as a list of chat turns (common in preference datasets)
        return head + parse_messages({"messages": prompt})
    check_text(prompt, "prompt")
    return (*head, Message(role="user", content=prompt))


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


def row_id(record: dict[str, Any], id_column: str) -> tuple[str, str]:
    """The row's id as text, and as written (JSON: ``1`` or ``"1"``)."""
    if id_column not in record:
        raise UnreadableRow(id_column, "missing (configured as id_column)")
    raw = record[id_column]
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        raise UnreadableRow(id_column, f"id must be a non-empty string or an integer, got {type_name(raw)}")
    value = str(raw)
    if not value:
        raise UnreadableRow(id_column, "id is empty")
    as_written = str(raw) if isinstance(raw, int) else orjson.dumps(raw).decode()
    return check_id(value, id_column), as_written
