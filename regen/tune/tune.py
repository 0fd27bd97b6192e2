"""The tune stage: ``regen tune`` (plan and recommend), ``regen tune --sweep`` (benchmark the top
configs live) and the ``tune`` rule's entry (``results/plan/server.json`` from the audited workload).

The memory model is :mod:`regen.sglang.plan`, the recommendation :mod:`regen.sglang.recommend`; the live
benchmark :mod:`regen.tune.sweep`; the projection :mod:`regen.tune.projection`; what a launched server
really got :mod:`regen.sglang.realized`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from regen.configfile import load_config
from regen.generate.server_time import timeout_disagreement
from regen.ingest.shards import read_shard_spread
from regen.layout.run import RunLayout
from regen.runconfig import GenerateConfig, RunConfig, ServerConfig, section_schema
from regen.serving.gpus import gpu_memory_from_nvidia_smi
from regen.serving.lifecycle import mode_of
from regen.sglang.config import PlanFile
from regen.sglang.flags import parse_flags
from regen.sglang.models import ModelShape
from regen.sglang.plan import DEFAULT_VERSION, SUPPORTED_VERSIONS, UnmodelledError
from regen.sglang.recommend import Recommendation, recommend, unmodelled_plan_file, write_plan_file
from regen.sglang.workload import (
    VariantShare,
    Workload,
    completions_per_prompt,
    default_workload,
    run_completions,
    shared_prefixes,
    workload_from_audit,
)
from regen.tune.pilot import DEFAULT_DRAIN_FRACTION
from regen.tune.prestart import confirm_prestarted
from regen.tune.projection import count_remaining
from regen.tune.sweep import (
    SweepCandidate,
    SweepError,
    SweepTimes,
    pilot_report,
    run_sweep,
    run_truncation,
    write_pilot,
)
from regen.tune.sweep_report import generate_job_seconds, render_result
from regen.tune.workload_plan import (
    plan_for_workload,
    planned_sglang_version,
    variant_shares,
    workload_from_audit_histogram,
)
from regen.types import Sample

log = logging.getLogger("regen.tune.tune")

SWEEP_DESCRIPTION = "benchmark a few candidate server configs live, keep the fastest, project the run."


# ----------------------------------------------------------------------------- regen tune --
_ROWS = [
    ("weights", "weights_gib"),
    ("state pool", "state_pool_gib"),
    ("spec scratch", "spec_scratch_gib"),
    ("KV cache", "kv_cache_gib"),
    ("ReplaySSM ring (outside the pool budget)", "replay_ring_gib"),
    ("graphs+activations reserve", "reserve_gib"),
    ("slack (1-mfs)", "slack_gib"),
    ("CUDA context", "context_gib"),
    ("free", "free_gib"),
]


def add_planning_arguments(parser: argparse.ArgumentParser) -> None:
    """The options ``regen tune`` and ``regen tune --sweep`` share: version, workload, quality opt-ins."""
    parser.add_argument(
        "--sglang-version",
        default=None,
        choices=SUPPORTED_VERSIONS,
        help=f"the SGLang whose allocation rules are modelled (regen tune: default {DEFAULT_VERSION}; "
        "--sweep: server.sglang_version, else the installed SGLang, as the tune rule plans)",
    )
    parser.add_argument("--prompt-p50", type=int, help="median prompt tokens (default: from --audit-summary)")
    parser.add_argument(
        "--prompt-p99", type=int, help="99th-percentile prompt tokens (default: --audit-summary)"
    )
    parser.add_argument("--audit-summary", help="audit summary.json with prompt-token percentiles")
    parser.add_argument("--allow-bf16-state", action="store_true", help="linear-attention state in bf16")
    parser.add_argument("--allow-fp8-kv", action="store_true", help="fp8 KV cache")
    parser.add_argument(
        "--allow-replay-decode", action="store_true",
        help="with --expected-output-tokens: add a ReplaySSM decode candidate (--enable-linear-replayssm); "
        "measured on an H200 (27B hybrid, SGLang 0.5.17): no gain",
    )  # fmt: skip
    parser.add_argument(
        "--expected-output-tokens", type=int,
        help="mean completion tokens expected: adds scheduler candidates sized for it (--sweep runs them)",
    )  # fmt: skip
    parser.add_argument(
        "--expected-output-cv", type=float,
        help="the answer lengths' coefficient of variation (std / mean, lengths capped at max_tokens; from "
        "the old answers or a pilot): with --expected-output-tokens, attention-only models fill the KV at "
        "the running set's mean context, prompt p50 + E[L](1+cv^2)/2 (default: the audit's, else unknown: "
        "prompt p50 + E[L])",
    )  # fmt: skip


def expected_output_fields(ns: argparse.Namespace, base: Workload) -> dict[str, Any]:
    """The workload's expected answer and its spread: the flags' where given, else the audit's (``base``)."""
    return {
        "expected_output_tokens": ns.expected_output_tokens or base.expected_output_tokens,
        "expected_output_source": "--expected-output-tokens"
        if ns.expected_output_tokens
        else base.expected_output_source,
        "expected_output_cv": base.expected_output_cv
        if ns.expected_output_cv is None
        else ns.expected_output_cv,
        "expected_output_cv_source": base.expected_output_cv_source
        if ns.expected_output_cv is None
        else "--expected-output-cv",
    }


