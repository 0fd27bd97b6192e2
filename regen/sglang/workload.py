"""What the planner plans for: the workload (prompt and answer lengths, their spread) and the running
context a request is planned at, with the rule it follows; read from the audit's summary.

The running context is regen's own rule (no SGLang equivalent): SGLang admits by expected need
(``managers/schedule_policy.py::PrefillAdder``, ``new_token_ratio``) and retracts under pressure
(``ScheduleBatch.retract_decode``), so the planned in-flight count is an expectation, not a bound.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: the rules map's ``client_concurrency`` entries: per rule, what it follows
CLIENT_RULE_WORST_CASE = "regen: the worst-case concurrency (linear-attention hybrids: the state pool)"
CLIENT_RULE_LENGTH_BIASED = (
    "regen: the KV filled at the running set's mean context, prompt p50 + E[L](1+cv^2)/2 (answer-length "
    "spread known), at least the decode-graph range, at most the cap; SGLang's admission and retraction "
    "hold the long ones"
)
CLIENT_RULE_CONSERVATIVE = (
    "regen: the KV filled at prompt p50 + the expected answer (answer-length spread unknown: conservative), "
    "at least the decode-graph range, at most the cap"
)
CLIENT_RULE_NO_EXPECTED = (
    "regen: the KV filled at prompt p50 + max_tokens (no expected answer length), at least the decode-graph "
    "range, at most the cap"
)


@dataclass(frozen=True, slots=True)
class Workload:
    prompt_p50: int
    prompt_p99: int
    max_tokens: int
    target_concurrency: int | None = None
    #: why the prompts share prefixes (:func:`shared_prefixes`); empty: every prompt is unique, and the
    #: planner turns the radix cache off
    shared_prefixes: tuple[str, ...] = ()
    #: mean completion tokens expected (the old answers, a pilot): attention-only models fill the KV at
    #: it; hybrids get scheduler candidates sized for it (``regen.sglang.alternatives``)
    expected_output_tokens: int | None = None
    #: where ``expected_output_tokens`` comes from, said in the recommendation's reasons
    expected_output_source: str = "given"
    #: the answer lengths' coefficient of variation (std / mean, lengths capped at ``max_tokens``), the
    #: spread that sets the mean context of a running set; None: unknown (the conservative rule plans)
    expected_output_cv: float | None = None
    #: where ``expected_output_cv`` comes from, said in the reasons and the rules map
    expected_output_cv_source: str = "given"
    #: how the variants' thinking modes weigh the expected answer (:func:`old_answers_expected`), added to
    #: the rules map's entry; None: one variant mode, or no variants given (the one length plans)
    expected_output_mix: str | None = None
    #: the run's completions: the audit's samples kept for generation x completions per prompt
    #: (:func:`run_completions`); None: unknown (a provisional plan, a plan without an audit), and the
    #: planner does not weigh the run's size (``regen.sglang.run_size``)
    completions: int | None = None
    #: completions of one prompt sent back to back (the variants' n together): with the radix cache on they
    #: hold the prompt's whole pages once between them (:meth:`paged_tokens_per_request`)
    completions_per_prompt: int = 1

    @property
    def unique_prompts(self) -> bool:
        """No prefix is shared between requests: the radix cache would keep KV nothing reuses."""
        return not self.shared_prefixes

    @property
    def tokens_per_request(self) -> int:
        """The worst case: prompt p99 + max_tokens."""
        return self.prompt_p99 + self.max_tokens

    @property
    def expected_output(self) -> int:
        """The expected answer length: ``expected_output_tokens`` when given below ``max_tokens``, else
        ``max_tokens`` (all the workload knows; :attr:`expected_output_known` says which)."""
        return int(self.expected_output_tokens) if self.expected_output_known else self.max_tokens

    @property
    def expected_output_known(self) -> bool:
        return bool(self.expected_output_tokens) and int(self.expected_output_tokens or 0) < self.max_tokens

    @property
    def spread_known(self) -> bool:
        """The expected answer and its spread are both known: the running set's mean context is planned."""
        return self.expected_output_known and self.expected_output_cv is not None

    @property
    def running_answer_tokens(self) -> int:
        """The answer part of a running set's mean context. With the spread known, length-biased (a
        request of length L is running for a time in proportion to L, and its context grows 0 to L):
        E[L^2] / (2 E[L]) = E[L] (1 + cv^2) / 2, at most max_tokens / 2 (the cap: for X = min(L, c),
        E[X^2] / E[X] <= c, and it grows with c, so moments of uncapped lengths only err long). Without
        the spread, the conservative E[L] (holds while cv^2 <= 1) or max_tokens."""
        if not self.spread_known:
            return self.expected_output
        cv = float(self.expected_output_cv or 0.0)
        biased = self.expected_output * (1.0 + cv * cv) / 2.0
        return math.ceil(min(biased, self.max_tokens / 2.0))

    @property
    def expected_tokens_per_request(self) -> int:
        """The context the KV is filled at per running request: prompt p50 + :attr:`running_answer_tokens`."""
        return self.prompt_p50 + self.running_answer_tokens

    def paged_tokens_per_request(self, page_size: int, radix_cache: bool = False) -> int:
        """:attr:`expected_tokens_per_request` on a KV pool of ``page_size``-token pages: a request holds
        whole pages, its last one half empty on average (:func:`page_waste`). With the radix cache on and
        several completions of a prompt, the prompt's whole pages (all but its last token, as SGLang's
        prefix match takes them) are held once for them all, as long as the longest of them runs: a running
        request holds :meth:`prompt_share` of them."""
        own = self.expected_tokens_per_request + page_waste(page_size)
        if not self.shares_prompt_pages(radix_cache):
            return own
        shared = self.shared_prompt_tokens(page_size)
        return own - shared + math.ceil(shared * self.prompt_share())

    def shares_prompt_pages(self, radix_cache: bool) -> bool:
        """Whether a prompt's completions hold its pages once between them: the radix cache on and more
        than one completion a prompt."""
        return radix_cache and self.completions_per_prompt > 1

    def shared_prompt_tokens(self, page_size: int) -> int:
        """The prompt's tokens a radix-cache match serves: whole pages of all but its last token."""
        page = max(1, page_size)
        return (max(self.prompt_p50 - 1, 0) // page) * page

    def prompt_share(self) -> float:
        """The share of a prompt's shared pages a running completion holds, time-averaged: its n completions
        run for L_1..L_n between them while the prompt is held for the longest, E[max L] / (n E[L]), with
        E[max L] <= E[L] (1 + cv (n - 1) / sqrt(2n - 1)) (the bound on the mean of the largest of n, Hartley
        and David 1954); cv the answers' (1 when unknown, as the conservative rule assumes)."""
        n = self.completions_per_prompt
        cv = float(self.expected_output_cv) if self.spread_known else 1.0
        return min(1.0, (1.0 + cv * (n - 1) / math.sqrt(2 * n - 1)) / n)

    def shared_pages_words(self, page_size: int, radix_cache: bool) -> str:
        """How :meth:`paged_tokens_per_request` shares the prompt ('' where it does not), for the reasons."""
        if not self.shares_prompt_pages(radix_cache):
            return ""
        n, shared = self.completions_per_prompt, self.shared_prompt_tokens(page_size)
        return (
            f"; the prompt's {shared:,} tokens in whole pages held once by its {n} completions while "
            f"the longest runs: {self.prompt_share():.2f} of them a running request (E[max of {n}] / "
            f"({n} E[L]), at most (1 + cv ({n} - 1) / sqrt(2 x {n} - 1)) / {n}, Hartley-David)"
        )

    def running_context_words(self) -> str:
        """How :attr:`expected_tokens_per_request` was found, for the reasons and the rules map."""
        if self.spread_known:
            return (
                f"prompt p50 {self.prompt_p50:,} + E[L](1+cv^2)/2 = {self.expected_output:,} x "
                f"(1 + {self.expected_output_cv:.2f}^2) / 2 = {self.running_answer_tokens:,} (the mean "
                "context of a running set: long answers stay longer; expected answer "
                f"{self.expected_output_source}, cv {self.expected_output_cv_source}, at most max_tokens / 2)"
            )
        if self.expected_output_known:
            return (
                f"prompt p50 {self.prompt_p50:,} + expected answer {self.expected_output:,}, "
                f"{self.expected_output_source} (answer-length spread unknown: the conservative rule, "
                "above the running set's mean context while cv <= 1; pass --expected-output-cv, or an audit "
                "whose old answers have a std)"
            )
        return (
            f"prompt p50 {self.prompt_p50:,} + max_tokens {self.max_tokens:,} (no expected answer length "
            "given: pass --expected-output-tokens, the old answers' or a pilot's mean; max_tokens is the "
            "upper bound)"
        )


def page_waste(page_size: int) -> int:
    """Tokens a request holds beyond its context on a paged KV pool, on average: its last page half empty
    (SGLang allocates whole pages, ``PagedTokenToKVPoolAllocator``)."""
    return page_size // 2


def client_rule_for(workload: Workload) -> str:
    """The rules map's entry for an attention-only model's client concurrency under ``workload``."""
    if workload.spread_known:
        rule = CLIENT_RULE_LENGTH_BIASED
    else:
        rule = CLIENT_RULE_CONSERVATIVE if workload.expected_output_known else CLIENT_RULE_NO_EXPECTED
    return f"{rule}; {workload.expected_output_mix}" if workload.expected_output_mix else rule


#: the prompt lengths planned for when no audit gives them (SGLang-agnostic guesses)
DEFAULT_PROMPT_P50 = 1024
DEFAULT_PROMPT_P99 = 4096


def default_workload(max_tokens: int) -> Workload:
    """The workload planned for without an audit: the default prompt lengths and the run's answer budget
    (``generate.sampling.max_tokens``, whose one default is the config schema's)."""
    return Workload(prompt_p50=DEFAULT_PROMPT_P50, prompt_p99=DEFAULT_PROMPT_P99, max_tokens=max_tokens)


@dataclass(frozen=True, slots=True)
class VariantShare:
    """A sampling variant as the planner weighs it: its completions per prompt (``n``) and the share of
    them with thinking on (1: on, 0: off, ``generate.thinking_fraction`` under ``mix``)."""

    name: str
    n: int
    thinking_share: float

    @property
    def thinking_on(self) -> float:
        return self.n * self.thinking_share

    @property
    def thinking_off(self) -> float:
        return self.n * (1.0 - self.thinking_share)


def completions_per_prompt(variants: Sequence[VariantShare]) -> int:
    """The completions each prompt gets, the variants' n together (1 without variants)."""
    return max(1, sum(v.n for v in variants))


#: a system prompt keeps the radix cache on when at least this share of the samples starts with it ...
SHARED_SYSTEM_PROMPT_SHARE = 0.1
#: ... and it is at least this long: two 64-token pages (the tuner's KV page, which SGLang's prefix match
#: works in) at about four characters a token; a shorter one saves little prefill
SHARED_SYSTEM_PROMPT_MIN_CHARS = 512


def shared_prefixes(summary: Mapping[str, Any], variants: Sequence[VariantShare]) -> tuple[str, ...]:
    """Why the run's requests share prompt prefixes, one phrase per cause (empty: every prompt unique):
    several completions per prompt (``variants``' n together), ``generate.regenerate: all`` over samples
    with more than one assistant turn (each turn's prompt extends the last; the audit's
    ``empty_answers`` counts turns under the mode it was given), and a long system prompt a share of the
    samples start with (the audit's ``system_prompts``, absent from older audits)."""
    out = []
    completions = completions_per_prompt(variants)
    if completions > 1:
        out.append(
            f"{completions} completions per prompt (generate.sampling.n / generate.variants), sent back to "
            "back: SGLang prefills each prompt once and the others read it from the cache"
        )
    turns = summary.get("empty_old_answers") or summary.get("empty_answers") or {}
    turns = turns if isinstance(turns, Mapping) else {}
    samples = int(summary.get("total") or 0)
    if turns.get("regenerate") == "all" and int(turns.get("old_answers") or 0) > samples:
        out.append(
            f"generate.regenerate: all over {turns['old_answers']:,} assistant turns in {samples:,} samples: "
            "each turn's prompt extends the one before it"
        )
    system = summary.get("system_prompts") or {}
    top, chars = int(system.get("most_common") or 0), int(system.get("most_common_chars") or 0)
    seen = int(system.get("samples") or 0)
    if (
        seen
        and top >= 2
        and top >= SHARED_SYSTEM_PROMPT_SHARE * seen
        and chars >= SHARED_SYSTEM_PROMPT_MIN_CHARS
    ):
        out.append(
            f"a {chars:,}-character system prompt starts {top:,} of {seen:,} samples (audit): its KV is "
            "prefilled once and shared"
        )
    return tuple(out)


def run_completions(summary: Mapping[str, Any], variants: Sequence[VariantShare]) -> int | None:
    """The run's completions: the audit's samples kept for generation (``kept``, else ``total`` less
    ``excluded``) x the variants' ``n`` together (1 without variants); None where the audit counts none."""
    kept = summary.get("kept")
    if kept is None and summary.get("total") is not None:
        kept = int(summary["total"]) - int(summary.get("excluded") or 0)
    if kept is None:
        return None
    return int(kept) * completions_per_prompt(variants)


def workload_from_audit(
    summary_json: str | Path | dict[str, Any],
    max_tokens: int,
    target_concurrency: int | None = None,
    variants: Sequence[VariantShare] = (),
    answer_only: Mapping[str, Any] | None = None,
) -> Workload:
    """Workload from the audit summary: prompt_tokens_p50/p99 keys, else a prompt_tokens{p50,p99} block;
    ``max_tokens``: the run's answer budget (``generate.sampling.max_tokens``); ``variants`` and
    ``answer_only``: as :func:`old_answers_expected`."""
    summary = summary_json if isinstance(summary_json, dict) else json.loads(Path(summary_json).read_text())
    block = summary.get("prompt_tokens") if isinstance(summary.get("prompt_tokens"), dict) else {}
    p50 = summary.get("prompt_tokens_p50", block.get("p50", DEFAULT_PROMPT_P50))
    p99 = summary.get("prompt_tokens_p99", block.get("p99", DEFAULT_PROMPT_P99))
    return Workload(
        prompt_p50=int(p50),
        prompt_p99=int(max(p99, p50)),
        max_tokens=int(max_tokens),
        target_concurrency=target_concurrency,
        shared_prefixes=shared_prefixes(summary, variants),
        completions=run_completions(summary, variants),
        completions_per_prompt=completions_per_prompt(variants),
        **old_answers_expected(summary, variants, answer_only),
    )


def old_answers_expected(
    summary: dict[str, Any],
    variants: Sequence[VariantShare] = (),
    answer_only: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The expected answer length and its spread from the audit: the mean and the coefficient of variation
    (std / mean) of the supervised (old answer) tokens per sample of its ``supervised_tokens`` histogram,
    as ``Workload`` fields; {} when the audit has no mean, no cv when it has no std (an audit from before
    the std was recorded: the conservative rule plans). A sample with several answers counts them all, so
    the mean errs long (fewer requests in flight), never short. The lengths are the old answers' own, not
    capped at ``max_tokens``: :attr:`Workload.running_answer_tokens` bounds the capped context by them.

    With ``variants`` of which some completions run thinking off, the expected answer is the mixture over
    the completions (weights: each variant's ``n`` by thinking mode): thinking on at the supervised length,
    thinking off at ``answer_only`` (a histogram of the supervised tokens without the reasoning). Its mean
    is sum w_i mu_i and its E[L^2] sum w_i (sigma_i^2 + mu_i^2), so the running set's E[L](1+cv^2)/2 is the
    mixture's. Without an ``answer_only`` mean the audit does not tell reasoning from answer: the one
    length plans every completion (it errs long for the thinking-off ones) and the rule says so."""
    hist = (summary.get("histograms") or {}).get("supervised_tokens") or {}
    mean = hist.get("mean")
    if not mean:
        return {}
    out: dict[str, Any] = {
        "expected_output_tokens": round(mean),
        "expected_output_source": "the old answers' mean (audit)",
    }
    if hist.get("std") is not None:
        out["expected_output_cv"] = float(hist["std"]) / float(mean)
        out["expected_output_cv_source"] = "the old answers' std / mean (audit)"
    on = sum(v.thinking_on for v in variants)
    off = sum(v.thinking_off for v in variants)
    if off <= 0:  # no variant, or every completion thinks: the one (full) length, as before
        return out
    off_names = ", ".join(v.name for v in variants if v.thinking_off > 0)
    answer_mean = (answer_only or {}).get("mean")
    if not answer_mean:
        out["expected_output_mix"] = (
            f"thinking-off completions ({off_names}: {off:g} of {on + off:g} per prompt) planned at the full "
            "old answers' length: the audit does not tell reasoning from answer (no answer-only lengths), "
            "so their shorter answers are not known (errs long: fewer requests in flight)"
        )
        return out
    total = on + off
    mixed_mean = (on * float(mean) + off * float(answer_mean)) / total
    words = (
        f"expected answer mixed over the variants' completions per prompt: thinking on {on:g} x the old "
        f"answers' mean {float(mean):,.0f}, thinking off {off:g} ({off_names}) x their answer-only mean "
        f"{float(answer_mean):,.0f} (reasoning tokens left out)"
    )
    split = answer_only or {}
    if split.get("left_out"):  # samples the audit could not split: that mean is over the rest
        words += f" over {split['count']:,} samples ({split['left_out']:,} not split, left out)"
    out["expected_output_tokens"] = round(mixed_mean)
    out["expected_output_source"] = f"the variants' mix of the old answers' means (audit): {mixed_mean:,.0f}"
    std, answer_std = hist.get("std"), (answer_only or {}).get("std")
    if std is None or answer_std is None:
        out.pop("expected_output_cv", None)
        out.pop("expected_output_cv_source", None)
    else:
        second = (
            on * (float(std) ** 2 + float(mean) ** 2) + off * (float(answer_std) ** 2 + answer_mean**2)
        ) / total
        mixed_std = math.sqrt(max(0.0, second - mixed_mean * mixed_mean))
        out["expected_output_cv"] = mixed_std / mixed_mean
        out["expected_output_cv_source"] = (
            "the variants' mix: sqrt(sum w (sigma^2 + mu^2) - mean^2) / mean of the old answers' and their "
            "answer-only lengths (audit)"
        )
    out["expected_output_mix"] = words
    return out
