"""ShareGPT rows (``{"conversations": [{"from", "value"}], "system"?, "tools"?}``) into the conversation's
turns.

Speakers are read as the trainers that use this format spell them (case and surrounding space ignored):

* LLaMA-Factory's ``sharegpt`` formatting (``data/README.md``; tags ``user_tag: human``, ``assistant_tag:
  gpt``, ``observation_tag: observation``, ``function_tag: function_call``, ``system_tag: system``): a
  ``function_call`` turn is the assistant calling tools, its value a JSON string holding one call
  ``{"name", "arguments"}`` or a list of them (the Glaive function-calling convention); an
  ``observation`` turn is a tool result;
* Axolotl's ``chat_template`` role mapping (``user: [human, user]``, ``assistant: [gpt, assistant]``,
  ``system``, ``tool``);
* the original ShareGPT dumps' ``chatgpt``, ``bing`` and ``bard`` answers, and ``model`` (Gemini's
  name for the assistant); ``function`` (OpenAI's legacy name for a function's result) is a tool turn.

The same spellings are read in a ``messages`` list (``{"role", "content"}`` turns: LLaMA-Factory's
sharegpt formatting with ``role_tag: role``) when one of its turns uses them (:func:`has_spelled_roles`).

A ``function_call`` turn becomes an assistant turn with OpenAI ``tool_calls`` (``{"id", "type":
"function", "function": {"name", "arguments"}}``, arguments as a JSON string, as the OpenAI API and SGLang
take them) and empty content; the tool turns after it answer its calls in order and get each call's
``tool_call_id`` and ``name``. A value that is not such JSON makes the row unreadable, naming the turn.
"""

from __future__ import annotations

from typing import Any

import orjson

from regen.ingest.rows import UnreadableRow, check_text, make_message, turn_list, type_name
from regen.types import DEVELOPER_ROLE, Message

SHAREGPT_ROLES: dict[str, str] = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "model": "assistant",
    "tool": "tool",
    "observation": "tool",
    "function": "tool",
    "developer": DEVELOPER_ROLE,
}
#: speakers whose value is a JSON tool call (or a list of them): the assistant calling tools
TOOL_CALL_SPEAKERS = frozenset({"function_call", "tool_call", "tool_calls"})
TOOL_CALL_SHAPE = 'a JSON tool call {"name": ..., "arguments": {...}} or a list of them'


def parse_sharegpt(record: dict[str, Any]) -> tuple[Message, ...]:
    system = record.get("system")
    if system is not None:
        if not isinstance(system, str):
            raise UnreadableRow("system", f"expected a string, got {type_name(system)}")
        check_text(system, "system")
    out = spelled_turns(turn_list(record, "conversations", "sharegpt"), "conversations", "from", "value")
    if system and not (out and out[0].role == "system"):
        out.insert(0, Message(role="system", content=system))
    return tuple(out)


def has_spelled_roles(turns: Any) -> bool:
    """Whether a ``messages`` list spells a speaker as the trainers do (``function_call``, ``observation``,
    ``human``, ``gpt`` ...: LLaMA-Factory's sharegpt formatting with ``role_tag: role``) and not as OpenAI."""
    if not isinstance(turns, list):
        return False
    for turn in turns:
        role = turn.get("role") if isinstance(turn, dict) else None
        spoken = role.strip().lower() if isinstance(role, str) else None
        if spoken in TOOL_CALL_SPEAKERS or (spoken in SHAREGPT_ROLES and SHAREGPT_ROLES[spoken] != role):
            return True
    return False


def spelled_turns(turns: list[Any], list_field: str, role_key: str, content_key: str) -> list[Message]:
    """Turns whose speakers are spelled as the trainers spell them (module doc), into OpenAI roles."""
    out: list[Message] = []
    unanswered: list[dict[str, Any]] = []  # calls of the last function_call turn that no tool turn answered
    for i, turn in enumerate(turns):
        where = f"{list_field}[{i}]"
        if not isinstance(turn, dict):
            raise UnreadableRow(
                where, f"expected an object with {role_key} and {content_key}, got {type_name(turn)}"
            )
        if role_key not in turn:
            raise UnreadableRow(f"{where}.{role_key}", "missing")
        speaker = turn[role_key]
        spoken = speaker.strip().lower() if isinstance(speaker, str) else None
        if spoken in TOOL_CALL_SPEAKERS:
            field = f"{where}.{content_key}"
            calls = tool_calls_from_value(turn.get(content_key), field, call_prefix=f"call_{i}")
            out.append(Message(role="assistant", content="", tool_calls=tuple(calls)))
            unanswered = list(calls)
            continue
        role = SHAREGPT_ROLES.get(spoken, speaker) if spoken is not None else speaker
        value, reasoning = turn.get(content_key), turn.get("reasoning_content")
        own = turn if role_key == "role" else None  # an OpenAI turn's own tool fields are read as they are
        message = make_message(role, value, reasoning, where, role_key, content_key, own)
        if role == "tool" and unanswered and message.tool_call_id is None:
            call = unanswered.pop(0)
            answered = (call["id"], call["function"]["name"])
            message = Message("tool", message.content, message.reasoning_content, None, *answered)
        elif role != "tool":
            unanswered = []
        out.append(message)
    return out


def tool_calls_from_value(value: Any, field_name: str, call_prefix: str) -> list[dict[str, Any]]:
    """The OpenAI tool calls a ``function_call`` turn's value holds; ``UnreadableRow`` when it holds none."""
    if isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise UnreadableRow(field_name, f"{_NEEDS}; not JSON: {exc}") from None
    if not isinstance(value, list):
        return [_openai_call(value, field_name, f"{call_prefix}_0")]
    if not value:
        raise UnreadableRow(field_name, f"{_NEEDS}; got an empty list")
    return [_openai_call(c, f"{field_name}[{k}]", f"{call_prefix}_{k}") for k, c in enumerate(value)]


_NEEDS = f"a function_call turn must hold {TOOL_CALL_SHAPE}"


def _openai_call(call: Any, field_name: str, call_id: str) -> dict[str, Any]:
    if not isinstance(call, dict):
        raise UnreadableRow(field_name, f"{_NEEDS}; got {type_name(call)}")
    if not isinstance(call.get("name"), str) or not call["name"]:
        raise UnreadableRow(f"{field_name}.name", f"{_NEEDS}; the call has no name")
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):  # arguments written as a JSON string inside the JSON: checked, kept
        try:
            orjson.loads(arguments)
        except orjson.JSONDecodeError as exc:
            raise UnreadableRow(f"{field_name}.arguments", f"a string that is not JSON: {exc}") from None
        text = arguments
    else:
        text = orjson.dumps(arguments).decode()
    return {"id": call_id, "type": "function", "function": {"name": call["name"], "arguments": text}}
