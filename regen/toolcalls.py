"""Tool calls that stay true under ``regenerate: all``.

With ``regenerate: all`` each regenerated assistant turn is followed by the dataset's next turns. When
those begin with tool turns, they answer the calls the *dataset's* assistant turn made. A regenerated
turn that calls something else (another function, other arguments, more or fewer calls, or none) would
be followed by tool results that answer a different question, and a drafter would learn from that
conversation. So the row ends at such a turn (``regen.generate.client``), and the mismatch is named by kind:

* ``count``: the regenerated turn makes another number of calls than the following tool turns answer
  (none where the dataset called, or a call where the dataset's next turn is not a tool turn);
* ``name``: the same number of calls, but a function name differs (compared call by call, in order);
* ``arguments``: the same functions, but some call's arguments differ, compared as JSON values (a JSON
  string and the object it encodes are equal; key order and whitespace do not matter).

``regenerate: last`` answers the final turn only: nothing follows it, so nothing is compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from regen.types import Message

COUNT = "count"
NAME = "name"
ARGUMENTS = "arguments"
#: every mismatch kind, in the order they are checked
MISMATCH_KINDS: tuple[str, ...] = (COUNT, NAME, ARGUMENTS)


def _function(call: Any) -> dict[str, Any]:
    """The ``function`` object of an OpenAI tool call (a bare ``{name, arguments}`` is accepted too)."""
    if isinstance(call, dict):
        fn = call.get("function")
        return fn if isinstance(fn, dict) else call
    return {}


def _arguments(value: Any) -> Any:
    """Arguments as a JSON value: a string holding JSON is decoded; other strings stay text."""
    if isinstance(value, str):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return {} if value is None else value


def tool_call_mismatch(regenerated: Sequence[Any] | None, answered: Sequence[Any] | None) -> str | None:
    """The kind of mismatch between a regenerated turn's calls and the calls the following tool turns
    answer (``MISMATCH_KINDS``), or None when they agree."""
    new, old = list(regenerated or ()), list(answered or ())
    if len(new) != len(old):
        return COUNT
    pairs = [(_function(a), _function(b)) for a, b in zip(new, old, strict=True)]
    if any(a.get("name") != b.get("name") for a, b in pairs):
        return NAME
    if any(_arguments(a.get("arguments")) != _arguments(b.get("arguments")) for a, b in pairs):
        return ARGUMENTS
    return None


def answered_calls(messages: Sequence[Message]) -> list[tuple[Any, ...]]:
    """For each assistant turn of a conversation, in order: the tool calls its following tool turns
    answer (the dataset turn's calls when a tool turn comes next; none otherwise)."""
    out: list[tuple[Any, ...]] = []
    for i, m in enumerate(messages):
        if m.role != "assistant":
            continue
        followed_by_tool = i + 1 < len(messages) and messages[i + 1].role == "tool"
        out.append(tuple(m.tool_calls or ()) if followed_by_tool else ())
    return out


def with_answered_ids(regenerated: Sequence[Any], answered: Sequence[Any]) -> list[Any]:
    """Matching regenerated calls under the ids of the dataset's calls that the following tool turns
    answer (by position): the server names its calls afresh, and SGLang refuses a tool turn whose
    ``tool_call_id`` no earlier call carries. Calls beyond ``answered`` keep their own ids."""
    out = []
    for i, call in enumerate(regenerated):
        old_id = answered[i].get("id") if i < len(answered) and isinstance(answered[i], dict) else None
        out.append({**call, "id": old_id} if isinstance(call, dict) and old_id is not None else call)
    return out
