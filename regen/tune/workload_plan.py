"""The one home of "plan from a Workload": the server plan the ``tune`` rule writes from the audited
workload, and the provisional plan ``regen.tune.prestart`` starts servers with from a first pass.

Both call :func:`plan_for_workload`, so a provisional plan and the audit's differ only by their workloads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from regen.ingest.audit_summary import ANSWER_ONLY_HISTOGRAM
from regen.runconfig import GenerateConfig, ServerConfig
from regen.serving.gpus import gpu_memory_from_nvidia_smi
from regen.serving.lifecycle import mode_of
from regen.sglang.config import PlanFile
from regen.sglang.models import ModelShape
from regen.sglang.plan import DEFAULT_VERSION, UnmodelledError
from regen.sglang.recommend import Recommendation, plan_file, recommend, unmodelled_plan_file
from regen.sglang.workload import (
    DEFAULT_PROMPT_P50,
    DEFAULT_PROMPT_P99,
    VariantShare,
    Workload,
    completions_per_prompt,
    old_answers_expected,
    run_completions,
    shared_prefixes,
    workload_from_audit,
)

PINNED_SGLANG_VERSION = DEFAULT_VERSION


def installed_sglang_version() -> str | None:
    """The sglang version importable here, if any (the plan follows the version that will run)."""
    from importlib import metadata

    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def planned_sglang_version(server_cfg: ServerConfig) -> str:
    """The SGLang version a plan follows: ``server.sglang_version``, else the installed one, else the
    pinned one (the version that will run)."""
    return server_cfg.sglang_version or installed_sglang_version() or PINNED_SGLANG_VERSION


def histogram_percentile(hist: dict[str, Any], q: float) -> int:
    """Upper edge of the histogram bucket holding quantile ``q`` (a conservative percentile)."""
    total = int(hist.get("count", 0))
    if total == 0:
        return 0
    seen = 0
    for bucket in hist.get("buckets", []):
        seen += int(bucket["count"])
        if seen >= q * total:
            return int(bucket["hi"])
    return int(hist.get("max", 0))


def variant_shares(generate: GenerateConfig) -> tuple[VariantShare, ...]:
    """The run's variants as the planner weighs their answers: completions per prompt and the share with
    thinking on (``Variant.thinking_mode``: on 1, off 0, mix ``generate.thinking_fraction``)."""
    share = {"on": 1.0, "off": 0.0, "mix": generate.thinking_fraction}
    return tuple(
        VariantShare(v.name, v.n, share[v.thinking_mode(generate.thinking)]) for v in generate.variants()
    )


def workload_from_audit_histogram(
    summary: dict[str, Any], max_tokens: int, variants: Sequence[VariantShare] = ()
) -> Workload:
    """Prompt p50/p99 from the audit: its exact percentiles over the kept samples when present, else
    its prompt-token histogram capped at the context limit (longer prompts never reach a server). The
    expected answer: the old answers' lengths, mixed over ``variants`` by thinking mode when the audit
    has answer-only lengths (``regen.sglang.workload.old_answers_expected``)."""
    answer_only = (summary.get("histograms") or {}).get(ANSWER_ONLY_HISTOGRAM)
    if "prompt_tokens_p99" in summary:  # exact, over the samples that go on to generation
        return workload_from_audit(summary, max_tokens=max_tokens, variants=variants, answer_only=answer_only)
    hist = summary.get("histograms", {}).get("prompt_tokens", {})
    limit = int(summary.get("context_limit") or 1 << 30)
    p50 = min(histogram_percentile(hist, 0.50), limit) or DEFAULT_PROMPT_P50
    p99 = min(histogram_percentile(hist, 0.99), limit) or DEFAULT_PROMPT_P99
    return Workload(
        prompt_p50=p50,
        prompt_p99=max(p99, p50),
        max_tokens=int(max_tokens),
        shared_prefixes=shared_prefixes(summary, variants),
        completions=run_completions(summary, variants),
        completions_per_prompt=completions_per_prompt(variants),
        **old_answers_expected(summary, variants, answer_only),
    )


@dataclass(frozen=True, slots=True)
class WorkloadPlan:
    """A plan for one workload: the plan file, and the recommendation it came from (None: a model the
    planner does not model, ``unmodelled`` says why; the given flags launch as they are)."""

    plan: PlanFile
    recommendation: Recommendation | None
    unmodelled: str | None = None


def plan_for_workload(server_cfg: ServerConfig, workload: Workload) -> WorkloadPlan:
    """The plan the servers launch with for ``workload``: the model config, the GPU, ``server.args`` and
    the quality opt-ins of ``server_cfg``; ``server.use_tuner`` decides, once, which section launches."""
    model_config = str(server_cfg.planned_model)
    gpu_mib = int(server_cfg.gpu_memory_mib or gpu_memory_from_nvidia_smi())
    version = planned_sglang_version(server_cfg)
    where: dict[str, Any] = {
        "sglang_version": version,
        "model_config": model_config,
        "gpu_memory_mib": gpu_mib,
    }
    model = ModelShape.from_config(model_config)
    args = mode_of(server_cfg).planned_args(server_cfg)  # as the server will be launched
    try:
        rec = recommend(
            model,
            gpu_mib,
            server_cfg.tp,
            args,
            workload,
            sglang_version=version,
            allow_fp8_kv=server_cfg.allow_fp8_kv,
            allow_bf16_state=server_cfg.allow_bf16_state,
        )
    except UnmodelledError as exc:
        return WorkloadPlan(unmodelled_plan_file(args, str(exc), **where), None, str(exc))
    planned = plan_file(rec, **where, use_recommended=server_cfg.use_tuner)
    return WorkloadPlan(mode_of(server_cfg).planned(server_cfg, planned), rec)
