"""Alpaca rows into conversation turns: ``{"instruction", "input"?, "output"?}``, and LLaMA-Factory's alpaca
with ``system`` and ``history`` (a list of ``[user, assistant]`` pairs before this one).

As LLaMA-Factory builds them: the history's pairs come first, then one user turn of ``instruction`` and
``input`` joined by a newline (an empty one left out), then ``output`` as the assistant turn. A row
without ``output`` (or with ``null``) ends with its user turn, which generation answers."""

from __future__ import annotations

from typing import Any

from regen.ingest.rows import UnreadableRow, check_text, optional_str, require, type_name
from regen.types import Message

#: the field whose presence marks an Alpaca row
ALPACA_FIELD = "instruction"


def parse_alpaca(record: dict[str, Any]) -> tuple[Message, ...]:
    instruction = require(record, ALPACA_FIELD, "alpaca")
    if not isinstance(instruction, str):
        raise UnreadableRow(ALPACA_FIELD, f"expected a string, got {type_name(instruction)}")
    check_text(instruction, ALPACA_FIELD)
    extra = optional_str(record.get("input"), "input")
    system = optional_str(record.get("system"), "system")
    out: list[Message] = [Message("system", system)] if system else []
    out.extend(_history(record.get("history")))
    out.append(Message("user", "\n".join(part for part in (instruction, extra) if part)))
    answer = record.get("output")
    if isinstance(answer, list):
        raise UnreadableRow("output", "a list of answers (ranking data); expected one answer, a string")
    answer = optional_str(answer, "output")
    if answer is not None:
        out.append(Message("assistant", answer))
    return tuple(out)


def _history(value: Any) -> list[Message]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise UnreadableRow("history", f"expected a list of [user, assistant] pairs, got {type_name(value)}")
    turns: list[Message] = []
    for i, pair in enumerate(value):
        where = f"history[{i}]"
        if not (isinstance(pair, list) and len(pair) == 2):
            raise UnreadableRow(where, f"expected a [user, assistant] pair, got {type_name(pair)}")
        for k, role in enumerate(("user", "assistant")):
            if not isinstance(pair[k], str):
                raise UnreadableRow(f"{where}[{k}]", f"expected a string, got {type_name(pair[k])}")
            check_text(pair[k], f"{where}[{k}]")
            turns.append(Message(role, pair[k]))
    return turns
