"""The race's check that regen's arm served regen's plan (bench/gpu/race.py): the command the supervisor
logged must carry the plan file's launch flags. The H100 races before 2026-12-07 03:18 loaded their plan from
``regen tune --json`` (no launch_args) and served SGLang's defaults under regen's name; this is the line that
run logged."""

from __future__ import annotations

from bench.gpu.race import flags_not_launched

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
