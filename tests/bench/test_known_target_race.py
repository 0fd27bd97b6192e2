"""The end-to-end race's sequence (bench/gpu/known_target/device.py, issue 37 items 4-6): its arguments, its
device-time estimate against the 2026-12-01 H200 runs it is built from, the sweep's projection against
the run, the target line, and every run's time split read from a campaign's work dir."""

from __future__ import annotations

import argparse
import json
import shutil
import tarfile
from pathlib import Path

import pytest
from support.decode_log import decode_log

from bench.gpu import where_time_went as wtw
from bench.gpu.known_target import device as ktd
from bench.gpu.known_target import run as ktr
from regen.tune.closedloop import StepModel
from regen.tune.pilot import DEFAULT_DRAIN_FRACTION
from regen.tune.projection import project

REPO = Path(__file__).resolve().parents[2]
PREFIX = REPO / "measurements/known-target-2026-12-01"


def test_sequence_args_keep_the_runs_flags_apart_from_its_own() -> None:
    own, same, run_args = ktd.sequence_args(
        ["--n", "200", "--warmup", "--order", "seed,regen", "--max-tokens", "512"]
    )
    # argparse's abbreviations would read --n as --no-sweep and drop the prompt count
    assert (same.n, same.max_tokens, own.no_sweep, own.warmup) == ("200", "512", False, True)
    assert own.order == "seed,regen"
    assert run_args == ["--n", "200", "--max-tokens", "512"]  # what known_target/run.py gets
    # the campaign's sweep: one candidate (not the given flags), 100 s after a warm start
    assert ktd.SWEEP_DRAIN_FRACTION == DEFAULT_DRAIN_FRACTION  # the pilot's own, restated before imports work
    pilot = 100 * (1 + DEFAULT_DRAIN_FRACTION)  # --seconds 100 and the drain after it
    assert ktd.sweep_device_s(same.sweep_args) == ktd.PRIOR["regen"].start_s + pilot + ktd.SWEEP_OVERHEAD_S
    no_drain = ktd.sweep_device_s(f"{same.sweep_args} --drain-seconds 0")
    assert no_drain == ktd.sweep_device_s(same.sweep_args) - 25
    assert ktd.sweep_device_s("--candidates 1") == 2 * ktd.sweep_device_s("--candidates 1 --no-given")


def test_a_sweep_first_is_the_warm_up_and_counts_its_cold_start() -> None:
    own, same, _ = ktd.sequence_args(["--sweep-first", "--order", "seed,regen,default", "--n", "1000"])
    assert own.sweep_first and not own.warmup
    cold = ktd.PRIOR["warmup"].start_s - ktd.PRIOR["regen"].start_s
    assert ktd.sweep_device_s(same.sweep_args, first=True) == ktd.sweep_device_s(same.sweep_args) + cold
    # in place of a warm-up server: the sequence is shorter by the warm-up's time but its sweep's cold start
    order = ["seed", "regen", "default"]
    with_warmup = ktd.budget_estimate(order, 1000, True, ktd.sweep_device_s(same.sweep_args))
    sweep_first = ktd.budget_estimate(order, 1000, False, ktd.sweep_device_s(same.sweep_args, first=True))
    assert with_warmup["total_s"] - sweep_first["total_s"] == pytest.approx(
        ktd.PRIOR["warmup"].seconds(1000) - cold, abs=2
    )


@pytest.mark.parametrize(("which", "day"), [("default", "2026-12-02"), ("seed", "2026-12-01")])
def test_prior_runs_are_the_latest_measured_baselines(which: str, day: str) -> None:
    b = json.loads((REPO / f"measurements/known-target-{day}.baseline-{which}.json").read_text())
    prior = ktd.PRIOR[which]
    assert prior.start_s == pytest.approx(b["server_start_s"], abs=1)
    assert prior.generation_s_per_1000 * b["n"] / 1000 == pytest.approx(b["generation_s"], abs=1)


