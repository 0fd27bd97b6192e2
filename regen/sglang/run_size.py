"""Pilot size (issue 57 item 6): whether a run is large enough to win back what regen's plan adds to
SGLang's start over SGLang's defaults, and, where it is not, the plan that keeps SGLang's defaults.

What the plan adds at start is modelled explicitly: the decode CUDA graphs it captures above SGLang's
own range (each size charged the slowest per-size capture measured). What it wins is counted low: the
run's tokens decoded at the full planned batch (the first batch of requests ramps and the last drains
at a smaller one), at the fastest rate SGLang's defaults were measured at, sped up by the smallest gain
regen's plan was measured to win; nothing where the answers' length is unknown. The workflow runs no
sweep (``regen tune --sweep`` is the user's own step), so none is counted. A run whose saving does not
pay for the added start keeps SGLang's defaults for the flags whose only benefit is throughput; the
given flags stay (the user's and the serving mode's), and so do the flags that make the start shorter
(prefill CUDA graphs only up to the refills: :func:`regen.sglang.alternatives.with_refill_prefill_graphs`)
and the cache report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from regen.sglang.alternatives import with_refill_prefill_graphs
from regen.sglang.cache_report import CACHE_REPORT_FLAG
from regen.sglang.flags import parse_flags
from regen.sglang.graphs import decode_graph_batch_sizes
from regen.sglang.plan import MemoryPlan, PlanError
from regen.sglang.search import Candidate, Target, radix_kept_reason
from regen.sglang.workload import Workload

#: seconds to capture one decode CUDA-graph batch size: the slowest per-size capture measured on the
#: H200 (SGLang 0.5.17): Qwen3-30B-A3B's defaults, 17.94 s for SGLang's 36 sizes up to 256
#: (measurements/dense-2026-12-02-pages-logs/dense-qwen3-30b-a3b-default.trimmed.log). The sizes regen adds
#: cost less each (Llama-3.1-8B: 4.6-5.8 s for 36 sizes, 7.05 s for 68 up to 1,024,
#: measurements/truth-2026-12-0{1,2}-logs), so this errs long: towards SGLang's defaults
DECODE_GRAPH_CAPTURE_S = 0.5
#: output tokens a second SGLang's defaults decode at, at most: the fastest default arm measured on the
#: H200, gpt-oss-20b at 256 running, 20.7-21.8K tok/s in its server log (measurements/families-2026-12-04.md)
DEFAULT_DECODE_TOK_S_BOUND = 21_800
#: regen's plan over SGLang's defaults at the full batch, at least: the smallest gain measured where the
#: plan won, Qwen3-32B-FP8 1.046x at steady state (measurements/families-2026-12-04.md)
PLAN_GAIN_BOUND = 1.046

#: the console line and the plan's rule where the run is too small
TOO_SMALL_LINE = (
    "regen: SGLang's defaults for this run: {completions:,} completions x {answer:,}-token answers = "
    "{tokens:,} tokens are too few to win back what regen's plan adds at start: decode CUDA graphs to "
    "{planned_graphs:,} instead of {default_graphs:,} ({added} sizes x {per:g} s = {extra:.1f} s) against "
    "{saved:.1f} s saved, counted low ({full:,} tokens at the full batch of {client:,}; SGLang's defaults at "
    "{rate:,} tok/s, the fastest measured, and the plan x{gain:g} faster, its smallest measured win); it "
    "pays from about {break_even:,} tokens at that batch"
)
#: ... and where the answers' length is unknown: the saving cannot be counted, SGLang's defaults stay
UNKNOWN_LENGTH_LINE = (
    "regen: SGLang's defaults for this run: the answers' length is unknown (no old answers' mean in the "
    "audit), so whether {completions:,} completions win back what regen's plan adds at start (decode CUDA "
    "graphs to {planned_graphs:,} instead of {default_graphs:,}: {added} sizes x {per:g} s = {extra:.1f} s) "
    "cannot be counted"
)


@dataclass(frozen=True, slots=True)
class PilotSizeVerdict:
    """What the plan adds at start and what it can win at most over this run; ``line`` says why."""

    extra_start_s: float
    most_saved_s: float
    line: str

    @property
    def takes_defaults(self) -> bool:
        return self.extra_start_s > 0 and self.most_saved_s < self.extra_start_s


def _graph_sizes(p: MemoryPlan) -> int:
    speculative = bool(parse_flags(list(p.args)).speculative_algorithm)
    return len(decode_graph_batch_sizes(p.cuda_graph_max_bs, speculative))


def pilot_size_verdict(given: MemoryPlan, planned: MemoryPlan, workload: Workload) -> PilotSizeVerdict | None:
    """Weigh ``planned`` against ``given`` (SGLang's defaults under the given flags) over the workload's
    ``completions`` of its expected answer; where the answers' length is unknown nothing is counted saved
    (SGLang's defaults stay wherever the plan adds to the start); None where the run's size is unknown (a
    provisional plan from a first pass: the plan stands)."""
    completions = workload.completions
    if not completions:
        return None
    expected_answer = workload.expected_output
    added = max(0, _graph_sizes(planned) - _graph_sizes(given))
    extra = added * DECODE_GRAPH_CAPTURE_S
    tokens = completions * expected_answer
    client = int(planned.client_concurrency or planned.effective_max_running_requests)
    full = math.floor(tokens * max(0, completions - client) / completions)
    per_token_s = (1 - 1 / PLAN_GAIN_BOUND) / DEFAULT_DECODE_TOK_S_BOUND
    saved = full * per_token_s
    numbers = {
        "completions": completions,
        "planned_graphs": planned.cuda_graph_max_bs,
        "default_graphs": given.cuda_graph_max_bs,
        "added": added,
        "per": DECODE_GRAPH_CAPTURE_S,
        "extra": extra,
    }
    if not workload.expected_output_known:
        return PilotSizeVerdict(extra, 0.0, UNKNOWN_LENGTH_LINE.format(**numbers))
    line = TOO_SMALL_LINE.format(
        **numbers,
        answer=expected_answer,
        tokens=tokens,
        saved=saved,
        full=full,
        client=client,
        rate=DEFAULT_DECODE_TOK_S_BOUND,
        gain=PLAN_GAIN_BOUND,
        break_even=math.ceil(extra / per_token_s),
    )
    return PilotSizeVerdict(extra, saved, line)


def defaults_candidate(target: Target, given: MemoryPlan, why: str) -> Candidate:
    """The plan that keeps SGLang's defaults: the given flags, the cache report where the radix cache is
    on, prefill graphs only up to the refills (a shorter start); the client follows the defaults' plan
    (the KV filled at the expected context, within SGLang's own cap)."""
    args = list(given.args)
    if not parse_flags(args).disable_radix_cache and CACHE_REPORT_FLAG not in args:
        args.append(CACHE_REPORT_FLAG)
    try:
        p = target.plan(args, target.workload)
    except PlanError:
        args, p = list(given.args), given
    p = replace(p, client_rule=f"{why}; {p.client_rule}")
    client = p.client_concurrency or p.effective_max_running_requests
    radix_on = not parse_flags(args).disable_radix_cache
    reasons = (why, radix_kept_reason(target)) if radix_on and target.workload.shared_prefixes else (why,)
    return with_refill_prefill_graphs(target, Candidate(tuple(args), p, int(client), reasons))


def for_run_size(target: Target, given: MemoryPlan, best: Candidate) -> tuple[Candidate, str]:
    """``best``, or the plan that keeps SGLang's defaults where the run is too small to win back what
    ``best`` adds at start (:func:`pilot_size_verdict`), with the line that says so ("" where it stands)."""
    verdict = pilot_size_verdict(given, best.plan, target.workload)
    if verdict is None or not verdict.takes_defaults:
        return best, ""
    return defaults_candidate(target, given, verdict.line), verdict.line
