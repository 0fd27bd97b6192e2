"""The known-target campaign's time split (bench/gpu/where_time_went.py) on the logs it shipped:
the phases must agree with what the server logs and the run's own records say directly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gpu import where_time_went as wtw

REPO = Path(__file__).resolve().parents[2]

PREFIX = REPO / "measurements/known-target-2026-12-01"


@pytest.fixture(scope="module")
def runs() -> dict[str, wtw.RunTime]:
    return wtw.run_times(PREFIX)


def test_startup_phases_add_up_to_the_supervisors_launch_to_ready(runs: dict[str, wtw.RunTime]) -> None:
    regen = runs["regen"].startup
    # the supervisor's own lines: "starting server" at 05:25:20, "server ready" at 05:28:33
    assert regen["launch_to_ready_s"] == 193
    assert sum(regen["phases_s"].values()) == regen["launch_to_ready_s"]
    # SGLang printed "Capture target prefill CUDA graph end. elapsed=97.90 s" and weights 20.87 s
    assert regen["printed_elapsed_s"]["prefill_graphs_s"] == pytest.approx(97.9)
    assert regen["printed_elapsed_s"]["weights_s"] == pytest.approx(20.87)
    # the seed run loads the MTP draft's weights too: both loads fall in the weights phase
    seed = runs["seed"].startup
    assert seed["phases_s"]["weights (target, then draft)"] >= 8
    assert seed["printed_elapsed_s"]["weights_s"] == pytest.approx(8.80 + 0.35)


def test_generation_phases_account_for_the_tokens_and_answers(runs: dict[str, wtw.RunTime]) -> None:
    measured = json.loads(Path(f"{PREFIX}.known_target_measured.json").read_text())
    regen = runs["regen"].generation
    # every answer, the 24 truncation retries and the supervisor's readiness probe
    assert regen.answers == measured["requests"] + measured["retried"] + 1
    # the decoded tokens include the truncated first attempts (2,048 each) the records replaced
    decoded = measured["output_tokens"] + measured["retried"] * 2048
    assert regen.decoded_tokens == pytest.approx(decoded, rel=0.05)
    assert (
        regen.full_running,
        runs["default"].generation.full_running,
        runs["seed"].generation.full_running,
    ) == (
        265,
        48,
        64,
    )
    for name in ("default", "seed"):
        b = json.loads(Path(f"{PREFIX}.baseline-{name}.json").read_text())
        gen = runs[name].generation
        assert gen.decoded_tokens == pytest.approx(b["answers"]["output_tokens"], rel=0.05)
        assert gen.total_s == pytest.approx(b["generation_s"], abs=3)


def test_projection_line_names_the_prompt_counts_the_targets_need(runs: dict[str, wtw.RunTime]) -> None:
    text, line = wtw.markdown(runs, PREFIX)
    assert line.startswith("where: ") and "limit_vs_seed=" in line
    fields = dict(kv.split("=") for kv in line.removeprefix("where: ").split())
    regen, default = runs["regen"], runs["default"]
    n = float(fields["prompts_for_default_target"])
    warm_fixed = regen.fixed_s - regen.startup["launch_to_ready_s"] + float(fields["regen_warm_start_s"])
    assert default.wall_at(n) == pytest.approx(
        1.5 * (warm_fixed + regen.s_per_prompt * n), rel=0.01
    )  # the line rounds to whole seconds and prompts
    assert "Projection, not a measurement" in text


def test_one_prefill_at_the_full_batch_costs_twice_as_much_without_prefill_graphs(
    runs: dict[str, wtw.RunTime],
) -> None:
    """The same plan at 265 running, 2026-12-01 with SGLang's prefill graphs, 2026-12-02 without
    (``--disable-prefill-cuda-graph``): ~12 single-request prefills every 40 decode passes, 64 ms each with
    the graphs and 141 ms without; regen's launch keeps them on since."""
    without = wtw.run_times(REPO / "measurements/known-target-2026-12-02-n800")["regen"].prefill
    with_graphs = runs["regen"].prefill
    assert with_graphs is not None and without is not None
    assert with_graphs.cost_ms == pytest.approx(64, abs=3) and without.cost_ms == pytest.approx(141, abs=3)
    assert (with_graphs.prefills_per_interval, without.prefills_per_interval) == (13, 12)
    # the decode passes themselves cost the same both days: the prefills made the difference
    assert without.clean_interval_s == pytest.approx(with_graphs.clean_interval_s, rel=0.05)