def render_table(rec: Recommendation) -> str:
    g, r = rec.given, rec.recommended
    lines = [f"{'GiB / count':<28}{'given':>24}{'recommended':>24}"]
    for label, attr in _ROWS:
        lines.append(f"{label:<28}{getattr(g, attr):>24.2f}{getattr(r, attr):>24.2f}")
    for label, attr in [
        ("mem_fraction_static", "mem_fraction_static"),
        ("KV tokens", "kv_cache_tokens"),
        ("sliding-window tokens", "swa_tokens"),
        ("mamba slots (K)", "max_mamba_cache_size"),
        ("slots per request", "mamba_slots_per_request"),
        ("effective running", "effective_max_running_requests"),
        ("worst-case concurrency", "workload_concurrency"),
        ("client in flight", "client_concurrency"),
        ("decode graphs to", "cuda_graph_max_bs"),
        ("binding constraint", "binding_constraint"),
    ]:
        lines.append(f"{label:<28}{_cell(getattr(g, attr)):>24}{_cell(getattr(r, attr)):>24}")
    lines.append("")
    lines.append("rules (recommended):")
    lines += [f"  {key}: {rule}" for key, rule in r.rules().items()]
    lines.append("")
    lines.append("recommended flags: " + " ".join(rec.args))
    lines += [f"  reason: {x}" for x in rec.reasons]
    lines += [f"  warning: {x}" for x in rec.warnings]
    if rec.mtp_note:
        lines.append(rec.mtp_note)
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def cli(argv: list[str]) -> int:
    own = argv[: argv.index("--")] if "--" in argv else argv
    if "--sweep" in own:  # live benchmark of the top configs (regen.tune.sweep measures them)
        cut = own.index("--sweep")
        return sweep_cli(argv[:cut] + argv[cut + 1 :])
    sglang_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, sglang_args = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(prog="regen tune", description="Plan SGLang memory and flags.")
    parser.add_argument("--model-config", help="HF model dir or config.json (default: the --configfile's)")
    parser.add_argument("--gpu-memory-mib", type=int, help="GPU memory (default: nvidia-smi)")
    tp = section_schema("server")["properties"]["tp"]["default"]
    parser.add_argument("--tp", type=int, help=f"tensor-parallel GPUs per server (default {tp})")
    parser.add_argument(
        "--configfile",
        help="the run's config file: server.model_config (else model_path), tp, gpu_memory_mib, args and "
        "generate.sampling.max_tokens are the defaults (with --sweep: its server and generate sections)",
    )
    add_planning_arguments(parser)
    parser.add_argument(
        "--max-tokens", type=int, help="answer budget per request (generate.sampling.max_tokens)"
    )
    parser.add_argument("--concurrency", type=int, help="target concurrency (default: as high as fits)")
    parser.add_argument("--json", action="store_true", help="print the recommendation as JSON, not a table")
    parser.add_argument("--out", help="write a plan file (launch_args + plans)")
    parser.add_argument(
        "--sweep", action="store_true", help="benchmark the top configs live; `regen tune --sweep --help`"
    )
    ns = parser.parse_args(argv)
    ns.sglang_version = ns.sglang_version or DEFAULT_VERSION
    try:
        run = run_config_of(ns.configfile)
        server = run.server
        if ns.configfile:
            ns.model_config = ns.model_config or server.planned_model
            ns.gpu_memory_mib = ns.gpu_memory_mib or server.gpu_memory_mib
            sglang_args = sglang_args or list(server.args)
        # generate.sampling.max_tokens as configured, else the schema's default (the one default)
        ns.max_tokens = ns.max_tokens or run.generate.sampling.max_tokens
        if not ns.model_config:
            parser.error("give --model-config, or --configfile with the run's config")
        ns.tp = ns.tp or server.tp
        model = ModelShape.from_config(ns.model_config)
        gpu = ns.gpu_memory_mib or gpu_memory_from_nvidia_smi()
        base = (
            workload_from_audit(ns.audit_summary, ns.max_tokens)
            if ns.audit_summary
            else default_workload(ns.max_tokens)
        )
        p99 = ns.prompt_p99 or base.prompt_p99
        p50 = ns.prompt_p50 or min(base.prompt_p50, p99)  # a given p99 below the default p50 bounds it
        workload = Workload(
            prompt_p50=p50,
            prompt_p99=max(p99, p50),
            max_tokens=ns.max_tokens,
            target_concurrency=ns.concurrency,
            shared_prefixes=run_shared_prefixes(ns.audit_summary, run.generate),
            completions=audit_completions(ns.audit_summary, run.generate),
            completions_per_prompt=completions_per_prompt(variant_shares(run.generate)),
            **expected_output_fields(ns, base),
        )
        rec = recommend(
            model, gpu, ns.tp, sglang_args, workload, ns.sglang_version,
            allow_fp8_kv=ns.allow_fp8_kv, allow_bf16_state=ns.allow_bf16_state,
            allow_replay_decode=ns.allow_replay_decode,
        )  # fmt: skip
    except UnmodelledError as exc:  # SGLang's own planning: the given flags, nothing that changes memory
        note = f"{exc}; SGLang plans its own memory: launch the given flags as they are"
        if ns.out:
            where = {
                "sglang_version": ns.sglang_version,
                "model_config": ns.model_config,
                "gpu_memory_mib": gpu,
            }
            unmodelled_plan_file(sglang_args, str(exc), **where).write(ns.out)
        unplanned = {"unmodelled": note, "recommended": {"args": sglang_args, "client_concurrency": None}}
        print(json.dumps(unplanned, indent=1) if ns.json else note)
        return 0
    except (ValueError, OSError) as exc:  # a refusal (tp SGLang refuses, weights that do not fit): non-zero
        print(f"regen tune: {exc}", file=sys.stderr)
        return 2
    if ns.out:
        write_plan_file(ns.out, rec, sglang_version=ns.sglang_version, model_config=ns.model_config,
                        gpu_memory_mib=gpu)  # fmt: skip
    if ns.json:
        print(json.dumps(rec.to_json(), indent=1))
    else:
        print(render_table(rec))
    if rec.small_run:
        print(rec.small_run, file=sys.stderr)
    if ns.configfile:  # the run's request timeout against this plan (regen check says it too)
        planned = mode_of(server).planned(server, PlanFile((), "recommended", {}, rec.recommended.to_json()))
        conflict = timeout_disagreement(run.generate, server, planned, None)
        if conflict is not None:
            print(f"regen tune: warning: {conflict}", file=sys.stderr)
    return 0


