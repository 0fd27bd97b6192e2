"""The simulated server's radix cache, as SGLang reports it (``regen.simulated.prefixcache``): a repeated
prompt is served from the cache but for its last token, reported in ``usage.prompt_tokens_details`` only
under ``--enable-cache-report``; a cache too small for what came between forgets it; a prompt counts once
for ``n`` choices."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import orjson
import pytest

from regen.simulated.launcher import start_simulated_server
from regen.simulated.prefixcache import PrefixCache


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
