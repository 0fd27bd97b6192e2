"""The pilot's unfinished answers put back from a right-censored log-normal (regen.tune.length_fit)."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
from pathlib import Path

import pytest

from regen.pilot_file import PilotFile
from regen.runconfig import GenerateConfig
from regen.serving.metrics import METHOD_LOG, SteadyState
from regen.tune.closedloop import Truncation
from regen.tune.length_fit import MIN_FINISHED_TO_FIT, fit_censored_lognormal
from regen.tune.pilot import CandidateResult, PilotMeasurement, SweepResult, measure_journal
from regen.tune.projection import Remaining
from regen.tune.sweep import censored_share, pilot_report, run_truncation
from regen.tune.sweep_report import render_result


def _pilot(seed: int, n: int = 300, unfinished_share: float = 0.17) -> tuple[list[int], list[int], int]:
    """n log-normal answers (median ~490, as the known-answer target's), cut at max_tokens 2048; a
    window that let all but the longest ``unfinished_share`` finish."""
    rng = random.Random(seed)
    every = [min(2048, max(1, round(math.exp(rng.gauss(6.2, 0.65))))) for _ in range(n)]
    cut = sorted(every)[int((1 - unfinished_share) * n)]
    finished = [x for x in every if x <= cut]
    return every, finished, n - len(finished)


@pytest.mark.parametrize("seed", range(4))
def test_the_unfinished_answers_are_put_back_within_5_percent(seed: int) -> None:
    every, finished, unfinished = _pilot(seed)
    truth = sum(every) / len(every)
    fit = fit_censored_lognormal(finished, unfinished)
    assert fit is not None and fit.censored_at == max(finished)
    modelled = [*finished, *fit.tail_lengths(2048)]
    assert len(modelled) == len(every) and max(modelled) <= 2048
    assert sum(finished) / len(finished) < 0.85 * truth  # the finished alone: the 2026-12-02 shortfall
    assert sum(modelled) / len(modelled) == pytest.approx(truth, rel=0.05)
    assert fit.mu == pytest.approx(6.2, abs=0.1) and fit.sigma == pytest.approx(0.65, abs=0.1)
    assert min(fit.tail_lengths(None)) >= fit.censored_at


def test_too_few_finished_answers_fit_nothing() -> None:
    few = list(range(100, 100 + MIN_FINISHED_TO_FIT - 1))
    assert fit_censored_lognormal(few, 50) is None
    assert fit_censored_lognormal(list(range(100, 200)), 0) is None  # nothing unfinished: nothing to model


def measured_pilot(journal: Path, finished: list[int], sent: int) -> PilotMeasurement:
    """The pilot's measurement from a journal of its ``finished`` first attempts (``sent`` were sent)."""
    now = time.time()
    journal.write_text("".join(
        json.dumps({"kind": "record", "id": f"s{k}", "usage": {"completion_tokens": n},
                    "timings": {"started_at": now, "latency_s": 1.0}}) + "\n" for k, n in enumerate(finished)
    ))  # fmt: skip
    ids = {f"s{k}" for k in range(sent)}
    return measure_journal(journal, now - 1, now + 5, 0.0, concurrency=265, sent=sent, first_ids=ids)


def test_a_pilot_with_long_answers_unfinished_projects_their_lengths(tmp_path: Path) -> None:
    """The pilot's report uses the modelled lengths, is no longer a lower bound, and says how it got them."""
    every, finished, unfinished = _pilot(0)
    m = measured_pilot(tmp_path / "j.jsonl", finished, sent=len(every))
    result = SweepResult((CandidateResult("recommended", (), 265, True, measurement=m),), 0, 6.0, 0.0, 300)
    keep = Truncation(2048, "keep", 2.0)  # the answers above are cut at 2048, as under truncation: keep
    censored = censored_share(result, keep)
    assert censored.modelled and not censored.lower_bound and censored.share == pytest.approx(0.17, abs=0.01)
    report = pilot_report(result, Remaining(shards=1, samples=800, finished=0), gpus=1, tp=1, truncation=keep)
    truth = sum(every) / len(every)
    assert report["projection"]["tokens_per_sample"] == pytest.approx(truth, rel=0.05)
    assert not report["projection"]["lower_bound"]
    assert report["censored_lengths"]["model"]["censored_at"] == max(finished)
    assert any("log-normal" in a and f"{unfinished} of the pilot's 300" in a for a in report["assumptions"])
    shown = render_result(PilotFile.from_json(report))
    assert f"lengths: {unfinished} of the pilot's 300 samples were unfinished, modelled as longer" in shown
    assert "at least" not in shown


@pytest.mark.parametrize("seed", range(3))
def test_answers_past_max_tokens_count_with_their_retry_as_the_client_sends_it(
    seed: int, tmp_path: Path
) -> None:
    """Under ``truncation: retry`` a first attempt past max_tokens holds its slot for max_tokens tokens, then
    for a fresh answer at twice the limit: the projection counts both, as the real client's slots decode."""
    rng = random.Random(seed)
    law = [max(1, round(math.exp(rng.gauss(6.2, 0.8)))) for _ in range(20000)]  # ~4.4% past 2048

    def slot(n: int) -> int:  # Requests.answer_turn: the cut first attempt, then a fresh draw at 4096
        return n if n <= 2048 else 2048 + min(rng.choice(law), 4096)

    every = law[:1000]  # a pilot's first attempts (fewer: the tail's sampling noise alone is ~6%)
    truth = sum(slot(n) for n in law) / len(law)
    cut = sorted(every)[int(0.83 * len(every))]
    finished = [n for n in every if n <= cut]
    m = measured_pilot(tmp_path / "j.jsonl", finished, sent=len(every))
    m = dataclasses.replace(m, server=SteadyState(265, 5, 4000.0, 4000.0, 100.0, 1.0, METHOD_LOG))
    best = CandidateResult("recommended", ("--tp", "1"), 265, True, measurement=m)
    result = SweepResult((best,), 0, 6.0, 0.0, 300)
    cfg = GenerateConfig.from_dict({"sampling": {"max_tokens": 2048}, "truncation": "retry"})
    retry = run_truncation(cfg, result.best_args)
    assert (retry.limit, retry.retry_limit, retry.replays) == (2048, 4096, False)
    report = pilot_report(
        result, Remaining(shards=1, samples=800, finished=0), gpus=1, tp=1, truncation=retry
    )
    got = report["projection"]["tokens_per_sample"]
    capped = censored_share(result, Truncation(2048, "keep", 2.0)).mean_tokens
    assert got == pytest.approx(truth, rel=0.06) and capped < got
    model = report["censored_lengths"]["model"]
    assert model["retried"] > 0 and model["truncation"]["retry_max_tokens"] == 4096
    assert any(
        "counted as 2048 tokens plus their retry's (a fresh answer" in a for a in report["assumptions"]
    )
    # the closed loop plays the same slot lengths: its tokens are the projection's, per request
    closed = report["projection_closed_loop"]
    assert closed["output_tokens"] / closed["requests"] == pytest.approx(got, rel=0.1)
    replays = run_truncation(cfg, ["--enable-deterministic-inference"])
    assert replays.replays and replays.slot_tokens([3000, 5000, 100]) == [2048 + 3000, 2048 + 4096, 100]
    assert Truncation(2048, "drop", 2.0).slot_tokens([3000, 100]) == [2048, 100]
