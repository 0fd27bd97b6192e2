"""The race's check that regen's arm served regen's plan (bench/gpu/race.py): the command the supervisor
logged must carry the plan file's launch flags. The H100 races before 2026-12-07 03:18 loaded their plan from
``regen tune --json`` (no launch_args) and served SGLang's defaults under regen's name; this is the line that
run logged."""

from __future__ import annotations

import json
from pathlib import Path

from bench.gpu.race import RaceWork, audit_summary, flags_not_launched
from regen.runconfig import RunConfig
from regen.tune.tune import audit_completions

#: the supervisor's line in measurements/race-2026-12-07-h100-pilot/race-logs.tgz (logs/gpu0.log), abridged
LOGGED = (
    "[regen-supervisor gpu0 pid 2572 2026-12-07 03:21:42] === regen supervisor: starting server (attempt 1): "
    "/opt/torch/.venv/bin/python3 -m sglang.launch_server --model-path /tmp/race-work/model --host 127.0.0.1 "
    "--port 40235 --reasoning-parser qwen3 --enable-metrics --load-format dummy --skip-server-warmup\n"
    "[regen-supervisor gpu0 pid 2572 2026-12-07 03:21:42] server PID 2573\n"
)
PLAN = ("--load-format", "dummy", "--enable-cache-report", "--cuda-graph-max-bs-prefill", "512")


def test_a_server_started_without_the_plans_flags_is_caught() -> None:
    assert flags_not_launched(PLAN, LOGGED) == ["--enable-cache-report", "--cuda-graph-max-bs-prefill", "512"]


def test_a_server_started_with_the_plans_flags_passes() -> None:
    served = LOGGED.replace("--skip-server-warmup", "--enable-cache-report --cuda-graph-max-bs-prefill 512")
    assert flags_not_launched(PLAN, served) == []
    assert flags_not_launched(PLAN, "") == list(PLAN)  # no server started: nothing of the plan was served


def test_regens_arm_is_given_the_prompt_count_the_workflows_audit_gives(tmp_path: Path) -> None:
    """The planner weighs a run's size only when the audit says how many prompts it kept (issue 57 item 6);
    the race's summary says it, read by regen's own reader, unless ``--size-unknown`` asks for the plan."""
    race = RaceWork(requests=2000, prompt_tokens=128, median=128, mean=160, cap=1024)
    generate = RunConfig.from_config({}).generate
    for size_known, completions in ((True, 2000), (False, None)):
        path = tmp_path / f"summary-{size_known}.json"
        path.write_text(json.dumps(audit_summary(race, size_known)))
        assert audit_completions(path, generate) == completions
