"""Where a ``length`` stop fell, and what the run does with it (``generate.truncation``).

An answer cut at ``max_tokens`` stopped either inside the reasoning (no answer yet: the think block never
closed, :data:`IN_REASONING`) or inside the answer (:data:`IN_ANSWER`). A bigger-budget retry of the first
often thinks again up to the new limit, so the two are counted apart (the report, the re-audit, ``regen
status``) and the policy treats them apart::

    generate:
      truncation: keep                       # the old form: one action for both
      truncation: {in_answer: retry, in_reasoning: retry_without_thinking}

Actions: ``keep`` the cut answer, ``drop`` it (a ``truncated`` failure line; nothing is lost: the
journal keeps the attempt), ``retry`` once at ``max_tokens * retry_max_tokens_factor``, and for a cut
inside the reasoning ``retry_without_thinking``: once more at the same ``max_tokens`` with thinking off
(the record then says ``thinking: false``).

This module is on the ground: it imports nothing of regen's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: where a length stop fell (``None``: the answer was not cut)
IN_REASONING = "in_reasoning"
IN_ANSWER = "in_answer"
WHERE = (IN_ANSWER, IN_REASONING)

KEEP = "keep"
DROP = "drop"
RETRY = "retry"
RETRY_WITHOUT_THINKING = "retry_without_thinking"


def truncated_where(
    finish_reason: str | None, content: str | None, reasoning: str | None, tool_calls: bool = False
) -> str | None:
    """Where an answer was cut: :data:`IN_REASONING` when it stopped at ``length`` with reasoning and no
    answer after it (the think block never closed), :data:`IN_ANSWER` for any other ``length`` stop, None
    when it was not cut. The same test validation's ``truncated_in_reasoning`` quarantine applies."""
    if finish_reason != "length":
        return None
    if not (content or "").strip() and not tool_calls and (reasoning or "").strip():
        return IN_REASONING
    return IN_ANSWER


def record_truncated_where(rec: Mapping[str, Any]) -> str | None:
    """:func:`truncated_where` of a generation record or dataset row (its last regenerated answer)."""
    return truncated_where(
        rec.get("finish_reason"),
        rec.get("content"),
        rec.get("reasoning_content"),
        bool(rec.get("tool_calls") or rec.get("tool_calls_json")),
    )


@dataclass(frozen=True, slots=True)
class TruncationPolicy:
    """``generate.truncation`` typed: the action for a cut inside the answer and for one inside the
    reasoning (the string form sets both)."""

    in_answer: str = KEEP
    in_reasoning: str = KEEP

    @classmethod
    def from_config(cls, value: str | Mapping[str, Any]) -> TruncationPolicy:
        """From the validated config value (a string, or the object with the schema's defaults filled)."""
        if isinstance(value, str):
            return cls(value, value)
        return cls(str(value.get("in_answer", KEEP)), str(value.get("in_reasoning", KEEP)))

    def action(self, where: str | None) -> str:
        """What to do with an answer cut ``where`` (``keep`` when it was not cut)."""
        if where is None:
            return KEEP
        return self.in_reasoning if where == IN_REASONING else self.in_answer

    @property
    def setting(self) -> str:
        """The policy as one string for the settings fingerprint: the old string form when both sides
        agree (so a config written before the split keeps its fingerprint), else both named."""
        if self.in_answer == self.in_reasoning:
            return self.in_answer
        return f"in_answer={self.in_answer},in_reasoning={self.in_reasoning}"

    @property
    def retries_bigger(self) -> bool:
        """Whether some answer may be asked again at ``max_tokens * retry_max_tokens_factor``."""
        return RETRY in (self.in_answer, self.in_reasoning)

    @property
    def modelled(self) -> str:
        """The one policy the planner's length model plays (it cannot tell where an answer it models
        would stop): ``retry`` when either side retries with a bigger budget, else ``keep`` (a drop or a
        retry without thinking holds its slot for ``max_tokens`` first, as keep does)."""
        return RETRY if self.retries_bigger else KEEP