# ------------------------------------------------------------------- regen tune --sweep --
def run_shared_prefixes(
    audit_summary: str | os.PathLike[str] | None, generate: GenerateConfig
) -> tuple[str, ...]:
    """Why the run's prompts share prefixes (``regen.sglang.workload.shared_prefixes``): its variants'
    completions per prompt, and the audit summary where one is given and written."""
    path = Path(audit_summary) if audit_summary else None
    summary = json.loads(path.read_text()) if path is not None and path.is_file() else {}
    return shared_prefixes(summary, variant_shares(generate))


def audit_completions(audit_summary: str | os.PathLike[str] | None, generate: GenerateConfig) -> int | None:
    """The run's completions (``regen.sglang.workload.run_completions``) where an audit summary is given
    and written; None otherwise (the run's size is not weighed)."""
    path = Path(audit_summary) if audit_summary else None
    if path is None or not path.is_file():
        return None
    return run_completions(json.loads(path.read_text()), variant_shares(generate))


def run_config_of(configfile: str | None) -> RunConfig:
    """The typed run config of ``--configfile`` (:func:`regen.configfile.load_config`: validated, the
    schema's defaults filled in; a file may hold only its server and generate sections); without one,
    the schema's defaults."""
    return RunConfig.from_config(load_config([configfile], whole=False) if configfile else {})


