"""Fault injection of the simulated server: drawn per request from ``hash(seed, server lifetime, sample id,
n-th request)``, so one server's faults do not depend on request order, and each attempt draws its own, as on
a real server: a retry sent to another server or to this one after a restart (a new lifetime) does not meet
the same fault again. Poison and wedged samples (``error_for``, ``hang_for``) fail every attempt by design."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, fields, replace
from typing import Any

from regen.simulated.completion import Completion

FAULT_KINDS: tuple[str, ...] = ("error", "hang", "disconnect", "malformed", "truncate")
#: the key that turns every fault off, whatever rates an earlier config file set
FAULTS_ENABLED = "enabled"


def unit_hash(*parts: object) -> float:
    """A uniform number in [0, 1) determined by ``parts``."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


@dataclass(frozen=True, slots=True)
class Faults:
    """Fault injection. Rates are per request; each request draws at most one fault."""

    error_rate: float = 0.0
    hang_rate: float = 0.0
    disconnect_rate: float = 0.0
    malformed_rate: float = 0.0
    truncate_rate: float = 0.0
    crash_after: int | None = None
    bad_request_for: tuple[str, ...] = ()
    error_for: tuple[str, ...] = ()  # ids/patterns that always get HTTP 500 (poison samples)
    hang_for: tuple[str, ...] = ()  # ids/patterns whose requests are accepted and never answered
    # bad model output (HTTP 200, well-formed JSON): drawn independently of the transport faults above,
    # for the validation stage to catch
    think_leak_rate: float = 0.0  # the answer carries a stray "</think>"
    empty_answer_rate: float = 0.0  # reasoning but no answer
    # token mode only: the completion's ids split one multi-character token in two, so the text
    # re-tokenizes differently from the ids the model produced
    noncanonical_rate: float = 0.0
    # scripted tool calls (a real model decides; tests and the demo script them): {id pattern: [calls of
    # answer 0, calls of answer 1, ...]}, answer k being the one after k assistant turns of the request,
    # each call {"name", "arguments"}; made only when the request sends tools and the answer stops
    tool_calls_for: tuple[tuple[str, tuple[tuple[Any, ...], ...]], ...] = ()
    # a stall as SGLang's (#30314, PR #34705): the process lives, /health and /metrics answer, requests are
    # taken, and no token is generated any more, no decode batch logged; once this lifetime has generated
    # this many tokens, or this many seconds after it became ready (``POST /_sim/stall`` stalls it at once)
    stall_after_tokens: int | None = None
    stall_at_s: float | None = None
    seed: int = 0

    @classmethod
    def from_json(cls, obj: dict[str, Any] | None) -> Faults:
        """From ``server.simulated.faults`` (or ``--faults``). ``enabled: false`` clears every fault, the
        other keys included: config files merge key by key (Snakemake's nested merge), so a later file's
        ``faults: {}`` leaves an earlier file's rates in place, and only ``enabled: false`` turns them off."""
        if not obj:
            return cls()
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(obj) - known - {FAULTS_ENABLED})
        if unknown:
            raise ValueError(f"--faults: unknown key(s) {unknown}; known: {sorted(known | {FAULTS_ENABLED})}")
        enabled = obj.get(FAULTS_ENABLED, True)
        if not isinstance(enabled, bool):
            raise ValueError(f"--faults: {FAULTS_ENABLED} must be true or false, not {enabled!r}")
        if not enabled:
            return cls()
        kwargs = {k: v for k, v in obj.items() if k != FAULTS_ENABLED}
        for key in ("bad_request_for", "error_for", "hang_for"):
            if key in kwargs:
                kwargs[key] = tuple(str(x) for x in kwargs[key])
        if "tool_calls_for" in kwargs:
            kwargs["tool_calls_for"] = tuple(
                (str(p), tuple(tuple(calls or ()) for calls in answers))
                for p, answers in dict(kwargs["tool_calls_for"]).items()
            )
        faults = cls(**kwargs)
        total = sum(getattr(faults, f"{k}_rate") for k in FAULT_KINDS)
        if total > 1.0 or any(getattr(faults, f"{k}_rate") < 0 for k in FAULT_KINDS):
            raise ValueError(f"--faults: rates must be >= 0 and sum to <= 1 (sum {total})")
        return faults

    def draw(self, key: str, nth: int, lifetime: str = "") -> str | None:
        """The fault (or None) for the ``nth`` request carrying sample id ``key`` in server ``lifetime``."""
        u = unit_hash(self.seed, lifetime, key, nth)
        edge = 0.0
        for kind in FAULT_KINDS:
            edge += getattr(self, f"{kind}_rate")
            if u < edge:
                return kind
        return None

    def is_bad_request(self, sample_id: str | None) -> bool:
        return _matches(sample_id, self.bad_request_for)

    def spoil(self, completion: Completion, key: str, nth: int) -> tuple[Completion, str | None]:
        """The completion with a bad-output fault applied (and its name), or unchanged (None)."""
        u = unit_hash(self.seed, "output", key, nth)
        if u < self.think_leak_rate:
            return replace(completion, content="</think>\n" + completion.content), "think_leak"
        if u < self.think_leak_rate + self.empty_answer_rate and completion.reasoning:
            return replace(completion, content=""), "empty_answer"
        return completion, None

    def is_noncanonical(self, key: str, nth: int) -> bool:
        return unit_hash(self.seed, "noncanonical", key, nth) < self.noncanonical_rate

    def is_poison(self, sample_id: str | None) -> bool:
        return _matches(sample_id, self.error_for)

    def is_wedged(self, sample_id: str | None) -> bool:
        return _matches(sample_id, self.hang_for)

    def scripted_tool_calls(self, sample_id: str | None, messages: list[Any]) -> list[dict[str, Any]]:
        """The tool calls scripted for this answer of ``sample_id`` (OpenAI shape, as SGLang's parser
        returns them: ids, indexes, arguments as JSON text); none when not scripted."""
        answer = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
        for pattern, answers in self.tool_calls_for:
            if _matches(sample_id, (pattern,)) and answer < len(answers):
                return [
                    {
                        "id": "call_"
                        + hashlib.blake2b(repr((sample_id, answer, i)).encode()).hexdigest()[:24],
                        "index": i,
                        "type": "function",
                        "function": {
                            "name": call["name"],
                            "arguments": json.dumps(call.get("arguments") or {}, ensure_ascii=False),
                        },
                    }
                    for i, call in enumerate(answers[answer])
                ]
        return []


def _matches(sample_id: str | None, patterns: tuple[str, ...]) -> bool:
    if sample_id is None:
        return False
    return any(sample_id == p or re.fullmatch(p, sample_id) for p in patterns)
