"""What one choice of a chat completion is (``Completion``) and what a request asks of it (``Ask``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Completion:
    reasoning: str | None
    content: str
    reasoning_tokens: int
    completion_tokens: int
    finish_reason: str
    tool_calls: tuple[dict[str, Any], ...] | None = None  # parsed calls (finish_reason "tool_calls")


@dataclass(frozen=True, slots=True)
class Ask:
    """What one chat-completions request asks of each of its ``n`` choices."""

    messages: list[Any]
    seed: int | None
    temperature: float
    max_tokens: int
    thinking: bool
    ignore_eos: bool
