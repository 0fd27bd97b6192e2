"""The recommendation: the best flags for the workload, the candidates the sweep measures beside them,
the warnings about the given flags, and the plan file the servers launch from
(:class:`regen.sglang.config.PlanFile`, built here and written by it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from regen.sglang.alternatives import (
    MOST_RUNNING,
    replay_flag_problems,
    scheduler_candidates,
    speculative_alternatives,
    static_mtp_note,
    with_batched_refills,
    with_refill_prefill_graphs,
)
from regen.sglang.config import PlanFile
from regen.sglang.flags import parse_flags, renamed_flag_warnings, strip_flags
from regen.sglang.models import ModelShape
from regen.sglang.plan import (
    DEFAULT_DECODE_GRAPH_LIMIT_NOTE,
    DEFAULT_VERSION,
    TUNER_MEM_FRACTION,
    MemoryPlan,
    Workload,
    plan,
)
from regen.sglang.pools import has_state
from regen.sglang.run_size import for_run_size
from regen.sglang.search import (
    Candidate,
    Choice,
    Target,
    best_running,
    expected_length_running,
    tradeoffs,
    with_swa_steady,
    within_headroom,
)


@dataclass(frozen=True, slots=True)
class Recommendation:
    given: MemoryPlan
    recommended: MemoryPlan
    args: tuple[str, ...]
    reasons: tuple[str, ...]
    warnings: tuple[str, ...]
    candidates: tuple[Candidate, ...] = field(default=())
    #: what ``regen tune --sweep`` measures against the recommendation for speculative decoding (MTP at 1-3
    #: steps when the model has MTP layers; the same without MTP when the given flags force it on)
    speculative: tuple[Candidate, ...] = field(default=())
    #: why MTP is on or off in this (static, unmeasured) plan
    mtp_note: str = ""
    #: where the run is too small to win back what the plan adds at start, the line that says so and why
    #: (the recommendation then keeps SGLang's defaults: ``regen.sglang.run_size``); "" otherwise
    small_run: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            **self.given.summary(),
            "recommended": {
                **self.recommended.summary(),
                "args": list(self.args),
                "reasons": list(self.reasons),
            },
            "warnings": list(self.warnings),
            "candidates": [
                {"args": list(c.args), "score": c.score, "reasons": list(c.reasons), **c.plan.summary()}
                for c in self.candidates
            ],
            "speculative_candidates": [
                {"args": list(c.args), "score": c.score, "reasons": list(c.reasons), **c.plan.summary()}
                for c in self.speculative
            ],
            "mtp": self.mtp_note,
            **({"small_run": self.small_run} if self.small_run else {}),
        }


_PLANNER_FLAGS = {
    "--mem-fraction-static",
    "--max-running-requests",
    "--max-mamba-cache-size",
    "--mamba-full-memory-ratio",
    "--mamba-radix-cache-strategy",
    "--mamba-scheduler-strategy",
    "--mamba-ssm-dtype",
    "--disable-radix-cache",
    "--kv-cache-dtype",
    "--cuda-graph-max-bs",
    "--cuda-graph-max-bs-decode",
}


def _strip_planner_flags(args: list[str]) -> list[str]:
    return strip_flags(args, _PLANNER_FLAGS)


def flag_warnings(args: list[str], model: ModelShape, sglang_version: str = DEFAULT_VERSION) -> list[str]:
    """Flags that do nothing in this configuration, and renamed/removed spellings."""
    flags = parse_flags(args)
    names = {a.split("=")[0] for a in args if a.startswith("--")}
    out = list(renamed_flag_warnings(args, sglang_version))
    if "--mamba-full-memory-ratio" in names:
        if flags.max_mamba_cache_size is not None:
            out.append("--mamba-full-memory-ratio is ignored when --max-mamba-cache-size is given")
        elif flags.disable_radix_cache and flags.max_running_requests is not None:
            out.append(
                "--mamba-full-memory-ratio is ignored with --disable-radix-cache and --max-running-requests "
                "(the mamba pool is sized to max_running_requests)"
            )
    if "--num-continuous-decode-steps" in names and sglang_version == "0.5.23":
        out.append("--num-continuous-decode-steps has no effect: nothing reads it in SGLang 0.5.23")
    if flags.disable_radix_cache and "--mamba-radix-cache-strategy" in names:
        out.append("--mamba-radix-cache-strategy is ignored with --disable-radix-cache")
    if not has_state(model):
        for flag in ("--max-mamba-cache-size", "--mamba-full-memory-ratio", "--mamba-ssm-dtype"):
            if flag in names:
                out.append(f"{flag} has no effect: {model.architecture} has no linear-attention layers")
    out += replay_flag_problems(flags, model, sglang_version)
    if (flags.mamba_radix_cache_strategy == "no_buffer") and not flags.disable_overlap_schedule:
        out.append(
            "--mamba-radix-cache-strategy no_buffer requires --disable-overlap-schedule (SGLang asserts)"
        )
    return out


#: the searched candidates a recommendation lists: the best and the next ones, this many in all
LISTED_CANDIDATES = 5


def recommend(
    model: ModelShape,
    gpu_memory_mib: int,
    tp: int,
    args: list[str],
    workload: Workload,
    sglang_version: str = DEFAULT_VERSION,
    *,
    allow_fp8_kv: bool,
    allow_bf16_state: bool,
    allow_replay_decode: bool = False,
) -> Recommendation:
    """The flags under which the server runs the most workload requests: for linear-attention hybrids
    the highest cap whose KV and state hold the worst case; for attention-only models the in-flight
    count that fills the KV at the expected context (:mod:`regen.sglang.search`). Raises
    :class:`UnmodelledError` for a model whose pools the planner does not model."""
    given = plan(model, gpu_memory_mib, tp, args, workload, sglang_version)
    target = Target(model, gpu_memory_mib, tp, tuple(_strip_planner_flags(args)), workload, sglang_version)
    user_flags = parse_flags(args)
    # the radix cache off for unique prompts, on where they share prefixes, unless the user turned it off
    radix_options = [True] if workload.unique_prompts or user_flags.disable_radix_cache else [False]
    state_dtypes: list[str | None] = [user_flags.mamba_ssm_dtype]
    if allow_bf16_state and has_state(model) and user_flags.mamba_ssm_dtype != "bfloat16":
        state_dtypes.append("bfloat16")
    kv_dtypes = [user_flags.kv_cache_dtype]
    if allow_fp8_kv and user_flags.kv_cache_dtype == "auto":
        kv_dtypes.append("fp8_e4m3")
    mfs_options: list[float | None] = [user_flags.mem_fraction_static]
    if user_flags.mem_fraction_static is None:
        mfs_options += [TUNER_MEM_FRACTION]
    worst_case = has_state(model) or bool(workload.target_concurrency)
    candidates: list[Candidate] = []
    for choice in (
        Choice(radix, state, kv, mfs)
        for radix in radix_options
        for state in state_dtypes
        for kv in kv_dtypes
        for mfs in mfs_options
    ):
        if worst_case:
            found = best_running(target, choice, workload.target_concurrency or MOST_RUNNING)
        else:
            found = expected_length_running(target, choice)
        if found is not None:
            candidates.append(found)
    warnings = flag_warnings(args, model, sglang_version)
    if user_flags.disable_radix_cache and not workload.unique_prompts:
        warnings.append(
            "--disable-radix-cache (given) kept, though the prompts share prefixes "
            f"({'; '.join(workload.shared_prefixes)}): each request prefills its prompt in full"
        )
    if not candidates:
        kept = ("no feasible configuration found; kept the flags as given",)
        return Recommendation(given, given, tuple(args), kept, tuple(warnings))
    # Highest workload concurrency; ties: fewer quality trade-offs, then more KV headroom.
    candidates.sort(key=lambda c: (-c.score, tradeoffs(c.args), -c.plan.kv_cache_tokens))
    best = within_headroom(target, with_refill_prefill_graphs(target, with_batched_refills(candidates[0])))
    best = with_swa_steady(target, best)
    best, small_run = for_run_size(target, given, best)
    if (
        args  # about flags the user gave; with none, the recommendation sets the graph limit itself
        and given.effective_max_running_requests > DEFAULT_DECODE_GRAPH_LIMIT_NOTE
        and user_flags.cuda_graph_max_bs is None
    ):
        warnings.append(
            f"the given flags allow {given.effective_max_running_requests} running requests; decode graphs "
            f"are captured only up to {given.cuda_graph_max_bs}; larger batches decode eagerly (slower)"
        )
    sched = scheduler_candidates(target, best, allow_replay_decode)
    return Recommendation(
        given=given,
        recommended=best.plan,
        args=best.args,
        reasons=best.reasons,
        warnings=tuple(warnings),
        candidates=(best, *sched, *candidates[1:LISTED_CANDIDATES]),
        speculative=tuple(speculative_alternatives(target, best)),
        mtp_note=static_mtp_note(model, list(best.args)),
        small_run=small_run,
    )


def plan_file(
    recommendation: Recommendation,
    *,
    sglang_version: str,
    model_config: str,
    gpu_memory_mib: int,
    use_recommended: bool = True,
) -> PlanFile:
    """The plan file the server rules read: the launch flags and both plans (``use_recommended`` picks,
    once, which the servers launch with)."""
    rec = recommendation
    return PlanFile(
        launch_args=tuple(rec.args if use_recommended else rec.given.args),
        launched="recommended" if use_recommended else "given",
        given=rec.given.to_json(),
        recommended={**rec.recommended.to_json(), "reasons": list(rec.reasons)},
        warnings=rec.warnings,
        sglang_version=sglang_version,
        model_config=model_config,
        gpu_memory_mib=gpu_memory_mib,
    )


def unmodelled_plan_file(
    args: list[str], note: str, *, sglang_version: str, model_config: str, gpu_memory_mib: int
) -> PlanFile:
    """A model the planner does not model: the given flags as they are, SGLang's own planning, no plan."""
    return PlanFile(
        launch_args=tuple(args),
        launched="given",
        given={},
        recommended={},
        warnings=(f"{note}; SGLang plans its own memory (the given flags launched as they are)",),
        sglang_version=sglang_version,
        model_config=model_config,
        gpu_memory_mib=gpu_memory_mib,
    )


def write_plan_file(path: str | Path, recommendation: Recommendation, **where: Any) -> None:
    """:func:`plan_file` written to ``path`` (``where``: its keyword arguments)."""
    plan_file(recommendation, **where).write(path)
