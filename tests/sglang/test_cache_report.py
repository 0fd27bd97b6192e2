"""``cached_tokens`` read back from SGLang's answers (regen.sglang.cache_report): the simulated server's chat
answers with and without ``--enable-cache-report``, and ``/generate``'s ``meta_info``."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson

from regen.sglang.cache_report import PrefillSaved, cached_tokens
from regen.simulated.launcher import start_simulated_server


def _ask(url: str, text: str, seed: int) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 8, "seed": seed}
        async with aiohttp.ClientSession() as s, s.post(url + "/v1/chat/completions", json=body) as r:
            return orjson.loads(await r.read())

    return asyncio.run(go())


PROMPT = "shared prompt " + " ".join(f"w{j}" for j in range(80))


def _four_answers(**opts: Any) -> PrefillSaved:
    url, stop = start_simulated_server(inline=True, **opts)
    saved = PrefillSaved()
    try:
        for seed in range(4):  # n = 4 sent back to back: the first prefills, three read the cache
            saved.add(_ask(url, PROMPT, seed))
    finally:
        stop()
    return saved


def test_a_shard_counts_the_prefill_the_cache_saved() -> None:
    saved = _four_answers(enable_cache_report=True)
    per_prompt = saved.prompt_tokens // 4
    assert saved.answers == 4 and saved.reported == 4  # 0.5.23 reports the first answer's miss as 0
    assert saved.cached_tokens == 3 * (per_prompt - 1)  # all but the last token of each repeat
    assert saved.cached_share == 3 * (per_prompt - 1) / (4 * per_prompt)
    assert "read from SGLang's radix cache" in saved.in_words()


def test_0_5_17s_null_for_a_miss_counts_as_0() -> None:
    saved = _four_answers(enable_cache_report=True, version="0.5.17")
    assert saved.reported == 3 and saved.cached_tokens == 3 * (saved.prompt_tokens // 4 - 1)


def test_without_the_report_nothing_is_claimed() -> None:
    saved = _four_answers()
    assert saved.answers == 4 and saved.reported == 0 and saved.cached_share is None
    assert "not reported" in saved.in_words()


def test_generate_answers_carry_it_in_meta_info() -> None:
    answer = {"text": "x", "meta_info": {"prompt_tokens": 100, "completion_tokens": 5, "cached_tokens": 64}}
    assert cached_tokens(answer) == 64
    assert cached_tokens({"usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 0}}}) == 0
    assert cached_tokens({"usage": {"prompt_tokens": 9, "prompt_tokens_details": None}}) is None
    saved = PrefillSaved()
    saved.add(answer)
    assert saved.to_json() == {"answers": 1, "reported": 1, "prompt_tokens": 100, "cached_tokens": 64,
                               "cached_share": 0.64}  # fmt: skip
