"""The dense bench (issue 33 item 4): its workload as the workflow's audit would give it to the tuner,
the warm-up of one request lifetime per window, the device budget and the last line's format."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import statistics
from pathlib import Path

import pytest

from bench.gpu import dense
from regen.io import write_json
from regen.sglang.workload import workload_from_audit

H200_LINE = (
    "[2026-12-01 20:50:01] Decode batch, #running-req: {n}, #token: 400000, token usage: 0.40, "
    "cuda graph: True, gen throughput (token/s): {tps}, #queue-req: 0, "
)


def test_the_tuner_gets_the_answers_mean_and_spread_as_the_audit_gives_them(tmp_path: Path) -> None:
    workload = dense.Workload(vocab=128256)
    budgets = [workload.max_new_tokens(i) for i in range(dense.SPREAD_SAMPLES)]
    path = tmp_path / "summary.json"
    write_json(path, dense.audit_summary(workload))
    planned = workload_from_audit(path, max_tokens=dense.ANSWER_CAP)
    assert planned.prompt_p50 == planned.prompt_p99 == dense.PROMPT_TOKENS
    assert planned.expected_output_tokens == round(statistics.fmean(budgets))
    cv = statistics.pstdev(budgets) / statistics.fmean(budgets)
    assert planned.expected_output_cv == pytest.approx(cv, rel=1e-9)
    # the log-normal of median 1,200 and mean 1,450: cv = sqrt(exp(sigma^2) - 1) ~ 0.68 (a cap of 8,192 and
    # 20,000 draws move it a little)
    sigma = dense.lognormal_sigma(dense.ANSWER_MEDIAN, dense.ANSWER_MEAN)
    assert cv == pytest.approx(math.sqrt(math.exp(sigma**2) - 1), abs=0.03)
    assert max(budgets) <= dense.ANSWER_CAP


class _Log:
    """A server whose log grows by one decode line per read (what ``warm_up`` polls)."""

    def __init__(self, running: int, tps: float) -> None:
        self.lines: list[str] = []
        self.line = H200_LINE.format(n=running, tps=tps)

    def text(self) -> str:
        self.lines.append(self.line)
        return "\n".join(self.lines)


def test_a_window_warms_up_for_one_request_lifetime() -> None:
    # 500 running at 10,000 tok/s: 20 tok/s a request, so a 30-token mean answer lives 1.5 s
    settings = dense.Settings(dry=True, warmup_s=0.2, warmup_max_s=5.0, window_s=1.0, fixed_window=None,
                              work=Path("."), ready_timeout_s=1.0, length_scale=1.0)  # fmt: skip
    warmed, lifetime = asyncio.run(dense.warm_up(_Log(500, 10000.0), 30.0, settings))  # type: ignore[arg-type]
    assert lifetime == pytest.approx(1.5)
    assert 1.5 <= warmed < 2.5
    capped = dataclasses.replace(settings, warmup_max_s=0.5)
    warmed, _ = asyncio.run(dense.warm_up(_Log(500, 10000.0), 30.0, capped))  # type: ignore[arg-type]
    assert warmed < 1.0  # the ceiling holds when the lifetime is longer


def test_the_device_budget_of_the_llama_bench() -> None:
    """Server starts as the 2026-12-01 run measured them, a lifetime's warm-up and a window per count."""
    two = dense.budget([(256, False), (512, False), (687, False)], 2, 1450, 20, 480)
    assert two.total_s == pytest.approx(480, abs=1) and 30 <= two.window_s <= 50
    three = dense.budget([(256, False), (512, False), (687, False), (1374, True)], 3, 1450, 20, 480)
    assert three.window_s == 30 and three.total_s > 480  # the fp8 arm does not fit 8 minutes
    # one lifetime: the mean answer at the per-request step (3.8 ms + 0.063 ms x 512 at 512 running)
    assert dense.lifetime_estimate_s(512, 1450) == pytest.approx(1450 * (3.8e-3 + 0.063e-3 * 512))
    assert dense.lifetime_estimate_s(1374, 1450, fp8_kv=True) < dense.lifetime_estimate_s(1374, 1450)


def _row() -> dict[str, object]:
    ends = {"log_tokens_first": 900_000, "log_tokens_last": 910_000, "log_running_first": 256,
            "log_running_last": 256}  # fmt: skip
    window = {"in_flight": 256, "client_tps": 11000.0, "log_median_tps": 12800.0, **ends}
    return {
        "model": "llama-3.1-8b",
        "predicted_kv": 925448,
        "default": {"windows": [window, {**window, "in_flight": 512, "client_tps": 12500.0}]},
        "regen": {"windows": [{"in_flight": 687, "client_tps": 13200.0, "log_median_tps": 14500.0}],
                  "realized_kv": 925436},
        "fp8kv": {"windows": [{"in_flight": 1374, "client_tps": 17000.0, "log_median_tps": 17500.0}]},
        "page1": {"windows": [{"in_flight": 680, "client_tps": 12100.0, "log_median_tps": 13300.0}]},
    }  # fmt: skip


def test_the_last_line_keeps_its_format_and_the_fp8_and_page_arms_stay_out_of_vs_default() -> None:
    row = _row()
    row |= dense.headline(row)
    # against the best default window (512 in flight ran faster than 256), not the 256 one
    assert row["vs_default"] == pytest.approx(13200 / 12500) and row["best_default_in_flight"] == 512
    line = dense.final_line(row)
    assert line.startswith(
        "dense: model=llama-3.1-8b regen_tps=13200 default256_tps=11000 default512_tps=12500 "
        "vs_default=1.056 best_default_in_flight=512 steady_windows=2/3 predicted_kv=925448 "
        "realized_kv=925436 "
    )
    assert line.endswith(
        "regen_log_tps=14500 default256_log_tps=12800 fp8kv_tps=17000 fp8kv_log_tps=17500 "
        "page1_tps=12100 page1_log_tps=13300 page16_tps=na page16_log_tps=na"
    )


def test_arms_are_checked() -> None:
    assert dense.arms_of("default,regen-fp8kv") == ("default", "regen-fp8kv")
    assert dense.arms_of("regen,regen-page1") == ("regen", "regen-page1")
    assert dense.model_arms("qwen3-30b-a3b", ("default",)) == ("qwen3-30b-a3b", ("default",))
    assert dense.model_arms("llama-3.1-8b:regen+regen-page16", ("default",)) == (
        "llama-3.1-8b",
        ("regen", "regen-page16"),
    )
    with pytest.raises(SystemExit, match="unknown"):
        dense.arms_of("default,fp8")


def test_the_best_default_window_wins_whatever_its_in_flight() -> None:
    windows = [{"in_flight": 256, "client_tps": 14224.0}, {"in_flight": 512, "client_tps": 9000.0}]
    default = {"windows": [*windows, {"in_flight": 1024, "client_tps": None}]}
    assert dense.best_default(default)["in_flight"] == 256
    assert dense.vs_best_default(11282.0, default) == pytest.approx(11282 / 14224)
    assert dense.vs_best_default(11282.0, {"windows": []}) is None and dense.best_default({}) == {}
