"""generate.truncation treats a cut inside the reasoning apart from one inside the answer (issue 52 item 5):
each policy run by the real client against the simulated server, whose budget here cuts some answers inside
the think block and some after it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from regen.runconfig import GenerateConfig
from regen.simulated.launcher import start_simulated_server
from regen.truncation import IN_ANSWER, IN_REASONING, TruncationPolicy, record_truncated_where
from tests.generate.test_client import Shard, make_samples, read_jsonl

N = 60
BUDGET = {"max_tokens": 12}  # reasoning 1..20 tokens, answers 1..20: some cut in each part


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    url, stop = start_simulated_server(inline=True, mean_answer_tokens=10, mean_reasoning_tokens=10)
    yield url
    stop()


@pytest.fixture(scope="module")
def kept(sim: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The records under keep, by id: where each answer was cut (both kinds present)."""
    sh = Shard(tmp_path_factory.mktemp("keep"))
    sh.run(make_samples(N), sim, sampling=BUDGET, truncation={"in_answer": "keep", "in_reasoning": "keep"})
    recs = {r["id"]: r for r in read_jsonl(sh.out)}
    assert len(recs) == N
    wheres = [record_truncated_where(r) for r in recs.values()]
    assert wheres.count(IN_REASONING) >= 3 and wheres.count(IN_ANSWER) >= 3, wheres
    for r in recs.values():
        if record_truncated_where(r) == IN_REASONING:  # the think block never closed: no answer yet
            assert r["finish_reason"] == "length" and r["content"] == "" and r["reasoning_content"]
    return recs


def ids_cut(kept: dict[str, dict[str, Any]], where: str | None) -> set[str]:
    return {i for i, r in kept.items() if record_truncated_where(r) == where}


@pytest.mark.parametrize("where", [IN_ANSWER, IN_REASONING])
def test_drop_one_kind_keeps_the_other(where: str, sim: str, kept: dict, tmp_path: Path) -> None:
    other = IN_REASONING if where == IN_ANSWER else IN_ANSWER
    sh = Shard(tmp_path)
    st = sh.run(make_samples(N), sim, sampling=BUDGET, truncation={where: "drop", other: "keep"})
    failed = read_jsonl(sh.failed)
    assert {f["id"] for f in failed} == ids_cut(kept, where) and st.failed == len(failed)
    assert all(f["reason"] == "truncated" for f in failed)
    recs = {r["id"]: r for r in read_jsonl(sh.out)}
    assert {i for i, r in recs.items() if record_truncated_where(r) == other} == ids_cut(kept, other)
    assert not any(record_truncated_where(r) == where for r in recs.values())


@pytest.mark.parametrize("where", [IN_ANSWER, IN_REASONING])
def test_retry_one_kind_with_a_bigger_budget(where: str, sim: str, kept: dict, tmp_path: Path) -> None:
    sh = Shard(tmp_path)
    sh.run(make_samples(N), sim, sampling=BUDGET, truncation={where: "retry"}, retry_max_tokens_factor=4)
    recs = {r["id"]: r for r in read_jsonl(sh.out)}
    assert len(recs) == N
    for i, first in kept.items():
        again = recs[i]
        if record_truncated_where(first) == where:
            assert again["attempts"] == 2 and again["sampling"]["max_tokens"] == 48 and again["thinking"]
        else:  # the other kind and the whole answers: sent once, as kept
            assert again["attempts"] == 1 and again["sampling"]["max_tokens"] == 12
            assert again["finish_reason"] == first["finish_reason"] and again["content"] == first["content"]


def test_retry_a_think_only_cut_without_thinking(sim: str, kept: dict, tmp_path: Path) -> None:
    sh = Shard(tmp_path)
    st = sh.run(make_samples(N), sim, sampling=BUDGET, truncation={"in_reasoning": "retry_without_thinking"})
    recs = {r["id"]: r for r in read_jsonl(sh.out)}
    assert len(recs) == N and st.failed == 0
    for i, first in kept.items():
        again = recs[i]
        if record_truncated_where(first) == IN_REASONING:
            # asked once more at the same budget with thinking off: an answer, no reasoning, and it says so
            assert again["attempts"] == 2 and again["thinking"] is False
            assert again["reasoning_content"] is None and again["sampling"]["max_tokens"] == 12
            assert record_truncated_where(again) != IN_REASONING
        else:
            assert again["attempts"] == 1 and again["thinking"] is True
            assert again["content"] == first["content"]


def test_the_string_form_still_sets_both_and_keeps_its_fingerprint() -> None:
    from regen.fingerprint import GenerationSettings

    for action in ("keep", "drop", "retry"):
        cfg = GenerateConfig.from_dict({"truncation": action})
        assert cfg.truncation == TruncationPolicy(action, action)
        same = GenerateConfig.from_dict({"truncation": {"in_answer": action, "in_reasoning": action}})
        assert GenerationSettings.of(cfg).fingerprint == GenerationSettings.of(same).fingerprint
        assert GenerationSettings.of(cfg).run.truncation == action  # the setting as before the split
    split = GenerateConfig.from_dict({"truncation": {"in_reasoning": "retry_without_thinking"}})
    assert (
        GenerationSettings.of(split).fingerprint
        != GenerationSettings.of(GenerateConfig.from_dict({})).fingerprint
    )
    with pytest.raises(Exception, match="in_answer"):
        GenerateConfig.from_dict({"truncation": {"in_answer": "retry_without_thinking"}})
