"""Per-sample audit rules: the flag names, structure faults (role rules), prompt digests, the verdict
(:class:`SampleAudit`). The role rules are described in ``regen.ingest.audit``."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from regen.types import DEVELOPER_ROLE, KNOWN_ROLES, BadRow, Message, prompt_end

log = logging.getLogger(__name__)


BAD_ROW = "bad_row"
STRUCTURE_ERROR = "structure_error"
OVER_LENGTH = "over_length"
DUPLICATE_PROMPT = "duplicate_prompt"
WHITESPACE_DUPLICATE_PROMPT = "whitespace_duplicate_prompt"
EMPTY_RESPONSE = "empty_response"
CONTAMINATED = "contaminated"
# also the priority order of exclude reasons
FLAG_NAMES: tuple[str, ...] = (
    BAD_ROW,
    STRUCTURE_ERROR,
    OVER_LENGTH,
    CONTAMINATED,
    DUPLICATE_PROMPT,
    WHITESPACE_DUPLICATE_PROMPT,
    EMPTY_RESPONSE,
)
DIGEST_BYTES = 8

# --------------------------------------------------------------------------------------
# Per-sample checks
# --------------------------------------------------------------------------------------

_ALLOWED_AFTER: dict[str | None, frozenset[str]] = {
    None: frozenset({"user"}),
    "user": frozenset({"assistant"}),
    "assistant": frozenset({"user", "tool"}),
    "tool": frozenset({"assistant", "tool"}),
}


def structure_faults(messages: Sequence[Message]) -> list[str]:
    """Every structure fault of a conversation, as ``kind: where`` strings (empty when sound)."""
    if not messages:
        return ["no_turns: the conversation has no messages"]
    faults: list[str] = []
    prev: str | None = None
    has_user = False
    for i, m in enumerate(messages):
        role, content = m.role, m.content
        if role not in KNOWN_ROLES and role != DEVELOPER_ROLE:
            faults.append(f"unknown_role: message {i} has role {role!r}")
            continue
        if content is not None and not isinstance(content, str):
            faults.append(f"non_text_content: message {i} ({role}) has {_content_kind(content)}")
        elif role in ("user", "tool") and (content is None or not content.strip()):
            faults.append(f"empty_content: message {i} ({role}) is empty")
        if role in ("system", DEVELOPER_ROLE):
            if i != 0:
                faults.append(f"system_not_first: message {i} is a system turn")
            continue
        has_user = has_user or role == "user"
        if role not in _ALLOWED_AFTER[prev]:
            after = f"after {prev}" if prev else "at the start"
            faults.append(f"bad_role_order: message {i} ({role}) {after}")
        prev = role
    if not has_user:
        faults.append("no_user_turn: the conversation has no user turn")
    return faults


def _content_kind(content: Any) -> str:
    """``list content with parts image_url, text`` / ``int content``: what a non-text content holds."""
    if isinstance(content, list):
        kinds = sorted({p.get("type") if isinstance(p, dict) else type(p).__name__ for p in content}, key=str)
        return f"list content with parts {', '.join(map(str, kinds)) or 'none'} (only text parts are read)"
    return f"{type(content).__name__} content"


def fault_kind(fault: str) -> str:
    return fault.split(":", 1)[0]


# every whitespace character (str.isspace) mapped to nothing: one C pass, no per-word objects
_DROP_WHITESPACE = {c: None for c in range(0x3001) if chr(c).isspace()}
_ASCII_WHITESPACE = bytes(c for c in range(128) if chr(c).isspace())


def _without_whitespace(text: str) -> bytes:
    """``text`` as UTF-8 with every whitespace character left out (ASCII text: one C pass)."""
    if not text.isascii():
        text = text.translate(_DROP_WHITESPACE)
    return text.encode("utf-8", "surrogatepass").translate(None, _ASCII_WHITESPACE)


def prompt_digest(dicts: Sequence[Mapping[str, Any]], squash_whitespace: bool = False) -> bytes:
    """8-byte blake2b of the prompt messages (everything before a final assistant turn).

    With ``squash_whitespace`` whitespace is left out, so prompts that differ only in whitespace get
    one digest.
    """
    prompt = dicts[: prompt_end([d["role"] for d in dicts])]
    if not squash_whitespace:
        payload = orjson.dumps(
            [(d["role"], d["content"], d.get("reasoning_content"), d.get("tool_calls")) for d in prompt]
        )
        return hashlib.blake2b(payload, digest_size=DIGEST_BYTES).digest()
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    for d in prompt:
        reasoning, calls = d.get("reasoning_content"), d.get("tool_calls")
        h.update(d["role"].encode() + b"\x00")
        h.update(_without_whitespace(d["content"]) + b"\x00")
        h.update(b"\x01" if reasoning is None else _without_whitespace(reasoning) + b"\x00")
        h.update(b"\x01" if calls is None else orjson.dumps(calls).translate(None, _ASCII_WHITESPACE))
        h.update(b"\x1e")
    return h.digest()


def bad_row_id(bad: BadRow) -> str:
    """The placeholder id of an unreadable row: ``row/<n>:<file>``. Real ids cannot contain ``/``
    (``regen.ingest.rows.check_id``), so a placeholder never equals a real id."""
    return f"row/{bad.row}:{bad.file}"


@dataclass(frozen=True, slots=True)
class SampleAudit:
    """The audit verdict for one input row."""

    id: str
    file: str | None
    row: int | None
    format: str | None
    flags: tuple[str, ...]
    supervised_tokens: int | None
    prompt_tokens: int | None
    excluded: bool
    exclude_reason: str | None
    detail: str | None
    id_json: str | None = None

    def excluded_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "reason": self.exclude_reason,
            "file": self.file,
            "row": self.row,
        }
        if self.id_json is not None:
            out["id_json"] = self.id_json
        if self.detail:
            out["detail"] = self.detail
        return out
