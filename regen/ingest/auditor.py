"""The auditor: verdicts for any stream of Samples (the input file, or the merged output), pipelined
with the tokenizer; :func:`audit_records` for samples in memory."""

from __future__ import annotations

import hashlib
import logging
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import orjson

from regen.chat import THINK_CLOSE, THINK_OPEN, ChatTemplate, TokenAccount, to_template_dicts
from regen.ingest.audit_config import AuditConfig, regenerate_setting
from regen.ingest.audit_summary import (
    ANSWER_ONLY_HISTOGRAM,
    SYSTEM_PROMPTS,
    AuditSummary,
    EmptyAnswers,
    Log2Histogram,
    SystemPrompts,
    evaluate_gates,
)
from regen.ingest.decontam import BenchmarkIndex, Contamination
from regen.ingest.flags import (
    BAD_ROW,
    CONTAMINATED,
    DIGEST_BYTES,
    DUPLICATE_PROMPT,
    EMPTY_RESPONSE,
    FLAG_NAMES,
    OVER_LENGTH,
    STRUCTURE_ERROR,
    WHITESPACE_DUPLICATE_PROMPT,
    SampleAudit,
    bad_row_id,
    fault_kind,
    prompt_digest,
    structure_faults,
)
from regen.types import BadRow, Sample, prompt_end

log = logging.getLogger(__name__)


BATCH_SIZE = 1024

# --------------------------------------------------------------------------------------
# The auditor (works on any stream of Samples)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OversizeAccount:
    """The token account of a row too long to tokenize: prompt tokens (exact, or a lower bound)."""

    prompt_tokens: int
    note: str


#: why a row's answer-only count is not known (``AnswerSplit`` as a reason, counted in the summary)
NOT_SPLIT_MASK = "its own loss mask (mask_supervised_tokens) counts the supervised tokens"
NOT_SPLIT_UNTOKENIZED = "not tokenized (too long)"
NOT_SPLIT_NO_TAGS = "reasoning, but the tokenizer has no single <think>/</think> tokens"
NOT_SPLIT_NOT_FOUND = "reasoning in the final answer, but no think block where the template renders it"
NOT_SPLIT_UNCLOSED = "a think block without </think> before the end of the turn"

#: per row: the supervised tokens of its think blocks (int), or why they cannot be told apart (str)
AnswerSplit = int | str


def final_turn_reasons(dicts: Sequence[Mapping[str, Any]]) -> bool:
    """True when the conversation ends with an assistant turn that carries reasoning: a
    ``reasoning_content`` with text, or a think block in the content (as the template splits it)."""
    if not dicts or dicts[-1]["role"] != "assistant":
        return False
    reasoning = dicts[-1].get("reasoning_content")
    return bool(isinstance(reasoning, str) and reasoning.strip()) or THINK_CLOSE in dicts[-1]["content"]


