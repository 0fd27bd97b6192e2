"""The race's check that regen's arm served regen's plan (bench/gpu/race.py): the command the supervisor
logged must carry the plan file's launch flags. The H100 races before 2026-12-07 03:18 loaded their plan from
``regen tune --json`` (no launch_args) and served SGLang's defaults under regen's name; this is the line that
run logged."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from bench.gpu import serverlog
from bench.gpu.harness import BOTH_ARMS_FLAGS
from bench.gpu.race import (
    RaceWork,
    Settings,
    audit_summary,
    chat_request,
    engine_args,
    flags_not_launched,
    offline_input,
    race_line,
    race_model,
    regen_arm,
    wall_bound,
)
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


#: two of SGLang 0.5.17's own prefill lines (measurements/race-2026-12-07-h100-pilot, logs/gpu0.log)
PREFILL_LINES = (
    "[2026-12-07 03:22:45] Prefill batch, #new-seq: 1, #new-token: 128, #cached-token: 0, token usage: 0.00, "
    "#running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: True, input throughput (token/s): 64.35\n"
    "[2026-12-07 03:22:48] Prefill batch, #new-seq: 65, #new-token: 8192, #cached-token: 1, "
    "token usage: 0.29, #running-req: 748, #queue-req: 418, #pending-token: 53119, cuda graph: True, "
    "input throughput (token/s): 44556.00\n"
)


def test_the_servers_own_prefill_lines_are_summed() -> None:
    got = serverlog.prefill_tokens(PREFILL_LINES + "[x] Decode batch, #running-req: 3, ...\n")
    assert got == {
        "prefill_lines": 2,
        "prefill_seqs": 66,
        "new_tokens": 8320,
        "cached_tokens": 1,
        "cached_share": round(1 / 8321, 4),
    }
    assert serverlog.prefill_tokens("")["cached_share"] is None


def test_every_arm_is_offered_each_prompts_completions() -> None:
    """With n completions a prompt: the chat arms ask with OpenAI's ``n``, the offline engine gets the prompt
    n times in a row (SGLang's advice for a large batch), each with the prompt's length; the planned tokens
    count every completion."""
    race = RaceWork(requests=5, prompt_tokens=8, median=12, mean=16, cap=64, completions=3)
    given = offline_input(race)
    assert given["prompts"] == [race.prompt(i) for i in range(5) for _ in range(3)]
    assert given["max_tokens"] == [race.max_tokens(i) for i in range(5) for _ in range(3)]
    assert sum(given["max_tokens"]) == race.planned_output_tokens()
    assert chat_request(race, 2, "m")["n"] == 3
    assert given["engine_args"] == {}
    assert "n" not in chat_request(RaceWork(5, 8, 12, 16, 64), 2, "m")


def test_with_several_completions_regen_keeps_the_radix_cache_and_the_server_counts_it(
    tmp_path: Path,
) -> None:
    """regen's arm on the simulated server, n = 2 and its full plan: every completion gets its prompt's length
    (the length proxy finds each completion's record id), the plan keeps SGLang's radix cache, and what the
    server's Prefill lines say it read from the cache is what regen's client read from the answers, whole
    pages of each prompt (SGLang's radix tree at the plan's page size); the same run with the cache off
    computes every prompt token (regen's plan for the user's flags with ``--disable-radix-cache``)."""
    race = RaceWork(requests=40, prompt_tokens=256, median=12, mean=16, cap=64, completions=2)
    s = Settings(
        tmp_path, dry=True, model="llama-3.1-8b", race=race, offers=(), offline=False, size_known=False
    )
    (tmp_path / "logs").mkdir()
    rows, _ = regen_arm(s, race_model(s.model, tmp_path / "model"))
    regen = next(r for r in rows if r["arm"] == "regen")
    assert regen["errors"] == 0 and regen["answers"] == 80
    assert regen["output_tokens"] == race.planned_output_tokens()
    assert regen["radix_kept"] is True
    client = regen["client_prefill"]
    # each completion finds its prompt's whole pages cached (the plan's --page-size 64): 256 of its 263 tokens
    per_prompt = client["prompt_tokens"] // 120  # a prefill request and two completions a prompt
    assert "64" in regen["plan_args"]["args"] and per_prompt == 263
    assert client["cached_tokens"] == 80 * 256
    # the same run on a server of the same plan with the cache off: every prompt token computed
    nocache = next(r for r in rows if r["arm"] == "regen-nocache")
    assert nocache["radix_kept"] is False and nocache["output_tokens"] == race.planned_output_tokens()
    # regen's own plan with the flag given: the cache off, its KV planned without shared pages
    assert "--disable-radix-cache" in nocache["plan_args"]["args"]
    assert nocache["client_concurrency"] <= regen["client_concurrency"]
    assert nocache["client_prefill"]["cached_tokens"] == 0
    assert nocache["prefill"]["new_tokens"] == nocache["client_prefill"]["prompt_tokens"]
    assert regen["prefill"]["new_tokens"] == 40 * 263 + 80 * (263 - 256)
    assert nocache["prefill"]["new_tokens"] == 80 * 263  # and no prefill request: the server said so
    assert regen["prefill"]["cached_tokens"] == client["cached_tokens"]  # the server's lines of regen's arm


#: the n = 4 race on the H100 (measurements/race-2026-12-07b-h100-n4): its JSON rows and its servers' logs
N4 = Path(__file__).resolve().parents[2] / "measurements" / "race-2026-12-07b-h100-n4"


def _n4_logs(tmp_path: Path) -> dict[str, str]:
    with tarfile.open(N4 / "race-logs.tgz") as tgz:
        tgz.extractall(tmp_path, filter="data")
    return {name: (tmp_path / "logs" / name).read_text() for name in ("offline.log", "gpu0.log")}


def test_the_servers_rates_are_read_past_their_misleading_lines(tmp_path: Path) -> None:
    """The offline engine's log has a prefill line at 45,874 tok/s and one decode line of 8 running at
    2,608 tok/s (requests ended in its interval); regen's has small prefill batches at up to 90,068 tok/s
    (SGLang's input throughput over the time since the last prefill line). The rates are the full batches'
    median and the flat lines' pace."""
    logs = _n4_logs(tmp_path)
    offline, regen = (serverlog.peak_rates(logs[n]) for n in ("offline.log", "gpu0.log"))
    assert offline["peak_decode_tps"] == 24577.98 and regen["peak_decode_tps"] == 25038.49
    assert 43_000 < offline["prefill_tps"] < 44_000 and 43_000 < regen["prefill_tps"] < 44_000
    assert 6.9 < offline["fastest_token_ms"] < 7.0  # 8 running at 1,144.84 tok/s, twice in a row
    assert 6.5 < regen["fastest_token_ms"] < 6.9
    assert set(serverlog.peak_rates("").values()) == {None}


def test_the_race_line_states_the_bound_its_servers_allow(tmp_path: Path) -> None:
    """That race, restated: no plan of those servers finishes its work in less than 87.5 s (regen's 64.9-s
    start, 800 prompts of 128 tokens computed once at 43.5k tok/s, 508,476 answer tokens at 25.0k tok/s), so
    1.15x the offline engine's 106.57 s was within reach (bound 1.218) and regen's 1.048 is short of the bar.
    Where the best peer comes within 15% of the bound, the bar is the bound."""
    logs = _n4_logs(tmp_path)
    doc = json.loads(next(N4.glob("race-*.json")).read_text())
    rows = doc["arms"]
    for row in rows:
        row["peaks"] = serverlog.peak_rates(logs["offline.log" if row["arm"] == "offline" else "gpu0.log"])
    race = RaceWork(**doc["workload"])
    bound = wall_bound(race, rows)
    assert bound is not None and bound.start_s == 64.87
    assert bound.prefill_s == pytest.approx(800 * 128 / 43_547.61)
    assert bound.decode_s == pytest.approx(508_476 / 25_038.49)
    line = race_line("llama-3.1-8b", race, rows, size_known=False)
    assert "bound_wall_s=87.5 " in line and "bound_ratio=1.218 bar=1.15" in line and " ratio=1.048" in line
    assert "generation_ratio=0.960" in line  # its starts left out, regen generated 4% slower: 36.81 s / 35.34
    offline = next(r for r in rows if r["arm"] == "offline")
    offline["wall_s"], offline["tps"] = 95.0, 508_476 / 95.0  # a peer within 15% of the bound
    assert "bound_ratio=1.085 bar=bound" in race_line("llama-3.1-8b", race, rows, size_known=False)
    assert wall_bound(race, [{"arm": "regen", "start_s": 60.0}]) is None  # no server logged a rate


def test_the_flags_every_arm_launches_with_reach_the_offline_engine_as_its_keywords() -> None:
    """Nemotron-H's Triton MoE runner, a launch flag for the servers, is the engine's ``moe_runner_backend``
    (``ServerArgs``' field names); a flag without its value is refused, not dropped."""
    race = RaceWork(requests=2, prompt_tokens=8, median=12, mean=16, cap=64)
    flags = BOTH_ARMS_FLAGS["nemotron-3-nano-30b-a3b"]
    assert offline_input(race, flags)["engine_args"] == {"moe_runner_backend": "triton"}
    with pytest.raises(ValueError, match="not --name value pairs"):
        engine_args(("--moe-runner-backend",))
