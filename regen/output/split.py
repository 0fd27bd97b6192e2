"""The held-out eval split: which dataset rows a drafter is evaluated on rather than trained on.

A row goes to the eval side when the hash of its *split key* falls below ``export.eval_fraction``. The
key is the conversation's opening prompt: its first user turn, with every whitespace character left out.
So the split depends on nothing but the prompt text (not the row id, the order of rows or files, the
shard count, the seed or the answers): reruns and resumes give the same split, and prompts that differ
only in whitespace, repeated prompts, and conversations that open alike (whose ``regenerate: all`` rows
share a first prompt) all land on the same side. A trainer measuring acceptance on the eval side never
measures it on a prompt it trained on.

``prompts_on_both_sides`` checks that from the other end: the rows grouped by their whole prompt (every
user and system turn, whitespace left out), a group found on both sides is a leak; the re-audit counts
them (there must be none).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

TRAIN = "train"
EVAL = "eval"
#: what the split key is, as the manifest and the re-audit summary say it
SPLIT_KEY = "the first user turn, whitespace left out"


def _squashed(text: Any) -> str:
    return "".join(text.split()) if isinstance(text, str) else repr(text)


def split_key(messages: Sequence[Mapping[str, Any]]) -> str:
    """The conversation's opening prompt, normalized: its first user turn with whitespace left out
    (the first turn of any role when there is no user turn)."""
    first = next((m for m in messages if m.get("role") == "user"), messages[0] if messages else {})
    return _squashed(first.get("content"))


def side_of(key: str, eval_fraction: float) -> str:
    """``EVAL`` or ``TRAIN`` for a split key: blake2b of the key as a number in [0, 1), below the fraction."""
    digest = hashlib.blake2b(
        ("eval-split\x1f" + key).encode("utf-8", "surrogatepass"), digest_size=8
    ).digest()
    return EVAL if int.from_bytes(digest, "big") / 2.0**64 < eval_fraction else TRAIN


def row_side(messages: Sequence[Mapping[str, Any]], eval_fraction: float) -> str:
    """The side of a dataset row (its ``messages`` as dicts with ``role`` and ``content``)."""
    return side_of(split_key(messages), eval_fraction)


def whole_prompt_key(messages: Sequence[Mapping[str, Any]]) -> bytes:
    """A digest of every user and system turn of a row, whitespace left out: what 'the same prompt'
    means to the leak check (independent of ``split_key``)."""
    h = hashlib.blake2b(digest_size=16)
    for m in messages:
        if m.get("role") in ("user", "system"):
            h.update(f"{m.get('role')}\x1f{_squashed(m.get('content'))}\x1e".encode("utf-8", "surrogatepass"))
    return h.digest()


@dataclass(slots=True)
class SplitCounts:
    """Rows per side over a dataset, and prompts found on both sides (must be none)."""

    eval_fraction: float
    rows: dict[str, int] = field(default_factory=lambda: {TRAIN: 0, EVAL: 0})
    _sides: dict[bytes, str] = field(default_factory=dict)
    _leaks: set[bytes] = field(default_factory=set)

    def add(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """Count one row; return its side."""
        side = row_side(messages, self.eval_fraction)
        self.rows[side] += 1
        whole = whole_prompt_key(messages)
        seen = self._sides.setdefault(whole, side)
        if seen != side:
            self._leaks.add(whole)
        return side

    def add_all(self, rows: Iterable[Sequence[Mapping[str, Any]]]) -> SplitCounts:
        for messages in rows:
            self.add(messages)
        return self

    @property
    def prompts_on_both_sides(self) -> int:
        return len(self._leaks)

    def to_json(self) -> dict[str, Any]:
        return {
            "eval_fraction": self.eval_fraction,
            "key": SPLIT_KEY,
            "rows": dict(self.rows),
            "prompts_on_both_sides": self.prompts_on_both_sides,
        }
