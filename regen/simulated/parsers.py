"""What SGLang parses out of a completion (Qwen3 reasoning, Qwen2.5 tool calls) and checks in a request."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import orjson

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>\n", "\n</tool_call>"


def tool_call_text(calls: tuple[dict[str, Any], ...]) -> str:
    """The calls as the Qwen3 chat template writes them in an assistant turn (what the model emits)."""
    return "\n".join(
        '<tool_call>\n{"name": "'
        + c["function"]["name"]
        + '", "arguments": '
        + c["function"]["arguments"]
        + "}\n</tool_call>"
        for c in calls
    )


def tool_call_pairing_error(messages: list[Any]) -> str | None:
    """SGLang 0.5.23's check (``serving_chat._tool_call_pairing_error``): every assistant tool call is
    answered by exactly one following tool message, unless that assistant message is the last one."""
    pending: set[Any] | None = None
    unpaired_ids = False
    for m in messages:
        m = m if isinstance(m, dict) else {}
        if m.get("role") == "tool":
            if unpaired_ids:
                continue
            if pending is None:
                return "A tool message must follow an assistant message with tool_calls."
            if m.get("tool_call_id") not in pending:
                return f"tool_call_id {m.get('tool_call_id')!r} does not match an unanswered tool call."
            pending.discard(m.get("tool_call_id"))
            continue
        if pending:
            return f"Tool calls {sorted(pending)} have no tool message answering them."
        pending, unpaired_ids = None, False
        if m.get("role") == "assistant" and m.get("tool_calls"):
            call_ids = [c.get("id") if isinstance(c, dict) else None for c in m["tool_calls"]]
            unpaired_ids = None in call_ids  # calls without ids cannot be paired: results unchecked
            pending = None if unpaired_ids else set(call_ids)
    last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    if pending and last.get("role") == "tool":
        return f"Tool calls {sorted(pending)} have no tool message answering them."
    return None


def version_tuple(version: str) -> tuple[int, ...]:
    """``"0.5.23"`` -> ``(0, 5, 23)`` (non-numeric parts end it)."""
    out: list[int] = []
    for part in version.split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


def completion_ids_field(version: str) -> str:
    """The choice field SGLang puts completion ids in: ``response_token_ids`` from 0.5.23 on."""
    return "response_token_ids" if version_tuple(version) >= (0, 5, 23) else "token_ids"


def parse_qwen3_reasoning(text: str, thinking: bool) -> tuple[str | None, str]:
    """SGLang 0.5.23's Qwen3 reasoning parser on a whole completion (``detect_and_parse``).

    With thinking on the parser forces reasoning mode: leading ``<think>`` tags are dropped, the text
    up to the first ``</think>`` is the reasoning (all of it when there is none) and the rest the
    answer, neither stripped. With thinking off the text is the answer.
    """
    if not thinking and THINK_OPEN not in text:
        return None, text
    while text.startswith(THINK_OPEN):
        text = text[len(THINK_OPEN) :]
    if THINK_CLOSE not in text:
        return text or None, ""
    reasoning, answer = text.split(THINK_CLOSE, 1)
    return reasoning or None, answer


def parse_qwen25_tool_calls(text: str, tools: list[Any]) -> tuple[str, list[dict[str, Any]]] | None:
    """SGLang 0.5.17's Qwen25Detector.detect_and_parse and serving_chat's ToolCall list: None when the
    text has no ``<tool_call>`` line; else (the text before it, stripped; the calls to known tools)."""
    idx = text.find(TOOL_CALL_OPEN)
    if idx < 0:
        return None
    names = [t.get("function", {}).get("name") if isinstance(t, dict) else None for t in tools]
    calls = []
    for body in re.findall(re.escape(TOOL_CALL_OPEN) + "(.*?)" + re.escape(TOOL_CALL_CLOSE), text, re.DOTALL):
        try:
            act = orjson.loads(body.strip())
        except orjson.JSONDecodeError:
            continue
        for a in act if isinstance(act, list) else [act]:
            name = a.get("name") if isinstance(a, dict) else None
            if not name or name not in names:
                continue  # SGLang drops calls to undefined functions
            args = a.get("parameters") or a.get("arguments", {})
            calls.append(
                {
                    "id": f"call_{uuid.uuid4().hex[:24]}",
                    "index": names.index(name),
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
                }
            )
    return text[:idx].strip(), calls


def needs_filtered_sampling(req: dict[str, Any]) -> bool:
    """SGLang samples with flashinfer's top-k/top-p/min-p kernels unless the request is greedy
    (temperature 0, or top_k 1) or its filters are off (top_k -1 or 2**30, top_p 1, min_p 0)."""
    temperature = req.get("temperature")
    top_k = req.get("top_k")
    if (temperature is not None and float(temperature) <= 1e-6) or top_k == 1:
        return False
    top_p = req.get("top_p")
    min_p = req.get("min_p")
    return (
        (top_k is not None and 0 < int(top_k) < 1 << 30)
        or (top_p is not None and float(top_p) < 1.0)
        or (min_p is not None and float(min_p) > 0.0)
    )


def count_prompt_tokens(messages: list[Any]) -> int:
    n = 3
    for m in messages:
        c = m.get("content") if isinstance(m, dict) else None
        n += 4 + (len(c.split()) if isinstance(c, str) else 0)
    return n
