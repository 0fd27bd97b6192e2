"""The pre-generation audit: per-sample flags, dataset-level summary, gates.

Flags (a sample may carry several):

* ``bad_row``: the row could not be read at all (``regen.ingest.dataset`` collected a BadRow);
* ``structure_error``: the conversation breaks the role rules below, has empty or
  non-text content, an unknown role, or repeats an earlier sample's id;
* ``over_length``: the prompt (conversation up to the last assistant turn, plus the
  generation prompt) has more tokens than ``context_limit``;
* ``duplicate_prompt``: the prompt messages equal an earlier sample's (first one kept);
* ``contaminated``: a prompt turn shares an n-gram with a benchmark prompt named in
  ``audit.decontamination`` (``regen.ingest.decontam``); the detail names the benchmark and item;
* ``whitespace_duplicate_prompt``: the prompt equals an earlier sample's except for whitespace
  (compared with all whitespace left out); kept by default, excluded when listed in ``exclude``;
* ``empty_response``: every assistant turn is template scaffolding only (an empty think
  block and end-of-turn, or nothing); for tokenized rows also when the row's own loss
  mask sums to at most ``scaffolding_max_tokens``. Samples without any assistant turn
  (prompt-only rows) have no old answer and are not flagged.

Empty old answers are also counted one by one, by fate under ``generate.regenerate``
(``EmptyAnswers``): in turns this run regenerates (replaced, so reported and never blocking), in
turns kept as context (with ``last``, every assistant turn but a final one; with ``all``, none), and
in excluded samples. The gate ``max_empty_response_fraction`` judges only what stays: the fraction of
samples that keep an empty old answer as context.

Every input row gets exactly one verdict: unreadable rows under a placeholder id
(``row/<n>:<file>``; real ids cannot contain ``/``), the rest under their id. A file whose tail
cannot be read (truncated compression, I/O error, broken structure) fails the gate
``max_unread_tail_files`` (0 by default) with how much was unread, and a dataset with no sample
left for generation fails whatever the gates say: both before any server starts.

Content that is a list with non-text parts is a ``non_text_content`` fault naming the part types;
an over-long row (more characters than ``context_limit`` tokens could hold under the tokenizer's
longest token) is flagged ``over_length`` without being tokenized, so one huge line costs memory in
proportion to its size, not to its token count.

Role rules: ``system`` (or ``developer``, for templates that render it) only at index 0; after
it the conversation starts with ``user``; ``user`` and ``assistant`` alternate (two users or two
assistants in a row are a fault);
``tool`` turns may follow an assistant turn or another tool turn, and the turn after
tool results is ``assistant`` or ``tool``. ``user``/``tool`` content must be non-empty text;
system content may be empty; assistant content may be empty (that is ``empty_response``).

The same code audits any stream of ``Sample``s (``Auditor`` / ``audit_records``), so the
merged output can be re-audited without a file.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import sys
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from regen.chat import ChatTemplate, TokenAccount, to_template_dicts
from regen.ingest.dataset import DatasetConfig, iter_samples
from regen.ingest.decontam import BenchmarkIndex, BenchmarkSpec, Contamination, DecontaminationConfig
from regen.io import atomic_open, atomic_path, write_json
from regen.layout import AuditFiles
from regen.records import FLAGS_SCHEMA, SHARD_SCHEMA, SampleRows
from regen.runconfig import section_schema, validated
from regen.types import DEVELOPER_ROLE, KNOWN_ROLES, BadInputError, BadRow, Message, Sample, prompt_end
from regen.verdict import keep_verdict

log = logging.getLogger(__name__)

BAD_ROW = "bad_row"
STRUCTURE_ERROR = "structure_error"
OVER_LENGTH = "over_length"
DUPLICATE_PROMPT = "duplicate_prompt"
WHITESPACE_DUPLICATE_PROMPT = "whitespace_duplicate_prompt"
EMPTY_RESPONSE = "empty_response"
CONTAMINATED = "contaminated"
# also the priority order of exclude reasons
FLAG_NAMES: tuple[str, ...] = (
    BAD_ROW,
    STRUCTURE_ERROR,
    OVER_LENGTH,
    CONTAMINATED,
    DUPLICATE_PROMPT,
    WHITESPACE_DUPLICATE_PROMPT,
    EMPTY_RESPONSE,
)
GATE_MEANING: dict[str, str] = {
    "max_empty_response_fraction": "fraction of samples that keep an empty old answer (template scaffolding "
    "only) as context: a turn generate.regenerate does not replace",
    "max_structure_error_fraction": "fraction of samples with structure faults or unreadable rows",
    "max_over_length_fraction": "fraction of prompts longer than audit.context_limit tokens",
    "max_unread_tail_files": "input files that could not be read to the end (their remaining rows are lost)",
}
BATCH_SIZE = 1024
PARQUET_BATCH_ROWS = 65536
DIGEST_BYTES = 8


class AuditGateError(RuntimeError):
    """A dataset-level gate failed; the message says which, by how much, and how to override."""


class NothingToGenerateError(AuditGateError):
    """No sample is left for generation (an empty input, or everything excluded); not overridable."""


# --------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AuditConfig:
    """The ``audit`` config section (built by :meth:`from_dict`: the schema's defaults filled in and its
    rules applied), with the run's ``generate.regenerate``."""

    context_limit: int
    scaffolding_max_tokens: int
    gates: Mapping[str, float]
    override_gates: bool
    exclude: frozenset[str]
    decontamination: DecontaminationConfig
    #: ``generate.regenerate`` (which old answers this run replaces); None: not given, the schema's
    #: default is assumed and the summary says so
    regenerate: str | None

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None, regenerate: str | None = None) -> AuditConfig:
        """Validate ``raw`` against the schema's ``audit`` section, fill its defaults, and type it;
        ``regenerate`` is ``generate.regenerate`` (None: not known here)."""
        modes = regenerate_setting()["enum"]
        if regenerate is not None and regenerate not in modes:
            raise ValueError(f"generate.regenerate: {regenerate!r} is not one of {', '.join(modes)}")
        a = validated("audit", raw)
        return cls(
            context_limit=int(a["context_limit"]),
            scaffolding_max_tokens=int(a["scaffolding_max_tokens"]),
            gates={name: float(limit) for name, limit in a["gates"].items()},
            override_gates=bool(a["override_gates"]),
            exclude=frozenset(a["exclude"]),
            decontamination=DecontaminationConfig.from_dict(a["decontamination"]),
            regenerate=regenerate,
        )


