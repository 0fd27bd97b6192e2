"""The client keeps the plan's ``client_concurrency`` in flight, not SGLang's running cap.

For dense, MoE and MLA models the planner leaves ``--max-running-requests`` at SGLang's default (thousands
on a large KV) and plans how many requests fill the KV at the expected length; a client that read the
server's cap would send thousands and live on retraction.
"""

from __future__ import annotations

from regen.serving.probes import effective_max_running
from regen.sglang.config import PlanFile


def _plan(client: int | None, args: tuple[str, ...] = ()) -> PlanFile:
    return PlanFile(
        launch_args=args,
        launched="recommended",
        given={},
        recommended={"client_concurrency": client} if client else {},
    )


def _info(cap: int) -> dict:
    return {"internal_states": [{"effective_max_running_requests_per_dp": cap}]}


def test_the_planned_in_flight_count_wins_over_a_larger_server_cap() -> None:
    assert effective_max_running(_info(4096), _plan(528)) == 528


def test_the_server_cap_bounds_the_plan() -> None:
    assert effective_max_running(_info(300), _plan(528)) == 300


def test_without_a_planned_count_the_server_cap_is_used() -> None:
    assert effective_max_running(_info(4096), _plan(None)) == 4096
    assert effective_max_running({}, _plan(None, ("--max-running-requests", "64"))) == 64
    assert effective_max_running({}, None) is None


def test_a_plan_with_no_server_info_keeps_its_count() -> None:
    assert effective_max_running({}, _plan(443)) == 443
