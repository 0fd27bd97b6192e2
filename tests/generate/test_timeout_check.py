"""``regen check`` and the generate job say when ``generate.request_timeout_s`` and the plan disagree: one
worst-case request at the planned batch takes longer than the timeout (issue 48 item 2), with the number
and the fix; the step line is the pilot's measured one when a sweep wrote it, else an estimate saying so."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml
from support.workflow import copy_workflow

from regen.generate.pacing import ESTIMATED_GPU_STEP
from regen.generate.server_time import request_time_for, stand_in_time, timeout_disagreement
from regen.runconfig import GenerateConfig, ServerConfig
from regen.sglang.config import PlanFile

REGEN = str(Path(sys.executable).with_name("regen"))


def check(wd: Path, *overlay: str) -> str:
    run = subprocess.run(
        [REGEN, "check", "--configfile", "config/demo.yaml", *overlay], cwd=wd, capture_output=True, text=True
    )
    return run.stdout + run.stderr


def test_regen_check_names_the_worst_request_and_the_fix(tmp_path: Path) -> None:
    wd = copy_workflow(tmp_path / "wd")
    assert "request_timeout_s" not in check(wd)  # the demo: 512 tokens on the stand-in, 30 s
    (wd / "config" / "long.yaml").write_text(
        "generate: {request_timeout_s: 60, sampling: {max_tokens: 32768}}\n"
    )
    out = check(wd, "config/long.yaml")
    line = next(x for x in out.splitlines() if "request_timeout_s 60 s is shorter" in x)
    server = ServerConfig.from_mapping(yaml.safe_load((wd / "config" / "demo.yaml").read_text())["server"])
    worst = stand_in_time(server).worst_s(128, 32768)
    assert f"at 128 running take {worst:,.0f} s" in line and "the stand-in's measured CPU cost" in line
    fix = re.search(r"Raise request_timeout_s to (\d+) or lower --max-running-requests to (\d+)", line)
    assert fix is not None, line
    assert int(fix[1]) >= worst and stand_in_time(server).worst_s(int(fix[2]), 32768) <= 60 < worst


def test_a_measured_step_line_is_used_and_an_estimate_says_it_is_one(tmp_path: Path) -> None:
    server = ServerConfig.from_mapping({"mode": "sglang", "model_path": "m"})
    generate = GenerateConfig.from_dict({"request_timeout_s": 300, "sampling": {"max_tokens": 32768}})
    plan = PlanFile(
        (), "recommended", {}, {"effective_max_running_requests": 4096, "client_concurrency": 671}
    )
    estimated = timeout_disagreement(generate, server, plan, tmp_path / "no-pilot.json")
    assert estimated is not None and "at 671 running" in estimated and "an estimate" in estimated
    assert request_time_for(server, None) == ESTIMATED_GPU_STEP
    pilot = tmp_path / "pilot.json"
    # the Llama-3.1-8B line: ~47 ms a step at 671 running
    step = {"fixed_s": 0.015, "per_request_s": 0.0000477, "basis": "least squares over 5 points"}
    pilot.write_text(json.dumps({"projection_closed_loop": {"step_model": step}}))
    measured = timeout_disagreement(generate, server, plan, pilot)
    assert measured is not None and "an estimate" not in measured and "1,542 s" in measured
    assert timeout_disagreement(generate.__class__.from_dict({"request_timeout_s": 3600,
                                "sampling": {"max_tokens": 32768}}), server, plan, pilot) is None  # fmt: skip


def test_regen_tune_warns_under_its_plan(tmp_path: Path) -> None:
    wd = copy_workflow(tmp_path / "wd")
    config = yaml.safe_load((wd / "config" / "demo.yaml").read_text())
    config["server"]["mode"] = "sglang"
    config["generate"].update(request_timeout_s=300, sampling={"max_tokens": 32768})
    (wd / "config" / "long.yaml").write_text(yaml.safe_dump(config))
    run = subprocess.run(
        [REGEN, "tune", "--configfile", "config/long.yaml"], cwd=wd, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    warning = next(x for x in run.stderr.splitlines() if x.startswith("regen tune: warning: "))
    assert "request_timeout_s 300 s is shorter" in warning and "(batch from the plan)" in warning
    assert "an estimate" in warning and "Raise request_timeout_s to " in warning
    config["generate"]["request_timeout_s"] = 3600
    (wd / "config" / "long.yaml").write_text(yaml.safe_dump(config))
    run = subprocess.run(
        [REGEN, "tune", "--configfile", "config/long.yaml"], cwd=wd, capture_output=True, text=True
    )
    assert run.returncode == 0 and "warning" not in run.stderr