def pilot_samples(shard: str | os.PathLike[str], limit: int) -> list[Sample]:
    """Up to ``limit`` samples spread evenly over the shard: the shard is ordered longest expected answer
    first (``regen.ingest.shards``), so its first samples would make a pilot of the longest answers."""
    out = read_shard_spread(shard, limit)
    if not out:
        raise SweepError(f"{shard}: no samples for the pilot")
    return out


def candidates_from_recommendation(
    rec: Any, top: int, mtp: bool = True, given: bool = True
) -> list[tuple[SweepCandidate, Any]]:
    """(candidate, its MemoryPlan): the recommended config, the tuner's next best, the speculative ones
    (``rec.speculative``: MTP at 1-3 steps, or MTP off when the given flags force it; unless ``mtp`` is
    False), then the given flags (unless ``given`` is False).

    The simulated cap is the plan's client concurrency (the in-flight count it plans for), else its
    worst-case workload concurrency, else its running cap.
    """

    def cap(p: Any) -> int:
        return int(p.client_concurrency or p.workload_concurrency or p.effective_max_running_requests)

    found: list[tuple[SweepCandidate, Any]] = [
        (SweepCandidate(tuple(rec.args), cap(rec.recommended), "recommended"), rec.recommended)
    ]
    for i, c in enumerate(rec.candidates[1:top], start=1):
        found.append((SweepCandidate(tuple(c.args), cap(c.plan), f"tuner #{i + 1}"), c.plan))
    for c in rec.speculative if mtp else ():  # MTP on / off, measured next to the best without it
        found.append((SweepCandidate(tuple(c.args), cap(c.plan), mtp_label(c.args)), c.plan))
    if given:
        found.append((SweepCandidate(tuple(rec.given.args), cap(rec.given), "given"), rec.given))
    seen: set[tuple[str, ...]] = set()
    unique = []
    for cand, p in found:
        if cand.args not in seen:
            seen.add(cand.args)
            unique.append((cand, p))
    return unique


def mtp_label(args: Sequence[str]) -> str:
    """A speculative candidate's sweep label: ``mtp 3 steps``, or ``mtp off`` (the given flags without it)."""
    flags = parse_flags(list(args))
    if not flags.speculative_algorithm:
        return "mtp off"
    steps = flags.speculative_num_steps or 3
    return f"mtp {steps} step{'s' if steps != 1 else ''}"