def regenerate_setting() -> dict[str, Any]:
    """``generate.regenerate`` as the config schema defines it: ``enum`` and ``default`` live there."""
    return section_schema("generate")["properties"]["regenerate"]


# --------------------------------------------------------------------------------------
# Per-sample checks
# --------------------------------------------------------------------------------------

_ALLOWED_AFTER: dict[str | None, frozenset[str]] = {
    None: frozenset({"user"}),
    "user": frozenset({"assistant"}),
    "assistant": frozenset({"user", "tool"}),
    "tool": frozenset({"assistant", "tool"}),
}


def structure_faults(messages: Sequence[Message]) -> list[str]:
    """Every structure fault of a conversation, as ``kind: where`` strings (empty when sound)."""
    if not messages:
        return ["no_turns: the conversation has no messages"]
    faults: list[str] = []
    prev: str | None = None
    has_user = False
    for i, m in enumerate(messages):
        role, content = m.role, m.content
        if role not in KNOWN_ROLES and role != DEVELOPER_ROLE:
            faults.append(f"unknown_role: message {i} has role {role!r}")
            continue
        if content is not None and not isinstance(content, str):
            faults.append(f"non_text_content: message {i} ({role}) has {_content_kind(content)}")
        elif role in ("user", "tool") and (content is None or not content.strip()):
            faults.append(f"empty_content: message {i} ({role}) is empty")
        if role in ("system", DEVELOPER_ROLE):
            if i != 0:
                faults.append(f"system_not_first: message {i} is a system turn")
            continue
        has_user = has_user or role == "user"
        if role not in _ALLOWED_AFTER[prev]:
            after = f"after {prev}" if prev else "at the start"
            faults.append(f"bad_role_order: message {i} ({role}) {after}")
        prev = role
    if not has_user:
        faults.append("no_user_turn: the conversation has no user turn")
    return faults


def _content_kind(content: Any) -> str:
    """``list content with parts image_url, text`` / ``int content``: what a non-text content holds."""
    if isinstance(content, list):
        kinds = sorted({p.get("type") if isinstance(p, dict) else type(p).__name__ for p in content}, key=str)
        return f"list content with parts {', '.join(map(str, kinds)) or 'none'} (only text parts are read)"
    return f"{type(content).__name__} content"


def fault_kind(fault: str) -> str:
    return fault.split(":", 1)[0]


# every whitespace character (str.isspace) mapped to nothing: one C pass, no per-word objects
_DROP_WHITESPACE = {c: None for c in range(0x3001) if chr(c).isspace()}
_ASCII_WHITESPACE = bytes(c for c in range(128) if chr(c).isspace())


def _without_whitespace(text: str) -> bytes:
    """``text`` as UTF-8 with every whitespace character left out (ASCII text: one C pass)."""
    if not text.isascii():
        text = text.translate(_DROP_WHITESPACE)
    return text.encode("utf-8", "surrogatepass").translate(None, _ASCII_WHITESPACE)


