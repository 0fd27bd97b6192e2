"""The simulated server is planned for what it is (issue 48 item 3): its running cap and the client's
in-flight count are what one stand-in process serves on a 2-core machine, not the GPU plan's thousands;
the GPU's memory map stays, and a real server's plan is untouched."""

from __future__ import annotations

import yaml
from support.workflow import ROOT

from regen.runconfig import ServerConfig
from regen.serving.simulated_mode import build_simulated_command, stand_in_plan
from regen.sglang.config import PlanFile
from regen.sglang.workload import Workload
from regen.simulated.capacity import STAND_IN_RUNNING_CAP
from regen.tune.workload_plan import plan_for_workload


def _plan(cap: int, client: int) -> PlanFile:
    section = {"effective_max_running_requests": cap, "client_concurrency": client, "kv_cache_tokens": 10**6}
    return PlanFile(("--max-running-requests", str(cap)), "recommended", {}, section)


def test_a_gpu_sized_plan_is_capped_at_what_the_stand_in_serves() -> None:
    cfg = ServerConfig.from_mapping({"mode": "simulated"})
    capped = stand_in_plan(cfg, _plan(9394, 9013))
    s = capped.launched_section
    assert s["effective_max_running_requests"] == s["client_concurrency"] == STAND_IN_RUNNING_CAP
    assert s["kv_cache_tokens"] == 10**6  # the memory map is the GPU's, as the stand-in reports it
    assert "planned for the GPU: 9,394" in s["rules"]["effective_max_running_requests"]
    assert capped.launch_args == ("--max-running-requests", str(STAND_IN_RUNNING_CAP))
    argv = build_simulated_command(cfg, 31000, "demo-model", capped)
    assert argv[argv.index("--max-running-requests") + 1] == str(STAND_IN_RUNNING_CAP)
    joined = PlanFile(("--max-running-requests=9394", "--x"), "given", _plan(9394, 9013).recommended, {})
    assert stand_in_plan(cfg, joined).launch_args == (f"--max-running-requests={STAND_IN_RUNNING_CAP}", "--x")
    small = _plan(32, 24)
    assert stand_in_plan(cfg, small) is small


def test_the_demo_plans_the_stand_in_and_a_real_server_keeps_the_gpu_plan() -> None:
    server = yaml.safe_load((ROOT / "config" / "demo.yaml").read_text())["server"]
    workload = Workload(prompt_p50=35, prompt_p99=238, max_tokens=32)
    demo = plan_for_workload(ServerConfig.from_mapping(server), workload).plan.launched_section
    assert demo["effective_max_running_requests"] == STAND_IN_RUNNING_CAP
    real = plan_for_workload(ServerConfig.from_mapping({**server, "mode": "sglang"}), workload).plan
    assert real.launched_section["effective_max_running_requests"] > 10 * STAND_IN_RUNNING_CAP