def _sweep_parser() -> argparse.ArgumentParser:
    """``regen tune --sweep``'s options (SGLang's own flags come after ``--``)."""
    p = argparse.ArgumentParser(prog="regen tune --sweep", description=SWEEP_DESCRIPTION)
    p.add_argument("--model-config", help="HF model dir or config.json (default: server.model_config)")
    p.add_argument("--gpu-memory-mib", type=int, help="default: server.gpu_memory_mib, nvidia-smi")
    p.add_argument("--tp", type=int, help="tensor parallel size (default: server.tp)")
    add_planning_arguments(p)
    p.add_argument("--max-tokens", type=int, help="default: generate.sampling.max_tokens")
    p.add_argument(
        "--configfile",
        "--server-config",
        dest="server_config",
        help="the run's config file: its server: and generate: sections are used",
    )
    p.add_argument("--simulated", action="store_true", help="run simulated servers (server.mode simulated)")
    p.add_argument("--pilot-shard", help="default: first results/shards/*.parquet")
    p.add_argument("--pilot-samples", type=int, default=300, help="pilot prompts (cycled) (default 300)")
    p.add_argument("--seconds", type=float, default=20.0, help="measurement time per candidate (default 20)")
    p.add_argument(
        "--drain-seconds",
        type=float,
        default=None,
        help="after each pilot's window, seconds it sends nothing new and lets the batch fall (the "
        f"projection's drain cost comes from it; default: {DEFAULT_DRAIN_FRACTION:g} of --seconds)",
    )
    p.add_argument("--candidates", type=int, default=2, help="tuner configs to try besides the given flags")
    p.add_argument(
        "--no-mtp", action="store_true", help="skip the MTP candidates (models with MTP layers: 1-3 steps)"
    )
    p.add_argument("--gpus", type=int, help="GPUs for the projection (default: server.gpus)")
    p.add_argument("--results", default="results", help="the run's results directory (default: results)")
    p.add_argument("--work", default="work", help="the run's work directory (default: work)")
    p.add_argument("--out", default=None, help="pilot file (default: RESULTS/plan/pilot.json)")
    p.add_argument("--plan-out", help="also write a plan file (like results/plan/server.json) with the best")
    p.add_argument(
        "--no-given",
        action="store_true",
        help="do not also measure the given flags (server.args untuned): one server fewer",
    )
    return p


def sweep_cli(argv: list[str]) -> int:
    """``regen tune --sweep``: recommend, benchmark the top configs live, write pilot.json."""
    sglang_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, sglang_args = argv[:cut], argv[cut + 1 :]
    ns = _sweep_parser().parse_args(argv)
    try:
        run = run_config_of(ns.server_config)
        server_cfg, generate_cfg = run.server, run.generate
        if ns.simulated:
            server_cfg = dataclasses.replace(server_cfg, mode="simulated")
        if server_cfg.mode == "external":
            raise SweepError("server.mode external: regen does not launch the server, nothing to sweep")
        if not sglang_args:
            sglang_args = mode_of(server_cfg).planned_args(server_cfg)  # as the tune rule plans
        model_config = ns.model_config or server_cfg.planned_model
        model = ModelShape.from_config(model_config)
        gpu_mib = ns.gpu_memory_mib or server_cfg.gpu_memory_mib or gpu_memory_from_nvidia_smi()
        tp = int(ns.tp or server_cfg.tp)
        gpus = int(ns.gpus or server_cfg.gpus)
        max_tokens = int(ns.max_tokens or generate_cfg.sampling.max_tokens)
        layout = RunLayout(results=Path(ns.results), work=Path(ns.work))
        ns.sglang_version = ns.sglang_version or planned_sglang_version(server_cfg)
        base = sweep_workload(ns.audit_summary, layout, max_tokens)
        p50 = ns.prompt_p50 or base.prompt_p50
        workload = Workload(
            prompt_p50=p50,
            prompt_p99=max(ns.prompt_p99 or base.prompt_p99, p50),
            max_tokens=max_tokens,
            shared_prefixes=run_shared_prefixes(ns.audit_summary or layout.audit_summary, generate_cfg),
            completions_per_prompt=completions_per_prompt(variant_shares(generate_cfg)),
            **expected_output_fields(ns, base),
        )
        rec = recommend(
            model, int(gpu_mib), tp, sglang_args, workload, ns.sglang_version,
            allow_fp8_kv=ns.allow_fp8_kv or server_cfg.allow_fp8_kv,
            allow_bf16_state=ns.allow_bf16_state or server_cfg.allow_bf16_state,
            allow_replay_decode=ns.allow_replay_decode,
        )  # fmt: skip
        pairs = candidates_from_recommendation(
            rec, 1 + max(0, ns.candidates - 1), mtp=not ns.no_mtp, given=not ns.no_given
        )
        shard = ns.pilot_shard or _first_shard(layout)
        samples = pilot_samples(shard, ns.pilot_samples)
        result = run_sweep(server_cfg, [c for c, _ in pairs], samples, generate_cfg, ns.seconds,
                           layout.sweep_dir, times=SweepTimes(drain_s=ns.drain_seconds))  # fmt: skip
        remaining = count_remaining(ns.results, ns.work, generate_cfg)
        report = pilot_report(
            result, remaining, gpus, tp,
            extra={"pilot_shard": str(shard), "model_config": str(model_config), "gpu_memory_mib": gpu_mib,
                   "server_mode": server_cfg.mode, "sglang_version": ns.sglang_version},
            truncation=run_truncation(generate_cfg, result.best_args),
        )  # fmt: skip
        out = Path(ns.out) if ns.out else layout.pilot
        pilot = write_pilot(out, report)
        if ns.plan_out:
            best_cand, best_plan = pairs[[c.args for c, _ in pairs].index(result.best_args)]
            chosen = dataclasses.replace(
                rec,
                recommended=best_plan,
                args=best_cand.args,
                reasons=(f"fastest in the pilot sweep: {result.best.rate_tok_s:.1f} tok/s "
                         f"({best_cand.label}); see {out}",),
            )  # fmt: skip
            write_plan_file(ns.plan_out, chosen, sglang_version=ns.sglang_version,
                            model_config=str(model_config), gpu_memory_mib=int(gpu_mib))  # fmt: skip
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"regen tune --sweep: {exc}", file=sys.stderr)
        return 2
    print(render_result(pilot, generate_job_seconds(layout)))
    print(f"wrote {out}")
    return 0