def prompt_digest(dicts: Sequence[Mapping[str, Any]], squash_whitespace: bool = False) -> bytes:
    """8-byte blake2b of the prompt messages (everything before a final assistant turn).

    With ``squash_whitespace`` whitespace is left out, so prompts that differ only in whitespace get
    one digest.
    """
    prompt = dicts[: prompt_end([d["role"] for d in dicts])]
    if not squash_whitespace:
        payload = orjson.dumps(
            [(d["role"], d["content"], d.get("reasoning_content"), d.get("tool_calls")) for d in prompt]
        )
        return hashlib.blake2b(payload, digest_size=DIGEST_BYTES).digest()
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    for d in prompt:
        reasoning, calls = d.get("reasoning_content"), d.get("tool_calls")
        h.update(d["role"].encode() + b"\x00")
        h.update(_without_whitespace(d["content"]) + b"\x00")
        h.update(b"\x01" if reasoning is None else _without_whitespace(reasoning) + b"\x00")
        h.update(b"\x01" if calls is None else orjson.dumps(calls).translate(None, _ASCII_WHITESPACE))
        h.update(b"\x1e")
    return h.digest()


def bad_row_id(bad: BadRow) -> str:
    """The placeholder id of an unreadable row: ``row/<n>:<file>``. Real ids cannot contain ``/``
    (``regen.ingest.dataset.check_id``), so a placeholder never equals a real id."""
    return f"row/{bad.row}:{bad.file}"


@dataclass(frozen=True, slots=True)
class SampleAudit:
    """The audit verdict for one input row."""

    id: str
    file: str | None
    row: int | None
    format: str | None
    flags: tuple[str, ...]
    supervised_tokens: int | None
    prompt_tokens: int | None
    excluded: bool
    exclude_reason: str | None
    detail: str | None
    id_json: str | None = None

    def excluded_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "reason": self.exclude_reason,
            "file": self.file,
            "row": self.row,
        }
        if self.id_json is not None:
            out["id_json"] = self.id_json
        if self.detail:
            out["detail"] = self.detail
        return out


# --------------------------------------------------------------------------------------
# Histograms
# --------------------------------------------------------------------------------------


@dataclass(slots=True)
class Log2Histogram:
    """Counts in power-of-two buckets: bucket 0 holds 0, bucket k holds [2^(k-1), 2^k)."""

    counts: list[int] = field(default_factory=lambda: [0] * 40)
    n: int = 0
    total: int = 0
    min: int | None = None
    max: int | None = None

    def add(self, value: int) -> None:
        self.counts[min(value.bit_length(), 39)] += 1
        self.n += 1
        self.total += value
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

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.n,
            "min": self.min,
            "max": self.max,
            "mean": (self.total / self.n) if self.n else None,
            "buckets": self.buckets(),
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


