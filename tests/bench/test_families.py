"""The families bench's verdict arithmetic (bench/gpu/families.py, issue 49 item 3) on rows shaped like the
H200 run's (measurements/families-2026-12-04-b.json): the bound on running, the ratio it allows, the bar."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.gpu import dense, families


def arm(
    running: float, log_tps: float, client_tps: float, kv: int, cap: int, tokens: tuple[int, int]
) -> dict:
    window = {
        "log_median_running": running,
        "log_median_tps": log_tps,
        "client_tps": client_tps,
        "log_tokens_first": tokens[0],
        "log_tokens_last": tokens[1],
        "log_running_first": running,
        "log_running_last": running,
    }
    return {"windows": [window], "realized_kv": kv, "startup": {"max_running_requests": cap}}


def row(regen: dict[str, Any], default: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "regen": regen, "default": default}


def test_a_mamba_hybrid_is_bound_by_its_state_slots_not_its_kv(tmp_path: Path) -> None:
    # Nemotron-3-Nano on the H200: 6.2M KV tokens would hold ~4,700 running, the server started with 732
    # Mamba slots; the defaults were capped at 139
    regen = arm(729, 15100, 12922, 6_215_486, 732, (880_000, 890_000))
    default = arm(139, 7741, 7018, 6_186_842, 139, (178_000, 181_000))
    v = families.verdict(row(regen, default), tmp_path, dense.ANSWER_MEAN)
    assert v.kv_bound_running == 732
    assert v.bound_ratio is not None and 1.9 < v.bound_ratio < 2.0
    assert v.bar == "1.15" and v.passed


def test_at_the_kv_bound_the_bar_is_the_bound_and_below_the_defaults_fails(tmp_path: Path) -> None:
    # Mixtral: KV for ~252 running against the defaults' 236; regen ran 256 at a 1.4% lower client count
    regen = arm(256, 6011, 5534, 335_680, 4096, (330_000, 331_000))
    default = arm(236, 5728, 5615, 316_339, 4096, (310_000, 312_000))
    v = families.verdict(row(regen, default), tmp_path, dense.ANSWER_MEAN)
    assert v.kv_bound_running is not None and v.kv_bound_running < 256 * 1.15
    assert v.bar == "bound" and not v.passed
    faster = families.verdict(
        row(arm(256, 6011, 5700, 335_680, 4096, (330_000, 331_000)), default), tmp_path, 1450
    )
    assert faster.bar == "bound" and faster.passed


def test_a_window_whose_kv_still_moves_does_not_count(tmp_path: Path) -> None:
    regen = arm(1024, 30120, 26012, 4_016_195, 2904, (900_000, 1_300_000))  # 10% of the pool in one window
    default = arm(256, 22278, 21401, 2_685_356, 4096, (500_000, 510_000))
    v = families.verdict(row(regen, default), tmp_path, dense.ANSWER_MEAN)
    assert not v.kv_flat and not v.passed


def test_kv_still_rising_by_a_tenth_of_itself_is_not_steady_though_small_against_the_pool(
    tmp_path: Path,
) -> None:
    # the issue-57 windows: KV in use up 9-13% of itself, under 5% of a 4M-token pool
    regen = arm(1024, 30120, 26012, 4_016_195, 2904, (1_000_000, 1_100_000))
    default = arm(256, 22278, 21401, 2_685_356, 4096, (500_000, 510_000))
    v = families.verdict(row(regen, default), tmp_path, dense.ANSWER_MEAN)
    assert not v.kv_flat and v.steady_windows == "1/2" and "steady_windows=1/2" in v.line()


def test_the_verdict_compares_with_the_best_default_window(tmp_path: Path) -> None:
    regen = arm(729, 15100, 12922, 6_215_486, 732, (880_000, 890_000))
    default = arm(139, 7741, 7018, 6_186_842, 139, (178_000, 181_000))
    wider = {**default["windows"][0], "in_flight": 512, "client_tps": 11000.0, "log_median_running": 400}
    default["windows"] = [{**default["windows"][0], "in_flight": 256}, wider]
    v = families.verdict(row(regen, default), tmp_path, dense.ANSWER_MEAN)
    assert v.default_tps == 11000.0 and v.default_running == 400
    assert v.ratio == 12922 / 11000 and v.steady_windows == "3/3"