def sweep_workload(audit_summary: str | None, layout: RunLayout, max_tokens: int) -> Workload:
    """The workload the sweep plans for: the given audit summary, else the run's own (the tune rule's
    reading of it, ``workload_from_audit_histogram``), else SGLang-agnostic defaults."""
    path = Path(audit_summary) if audit_summary else layout.audit_summary
    if not path.is_file():
        if audit_summary:
            raise SweepError(f"--audit-summary {audit_summary}: no such file")
        return default_workload(max_tokens)
    return workload_from_audit_histogram(json.loads(path.read_text()), max_tokens)


def _first_shard(layout: RunLayout) -> Path:
    shards = layout.shard_files()
    if not shards:
        raise SweepError(f"no prompt shard under {layout.shards_dir}: pass --pilot-shard")
    return shards[0]


# ------------------------------------------------------------------------ workflow rule --
def write_plan_for_workflow(
    *,
    server_cfg: ServerConfig,
    max_tokens: int,
    audit_summary: str,
    out_path: str,
    variants: Sequence[VariantShare] = (),
) -> None:
    """The ``tune`` rule: plan (and recommend) from the model config, the GPU and the audited workload;
    servers this run prestarted from a provisional plan are adopted or stopped first
    (``regen.tune.prestart.confirm_prestarted``)."""
    if server_cfg.mode == "external":
        PlanFile.for_external_server().write(out_path)
        log.info("server.mode external: nothing to plan, the endpoint is managed by the user")
        return
    workload = workload_from_audit_histogram(
        json.loads(Path(audit_summary).read_text()), max_tokens, variants
    )
    planned = plan_for_workload(server_cfg, workload)
    if planned.unmodelled is not None:
        log.warning(
            "%s: SGLang plans its own memory; the given server.args launch as they are", planned.unmodelled
        )
    # a small run's plan without the weighing of its size: what prestarted servers are kept for
    small = planned.recommendation is not None and planned.recommendation.small_run
    unweighed = (
        plan_for_workload(server_cfg, dataclasses.replace(workload, completions=None)).plan if small else None
    )
    # the one place the launched section is decided: server.use_tuner (plan_for_workload)
    written = confirm_prestarted(planned.plan, server_cfg, started_plan=unweighed)
    written.write(out_path)
    rec = planned.recommendation
    if rec is None:
        return
    plan = planned.plan
    log.info("plan for %s on %d MiB (sglang %s): %s", plan.model_config, plan.gpu_memory_mib,
             plan.sglang_version, workload)  # fmt: skip
    if rec.small_run and written.launch_args == planned.plan.launch_args:  # not kept for started servers
        log.warning("%s", rec.small_run)  # the one line on Snakemake's console: SGLang's defaults, and why
        print(rec.small_run, file=sys.__stderr__, flush=True)
    for reason in rec.reasons:
        log.info("recommend: %s", reason)
    for warning in rec.warnings:
        log.warning("%s", warning)
