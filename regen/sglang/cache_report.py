"""SGLang's usage report read back: the prompt tokens an answer read from the radix cache (``cached_tokens``)
and, per shard, the prefill they saved.

Where SGLang puts it (read in its source, 0.5.17 and 0.5.23): ``/generate`` answers carry
``meta_info.cached_tokens`` always (``TokenizerManager``); ``/v1/chat/completions`` answers carry
``usage.prompt_tokens_details.cached_tokens`` only on a server launched with ``--enable-cache-report``
(``UsageProcessor.calculate_response_usage``), else ``prompt_tokens_details`` is null. 0.5.17 also leaves
it null when the count is 0 (``_details_if_cached``); 0.5.23 writes ``{"cached_tokens": 0}``. So one
null says nothing; a shard's share counts a null as 0 once any answer of it reported a count (its server
runs with the report), and says "not reported" while none did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: SGLang's flag that puts ``cached_tokens`` (prompt tokens read from the radix cache) in every answer's
#: ``usage.prompt_tokens_details`` (``UsageProcessor.calculate_response_usage``); off by default
CACHE_REPORT_FLAG = "--enable-cache-report"


def cached_tokens(answer: Mapping[str, Any]) -> int | None:
    """The prompt tokens ``answer`` (a parsed SGLang response body) read from the radix cache: the chat
    answer's ``usage.prompt_tokens_details.cached_tokens``, else the ``/generate`` answer's
    ``meta_info.cached_tokens``; None where the server did not report it."""
    details = (answer.get("usage") or {}).get("prompt_tokens_details") or {}
    value = details.get("cached_tokens")
    if value is None:
        value = (answer.get("meta_info") or {}).get("cached_tokens")
    return None if value is None else int(value)


def prompt_tokens(answer: Mapping[str, Any]) -> int:
    """The answer's prompt tokens: ``usage.prompt_tokens`` (chat) or ``meta_info.prompt_tokens``."""
    usage = answer.get("usage") or answer.get("meta_info") or {}
    return int(usage.get("prompt_tokens") or 0)


@dataclass(slots=True)
class PrefillSaved:
    """A shard's answers' prompt tokens and the part of them SGLang read from its radix cache: what the
    shard's end line and stats say (``cached_share``: the prefill the cache saved)."""

    answers: int = 0
    #: answers that carried a ``cached_tokens`` count (none where the server runs without
    #: ``--enable-cache-report``; 0.5.17 also leaves out a count of 0)
    reported: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0

    def add(self, answer: Mapping[str, Any]) -> None:
        """One parsed answer body."""
        self.count(prompt_tokens(answer), cached_tokens(answer))

    def count(self, prompt: int, cached: int | None) -> None:
        """One answer's prompt tokens and its ``cached_tokens`` (None: not reported)."""
        self.answers += 1
        self.prompt_tokens += prompt
        if cached is not None:
            self.reported += 1
            self.cached_tokens += cached

    @property
    def cached_share(self) -> float | None:
        """Cached over prompt tokens; None while no answer reported a count."""
        return self.cached_tokens / self.prompt_tokens if self.reported and self.prompt_tokens else None

    def to_json(self) -> dict[str, Any]:
        return {
            "answers": self.answers,
            "reported": self.reported,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "cached_share": self.cached_share,
        }

    def in_words(self) -> str:
        """For the shard's end line."""
        if self.cached_share is None:
            return "prefill saved: not reported (the server runs without --enable-cache-report)"
        return (
            f"prefill saved: {self.cached_tokens:,} of {self.prompt_tokens:,} prompt tokens sent "
            f"({self.cached_share:.0%}) read from SGLang's radix cache"
        )
