"""A sliding-window pool must hold the planned batch at steady decode, not only at start (issue 49).

Measured (H200, SGLang 0.5.17, dummy weights): gpt-oss-20b under regen's plan ``--disable-radix-cache
--cuda-graph-max-bs-decode 1024 --max-running-requests 2904 --min-free-slots-delay 4
--cuda-graph-max-bs-prefill 1280`` at 2,904 in flight held 60 s without a crash but retracted 789 requests:
"Full KV 4,016,195 tokens; SWA KV 762,713 tokens", decode lines at ``full token usage: 0.24 ... swa token
usage: 0.65`` (2,903 running) and then ``full token usage: 0.45, #swa token: 762612, swa token usage:
1.00`` at 2,476 running with 436 queued: the SWA pool ran out with the full pool under half used.

Second run, the plan sized with one interval (07:04 UTC): client 2,982, ``--max-running-requests 3162``,
"SWA KV 829,019" (as planned), full KV 3,949,889; still 403 requests retracted in 60 s (46 events). The
decode lines show the saw with all requests in phase: bottom 453,264 at 2,982 running (152 each), top
``#swa token: 828505, swa token usage: 1.00`` at 2,940 running (282 each) -> retraction: 282 > 257, an
eviction came later than 128 steps after the one before.

Third run, the plan sized with one skipped eviction (measurements/families-2026-12-04.md): client 2,130,
``--max-running-requests 3446``, 300-token prompts, answers ~1,450 on average, refill-heavy (the client ran
above the decode graphs; retracted requests re-prefilled). The pool filled at ``#running-req: 1761 ...
#swa token: 900982, swa token usage: 1.00 ... #queue-req: 373``: ~511 a running request (a lower bound of
the need, the pool being full) = window 127 + 3 x 128 + 1, two evictions skipped in a row; 941 requests
retracted, 0.26x the defaults' throughput.

SGLang's rules, written out here rather than taken from :mod:`regen.sglang.pools.swa`:
- 0.5.17 ``ScheduleBatch.maybe_evict_swa`` frees tokens older than the window only on decode steps with
  ``forward_iter % SGLANG_SWA_EVICTION_INTERVAL == 0`` (128) and ``decode_batch_idx >= 1``;
  ``forward_iter`` is ``Scheduler.forward_ct``, counted by ``run_batch`` for every forward, prefill
  batches included, so a refill batch on the 128th count skips the eviction for every decode request:
  they wait 2 x 128 steps, and each further multiple taken by a prefill adds 128 (the source bounds it by
  nothing; planned: two in a row, 3 x 128, as the third run measured; 0.5.23 gates per request on tokens
  slid out instead).
  ``free_swa_out_of_window_slots`` (radix cache off) keeps window + 1; gpt-oss's window is
  ``sliding_window - 1`` = 127. A request past its first eviction so holds at most
  127 + 384 + 1 + the next step's page 1 = 513 on 0.5.17 (257, SGLang's own per-request sum, on 0.5.23).
- A request admitted since the last eviction holds its whole prompt (300) until its first, so up to
  300 - 127 more; a closed loop at n in flight with 1,437-token answers admits n x 384 / 1,437 of them
  between two evictions. ``PrefillAdder`` admits by the SWA free *now*; ``check_decode_mem`` retracts
  when short.
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

MODELS = Path(__file__).parents[2] / "resources" / "models"
H200_MIB = 143771
ISSUE = Workload(
    prompt_p50=300, prompt_p99=300, max_tokens=8192, expected_output_tokens=1437, expected_output_cv=0.65
)
HELD_PLAN = (
    "--disable-radix-cache", "--cuda-graph-max-bs-decode", "1024", "--max-running-requests", "2904",
    "--min-free-slots-delay", "4", "--cuda-graph-max-bs-prefill", "1280",
)  # fmt: skip
THIRD_PLAN = (
    "--disable-radix-cache", "--cuda-graph-max-bs-decode", "1024", "--min-free-slots-delay", "4",
    "--cuda-graph-max-bs-prefill", "1280", "--max-running-requests", "3446",
)  # fmt: skip
SECOND_PLAN = (
    "--disable-radix-cache", "--cuda-graph-max-bs-decode", "1024", "--min-free-slots-delay", "4",
    "--cuda-graph-max-bs-prefill", "1280", "--max-running-requests", "3162",
)  # fmt: skip
PER_REQUEST = 127 + 128 + 1 + 1  # SGLang's pool per cap
ONE_SKIP = 127 + 2 * 128 + 1 + 1  # held per request before an eviction, one eviction skipped (0.5.17)
HELD = 127 + 3 * 128 + 1 + 1  # two skipped in a row, as planned for 0.5.17 (the third run)
CHUNKS = 2 * 8192 + 1


def steady_need(running: int, held: int = HELD, span: int = 3 * 128) -> int:
    admitted = math.ceil(running * span / 1437)
    return running * held + admitted * (300 - 127) + CHUNKS


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


def test_the_second_held_plan_skips_an_eviction(gpt_oss: ModelShape) -> None:
    second = plan(gpt_oss, H200_MIB, 1, list(SECOND_PLAN), ISSUE, "0.5.17")
    assert second.swa_tokens == 829_019 == 3162 * PER_REQUEST + CHUNKS  # as logged
    assert steady_need(2982, PER_REQUEST, 128) <= 829_019  # it held the client at one interval...
    assert PER_REQUEST < 828_505 / 2940  # ...but the saw's top was 282 a request: an eviction was skipped
    assert ONE_SKIP >= 828_505 / 2940
    assert steady_need(2982, ONE_SKIP, 2 * 128) > 829_019
    assert steady_need(2982) > 829_019
    assert not swa_holds(Target(gpt_oss, H200_MIB, 1, (), ISSUE, "0.5.17"), second, 2982)
    # 0.5.23 evicts per request once 128 tokens slid out: one interval is its worst case
    assert swa_holds(Target(gpt_oss, H200_MIB, 1, (), ISSUE, "0.5.23"), second, 2982)


def test_the_third_held_plan_skips_two_evictions_in_a_row(gpt_oss: ModelShape) -> None:
    third = plan(gpt_oss, H200_MIB, 1, list(THIRD_PLAN), ISSUE, "0.5.17")
    assert third.swa_tokens == 902_007 == 3446 * PER_REQUEST + CHUNKS  # the request-capped pool
    top, running = 900_982, 1761  # "#swa token: 900982, swa token usage: 1.00" at 1,761 running
    assert round(top / third.swa_tokens, 2) == 1.00  # as logged: the pool full
    # planned with one skip, the client's 2,130 just fit (the plan's own sizing), 1,761 with room...
    assert steady_need(2130, ONE_SKIP, 2 * 128) <= third.swa_tokens + PER_REQUEST
    assert steady_need(running, ONE_SKIP, 2 * 128) < 0.85 * third.swa_tokens
    # ...yet the pool filled: one skip cannot explain the top even with every admission at its prompt
    assert top / running > ONE_SKIP and top > steady_need(running, ONE_SKIP, 2 * 128)
    assert top / running <= HELD  # two skips in a row can (~511 = 127 + 3 x 128 + 1)
    assert steady_need(running) > third.swa_tokens
    target = Target(gpt_oss, H200_MIB, 1, (), ISSUE, "0.5.17")
    assert not swa_holds(target, third, running)
    assert not swa_holds(target, third, 2130)
    # 0.5.23 evicts per request: one interval, the held plan holds its client there
    assert swa_holds(Target(gpt_oss, H200_MIB, 1, (), ISSUE, "0.5.23"), third, 2130)


def test_the_new_plan_holds_its_client_at_steady_decode(gpt_oss: ModelShape) -> None:
    rec = recommend(gpt_oss, H200_MIB, 1, [], ISSUE, "0.5.17", allow_fp8_kv=False, allow_bf16_state=False)
    p = rec.recommended
    cap, client = p.effective_max_running_requests, p.client_concurrency
    assert client is not None and parse_flags(list(rec.args)).max_running_requests == cap
    assert p.swa_tokens == cap * PER_REQUEST + CHUNKS  # the request-capped pool, sized from the cap
    assert p.swa_tokens >= steady_need(client)  # holds the client with two evictions skipped in a row
    assert p.swa_tokens >= client * 511  # and at the third run's measured ~511 a request
    assert cap > client  # the cap is the lever on the SWA pool: raised above the client for it
    # the decode graphs bound the client (eager decode is no faster: issue 49), far below what the KV holds
    assert client == 1024
    assert p.kv_cache_tokens >= client * ISSUE.paged_tokens_per_request(1)
    assert p.decode_step_fits
    assert p.swa_steady_tokens == steady_need(client)
    assert "eviction" in p.rules()["swa_steady_tokens"]
    assert "SWA pool" in p.rules()["swa_steady_tokens"]