class ThinkBlocks:
    """Counts the supervised tokens of the think blocks in a rendered conversation from its token ids
    (the audit's one batch encode: nothing is tokenized again).

    A think block is an assistant turn's opening ``<think>`` (the token right after the assistant
    header) through its ``</think>``, plus the one newline-only token after it: the template's
    scaffolding around the reasoning goes with the reasoning, since a thinking-off request has the
    empty block in its prompt (``enable_thinking=False``) and generates only the answer and the
    end-of-turn token. What is left of the supervised tokens is the answer-only count.
    """

    def __init__(self, chat: ChatTemplate) -> None:
        tok = chat.tokenizer
        self.tokenizer = tok
        self.open_id = tok.token_to_id(THINK_OPEN)
        self.close_id = tok.token_to_id(THINK_CLOSE)
        self.end_id = tok.token_to_id(chat.end_of_turn)
        self.header = tok.encode(chat.assistant_header, add_special_tokens=False).ids
        self._newlines: dict[int, bool] = {}

    def _newline_only(self, token: int) -> bool:
        known = self._newlines.get(token)
        if known is None:
            text = self.tokenizer.decode([token], skip_special_tokens=False)
            known = self._newlines[token] = bool(text) and not text.strip("\r\n")
        return known

    def count(self, ids: list[int], final_reasons: bool) -> AnswerSplit:
        """The think blocks' tokens in ``ids``, or why they cannot be counted (``final_reasons``: the
        final assistant turn carries reasoning, so a block must be found)."""
        op, cl = self.open_id, self.close_id
        if op is None or cl is None:
            return NOT_SPLIT_NO_TAGS if final_reasons else 0
        header, h, n = self.header, len(self.header), len(ids)
        total = 0
        last_end = -1  # the end of the last block found (the final turn's, when it has one)
        j = -1
        while True:
            try:
                j = ids.index(op, j + 1)
            except ValueError:
                break
            if j < h or ids[j - h : j] != header:  # a <think> inside a text, not where a turn opens
                continue
            try:
                end = ids.index(self.end_id, j) if self.end_id is not None else n
            except ValueError:
                end = n
            try:
                k = ids.index(cl, j + 1, end) + 1
            except ValueError:
                return NOT_SPLIT_UNCLOSED
            if k < n and self._newline_only(ids[k]):
                k += 1
            total += k - j
            last_end = end
            j = k - 1
        if final_reasons and not self._ends_last_turn(ids, last_end):
            return NOT_SPLIT_NOT_FOUND
        return total

    def _ends_last_turn(self, ids: list[int], end: int) -> bool:
        """True when ``end`` (an end-of-turn index) closes the conversation's last assistant turn."""
        if end < 0:
            return False
        if self.end_id is None:
            return True
        try:
            ids.index(self.end_id, end + 1)
        except ValueError:
            return True
        return False


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
        # the supervised tokens without the reasoning (answer only): what a thinking-off completion plans
        self.answer_hist = Log2Histogram()
        self.answer_left_out: Counter[str] = Counter()
        self.think_blocks = ThinkBlocks(chat)
        self.prompt_hist = Log2Histogram()
        self.empty_answers = EmptyAnswers(
            cfg.regenerate or regenerate_setting()["default"], regenerate_assumed=cfg.regenerate is None
        )
        # prompt lengths of the samples that go on to generation (4 bytes each): exact percentiles
        # for the server planner, which sizes the KV cache for running x (p99 + max_tokens)
        self.kept_prompt_tokens = array("I")
        # the most common system prompt of those samples: a long one many share keeps SGLang's radix cache
        # on (regen.sglang.workload.shared_prefixes)
        self.system_prompts = SystemPrompts()

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
        encodings = self.chat.encode_rendered(rendered)
        accounts = self.chat.account_encoded(rendered, encodings)
        splits = self.answer_splits(dicts, normal, encodings)
        merged = self.merge_accounts(samples, dicts, normal, accounts)
        return self.finish_batch(samples, dicts, merged, splits)

    def answer_splits(
        self, dicts: Sequence[Sequence[Mapping[str, Any]]], normal: Sequence[int], encodings: Sequence[Any]
    ) -> list[AnswerSplit]:
        """Per row: its think blocks' supervised tokens (from the batch's encodings of the rows at
        ``normal``), or why not (the oversize rest is not tokenized)."""
        out: list[AnswerSplit] = [NOT_SPLIT_UNTOKENIZED] * len(dicts)
        for i, enc in zip(normal, encodings, strict=True):
            out[i] = self.think_blocks.count(enc.ids, final_turn_reasons(dicts[i]))
        return out

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
        splits: Sequence[AnswerSplit] | None = None,
    ) -> list[SampleAudit]:
        """Verdicts from precomputed template dicts and token accounts (see ``iter_audits``); ``splits``:
        as :meth:`answer_splits` (None: the answer-only counts are not known)."""
        found: list[Contamination | None] = [None] * len(samples)
        if self.benchmarks is not None:
            found = self.benchmarks.check(s.messages for s in samples)
        if splits is None:
            splits = ["not split"] * len(samples)
        return [
            self._audit_one(s, d, a, c, t)
            for s, d, a, c, t in zip(samples, dicts, accounts, found, splits, strict=True)
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
        split: AnswerSplit = "not split",
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
            self._add_answer_only(supervised, NOT_SPLIT_MASK if mask_tokens is not None else split)
        self.prompt_hist.add(acc.prompt_tokens)
        reason = self._exclusion(flags)
        if reason is None:
            self.system_prompts.add(dicts)
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

    def _add_answer_only(self, supervised: int, split: AnswerSplit) -> None:
        if isinstance(split, str):
            self.answer_left_out[split] += 1
        elif split > supervised:  # cannot happen when both count the one encoding: never a negative answer
            self.answer_left_out["think blocks longer than the supervised tokens"] += 1
        else:
            self.answer_hist.add(supervised - split)

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
                ANSWER_ONLY_HISTOGRAM: answer_only_json(self.answer_hist, self.answer_left_out),
            },
            gates=evaluate_gates(
                self.total, self.flag_counts, self.cfg.gates, self.empty_answers, len(self.unread_tails)
            ),
            overridden=self.cfg.override_gates,
            context={
                "context_limit": self.cfg.context_limit,
                **kept_prompt_percentiles(self.kept_prompt_tokens),
                SYSTEM_PROMPTS: self.system_prompts.to_json(),
                **({"decontamination": self.benchmarks.summary_json()} if self.benchmarks else {}),
                **(context or {}),
            },
            empty_answers=replace(self.empty_answers),
            unread_tails=tuple(self.unread_tails),
            contaminated_by=dict(sorted(self.contaminated_by.items())),
        )


def answer_only_json(hist: Log2Histogram, left_out: Mapping[str, int]) -> dict[str, Any]:
    """The answer-only histogram as the summary writes it, with the rows left out of it (their
    supervised count cannot be split into reasoning and answer) counted by reason."""
    n_out = sum(left_out.values())
    return {
        **hist.to_json(),
        "left_out": n_out,
        "left_out_reasons": dict(sorted(left_out.items())),
        "in_words": (
            "supervised tokens without the reasoning (think blocks and their tags), per sample"
            + (f"; {n_out:,} sample(s) left out (reasoning and answer not told apart)" if n_out else "")
        ),
    }


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
    encodings = p.future.result()
    accounts = auditor.chat.account_encoded(p.rendered, encodings)
    return auditor.finish_batch(
        p.batch,
        p.dicts,
        auditor.merge_accounts(p.batch, p.dicts, p.normal, accounts),
        auditor.answer_splits(p.dicts, p.normal, encodings),
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
