"""The simulated server's radix cache, as SGLang reports it (``regen.simulated.prefixcache``): a repeated
prompt is served from the cache but for its last token, reported in ``usage.prompt_tokens_details`` only
under ``--enable-cache-report``; a cache too small for what came between forgets it; a prompt counts once
for ``n`` choices."""

from __future__ import annotations

import asyncio
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from bench.gpu.serverlog import prefill_tokens
from regen.serving.probes import fetch_server_info, radix_cache_on
from regen.simulated.launcher import start_simulated_server
from regen.simulated.prefixcache import PrefixCache

REPO = Path(__file__).resolve().parents[2]


def question(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"question {i}: " + " ".join(f"word{j}" for j in range(60))}]


def ask(url: str, messages: list[dict[str, str]], **kw: Any) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        body = {"model": "m", "messages": messages, "max_tokens": 32, "seed": 1, **kw}
        async with aiohttp.ClientSession() as s, s.post(url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200
            return orjson.loads(await r.read())

    return asyncio.run(go())


def stats(url: str) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        async with aiohttp.ClientSession() as s, s.get(url + "/_sim/stats") as r:
            return orjson.loads(await r.read())

    return asyncio.run(go())["prefix_cache"]


@pytest.fixture
def reporting() -> Iterator[str]:
    url, stop = start_simulated_server(inline=True, enable_cache_report=True, prefix_cache_tokens=400)
    yield url
    stop()


def test_a_repeated_prompt_is_served_from_the_cache_but_its_last_token(reporting: str) -> None:
    first = ask(reporting, question(0))["usage"]
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}  # nothing cached: 0.5.23 reports 0
    again = ask(reporting, question(0), seed=2)["usage"]
    assert again["prompt_tokens"] == first["prompt_tokens"]
    assert again["prompt_tokens_details"] == {"cached_tokens": first["prompt_tokens"] - 1}
    other = ask(reporting, question(1))["usage"]  # shares the chat scaffolding's first block only
    assert other["prompt_tokens_details"] is None or other["prompt_tokens_details"]["cached_tokens"] < 16
    counted = stats(reporting)
    assert counted["prompt_tokens"] == 3 * first["prompt_tokens"]
    assert counted["prefilled_tokens"] == counted["prompt_tokens"] - (first["prompt_tokens"] - 1) - (
        (other["prompt_tokens_details"] or {}).get("cached_tokens", 0)
    )


def test_a_cache_too_small_for_what_came_between_forgets_the_prompt(reporting: str) -> None:
    size = ask(reporting, question(0))["usage"]["prompt_tokens"]
    for i in range(1, 1 + 400 // size + 1):  # more than the 400 tokens the cache holds
        ask(reporting, question(i))
    assert ask(reporting, question(0))["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


def test_0_5_17_leaves_a_miss_out() -> None:
    url, stop = start_simulated_server(inline=True, enable_cache_report=True, version="0.5.17")
    try:
        first = ask(url, question(0))["usage"]
        again = ask(url, question(0), seed=2)["usage"]
    finally:
        stop()
    assert first["prompt_tokens_details"] is None  # _details_if_cached: null for 0
    assert again["prompt_tokens_details"] == {"cached_tokens": first["prompt_tokens"] - 1}


def test_without_cache_report_the_details_stay_null_and_n_counts_the_prompt_once() -> None:
    url, stop = start_simulated_server(inline=True)
    try:
        one = ask(url, question(0))["usage"]
        both = ask(url, question(0), n=2)["usage"]
    finally:
        stop()
    assert one["prompt_tokens_details"] is None and both["prompt_tokens_details"] is None
    assert both["prompt_tokens"] == one["prompt_tokens"]
    assert both["total_tokens"] == both["prompt_tokens"] + both["completion_tokens"]


def test_copies_of_a_prompt_in_one_prefill_batch_each_prefill_it() -> None:
    """SGLang 0.5.17's default ``fcfs`` policy matches every request of a prefill batch against the tree as
    it was before the batch and inserts their prompts once it has run. On an H100, regen's 3,200 completions
    of 800 prompts, a prompt's four sent together, found 256 of 409,600 prompt tokens cached; the simulated
    server must not serve the copies from a batch that has not run."""
    cache = PrefixCache(capacity_tokens=10_000)
    prompt = [f"t{i}" for i in range(100)]
    assert [cache.serve(prompt) for _ in range(4)] == [0, 0, 0, 0]  # one batch: none sees another
    cache.commit()  # the batch ran: its Prefill batch line is out
    assert cache.serve(prompt) == 99
    assert cache.stats()["cached_tokens"] == 99 and cache.stats()["prompt_tokens"] == 500


@pytest.mark.parametrize(("page", "cached"), [(1, 127), (16, 112), (64, 64), (128, 0)])
def test_the_tree_serves_whole_pages(page: int, cached: int) -> None:
    """SGLang's ``RadixCache.match_prefix`` cuts the key to whole pages, the key being all of the prompt
    but its last token: a repeated 128-token prompt finds 64 tokens cached at page 64, none at page 128."""
    cache = PrefixCache(10_000, page_size=page)
    prompt = list(range(128))
    assert cache.serve(prompt) == 0
    cache.commit()
    assert cache.serve(prompt) == cached


def test_whole_pages_are_what_sglang_served_on_the_h200(tmp_path: Path) -> None:
    """The race on the H200 (measurements/race-2026-12-07c-h200-n4): regen's server at page 64 logged
    204,800 cached tokens for 3,200 completions of 800 128-token prompts, each after its prompt's prefill
    request: what this cache serves them."""
    with tarfile.open(REPO / "measurements" / "race-2026-12-07c-h200-n4" / "race-logs.tgz") as tgz:
        tgz.extractall(tmp_path, filter="data")
    logged = prefill_tokens((tmp_path / "logs" / "gpu0.log").read_text())  # cache kept, then cache off
    cache = PrefixCache(1_000_000, page_size=64)
    prompts = [[i, *range(1000, 1127)] for i in range(800)]
    for prompt in prompts:  # the prefill requests, then the four completions of each
        cache.serve(prompt)
    cache.commit()
    served = sum(cache.serve(prompt) for prompt in prompts for _ in range(4))
    assert logged["cached_tokens"] == served == 204_800


def test_the_stand_in_reports_and_serves_the_launched_page_size() -> None:
    url, stop = start_simulated_server(inline=True, enable_cache_report=True, page_size=64)
    try:
        info = fetch_server_info(url, None)  # what the client reads before it sends prefill requests
        assert info["page_size"] == 64 and radix_cache_on(info) is True
        messages = question(3)  # 3 + 4 + 62 = 69 tokens: 64 of them cached the second time
        ask(url, messages)
        usage = ask(url, messages)["usage"]
        assert usage["prompt_tokens"] == 69 and usage["prompt_tokens_details"]["cached_tokens"] == 64
    finally:
        stop()
