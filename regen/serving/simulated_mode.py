"""server.mode simulated: the SGLang-compatible simulated server (``regen.simulated``) per GPU slot."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import ClassVar

from regen.runconfig import ServerConfig
from regen.serving.base import ServerMode
from regen.sglang.cache_report import CACHE_REPORT_FLAG
from regen.sglang.config import PlanFile
from regen.sglang.plan import parse_flags
from regen.simulated.capacity import STAND_IN_RUNNING_CAP

#: the keys of a plan section that a stand-in serves at most :data:`STAND_IN_RUNNING_CAP` of
STAND_IN_CAPPED = ("effective_max_running_requests", "client_concurrency")


def simulated_running_cap(cfg: ServerConfig, plan: PlanFile | None) -> int:
    """The simulated server's concurrency cap: explicit config, else the launched plan section's
    effective cap (so the simulated server behaves like the SGLang the tuner planned), else 64."""
    explicit = cfg.simulated.max_running_requests
    if explicit:
        return int(explicit)
    planned = plan.launched_section.get("effective_max_running_requests") if plan is not None else None
    return int(planned) if planned else 64


def build_simulated_command(
    cfg: ServerConfig, port: int, model_path: str, plan: PlanFile | None = None
) -> list[str]:
    """``python -m regen.simulated`` with the ``server.simulated`` behaviour."""
    sim = cfg.simulated
    return [
        sys.executable,
        "-m",
        "regen.simulated",
        "--host",
        cfg.host,
        "--port",
        str(port),
        "--model-path",
        model_path,
        "--max-running-requests",
        str(simulated_running_cap(cfg, plan)),
        "--token-rate",
        str(sim.token_rate),
        "--startup-delay",
        str(sim.startup_delay_s),
        "--faults",
        json.dumps(dict(sim.faults), sort_keys=True),
        *(["--half-speed-running", str(sim.half_speed_running)] if sim.half_speed_running else []),
        *(["--tokenizer-path", str(sim.tokenizer_path)] if sim.tokenizer_path else []),
        *simulated_plan_options(plan),
    ]


def simulated_plan_options(plan: PlanFile | None) -> list[str]:
    """``--options`` making the simulated server report the memory map of the launched plan section and
    the state/KV dtypes of its launch flags (an SGLang started with those flags reports its own)."""
    planned = plan.launched_section if plan is not None else {}
    flags = parse_flags(list(plan.launch_args)) if plan is not None else None
    fields = {
        "weights_gib": planned.get("weights_gib"),
        "kv_cache_gib": planned.get("kv_cache_gib"),
        "max_total_num_tokens": planned.get("kv_cache_tokens"),
        "mem_fraction_static": planned.get("mem_fraction_static"),
        "available_gpu_mem_gib": planned.get("free_gib"),
        "replay_ring_gib": planned.get("replay_ring_gib") or None,
        "max_mamba_cache_size": planned.get("max_mamba_cache_size"),
        "kv_cache_dtype": flags.kv_cache_dtype if flags is not None else None,
        "mamba_ssm_dtype": flags.mamba_ssm_dtype if flags is not None else None,
        # the radix cache and its report as launched: the stand-in serves and reports cached_tokens so
        "disable_radix_cache": True if flags is not None and flags.disable_radix_cache else None,
        "page_size": flags.page_size if flags is not None and flags.page_size > 1 else None,
        "enable_cache_report": True if plan is not None and CACHE_REPORT_FLAG in plan.launch_args else None,
    }
    options = {k: v for k, v in fields.items() if v is not None}
    return ["--options", json.dumps(options, sort_keys=True)] if options else []


def stand_in_plan(cfg: ServerConfig, plan: PlanFile) -> PlanFile:
    """The plan as a stand-in serves it: its running cap and the client's in-flight count at most what one
    stand-in process serves on a 2-core machine (``regen.simulated.capacity``), so the demo's servers are
    driven as a real server at its own scale (the planned GPU's memory map is kept: the stand-in reports it).
    An explicit ``server.simulated.max_running_requests`` still launches as given
    (``simulated_running_cap``)."""
    section = dict(plan.launched_section)
    rules = dict(section.get("rules") or {})
    why = (
        f"the stand-in (server.mode simulated) serves at most {STAND_IN_RUNNING_CAP} at once on a 2-core "
        "machine (regen.simulated.capacity)"
    )
    changed = False
    for key in STAND_IN_CAPPED:
        value = section.get(key)
        if isinstance(value, int) and value > STAND_IN_RUNNING_CAP:
            section[key] = STAND_IN_RUNNING_CAP
            rules[key] = f"{why}; planned for the GPU: {value:,}"
            changed = True
    if not changed:
        return plan
    section["rules"] = rules
    args = list(plan.launch_args)
    for at, arg in enumerate(args):
        if arg == "--max-running-requests" and at + 1 < len(args) and args[at + 1].isdigit():
            args[at + 1] = str(min(int(args[at + 1]), STAND_IN_RUNNING_CAP))
        elif arg.startswith("--max-running-requests=") and arg.split("=", 1)[1].isdigit():
            args[at] = f"--max-running-requests={min(int(arg.split('=', 1)[1]), STAND_IN_RUNNING_CAP)}"
    where = {plan.launched: section}
    return dataclasses.replace(plan, launch_args=tuple(args), **where)  # type: ignore[arg-type]


class Simulated(ServerMode):
    """The simulated server launched on each GPU slot (``build_simulated_command``), planned as what it is
    (``stand_in_plan``)."""

    name: ClassVar[str] = "simulated"

    def planned(self, cfg: ServerConfig, plan: PlanFile) -> PlanFile:
        return stand_in_plan(cfg, plan)

    def command(self, cfg: ServerConfig, plan: PlanFile | None, port: int, model_path: str) -> list[str]:
        return build_simulated_command(cfg, port, model_path, plan)
