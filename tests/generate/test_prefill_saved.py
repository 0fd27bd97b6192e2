"""SGLang's ``cached_tokens`` in the shard's stats (issue 57 item 4): n = 4 completions of each prompt, sent
to the stand-in after a request that prefills the prompt (``Requests.prefill_prompt``, as SGLang's own n
does); with its radix cache and the report on, all four read the prompt from the cache, one at a time or
all at once, and the shard's end line says how much prefill that saved; with the cache off, none, and no
prefill request goes out; without the report, nothing is claimed. The records' usage stays as it was."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import orjson
import pytest

from regen.generate.client import Endpoint, ProgressOptions, ShardJob, generate_shard
from regen.generate.scheduler import ShardStats
from regen.runconfig import GenerateConfig
from regen.serving.simulated_mode import simulated_plan_options
from regen.sglang.config import PlanFile
from regen.simulated.launcher import start_simulated_server
from regen.types import Message, Sample

SAMPLES = [
    Sample(f"s{i}", (Message("user", f"question {i} " + "word " * 60), Message("assistant", "old")))
    for i in range(3)
]
FOUR = GenerateConfig.from_dict({"concurrency": 1, "sampling": {"max_tokens": 32, "n": 4}, "spill": False})
#: a prompt's four completions in flight together: each would prefill it, were it not prefilled first
AT_ONCE = GenerateConfig.from_dict({"concurrency": 8, "sampling": {"max_tokens": 32, "n": 4}, "spill": False})


def _shard(
    tmp_path: Path, cfg: GenerateConfig = FOUR, known: dict[str, Any] | None = None, **server: Any
) -> tuple[ShardStats, list[dict[str, Any]]]:
    # the in-flight copies share a prefill batch only where the server queues and decodes over time
    queued = {"inline": False, "token_rate": 4000.0} if cfg is AT_ONCE else {"inline": True}
    url, stop = start_simulated_server(mean_answer_tokens=8, **queued, **server)
    try:
        t, progress = tmp_path, ProgressOptions(status_path=tmp_path / "s.json")
        paths = (t / "j.jsonl", t / "o.jsonl", t / "f.jsonl")
        endpoint = Endpoint(url, "gpu0", **(known or {}))  # known: what /server_info is not read for
        job = ShardJob(SAMPLES, *paths, cfg, endpoint, "00000", progress)
        stats = generate_shard(job)
    finally:
        stop()
    return stats, [orjson.loads(x) for x in (tmp_path / "o.jsonl").read_bytes().splitlines()]


@pytest.mark.parametrize("cfg", [FOUR, AT_ONCE], ids=["one-at-a-time", "all-at-once"])
def test_the_cache_saves_four_prefills_of_five(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, cfg: GenerateConfig
) -> None:
    with caplog.at_level(logging.INFO, logger="regen"):
        stats, records = _shard(tmp_path, cfg, enable_cache_report=True)
    saved = stats.prefill
    per_prompt = saved.prompt_tokens // 15  # a prefill request and four completions a prompt
    assert saved.answers == 15 and saved.reported == 15  # 0.5.23 reports a miss as 0
    assert (
        saved.cached_tokens == 3 * 4 * (per_prompt - 1) > 0
    )  # every completion finds its prompt cached, all but its last token
    assert stats.to_json()["prefill"]["cached_share"] == pytest.approx(
        12 * (per_prompt - 1) / (15 * per_prompt)
    )
    end = [r.getMessage() for r in caplog.records if "wrote 12 records" in r.getMessage()]
    assert len(end) == 1 and f"prefill saved: {saved.cached_tokens:,} of {saved.prompt_tokens:,}" in end[0]
    assert all(
        "cached_tokens" not in r["usage"] and "prompt_tokens_details" not in r["usage"] for r in records
    )


def test_with_the_cache_off_nothing_is_read_from_it_and_no_prefill_is_sent(tmp_path: Path) -> None:
    stats, _ = _shard(tmp_path, enable_cache_report=True, disable_radix_cache=True)
    # the server's /server_info says the cache is off: the four completions of a prompt, no prefill request
    assert stats.prefill.reported == 12 and stats.prefill.cached_tokens == 0
    assert stats.prefill.cached_share == 0.0 and "(0%)" in stats.prefill.in_words()


def test_a_server_that_does_not_say_is_taken_to_keep_its_cache(tmp_path: Path) -> None:
    # what is known of the server spares the client /server_info, the one place that says whether the radix
    # cache is off (a server that is not SGLang has none; vLLM's prefix caching is on by default)
    stats, _ = _shard(tmp_path, known={"version": "other", "numerics": {}}, enable_cache_report=True)
    assert stats.prefill.answers == 15 and stats.prefill.cached_tokens > 0  # the prefill request went out
    off = {"version": "0.5.17", "numerics": {}, "radix_cache": False}  # a plan that turned it off says so
    stats, _ = _shard(tmp_path / "off", known=off, enable_cache_report=True, disable_radix_cache=True)
    assert stats.prefill.answers == 12 and stats.prefill.cached_tokens == 0


def test_without_the_report_nothing_is_claimed(tmp_path: Path) -> None:
    stats, _ = _shard(tmp_path)
    assert stats.prefill.answers == 15 and stats.prefill.reported == 0 and stats.prefill.cached_share is None


def test_the_stand_in_is_launched_with_the_plans_cache_flags() -> None:
    plan = PlanFile(
        ("--disable-radix-cache", "--enable-cache-report", "--page-size", "64"), "recommended", {}, {}
    )
    options = orjson.loads(simulated_plan_options(plan)[1])
    assert options["disable_radix_cache"] is True and options["enable_cache_report"] is True
    assert options["page_size"] == 64  # its radix cache matches whole pages, as SGLang's does
    kept = PlanFile((), "recommended", {}, {"kv_cache_tokens": 1000})
    assert "disable_radix_cache" not in orjson.loads(simulated_plan_options(kept)[1])
