"""server.mode simulated: the SGLang-compatible simulated server (``regen.simulated``) per GPU slot."""

from __future__ import annotations

import json
import sys
from typing import ClassVar

from regen.runconfig import ServerConfig
from regen.serving.base import ServerMode
from regen.sglang.config import PlanFile
from regen.sglang.plan import parse_flags


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
    }
    options = {k: v for k, v in fields.items() if v is not None}
    return ["--options", json.dumps(options, sort_keys=True)] if options else []


class Simulated(ServerMode):
    """The simulated server launched on each GPU slot (``build_simulated_command``)."""

    name: ClassVar[str] = "simulated"

    def command(self, cfg: ServerConfig, plan: PlanFile | None, port: int, model_path: str) -> list[str]:
        return build_simulated_command(cfg, port, model_path, plan)
