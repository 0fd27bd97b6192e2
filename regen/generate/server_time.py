"""How long one request takes on this run's servers (``regen.generate.pacing.RequestTime``): the stand-in's
measured speed for ``server.mode simulated``, else the decode-step line the last ``regen tune --sweep``
measured (``results/plan/pilot.json``), else the documented estimate (``ESTIMATED_GPU_STEP``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from regen.generate.pacing import ESTIMATED_GPU_STEP, RequestTime, measured_step
from regen.runconfig import ServerConfig
from regen.simulated.capacity import STAND_IN_REQUEST_S, STAND_IN_TOKEN_S


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
            doc = json.loads(Path(pilot).read_text())
        except (OSError, ValueError):
            doc = None
        closed = doc.get("projection_closed_loop") if isinstance(doc, dict) else None
        found = measured_step(closed.get("step_model")) if isinstance(closed, dict) else None
        if found is not None:
            return found
    return ESTIMATED_GPU_STEP
