"""The audit's dataset-level result: histograms, empty old answers by fate, gates, the summary
(``summary.json``), its messages and its table."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from regen.ingest.audit_config import regenerate_setting
from regen.ingest.flags import (
    BAD_ROW,
    CONTAMINATED,
    DUPLICATE_PROMPT,
    EMPTY_RESPONSE,
    FLAG_NAMES,
    OVER_LENGTH,
    STRUCTURE_ERROR,
    WHITESPACE_DUPLICATE_PROMPT,
)

log = logging.getLogger(__name__)


GATE_MEANING: dict[str, str] = {
    "max_empty_response_fraction": "fraction of samples that keep an empty old answer (template scaffolding "
    "only) as context: a turn generate.regenerate does not replace",
    "max_structure_error_fraction": "fraction of samples with structure faults or unreadable rows",
    "max_over_length_fraction": "fraction of prompts longer than audit.context_limit tokens",
    "max_unread_tail_files": "input files that could not be read to the end (their remaining rows are lost)",
}


class AuditGateError(RuntimeError):
    """A dataset-level gate failed; the message says which, by how much, and how to override."""


class NothingToGenerateError(AuditGateError):
    """No sample is left for generation (an empty input, or everything excluded); not overridable."""


# --------------------------------------------------------------------------------------
# Histograms
# --------------------------------------------------------------------------------------


#: the summary's histogram of the old answers' supervised tokens without their reasoning (answer only),
#: which plans a thinking-off variant's answers (``regen.tune.workload_plan``); the auditor records it
#: (``regen.ingest.auditor.ThinkBlocks``) with the samples it cannot split counted beside it (``left_out``,
#: ``left_out_reasons``); a summary without it (an older audit) plans the one length and says so
ANSWER_ONLY_HISTOGRAM = "answer_tokens"


@dataclass(slots=True)
class Log2Histogram:
    """Counts in power-of-two buckets: bucket 0 holds 0, bucket k holds [2^(k-1), 2^k); the exact mean
    and standard deviation beside them (the tuner plans the running set's context from the old answers'
    mean and spread: ``regen.sglang.workload.old_answers_expected``)."""

    counts: list[int] = field(default_factory=lambda: [0] * 40)
    n: int = 0
    total: int = 0
    total_squares: int = 0
    min: int | None = None
    max: int | None = None

    def add(self, value: int) -> None:
        self.counts[min(value.bit_length(), 39)] += 1
        self.n += 1
        self.total += value
        self.total_squares += value * value
        if self.min is None or value < self.min:
            self.min = value
        if self.max is None or value > self.max:
            self.max = value

    def buckets(self) -> list[dict[str, int]]:
        """Non-empty buckets as ``{"lo", "hi", "count"}`` (``hi`` inclusive)."""
        out = []
        for k, c in enumerate(self.counts):
            if c:
                lo, hi = (0, 0) if k == 0 else (1 << (k - 1), (1 << k) - 1)
                out.append({"lo": lo, "hi": hi, "count": c})
        return out

    def std(self) -> float | None:
        """The population standard deviation of the values added (None before any)."""
        if not self.n:
            return None
        mean = self.total / self.n
        return max(0.0, self.total_squares / self.n - mean * mean) ** 0.5

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.n,
            "min": self.min,
            "max": self.max,
            "mean": (self.total / self.n) if self.n else None,
            "std": self.std(),
            "buckets": self.buckets(),
        }


#: the summary's entry for the most common system prompt (:class:`SystemPrompts`): the planner keeps
#: SGLang's radix cache on for a system prompt many samples share (``regen.sglang.workload.shared_prefixes``)
SYSTEM_PROMPTS = "system_prompts"


@dataclass(slots=True)
class SystemPrompts:
    """The most common system prompt (a first message with role ``system``) among the samples added, in
    bounded memory: Misra-Gries over ``slots`` digests finds every prompt in more than 1/``slots`` of the
    samples, its count low by at most samples/``slots`` (the summary's count is a lower bound)."""

    slots: int = 64
    samples: int = 0
    with_system_prompt: int = 0
    counts: dict[bytes, int] = field(default_factory=dict)
    chars: dict[bytes, int] = field(default_factory=dict)

    def add(self, messages: Sequence[Mapping[str, Any]]) -> None:
        self.samples += 1
        if not messages or messages[0].get("role") != "system":
            return
        content = messages[0].get("content")
        text = content if isinstance(content, str) else orjson.dumps(content).decode()
        self.with_system_prompt += 1
        key = hashlib.blake2b(text.encode(), digest_size=8).digest()
        if key in self.counts or len(self.counts) < self.slots:
            self.counts[key] = self.counts.get(key, 0) + 1
            self.chars[key] = len(text)
            return
        for other in list(self.counts):  # a new prompt with every slot taken: each count drops by one
            self.counts[other] -= 1
            if not self.counts[other]:
                del self.counts[other], self.chars[other]

    def to_json(self) -> dict[str, Any]:
        top = max(self.counts, key=self.counts.__getitem__, default=None)
        return {
            "samples": self.samples,
            "with_system_prompt": self.with_system_prompt,
            "most_common": self.counts[top] if top is not None else 0,
            "most_common_chars": self.chars[top] if top is not None else 0,
        }


# --------------------------------------------------------------------------------------
# Summary and gates
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GateResult:
    name: str
    limit: float
    value: float
    passed: bool

    def to_json(self) -> dict[str, Any]:
        return {"limit": self.limit, "value": self.value, "passed": self.passed}


def _percent(fraction: float) -> str:
    """``87%``, ``0.4%``: a fraction in plain words (one decimal at most)."""
    text = f"{100 * fraction:.1f}".removesuffix(".0")
    return f"{text}%"


@dataclass(slots=True)
class EmptyAnswers:
    """Empty old answers (template scaffolding only), one by one, by fate under ``generate.regenerate``.

    ``regenerated``: in turns this run replaces (reported, never blocking); ``context``: in turns kept
    as context (``last``: every assistant turn but a final one; ``all``: none); ``excluded``: in samples
    kept out of generation. ``samples_with_empty_context`` is what the gate
    ``max_empty_response_fraction`` counts. ``regenerate_assumed``: the mode was not given (``regen
    audit`` without ``--regenerate``), the schema's default was assumed. The auditor counts with
    ``add``; a summary holds a copy.
    """

    regenerate: str
    regenerate_assumed: bool
    old_answers: int = 0
    empty: int = 0
    regenerated: int = 0
    context: int = 0
    excluded: int = 0
    samples_with_empty_context: int = 0

    def add(self, empty_turns: Sequence[bool], ends_with_answer: bool, excluded: bool) -> None:
        """One sample: per old answer (assistant turn, in order) whether it is empty."""
        n_empty = sum(empty_turns)
        self.old_answers += len(empty_turns)
        self.empty += n_empty
        if not n_empty:
            return
        if excluded:
            self.excluded += n_empty
            return
        replaced = regenerated_turns(len(empty_turns), ends_with_answer, self.regenerate)
        in_context = sum(e and not r for e, r in zip(empty_turns, replaced, strict=True))
        self.regenerated += n_empty - in_context
        self.context += in_context
        self.samples_with_empty_context += in_context > 0

    @property
    def mode_words(self) -> str:
        if self.regenerate_assumed:
            return f"regenerate: {self.regenerate}, assumed"
        return f"generate.regenerate: {self.regenerate}"

    def in_words(self) -> str:
        """One sentence: how many old answers are empty and what becomes of them."""
        if not self.old_answers:
            return "no sample has an old answer (every conversation ends with a prompt)"
        if not self.empty:
            return f"none of the {self.old_answers:,} old answers is empty"
        head = (
            f"{_percent(self.empty / self.old_answers)} of old answers are empty "
            f"({self.empty:,} of {self.old_answers:,}, template scaffolding only)"
        )
        if self.regenerated == self.empty:
            which = "all of them are" if self.empty > 1 else "it is"
            return f"{head}; {which} regenerated ({self.mode_words}), so none stays in the training data"
        parts = [f"{self.regenerated:,} regenerated ({self.mode_words})"] if self.regenerated else []
        if self.context:
            samples = self.samples_with_empty_context
            mode = "" if self.regenerated else f"{self.mode_words}; "
            parts.append(
                f"{self.context:,} kept as context in {samples:,} sample{'s' * (samples != 1)} "
                f"({mode}generate.regenerate: all would regenerate them)"
            )
        if self.excluded:
            parts.append(f"{self.excluded:,} in excluded samples (not generated)")
        return f"{head}: {', '.join(parts)}"

    def to_json(self) -> dict[str, Any]:
        return {
            "regenerate": self.regenerate,
            "regenerate_assumed": self.regenerate_assumed,
            "old_answers": self.old_answers,
            "empty": self.empty,
            "regenerated": self.regenerated,
            "context": self.context,
            "excluded": self.excluded,
            "samples_with_empty_context": self.samples_with_empty_context,
            "in_words": self.in_words(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EmptyAnswers:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def regenerated_turns(n_answers: int, ends_with_answer: bool, regenerate: str) -> list[bool]:
    """Per old answer (assistant turn, in order): does this run replace it?

    ``all`` replaces every one; ``last`` only a final assistant turn (a conversation ending with a user
    or tool turn gets a new answer and keeps every old one as context).
    """
    if regenerate == "all":
        return [True] * n_answers
    return [ends_with_answer and i == n_answers - 1 for i in range(n_answers)]


@dataclass(frozen=True, slots=True)
class AuditSummary:
    """Dataset-level result of an audit; ``to_json`` is ``summary.json``."""

    total: int
    flag_counts: Mapping[str, int]
    structure_error_kinds: Mapping[str, int]
    excluded: int
    excluded_reasons: Mapping[str, int]
    histograms: Mapping[str, Mapping[str, Any]]
    gates: tuple[GateResult, ...]
    overridden: bool
    context: Mapping[str, Any]
    empty_answers: EmptyAnswers
    unread_tails: tuple[str, ...] = ()
    contaminated_by: Mapping[str, int] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(g.passed for g in self.gates)

    @property
    def kept(self) -> int:
        return self.total - self.excluded

    def fraction(self, flag: str) -> float:
        return self.flag_counts.get(flag, 0) / self.total if self.total else 0.0

    def failed_gates(self) -> list[GateResult]:
        return [g for g in self.gates if not g.passed]

    def to_json(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "kept": self.kept,
            "excluded": self.excluded,
            "excluded_reasons": dict(self.excluded_reasons),
            "flagged_empty_response": self.flag_counts.get(EMPTY_RESPONSE, 0),
            "flagged_empty_response_fraction": self.fraction(EMPTY_RESPONSE),
            "empty_old_answers": self.empty_answers.to_json(),
            "structure_errors": self.flag_counts.get(STRUCTURE_ERROR, 0),
            "structure_error_kinds": dict(self.structure_error_kinds),
            "duplicate_prompts": self.flag_counts.get(DUPLICATE_PROMPT, 0),
            "over_length": self.flag_counts.get(OVER_LENGTH, 0),
            "bad_rows": self.flag_counts.get(BAD_ROW, 0),
            "whitespace_duplicate_prompts": self.flag_counts.get(WHITESPACE_DUPLICATE_PROMPT, 0),
            "unread_tails": list(self.unread_tails),
            "contaminated": self.flag_counts.get(CONTAMINATED, 0),
            "contaminated_by": dict(self.contaminated_by),
            "flag_counts": {f: self.flag_counts.get(f, 0) for f in FLAG_NAMES},
            "flag_fractions": {f: self.fraction(f) for f in FLAG_NAMES},
            "histograms": dict(self.histograms),
            "gates": {g.name: g.to_json() for g in self.gates},
            "passed": self.passed,
            "overridden": self.overridden and not self.passed,
            **dict(self.context),
        }


def evaluate_gates(
    total: int,
    flag_counts: Mapping[str, int],
    limits: Mapping[str, float],
    empty_answers: EmptyAnswers,
    unread_tail_files: int = 0,
) -> tuple[GateResult, ...]:
    """Each gate's value against its limit (a value equal to the limit passes).

    ``max_empty_response_fraction`` counts the samples that keep an empty old answer as context:
    empty answers this run regenerates are reported (``empty_answers``), never blocking.
    """

    def frac(n: int) -> float:
        return n / total if total else 0.0

    values = {
        "max_empty_response_fraction": frac(empty_answers.samples_with_empty_context),
        "max_structure_error_fraction": frac(
            flag_counts.get(STRUCTURE_ERROR, 0) + flag_counts.get(BAD_ROW, 0)
        ),
        "max_over_length_fraction": frac(flag_counts.get(OVER_LENGTH, 0)),
        "max_unread_tail_files": float(unread_tail_files),
    }
    return tuple(
        GateResult(name, limits[name], values[name], values[name] <= limits[name]) for name in values
    )


def gate_failure_message(
    summary: AuditSummary, summary_path: str | Path | None = None, rows_path: str | Path | None = None
) -> str:
    """A multi-line explanation of every failed gate and how to override (``rows_path``: where the
    excluded rows are kept with their reasons)."""
    lines = ["audit gate(s) failed, so generation will not start:"]
    for g in summary.failed_gates():
        lines.append(
            f"  - audit.gates.{g.name}: value {g.value:.4f} > limit {g.limit:.4f} "
            f"({GATE_MEANING.get(g.name, g.name)})"
        )
        if g.name == "max_empty_response_fraction":
            lines.append(f"    {summary.empty_answers.in_words()};")
            kept = summary.empty_answers.context
            lines.append(
                "    set generate.regenerate: all (regen audit --regenerate all) to regenerate every "
                f"assistant turn instead of keeping the {kept:,} empty one(s) as context"
            )
    for tail in summary.unread_tails:
        lines.append(f"  - unread tail: {tail}")
    lines.append(f"  ({summary.total} samples audited)")
    if summary_path is not None:
        lines.append(f"details: {summary_path}")
    if rows_path is not None and summary.excluded:
        lines.append(f"each excluded row with its reason: {rows_path}")
    lines.append(
        "to go on anyway, raise the limit in the config (audit.gates.<name>) or set "
        "audit.override_gates: true (CLI: --override-gates); violated gates are then reported as warnings."
    )
    return "\n".join(lines)


def nothing_to_generate_message(
    summary: AuditSummary,
    input_path: str | Path,
    summary_path: str | Path,
    rows_path: str | Path | None = None,
) -> str:
    """Why no sample is left: an empty input, or every row excluded (with the reasons, and where each
    excluded row is kept with its own). No server has started: ``regen check`` fails a dataset whose
    first rows are all excluded before any job, and the prestart (``regen.tune.prestart``) starts none
    when its first pass keeps no row, which it cannot when the whole audit keeps none."""
    if summary.total == 0:
        what = f"{input_path}: the dataset has no rows"
    else:
        reasons = ", ".join(f"{r}={n}" for r, n in summary.excluded_reasons.items())
        what = f"{input_path}: all {summary.total} rows are excluded ({reasons})"
        if rows_path is not None:
            what += f"; each row with its reason: {rows_path}"
    return (
        f"{what}, so there is nothing to generate; stopping before any server starts "
        f"(details: {summary_path}; this is not a gate and cannot be overridden)"
    )


def format_summary(summary: AuditSummary) -> str:
    """A readable table of the summary."""
    rows: list[tuple[str, str, str]] = [("samples", str(summary.total), "")]
    for flag in FLAG_NAMES:
        n = summary.flag_counts.get(flag, 0)
        rows.append((flag, str(n), f"{summary.fraction(flag):.2%}"))
    rows.append(
        (
            "excluded",
            str(summary.excluded),
            f"{summary.excluded / summary.total:.2%}" if summary.total else "",
        )
    )
    rows.append(("kept for generation", str(summary.kept), ""))
    for name, hist in summary.histograms.items():
        mean = hist["mean"]
        rows.append((f"{name} (min/mean/max)", f"{hist['min']}/{mean or 0:.1f}/{hist['max']}", ""))
    width = max(len(r[0]) for r in rows)
    lines = [f"{name:<{width}}  {value:>12}  {pct:>8}" for name, value, pct in rows]
    if summary.structure_error_kinds:
        kinds = ", ".join(f"{k}={v}" for k, v in summary.structure_error_kinds.items())
        lines.append(f"structure faults: {kinds}")
    if summary.contaminated_by:
        lines.append("contaminated by: " + ", ".join(f"{k}={v}" for k, v in summary.contaminated_by.items()))
    empty = summary.empty_answers
    if empty.regenerate_assumed:
        lines.append(
            f"regenerate: {empty.regenerate} (assumed: no workflow config; choose with --regenerate "
            f"{'|'.join(regenerate_setting()['enum'])})"
        )
    else:
        lines.append(f"regenerate: {empty.regenerate} (the run's generate.regenerate)")
    lines.append(f"empty old answers: {empty.in_words()}")
    ids = summary.context.get("ids")
    if isinstance(ids, Mapping) and ids.get("in_words"):
        lines.append(str(ids["in_words"]))
    lines.append("gates:")
    for g in summary.gates:
        verdict = "ok" if g.passed else "FAILED"
        lines.append(f"  {g.name:<30} value {g.value:.4f}  limit {g.limit:.4f}  {verdict}")
    lines.append(f"verdict: {'passed' if summary.passed else 'FAILED'}")
    return "\n".join(lines)


def summary_from_file(path: Path) -> AuditSummary:
    data = orjson.loads(path.read_bytes())
    return AuditSummary(
        total=data["total"],
        flag_counts=data["flag_counts"],
        structure_error_kinds=data["structure_error_kinds"],
        excluded=data["excluded"],
        excluded_reasons=data["excluded_reasons"],
        histograms=data["histograms"],
        gates=tuple(GateResult(k, v["limit"], v["value"], v["passed"]) for k, v in data["gates"].items()),
        overridden=data["overridden"],
        context={"ids": data["ids"]} if "ids" in data else {},
        empty_answers=EmptyAnswers.from_json(data["empty_old_answers"]),
        unread_tails=tuple(data.get("unread_tails", ())),
        contaminated_by=data.get("contaminated_by", {}),
    )
