"""A sliding-window pool must hold the planned batch at steady decode, not only at start (issue 49).

Measured (H200, SGLang 0.5.17, dummy weights): gpt-oss-20b under regen's plan ``--disable-radix-cache
--cuda-graph-max-bs-decode 1024 --max-running-requests 2904 --min-free-slots-delay 4
--cuda-graph-max-bs-prefill 1280`` at 2,904 in flight held 60 s without a crash but retracted 789 requests:
"Full KV 4,016,195 tokens; SWA KV 762,713 tokens", decode lines at ``full token usage: 0.24 ... swa token
usage: 0.65`` (2,903 running) and then ``full token usage: 0.45, #swa token: 762612, swa token usage:
1.00`` at 2,476 running with 436 queued: the SWA pool ran out with the full pool under half used.

SGLang's rules, written out here rather than taken from :mod:`regen.sglang.pools.swa`:
- ``ScheduleBatch.maybe_evict_swa`` frees tokens older than the window only on decode steps with
  ``forward_iter % SGLANG_SWA_EVICTION_INTERVAL == 0`` (128) and ``decode_batch_idx >= 1``;
  ``free_swa_out_of_window_slots`` (radix cache off) keeps window + 1; gpt-oss's window is
  ``sliding_window - 1`` = 127. A request past its first eviction so holds at most
  127 + 128 + 1 + the next step's page 1 = 257 (``SWAChunkCapPoolConfigurator``'s per-request sum).
- A request admitted since the last eviction holds its whole prompt (300) until its first, so up to
  300 - 127 more; a closed loop at n in flight with 1,437-token answers admits n x 128 / 1,437 of them
  an interval. ``PrefillAdder`` admits by the SWA free *now*; ``check_decode_mem`` retracts when short.
- With ``--max-running-requests`` given and the radix cache off, the SWA pool is
  257 x cap + 2 x chunked prefill 8,192 + 1 (``--swa-full-tokens-ratio`` is not read).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from regen.sglang.flags import parse_flags
from regen.sglang.models import ModelShape
from regen.sglang.plan import Workload, plan
from regen.sglang.recommend import recommend
from regen.sglang.search import Target, swa_holds

MODELS = Path(__file__).parents[1] / "data" / "models"
H200_MIB = 143771
ISSUE = Workload(
    prompt_p50=300, prompt_p99=300, max_tokens=8192, expected_output_tokens=1437, expected_output_cv=0.65
)
HELD_PLAN = (
    "--disable-radix-cache", "--cuda-graph-max-bs-decode", "1024", "--max-running-requests", "2904",
    "--min-free-slots-delay", "4", "--cuda-graph-max-bs-prefill", "1280",
)  # fmt: skip
PER_REQUEST = 127 + 128 + 1 + 1
CHUNKS = 2 * 8192 + 1


def steady_need(running: int) -> int:
    admitted = math.ceil(running * 128 / 1437)
    return running * PER_REQUEST + admitted * (300 - 127) + CHUNKS


@pytest.fixture(scope="module")
def gpt_oss() -> ModelShape:
    return ModelShape.from_config(MODELS / "gpt-oss-20b")


def test_the_held_plan_runs_out_of_swa(gpt_oss: ModelShape) -> None:
    old = plan(gpt_oss, H200_MIB, 1, list(HELD_PLAN), ISSUE, "0.5.17")
    assert old.swa_tokens == 762_713 == 2904 * PER_REQUEST + CHUNKS  # SGLang's pool, as logged
    assert steady_need(2904) > 762_713  # its 2,904 in flight do not fit between two evictions
    assert not swa_holds(Target(gpt_oss, H200_MIB, 1, (), ISSUE, "0.5.17"), old, 2904)
    # at the storm: 762,612 SWA tokens held by 2,476 running, ~308 each, above the 257 of steady decode
    assert PER_REQUEST < 762_612 / 2476


def test_the_new_plan_holds_its_client_at_steady_decode(gpt_oss: ModelShape) -> None:
    rec = recommend(gpt_oss, H200_MIB, 1, [], ISSUE, "0.5.17", allow_fp8_kv=False, allow_bf16_state=False)
    p = rec.recommended
    cap, client = p.effective_max_running_requests, p.client_concurrency
    assert client is not None and parse_flags(list(rec.args)).max_running_requests == cap
    assert p.swa_tokens == cap * PER_REQUEST + CHUNKS  # the request-capped pool, sized from the cap
    assert p.swa_tokens >= steady_need(client)  # holds the client between two evictions
    assert cap > client  # the cap is the lever on the SWA pool: raised above the client for it
    assert client >= 2700  # the batch is not given up for it: the full KV bounds it, not the SWA pool
    assert p.kv_cache_tokens >= client * ISSUE.paged_tokens_per_request(1)
    assert p.decode_step_fits
    assert p.swa_steady_tokens == steady_need(client)
    assert "eviction" in p.rules()["swa_steady_tokens"]
    assert any("SWA pool" in r for r in rec.reasons)
