"""How long one request takes on this run's servers (``regen.generate.pacing.RequestTime``): the stand-in's
measured speed for ``server.mode simulated``, else the decode-step line the last ``regen tune --sweep``
measured (``results/plan/pilot.json``), else the documented estimate (``ESTIMATED_GPU_STEP``); and whether
``generate.request_timeout_s`` and the plan disagree (:func:`timeout_disagreement`: ``regen check`` and the
generate job say it)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from regen.generate.pacing import (
    ESTIMATED_GPU_STEP,
    RequestTime,
    longest_request_tokens,
    measured_step,
    timeout_conflict,
)
from regen.layout.run import RunLayout
from regen.pilot_file import PilotFile
from regen.runconfig import GenerateConfig, ServerConfig, config_section
from regen.sglang.config import PlanFile
from regen.sglang.flags import parse_flags
from regen.simulated.capacity import STAND_IN_REQUEST_S, STAND_IN_RUNNING_CAP, STAND_IN_TOKEN_S


def stand_in_time(server: ServerConfig) -> RequestTime:
    """The simulated server's request time: a decode step is ``1 / token_rate`` (slower with
    ``half_speed_running``) plus its CPU per token for each running request; a request's own CPU cost
    stands for the prefill (``regen.simulated.capacity``)."""
    sim = server.simulated
    rate = float(sim.token_rate)
    fixed = 1.0 / rate if rate > 0 else 0.0
    per = STAND_IN_TOKEN_S + (
        1.0 / (sim.half_speed_running * rate) if rate > 0 and sim.half_speed_running else 0
    )
    basis = f"the stand-in's measured CPU cost (regen.simulated.capacity), token_rate {rate:g}"
    return RequestTime(fixed, per, STAND_IN_REQUEST_S, basis, False)


def request_time_for(server: ServerConfig, pilot: str | os.PathLike[str] | None = None) -> RequestTime:
    """The request time of ``server``'s mode: the stand-in's, the pilot's measured step line (``pilot``:
    its ``pilot.json``), else the estimate."""
    if server.mode == "simulated":
        return stand_in_time(server)
    if pilot is not None:
        try:
            sweep = PilotFile.read(pilot)
        except (OSError, ValueError):
            sweep = None
        found = measured_step(sweep.step_model) if sweep is not None else None
        if found is not None:
            return found
    return ESTIMATED_GPU_STEP


def planned_batch(server: ServerConfig, plan: PlanFile | None) -> tuple[int, str] | None:
    """(the batch the client runs on each server, where it comes from): the plan's client count within its
    running cap; without a plan, ``--max-running-requests`` in ``server.args``, or the stand-in's cap; None
    when nothing says it."""
    section = plan.launched_section if plan is not None else {}
    counts = [
        int(section[k]) for k in ("client_concurrency", "effective_max_running_requests") if section.get(k)
    ]
    if counts:
        return min(counts), "the plan"
    given = parse_flags(list(server.args)).max_running_requests if server.args else None
    if given:
        return int(given), "server.args --max-running-requests"
    if server.mode == "simulated":
        return STAND_IN_RUNNING_CAP, "the stand-in's cap"
    return None


def timeout_disagreement(
    generate: GenerateConfig,
    server: ServerConfig,
    plan: PlanFile | None,
    pilot: str | os.PathLike[str] | None,
) -> str | None:
    """Why ``generate.request_timeout_s`` is shorter than one worst-case request at the planned batch
    (``regen.generate.pacing.timeout_conflict``: the number and the fix), naming where the batch came from;
    without a planned batch, whether one such request alone is longer; None when they agree."""
    if server.mode == "external":
        return None
    time = request_time_for(server, pilot)
    batch = planned_batch(server, plan)
    running, source = batch if batch is not None else (1, "one request alone (no plan yet)")
    conflict = timeout_conflict(running, generate.request_timeout_s, longest_request_tokens(generate), time)
    return None if conflict is None else f"{conflict} (batch from {source})"


def timeout_notes(config: Mapping[str, Any], results_dir: str | os.PathLike[str] = "results") -> list[str]:
    """``regen check``'s note when the timeout and the plan (``RESULTS/plan/server.json`` when written, and a
    sweep's measured step line) disagree; nothing when they agree or the config does not read."""
    layout = RunLayout(results=Path(results_dir))
    try:
        generate = GenerateConfig.from_dict(config_section(config, "generate"))
        server = ServerConfig.from_mapping(config_section(config, "server"))
        plan = PlanFile.read(layout.server_plan) if layout.server_plan.is_file() else None
    except (OSError, ValueError, KeyError, TypeError):
        return []
    found = timeout_disagreement(generate, server, plan, layout.pilot)
    return [found] if found else []
