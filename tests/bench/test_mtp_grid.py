"""The MTP grid's decision arithmetic (bench/gpu/mtp_grid.py, issue 25): acceptance per steps, regen's
choice at the caps against the grid best and the seed, the crossover; the GPU run itself is ``mtp.sh``."""

from __future__ import annotations

import pytest

from bench.gpu import mtp_grid


def test_fewer_steps_get_the_accept_length_of_the_same_drafter() -> None:
    p = mtp_grid.per_draft_acceptance(2.9)
    assert 1 + p + p**2 + p**3 == pytest.approx(2.9)
    assert mtp_grid.sim_accept_len(2.9, 3, "chain") == pytest.approx(2.9, abs=1e-3)
    assert mtp_grid.sim_accept_len(2.9, 2, "chain") == pytest.approx(1 + p + p**2, abs=1e-3)
    assert mtp_grid.sim_accept_len(2.9, 1, "chain") == pytest.approx(1 + p, abs=1e-3)
    # SGLang's knob taken as is: min(a, steps + 1), as its match-expected simulation clamps
    assert [mtp_grid.sim_accept_len(2.9, s, "flat") for s in (1, 2, 3)] == [2.0, 2.9, 2.9]


def level(c: int, tps: float) -> dict:
    return {"concurrency": c, "running": c, "decode_tps": tps, "client": {"client_tok_s": tps}}


def server(name: str, acc: float | None, cap: int, levels: list[dict], realized: int | None = None) -> dict:
    return {"name": name, "acceptance": acc, "predicted": {"cap": cap}, "realized_cap": realized or cap,
            "levels": levels}  # fmt: skip


def test_the_choice_is_the_sweeps_ranking_at_the_caps_against_the_grid_best_and_the_seed() -> None:
    results = [
        server("off", None, 454, [level(454, 5400.0), level(16, 1200.0), level(64, 2900.0)]),
        server("seed", 2.9, 64, [level(64, 3800.0), level(16, 1900.0)]),
        server("mtp3", 2.9, 96, [level(96, 4600.0), level(16, 2100.0), level(64, 3900.0)]),
        server("mtp1", 2.9, 157, [level(157, 4900.0)]),
        server("mtp3", 1.5, 96, [level(96, 2500.0), level(16, 1250.0), level(64, 2800.0)]),
    ]
    s29, s15 = mtp_grid.summarize(results, [2.9, 1.5])
    assert (s29["choice"], s29["choice_tps"]) == ("off", 5400.0)
    assert (s29["best_on_tps"], s29["best_off_tps"]) == (4900.0, 5400.0)
    assert s29["choice_vs_best"] == 1.0 and s29["vs_seed"] == pytest.approx(5400 / 3800, abs=1e-3)
    assert s29["predicted_cap"] == s29["realized_cap"] == 454
    # at equal running MTP wins at 16 and 64 (1.75x, 1.34x): no crossover below the MTP caps
    assert s29["crossover"] == {
        "mtp_over_off_by_concurrency": {"16": 1.75, "64": 1.345},
        "mtp_loses_from": None,
    }
    assert s15["seed_tps"] is None and s15["vs_seed"] is None
    assert s15["crossover"]["mtp_loses_from"] == 64
    line = mtp_grid.final_lines([s29, s15])
    assert line[0] == (
        "mtp: acceptance=2.9 best_off_tps=5400 best_on_tps=4900 choice_tps=5400 choice_vs_best=1 "
        "seed_tps=3800 vs_seed=1.421 predicted_cap=454 realized_cap=454"
    )
    assert line[1].endswith("seed_tps=na vs_seed=na predicted_cap=454 realized_cap=454")
    # a faster MTP candidate at its cap is the choice; the seed is never a candidate of regen's
    results[3]["levels"] = [level(157, 5600.0)]
    results[1]["levels"] = [level(64, 9000.0)]
    (s,) = mtp_grid.summarize(results, [2.9])
    assert s["choice"] == "mtp1" and s["choice_vs_best"] == pytest.approx(5600 / 9000, abs=1e-3)
