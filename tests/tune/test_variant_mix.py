"""The planner's expected answer is a mix over the variants' completions (issue 52 item 4): thinking-off
completions plan at the audit's answer-only length, thinking-on ones at the full supervised length, and a
run of the one default variant plans exactly as before."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path
from typing import Any

import yaml

from regen.ingest.audit_summary import ANSWER_ONLY_HISTOGRAM, Log2Histogram
from regen.runconfig import GenerateConfig, ServerConfig
from regen.sglang.workload import old_answers_expected
from regen.tune.workload_plan import plan_for_workload, variant_shares, workload_from_audit_histogram

ROOT = Path(__file__).resolve().parents[2]
THINK_ON = {"name": "think", "n": 1, "thinking": "on"}
THINK_OFF = {"name": "plain", "n": 1, "thinking": "off"}


def _hist(values: list[int]) -> dict[str, Any]:
    hist = Log2Histogram()
    for v in values:
        hist.add(v)
    return hist.to_json()


def _lengths(seed: int) -> tuple[list[int], list[int]]:
    """Old answers: the full supervised length (reasoning + answer) and the answer alone, per sample."""
    rng = random.Random(seed)
    answers = [rng.randint(100, 500) for _ in range(400)]
    reasoning = [rng.randint(1500, 3500) for _ in range(400)]
    return [a + r for a, r in zip(answers, reasoning, strict=True)], answers


def _summary(answer_only: bool = True) -> dict[str, Any]:
    full, answers = _lengths(7)
    hists = {"supervised_tokens": _hist(full), "prompt_tokens": _hist([300] * 400)}
    if answer_only:
        hists[ANSWER_ONLY_HISTOGRAM] = _hist(answers)
    return {"prompt_tokens_p50": 300, "prompt_tokens_p99": 2000, "histograms": hists}


def _generate(variants: list[dict[str, Any]] | None = None) -> GenerateConfig:
    return GenerateConfig.from_dict({"variants": variants} if variants else {})


def _server() -> ServerConfig:
    server = yaml.safe_load((ROOT / "config" / "demo.yaml").read_text())["server"]
    return ServerConfig.from_mapping({**server, "mode": "sglang"})  # a GPU plan, not the stand-in's cap


def test_a_thinking_off_variant_plans_a_shorter_context_than_thinking_on_alone() -> None:
    summary = _summary()
    on = workload_from_audit_histogram(summary, 16384, variant_shares(_generate([THINK_ON])))
    mixed = workload_from_audit_histogram(summary, 16384, variant_shares(_generate([THINK_ON, THINK_OFF])))
    assert mixed.expected_tokens_per_request < on.expected_tokens_per_request
    assert mixed.expected_output < on.expected_output
    plan_on = plan_for_workload(_server(), on).plan.launched_section
    plan_mixed = plan_for_workload(_server(), mixed).plan.launched_section
    assert plan_mixed["client_concurrency"] > plan_on["client_concurrency"]
    assert "thinking off 1 (plain) x their answer-only mean" in plan_mixed["rules"]["client_concurrency"]
    assert "answer-only" not in plan_on["rules"]["client_concurrency"]


def test_the_mix_has_the_pooled_lengths_moments() -> None:
    """Equal weights (n 1 and 1) over equal counts: the mixture is the pooled sample, whose mean and
    cv the planner must reproduce (E[L^2] = sum w (sigma^2 + mu^2), not the mean of the cvs)."""
    full, answers = _lengths(7)
    pooled = full + answers
    got = old_answers_expected(
        _summary(),
        variant_shares(_generate([THINK_ON, THINK_OFF])),
        _summary()["histograms"][ANSWER_ONLY_HISTOGRAM],
    )
    assert got["expected_output_tokens"] == round(statistics.fmean(pooled))
    cv = statistics.pstdev(pooled) / statistics.fmean(pooled)
    assert abs(got["expected_output_cv"] - cv) < 1e-9
    # weights follow n: three thinking-off completions to one thinking-on pull the mean toward the answers
    three_off = variant_shares(_generate([THINK_ON, {**THINK_OFF, "n": 3}]))
    weighted = old_answers_expected(_summary(), three_off, _summary()["histograms"][ANSWER_ONLY_HISTOGRAM])
    assert weighted["expected_output_tokens"] == round(
        (statistics.fmean(full) + 3 * statistics.fmean(answers)) / 4
    )


def test_the_one_default_variant_plans_exactly_as_before() -> None:
    summary = _summary()
    before = workload_from_audit_histogram(summary, 16384)  # the call as it was: no variants
    default = workload_from_audit_histogram(summary, 16384, variant_shares(_generate()))
    assert default == before
    assert default.expected_output_mix is None
    assert plan_for_workload(_server(), default).plan == plan_for_workload(_server(), before).plan
    # the histogram reading (no exact percentiles) too
    del summary["prompt_tokens_p99"], summary["prompt_tokens_p50"]
    assert workload_from_audit_histogram(summary, 16384, variant_shares(_generate())) == (
        workload_from_audit_histogram(summary, 16384)
    )


def test_mix_mode_weighs_the_thinking_fraction() -> None:
    gen = GenerateConfig.from_dict({"thinking": "mix", "thinking_fraction": 0.25})
    (share,) = variant_shares(gen)
    assert (share.thinking_on, share.thinking_off) == (0.25, 0.75)


def test_an_audit_that_cannot_tell_reasoning_from_answer_says_so_and_plans_the_one_length() -> None:
    summary = _summary(answer_only=False)
    one = workload_from_audit_histogram(summary, 16384)
    mixed = workload_from_audit_histogram(summary, 16384, variant_shares(_generate([THINK_ON, THINK_OFF])))
    assert (mixed.expected_output_tokens, mixed.expected_output_cv) == (
        one.expected_output_tokens,
        one.expected_output_cv,
    )
    rule = plan_for_workload(_server(), mixed).plan.launched_section["rules"]["client_concurrency"]
    assert "the audit does not tell reasoning from answer" in rule
    assert "plain: 1 of 2 per prompt" in rule


def test_the_tune_rule_writes_the_mix_into_the_plan_files_rules(tmp_path: Path) -> None:
    """The tune rule's entry (``write_plan_for_workflow``, what scripts/tune.py calls) with the run's
    variants: the plan file's rules map says the mix, or that the audit cannot tell them apart."""
    from regen.sglang.config import PlanFile
    from regen.tune.tune import write_plan_for_workflow

    for answer_only, words in ((True, "answer-only mean"), (False, "does not tell reasoning from answer")):
        audit = tmp_path / f"summary-{answer_only}.json"
        audit.write_text(json.dumps(_summary(answer_only)))
        out = tmp_path / f"server-{answer_only}.json"
        write_plan_for_workflow(
            server_cfg=_server(),
            max_tokens=16384,
            audit_summary=str(audit),
            out_path=str(out),
            variants=variant_shares(_generate([THINK_ON, THINK_OFF])),
        )
        assert words in PlanFile.read(out).launched_section["rules"]["client_concurrency"]