def gate_failure_message(summary: AuditSummary, summary_path: str | Path | None = None) -> str:
    """A multi-line explanation of every failed gate and how to override."""
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
    lines.append(
        "to go on anyway, raise the limit in the config (audit.gates.<name>) or set "
        "audit.override_gates: true (CLI: --override-gates); violated gates are then reported as warnings."
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# The auditor (works on any stream of Samples)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OversizeAccount:
    """The token account of a row too long to tokenize: prompt tokens (exact, or a lower bound)."""

    prompt_tokens: int
    note: str


def _turn_chars(d: Mapping[str, Any]) -> int:
    n = len(d["content"]) + len(d.get("reasoning_content") or "")
    calls = d.get("tool_calls")
    return n + (len(orjson.dumps(calls, default=str)) if calls else 0)


class Auditor:
    """Stateful auditor: feed samples (in batches) and bad rows; read the summary at the end.

    Memory: one 8-byte digest per distinct prompt and per distinct id, plus counters, plus
    12 bytes per benchmark n-gram when decontamination is configured.
    """

    def __init__(self, cfg: AuditConfig, chat: ChatTemplate) -> None:
        self.cfg = cfg
        self.chat = chat
        decontam = cfg.decontamination
        self.benchmarks = BenchmarkIndex.build(decontam) if decontam.enabled else None
        self.contaminated_by: Counter[str] = Counter()
        self._seen_prompts: set[bytes] = set()
        self._seen_squashed_prompts: set[bytes] = set()
        self._seen_ids: set[bytes] = set()
        self.unread_tails: list[str] = []
        # rows with more characters than this are not tokenized (see oversize_chars)
        self.untokenized_chars = cfg.context_limit * chat.max_token_chars
        self.flag_counts: Counter[str] = Counter()
        self.structure_kinds: Counter[str] = Counter()
        self.excluded_reasons: Counter[str] = Counter()
        self.total = 0
        self.excluded = 0
        self.supervised_hist = Log2Histogram()
        self.prompt_hist = Log2Histogram()
        self.empty_answers = EmptyAnswers(
            cfg.regenerate or regenerate_setting()["default"], regenerate_assumed=cfg.regenerate is None
        )
        # prompt lengths of the samples that go on to generation (4 bytes each): exact percentiles
        # for the server planner, which sizes the KV cache for running x (p99 + max_tokens)
        self.kept_prompt_tokens = array("I")

    def _finish(self, audit: SampleAudit) -> SampleAudit:
        self.total += 1
        self.flag_counts.update(audit.flags)
        if audit.excluded:
            self.excluded += 1
            self.excluded_reasons[audit.exclude_reason or ""] += 1
        elif audit.prompt_tokens is not None:
            self.kept_prompt_tokens.append(audit.prompt_tokens)
        return audit

    def _exclusion(self, flags: Sequence[str]) -> str | None:
        return next((f for f in FLAG_NAMES if f in flags and f in self.cfg.exclude), None)

    def audit_bad_row(self, bad: BadRow) -> SampleAudit:
        """The verdict for an unreadable row (an unreadable tail is also listed for its gate)."""
        if bad.unread_tail:
            self.unread_tails.append(str(bad))
        flags = (BAD_ROW,)
        reason = self._exclusion(flags)
        detail = f"field {bad.field!r}: {bad.problem}"
        return self._finish(
            SampleAudit(
                bad_row_id(bad),
                bad.file,
                bad.row,
                None,
                flags,
                None,
                None,
                reason is not None,
                reason,
                detail,
            )
        )

    def audit_batch(self, samples: Sequence[Sample]) -> list[SampleAudit]:
        """Verdicts for a batch of samples, in order (duplicates judged against everything seen so far)."""
        dicts = [to_template_dicts(s.messages) for s in samples]
        oversize = [self.oversize_chars(d) for d in dicts]
        normal = [i for i, n in enumerate(oversize) if n is None]
        rendered = self.chat.render_batch([dicts[i] for i in normal], [samples[i].tools for i in normal])
        accounts = self.chat.account_encoded(rendered, self.chat.encode_rendered(rendered))
        return self.finish_batch(samples, dicts, self.merge_accounts(samples, dicts, normal, accounts))

    def oversize_chars(self, dicts: Sequence[Mapping[str, Any]]) -> tuple[int, int] | None:
        """``(prompt chars, total chars)`` of a conversation too long to tokenize whole, else None.

        Too long: more characters than ``context_limit`` tokens can stand for. Such a row is judged
        from character counts (its prompt is tokenized only when short enough), so memory stays in
        proportion to the row's size.
        """
        sizes = [_turn_chars(d) for d in dicts]
        total = sum(sizes)
        if total <= self.untokenized_chars:
            return None
        return sum(sizes[: prompt_end([d["role"] for d in dicts])]), total

    def merge_accounts(
        self,
        samples: Sequence[Sample],
        dicts: Sequence[list[dict[str, Any]]],
        normal: Sequence[int],
        accounts: Sequence[TokenAccount],
    ) -> list[TokenAccount | OversizeAccount]:
        """Token accounts for the rows at ``normal``, character-based ones for the oversize rest."""
        out: list[TokenAccount | OversizeAccount] = []
        it = iter(accounts)
        normal_set = set(normal)
        for i, (sample, d) in enumerate(zip(samples, dicts, strict=True)):
            out.append(next(it) if i in normal_set else self._oversize_account(sample, d))
        return out

    def _oversize_account(self, sample: Sample, dicts: list[dict[str, Any]]) -> OversizeAccount:
        sizes = self.oversize_chars(dicts)
        assert sizes is not None
        prompt_chars, total_chars = sizes
        if prompt_chars > self.untokenized_chars:
            tokens = -(-prompt_chars // self.chat.max_token_chars)
            note = f"prompt of {prompt_chars:,} characters: at least {tokens:,} tokens (not tokenized)"
        else:
            prompt = dicts[: prompt_end([d["role"] for d in dicts])]
            text = self.chat.render_dicts(prompt, True, True, tools=sample.tools)
            tokens = len(self.chat.tokenizer.encode(text, add_special_tokens=False))
            note = f"conversation of {total_chars:,} characters: answer not tokenized"
        return OversizeAccount(tokens, note)

    def finish_batch(
        self,
        samples: Sequence[Sample],
        dicts: Sequence[list[dict[str, Any]]],
        accounts: Sequence[TokenAccount | OversizeAccount],
    ) -> list[SampleAudit]:
        """Verdicts from precomputed template dicts and token accounts (see ``iter_audits``)."""
        found: list[Contamination | None] = [None] * len(samples)
        if self.benchmarks is not None:
            found = self.benchmarks.check(s.messages for s in samples)
        return [
            self._audit_one(s, d, a, c) for s, d, a, c in zip(samples, dicts, accounts, found, strict=True)
        ]

    def _duplicate_prompt_flag(self, dicts: list[dict[str, Any]]) -> str | None:
        digest = prompt_digest(dicts)
        squashed = prompt_digest(dicts, squash_whitespace=True)
        if digest in self._seen_prompts:
            return DUPLICATE_PROMPT
        self._seen_prompts.add(digest)
        if squashed in self._seen_squashed_prompts:
            return WHITESPACE_DUPLICATE_PROMPT
        self._seen_squashed_prompts.add(squashed)
        return None

    def _audit_one(
        self,
        sample: Sample,
        dicts: list[dict[str, Any]],
        acc: TokenAccount | OversizeAccount,
        found: Contamination | None = None,
    ) -> SampleAudit:
        cfg = self.cfg
        flags: list[str] = []
        faults = structure_faults(sample.messages)
        source = sample.source
        id_json = source.get("id_json")
        id_digest = hashlib.blake2b(sample.id.encode(), digest_size=DIGEST_BYTES).digest()
        if id_digest in self._seen_ids:
            written = f' (written {id_json}; ids compare as text, so 1 and "1" are one id)' if id_json else ""
            faults.append(f"duplicate_id: id {sample.id!r} was used by an earlier sample{written}")
        else:
            self._seen_ids.add(id_digest)
        if faults:
            flags.append(STRUCTURE_ERROR)
            self.structure_kinds.update({fault_kind(f) for f in faults})
        if acc.prompt_tokens > cfg.context_limit:
            flags.append(OVER_LENGTH)
        if found is not None:
            flags.append(CONTAMINATED)
            self.contaminated_by[found.benchmark] += 1
        if not faults:
            dup = self._duplicate_prompt_flag(dicts)
            if dup is not None:
                flags.append(dup)
        notes = list(faults)
        mask_tokens = source.get("mask_supervised_tokens")
        supervised: int | None
        empty_turns: tuple[bool, ...]  # per old answer: template scaffolding only?
        if isinstance(acc, OversizeAccount):
            notes.append(acc.note)
            supervised = None if mask_tokens is None else int(mask_tokens)
            empty_turns = (False,) * sum(m.role == "assistant" for m in sample.messages)  # not tokenized
        else:
            supervised = acc.supervised_tokens if mask_tokens is None else int(mask_tokens)
            empty_turns = acc.scaffolding_turns
            mask_empty = mask_tokens is not None and supervised <= cfg.scaffolding_max_tokens
            if mask_empty:  # the row's own loss mask supervises next to nothing: every old answer is empty
                empty_turns = (True,) * len(empty_turns)
            if acc.scaffolding_only or mask_empty:
                flags.append(EMPTY_RESPONSE)
        if supervised is not None:
            self.supervised_hist.add(supervised)
        self.prompt_hist.add(acc.prompt_tokens)
        reason = self._exclusion(flags)
        roles = [m.role for m in sample.messages]
        self.empty_answers.add(empty_turns, prompt_end(roles) < len(roles), excluded=reason is not None)
        return self._finish(
            SampleAudit(
                id=sample.id,
                file=source.get("file"),
                row=source.get("row"),
                format=source.get("format"),
                flags=tuple(flags),
                supervised_tokens=supervised,
                prompt_tokens=acc.prompt_tokens,
                excluded=reason is not None,
                exclude_reason=reason,
                detail="; ".join([*notes, found.detail()] if found else notes) or None,
                id_json=id_json,
            )
        )

    def summary(self, context: Mapping[str, Any] | None = None) -> AuditSummary:
        """The dataset-level summary of everything audited so far."""
        return AuditSummary(
            total=self.total,
            flag_counts=dict(self.flag_counts),
            structure_error_kinds=dict(sorted(self.structure_kinds.items())),
            excluded=self.excluded,
            excluded_reasons=dict(sorted(self.excluded_reasons.items())),
            histograms={
                "supervised_tokens": self.supervised_hist.to_json(),
                "prompt_tokens": self.prompt_hist.to_json(),
            },
            gates=evaluate_gates(
                self.total, self.flag_counts, self.cfg.gates, self.empty_answers, len(self.unread_tails)
            ),
            overridden=self.cfg.override_gates,
            context={
                "context_limit": self.cfg.context_limit,
                **kept_prompt_percentiles(self.kept_prompt_tokens),
                **({"decontamination": self.benchmarks.summary_json()} if self.benchmarks else {}),
                **(context or {}),
            },
            empty_answers=replace(self.empty_answers),
            unread_tails=tuple(self.unread_tails),
            contaminated_by=dict(sorted(self.contaminated_by.items())),
        )


def kept_prompt_percentiles(tokens: array) -> dict[str, int]:
    """``prompt_tokens_p50``/``p99`` of the kept samples (the observed value at or above each quantile)."""
    if not tokens:
        return {}
    values = np.frombuffer(tokens, dtype=np.uint32)
    p50, p99 = np.percentile(values, [50, 99], method="higher")
    return {"prompt_tokens_p50": int(p50), "prompt_tokens_p99": int(p99)}


def _batched(it: Iterable[Sample], size: int) -> Iterator[list[Sample]]:
    batch: list[Sample] = []
    for s in it:
        batch.append(s)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def iter_audits(
    auditor: Auditor,
    samples: Iterable[Sample],
    bad_rows: list[BadRow] | None = None,
    batch_size: int = BATCH_SIZE,
) -> Iterator[SampleAudit]:
    """Stream verdicts for ``samples``; BadRows appended to ``bad_rows`` meanwhile are drained and judged too.

    Pipelined: while a worker thread tokenizes batch k (the tokenizer releases the GIL), this
    thread reads and renders batch k+1. Verdicts still come out in input order.
    """
    chat = auditor.chat

    def drain() -> Iterator[SampleAudit]:
        if bad_rows:
            for bad in bad_rows:
                yield auditor.audit_bad_row(bad)
            bad_rows.clear()

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-encode") as pool:
        pending: _Pending | None = None
        for batch in _batched(samples, batch_size):
            dicts = [to_template_dicts(s.messages) for s in batch]
            normal = [i for i, d in enumerate(dicts) if auditor.oversize_chars(d) is None]
            rendered = chat.render_batch([dicts[i] for i in normal], [batch[i].tools for i in normal])
            future = pool.submit(chat.encode_rendered, rendered)
            if pending is not None:
                yield from _finish_pending(auditor, pending)
            yield from drain()
            pending = _Pending(batch, dicts, normal, rendered, future)
        if pending is not None:
            yield from _finish_pending(auditor, pending)
        yield from drain()


@dataclass(frozen=True, slots=True)
class _Pending:
    """A batch rendered and queued for encoding; ``normal`` indexes the rows that are tokenized."""

    batch: list[Sample]
    dicts: list[list[dict[str, Any]]]
    normal: list[int]
    rendered: Any
    future: Future[Any]


def _finish_pending(auditor: Auditor, p: _Pending) -> list[SampleAudit]:
    accounts = auditor.chat.account_encoded(p.rendered, p.future.result())
    return auditor.finish_batch(
        p.batch, p.dicts, auditor.merge_accounts(p.batch, p.dicts, p.normal, accounts)
    )


def audit_records(
    samples: Iterable[Sample],
    config: AuditConfig,
    chat: ChatTemplate,
    bad_rows: Iterable[BadRow] = (),
) -> tuple[list[SampleAudit], AuditSummary]:
    """Audit an in-memory stream of samples (no files): per-sample verdicts and the summary."""
    auditor = Auditor(config, chat)
    audits = list(iter_audits(auditor, samples))
    audits.extend(auditor.audit_bad_row(b) for b in bad_rows)
    return audits, auditor.summary()


# --------------------------------------------------------------------------------------
# Outputs
# --------------------------------------------------------------------------------------


class FlagsWriter:
    """Buffers verdicts into columns and writes ``flags.parquet`` row-group by row-group."""

    def __init__(self, writer: pq.ParquetWriter, rows_per_batch: int = PARQUET_BATCH_ROWS) -> None:
        self._writer = writer
        self._rows = rows_per_batch
        self._cols: dict[str, list[Any]] = {name: [] for name in FLAGS_SCHEMA.names}

    def add(self, a: SampleAudit) -> None:
        c = self._cols
        c["id"].append(a.id)
        c["file"].append(a.file)
        c["row"].append(a.row)
        c["format"].append(a.format)
        c["flags"].append(list(a.flags))
        c["supervised_tokens"].append(a.supervised_tokens)
        c["prompt_tokens"].append(a.prompt_tokens)
        c["excluded"].append(a.excluded)
        c["exclude_reason"].append(a.exclude_reason)
        c["detail"].append(a.detail)
        c["id_json"].append(a.id_json)
        if len(c["id"]) >= self._rows:
            self.flush()

    def flush(self) -> None:
        if not self._cols["id"]:
            return
        self._writer.write_table(pa.table(self._cols, schema=FLAGS_SCHEMA))
        for col in self._cols.values():
            col.clear()


def _plot_histogram(hist: Mapping[str, Any], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    buckets = hist["buckets"]
    labels = [str(b["lo"]) if b["lo"] == b["hi"] else f"{b['lo']}-{b['hi']}" for b in buckets]
    fig, ax = plt.subplots(figsize=(8, 4))
    try:
        ax.bar(range(len(buckets)), [b["count"] for b in buckets], color="#4472c4")
        ax.set_xticks(range(len(buckets)), labels, rotation=45, ha="right", fontsize=8)
        ax.set_xlabel("tokens (power-of-two buckets)")
        ax.set_ylabel("samples")
        ax.set_title(f"{title} (n={hist['count']}, mean={hist['mean'] or 0:.1f})")
        fig.tight_layout()
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="svg")
    finally:
        plt.close(fig)


def run_audit(
    input_path: str | Path,
    out_dir: str | Path,
    config: AuditConfig,
    tokenizer_dir: str | Path,
    dataset: DatasetConfig,
    verdict_out: str | Path | None = None,
) -> AuditSummary:
    """Audit one dataset file; write summary.json, flags.parquet, excluded.jsonl, the kept samples
    (samples.parquet, the shard step's input) and the plots.

    ``input_path`` is the local file (the workflow's copy of ``dataset.path``); ``dataset`` says how to
    read it. ``config.regenerate`` is ``generate.regenerate``: which old answers this run replaces, so
    which empty ones the gate ``max_empty_response_fraction`` judges (None: the schema's default,
    assumed and said so).

    Raises ``AuditGateError`` (after writing every output) when a gate fails and gates are not
    overridden, and ``NothingToGenerateError`` when no sample is left for generation; the summary is
    also kept at ``verdict_out`` (beside the log), which survives the failed job.
    """
    chat = ChatTemplate.from_dir(tokenizer_dir)
    paths = AuditFiles(Path(out_dir))
    auditor = Auditor(config, chat)
    bad_rows: list[BadRow] = []
    samples = iter_samples(
        input_path,
        dataset.format,
        dataset.id_column,
        dataset.on_bad_row,
        tokenizer_dir,
        bad_rows,
        developer_role=chat.developer_role,
    )
    awaiting_verdict: dict[tuple[Any, Any], Sample] = {}  # the shard step gets the kept ones: one parse

    def remembered(stream: Iterable[Sample]) -> Iterator[Sample]:
        for sample in stream:
            awaiting_verdict[(sample.source.get("file"), sample.source.get("row"))] = sample
            yield sample

    with (
        atomic_path(paths.flags) as flags_tmp,
        pq.ParquetWriter(flags_tmp, FLAGS_SCHEMA, compression="zstd") as pw,
        atomic_open(paths.excluded, "wb") as excluded_fh,
        atomic_path(paths.samples) as samples_tmp,
        pq.ParquetWriter(samples_tmp, SHARD_SCHEMA, compression="zstd") as samples_pw,
    ):
        flags_writer = FlagsWriter(pw)
        kept = SampleRows(samples_pw)
        for audit in iter_audits(auditor, remembered(samples), bad_rows):
            flags_writer.add(audit)
            sample = awaiting_verdict.pop((audit.file, audit.row), None)
            if audit.excluded:
                excluded_fh.write(orjson.dumps(audit.excluded_json()) + b"\n")
            elif sample is not None:
                kept.add(sample)
        flags_writer.flush()
        kept.flush()
    summary = auditor.summary(
        {
            "input": str(input_path),
            "tokenizer": str(tokenizer_dir),
            "format": dataset.format,
            "fast_renderer": chat.uses_fast_renderer,
        }
    )
    _plot_histogram(
        summary.histograms["supervised_tokens"], "supervised tokens per sample", paths.supervised_plot
    )
    _plot_histogram(summary.histograms["prompt_tokens"], "prompt tokens per sample", paths.prompt_plot)
    write_json(paths.summary, summary.to_json())
    keep_verdict(summary.to_json(), verdict_out)
    log.info("empty old answers: %s", summary.empty_answers.in_words())
    if summary.kept == 0:
        raise NothingToGenerateError(
            nothing_to_generate_message(summary, input_path, verdict_out or paths.summary)
        )
    if not summary.passed:
        message = gate_failure_message(summary, verdict_out or paths.summary)
        if not config.override_gates:
            raise AuditGateError(message)
        log.warning("gates overridden (audit.override_gates: true):\n%s", message)
    return summary


def nothing_to_generate_message(summary: AuditSummary, input_path: str | Path, summary_path: Path) -> str:
    """Why no sample is left: an empty input, or every row excluded (with the reasons)."""
    if summary.total == 0:
        what = f"{input_path}: the dataset has no rows"
    else:
        reasons = ", ".join(f"{r}={n}" for r, n in summary.excluded_reasons.items())
        what = f"{input_path}: all {summary.total} rows are excluded ({reasons})"
    return (
        f"{what}, so there is nothing to generate; stopping before any server starts "
        f"(details: {summary_path}; this is not a gate and cannot be overridden)"
    )


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------


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
    lines.append("gates:")
    for g in summary.gates:
        verdict = "ok" if g.passed else "FAILED"
        lines.append(f"  {g.name:<30} value {g.value:.4f}  limit {g.limit:.4f}  {verdict}")
    lines.append(f"verdict: {'passed' if summary.passed else 'FAILED'}")
    return "\n".join(lines)


def cli(argv: list[str]) -> int:
    """``regen audit INPUT --out DIR``: audit a dataset, print a summary table, write DIR/summary.json.

    An option not given takes the schema's default for its config key (``dataset``, ``audit``)."""
    dataset_keys = section_schema("dataset")["properties"]
    audit_keys = section_schema("audit")["properties"]
    ngram = audit_keys["decontamination"]["properties"]["ngram"]
    parser = argparse.ArgumentParser(
        prog="regen audit", description="Audit a chat dataset before regeneration."
    )
    parser.add_argument("input", help="dataset file (.jsonl, .json or .parquet)")
    parser.add_argument(
        "--format",
        choices=dataset_keys["format"]["enum"],
        dest="fmt",
        help=f"row format of INPUT (default: {dataset_keys['format']['default']}, detected per row)",
    )
    parser.add_argument(
        "--tokenizer",
        default=section_schema("tokenizer")["default"],
        help="tokenizer directory (default: %(default)s)",
    )
    parser.add_argument(
        "--context-limit",
        type=int,
        help="longer prompts (tokens) are flagged over_length "
        f"(default {audit_keys['context_limit']['default']})",
    )
    parser.add_argument(
        "--scaffolding-max-tokens",
        type=int,
        help="an old answer with at most this many supervised tokens beyond the template scaffolding "
        f"is flagged empty_response (default {audit_keys['scaffolding_max_tokens']['default']})",
    )
    parser.add_argument("--id-column", help="column with a stable sample id (default: hash the content)")
    parser.add_argument(
        "--on-bad-row",
        choices=dataset_keys["on_bad_row"]["enum"],
        help="skip: record unreadable rows and go on; stop: fail at the first "
        f"(default {dataset_keys['on_bad_row']['default']})",
    )
    parser.add_argument(
        "--regenerate",
        choices=regenerate_setting()["enum"],
        default=None,
        help="the run's generate.regenerate: which old answers are replaced, so which empty ones the gate "
        "max_empty_response_fraction judges (only those kept as context); default: "
        f"{regenerate_setting()['default']}, assumed and said so",
    )
    parser.add_argument("--override-gates", action="store_true", help="report failed gates as warnings")
    parser.add_argument(
        "--benchmark",
        action="append",
        default=[],
        metavar="NAME=PATH[:FIELD]",
        help="flag samples sharing an n-gram with this benchmark's prompts (.jsonl, .jsonl.gz, .json, "
        ".parquet; FIELD defaults to 'prompt'); repeatable",
    )
    parser.add_argument(
        "--ngram",
        type=int,
        help=f"words per n-gram for --benchmark matching (default {ngram['default']})",
    )
    parser.add_argument("--out", required=True, help="output directory")
    args = parser.parse_args(argv)

    def given(**options: Any) -> dict[str, Any]:
        return {k: v for k, v in options.items() if v is not None}  # the rest: the schema's defaults

    try:
        benchmarks = [BenchmarkSpec.parse(b).to_json() for b in args.benchmark]
        config = AuditConfig.from_dict(
            given(
                context_limit=args.context_limit,
                scaffolding_max_tokens=args.scaffolding_max_tokens,
                override_gates=args.override_gates,
                decontamination=given(benchmarks=benchmarks, ngram=args.ngram),
            ),
            args.regenerate,
        )
        dataset = DatasetConfig.from_dict(
            given(path=args.input, format=args.fmt, id_column=args.id_column, on_bad_row=args.on_bad_row)
        )
        summary = run_audit(args.input, args.out, config, args.tokenizer, dataset)
    except (BadInputError, OSError, ValueError) as exc:  # bad input, missing file, directory, bad template
        print(f"regen audit: {exc}", file=sys.stderr)
        return 2
    except AuditGateError as exc:
        summary_path = AuditFiles(Path(args.out)).summary
        if summary_path.is_file():
            print(format_summary(_summary_from_file(summary_path)))
        print(f"\n{exc}", file=sys.stderr)
        return 1
    print(format_summary(summary))
    if not summary.passed:
        print("\n" + gate_failure_message(summary), file=sys.stderr)
        print("(gates overridden: continuing)", file=sys.stderr)
    print(f"\nwrote {AuditFiles(Path(args.out)).summary}")
    return 0


def _summary_from_file(path: Path) -> AuditSummary:
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
        context={},
        empty_answers=EmptyAnswers.from_json(data["empty_old_answers"]),
        unread_tails=tuple(data.get("unread_tails", ())),
        contaminated_by=data.get("contaminated_by", {}),
    )