def test_budget_estimate_names_the_prompts_that_fit() -> None:
    order = ["default", "regen", "seed"]
    est = ktd.budget_estimate(order, 1000, True, 250.0)
    assert set(est["each_s"]) == {"warmup", *order, "sweep"}
    assert est["total_s"] == pytest.approx(sum(est["each_s"].values()), abs=len(est["each_s"]))
    fits = ktd.prompts_within(est, 1000, 22 * 60)
    assert 0 < fits < 1000  # the 2026-12-01 walls do not fit 1,000 prompts with a warm-up and a sweep
    assert ktd.budget_estimate(order, fits, True, 250.0)["total_s"] <= 22 * 60 + 1
    assert ktd.budget_estimate(order, fits + 5, True, 250.0)["total_s"] > 22 * 60
    assert "sweep" not in ktd.budget_estimate(order, 1000, False, None)["each_s"]


def write_tsv(path: Path, seconds: list[float]) -> None:
    """A Snakemake benchmark file (its header, one row per repeat)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    head = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time"
    path.write_text(head + "\n" + "".join(f"{s}\t0:00:01\t1\t1\t1\t1\t0\t0\t0\t1\n" for s in seconds))


def test_sweep_projection_compares_its_closed_loop_with_the_generation_phase(tmp_path: Path) -> None:
    steady = project(1000, 635.0, 4000.0, 1, 1).to_json()
    basis = "the best pilot's plateau and falling batch: least squares over 30 points at 7 batch sizes"
    closed = {"wall_s": 190.0, "gpu_hours": 190.0 / 3600, "step_model": {"basis": basis}}
    pilot = {"projection": steady, "projection_closed_loop": closed}
    pilot["best_args"] = ["--max-running-requests", "265"]
    (tmp_path / "results" / "plan").mkdir(parents=True)
    (tmp_path / "results" / "plan" / "pilot.json").write_text(json.dumps(pilot))
    write_tsv(tmp_path / "benchmarks" / "generate" / "shard-0000.tsv", [250.5])
    write_tsv(tmp_path / "benchmarks" / "generate" / "shard-0001.tsv", [10.0])
    got = ktr.sweep_projection(tmp_path, {"generation_s": 200.0})
    assert got is not None
    assert got["projected_from"] == "projection_closed_loop"
    assert got["error"] == pytest.approx((190.0 - 200.0) / 200.0)
    assert got["steady_projection_gpu_s"] == pytest.approx(1000 * 635.0 / 4000.0)
    assert got["generate_jobs_s"] == pytest.approx(260.5)
    lines = ktr.projection_lines({"sweep_projection": {**got, "error": 0.1}})
    assert f"step line from {basis}" in "".join(lines)
    assert got["run_step_line"] is None  # no server log in this run
    (tmp_path / "logs" / "servers").mkdir(parents=True)
    drained = StepModel(0.014, 0.00015)
    (tmp_path / "logs" / "servers" / "gpu0.log").write_text(decode_log(drained, [265] * 6 + [120, 20, 1]))
    line = ktr.sweep_projection(tmp_path, {"generation_s": 200.0})["run_step_line"]
    assert line.startswith("14.00 ms + 0.1500 ms a request (least squares")
    del pilot["projection_closed_loop"]  # no server reading for the closed loop: the steady rate's
    (tmp_path / "results" / "plan" / "pilot.json").write_text(json.dumps(pilot))
    assert ktr.sweep_projection(tmp_path, {"generation_s": 200.0})["error"] == pytest.approx(
        (1000 * 635.0 / 4000.0 - 200.0) / 200.0
    )
    assert ktr.sweep_projection(tmp_path / "none", {"generation_s": 200.0}) is None


def test_target_line_spells_the_issues_fields_in_order() -> None:
    m = {
        "requests": 1000, "stop_fraction": 0.99, "designed_stop_fraction": 0.98, "reasoning_split_exact": 1.0,
        "tool_calls_parsed": 1.0, "export_ids_equal": 1.0, "wall_s": 300.0,
        "phases": {"generation_s": 200.0, "sweep_s": 150.0},
        "sweep_projection": {"error": -0.05}, "projection": {"generation_s": 100.0},
        "time_split": {"fixed_s": 120.0, "drain_token_share": 0.1},
    }  # fmt: skip
    a = argparse.Namespace(default_wall_s=450.0, seed_wall_s=None, projected_s=None)
    line = ktr.target_line(m, a)
    fields = dict(kv.split("=") for kv in line.removeprefix("target: ").split())
    assert list(fields) == [
        "requests", "stop_fraction", "designed_stop_fraction", "reasoning_split_exact", "tool_calls_parsed",
        "export_ids_equal", "projection_error", "default_wall_s", "seed_wall_s", "regen_wall_s", "vs_default",
        "vs_seed", "fixed_s", "drain_token_share", "sweep_s", "projection_lower_bound",
    ]  # fmt: skip
    assert fields["projection_error"] == "-0.0500"  # the sweep's, ahead of the static plan's
    assert fields["projection_lower_bound"] == "0"
    m["sweep_projection"] = {"error": -0.75, "lower_bound": True}  # the pilot saw only short answers
    assert "projection_lower_bound=1" in ktr.target_line(m, a)
    assert (fields["vs_default"], fields["vs_seed"], fields["sweep_s"]) == ("1.5000", "na", "150.0000")
    del m["sweep_projection"]
    assert "projection_error=-0.5000" in ktr.target_line(m, a)  # the static plan's, without a sweep


def campaign_work_dir(tmp_path: Path, names: tuple[str, ...]) -> Path:
    """The 2026-12-01 results laid out as known_target/device.py leaves its work dir."""
    work = tmp_path / "kt-work"
    where = {"regen": work / "run/logs/servers/gpu0.log"}
    where |= {n: work / f"baseline-{n}/logs/gpu0.log" for n in ("default", "seed")}
    with tarfile.open(f"{PREFIX}.logs.tgz") as tar:
        for name in names:
            where[name].parent.mkdir(parents=True, exist_ok=True)
            where[name].write_bytes(tar.extractfile(wtw.LOGS[name]).read())  # type: ignore[union-attr]
    shutil.copy(f"{PREFIX}.known_target_measured.json", work / "known_target_measured.json")
    for name in set(names) - {"regen"}:
        shutil.copy(f"{PREFIX}.baseline-{name}.json", work / f"baseline-{name}.json")
    return work


def test_work_dir_split_is_the_committed_results_split(tmp_path: Path) -> None:
    committed = wtw.run_times(PREFIX)
    runs = wtw.work_run_times(campaign_work_dir(tmp_path, ("regen", "default", "seed")))
    assert {n: r.fixed_s for n, r in runs.items()} == {n: r.fixed_s for n, r in committed.items()}
    assert wtw.markdown(runs, tmp_path)[1] == wtw.markdown(committed, tmp_path)[1]
    split = ktr.regen_time_split(
        tmp_path / "kt-work", json.loads(Path(f"{PREFIX}.known_target_measured.json").read_text())
    )
    assert split["fixed_s"] == pytest.approx(committed["regen"].fixed_s, abs=0.1)
    assert split["drain_token_share"] == pytest.approx(committed["regen"].generation.drain_token_share)


def test_work_dir_without_every_run_still_has_its_tables(tmp_path: Path) -> None:
    runs = wtw.work_run_times(campaign_work_dir(tmp_path, ("regen", "default")))
    text, line = wtw.markdown(runs, tmp_path)
    assert list(runs) == ["regen", "default"]
    assert "| regen | 465.2 | 343 | 193 |" in text and "| interpreter and imports | 31 | 22 |" in text
    assert line == "where: runs=regen,default (the projection needs regen, default and seed)"
    assert "Projection, not a measurement" not in text


def test_warm_up_start_split_is_shown_without_a_generation_window(tmp_path: Path) -> None:
    work = campaign_work_dir(tmp_path, ("regen", "default", "seed"))
    log = (work / "baseline-default/logs/gpu0.log").read_text()
    cut = log.index("server ready at ")
    (work / "baseline-warmup/logs").mkdir(parents=True)
    (work / "baseline-warmup/logs/gpu0.log").write_text(log[: log.index("\n", cut) + 1])  # start, no answers
    b = json.loads((work / "baseline-default.json").read_text()) | {"which": "warmup", "n": 8}
    (work / "baseline-warmup.json").write_text(json.dumps(b))
    runs, startups = wtw.work_run_times(work), wtw.work_startups(work)
    assert "warmup" not in runs and startups["warmup"] == startups["default"]
    text, line = wtw.markdown(runs, work, startups)
    assert "| server start phase | regen | default | seed | warmup |" in text
    assert line == wtw.markdown(wtw.run_times(PREFIX), PREFIX)[1]  # the warm-up is in no projection
