"""The client's in-flight window (regen.generate.pacing): planned within what the server finishes in the
request timeout, halved on overload, grown back on clean windows, never below 1 nor above the planned count;
and the timeout/plan disagreement ``regen check`` reports (issue 48)."""

from __future__ import annotations

import asyncio

import pytest

from regen.generate.pacing import (
    ESTIMATED_GPU_STEP,
    MIN_EPOCH,
    OK,
    OTHER,
    OVERLOAD,
    AimdWindow,
    RequestTime,
    measured_step,
    plan_in_flight,
    timeout_conflict,
    whole_shard_offer,
)

STEP_47MS = RequestTime(0.015, 0.0000477, 0.0, "Llama-3.1-8B at 671 running: ~47 ms", False)


def run(coro):
    return asyncio.run(coro)


def test_the_window_starts_within_what_finishes_in_the_timeout() -> None:
    # 40 ms steps at the cap of 100, 32-token answers: 1.28 s a request; 2 s of timeout finish 100 * 2 / 1.28
    time = RequestTime(0.040, 0.0, 0.0, "test", False)
    plan = plan_in_flight(5000, 100, 2.0, 32, time)
    assert plan.ceiling == 5000 and plan.timeout_window == int(0.8 * 100 * 2.0 / 1.28) == plan.start == 125
    assert "1.28-s worst-case request at 100 running" in plan.describe()
    # a long timeout leaves the planned count as it is
    assert plan_in_flight(120, 100, 3600, 32, time).start == 120
    # no request time known: the planned count
    assert plan_in_flight(64, None, 1.0, 32, time).start == 64 == plan_in_flight(64, 10, 1.0, 32, None).start


def test_a_timeout_shorter_than_one_request_still_keeps_one_in_flight() -> None:
    plan = plan_in_flight(500, 400, 1.0, 32768, STEP_47MS)
    assert plan.start == plan.timeout_window == 1


def test_a_burst_halves_the_window_once_and_clean_windows_bring_it_back_to_half_its_plan_fast() -> None:
    async def go() -> None:
        w = AimdWindow(ceiling=200, limit=200.0, start=200)
        tickets = [await w.acquire() for _ in range(200)]
        assert w.in_flight == 200 and w.room == 0
        for t in tickets[:11]:  # 11 timeouts in a row: a burst, halved once
            w.release(t, OVERLOAD)
        assert w.limit == 100 and w.decreases == 1
        for t in tickets[11:]:  # answers and timeouts of requests sent before the decrease: not counted
            w.release(t, OVERLOAD)
        assert w.limit == 100 and w.decreases == 1 and w.in_flight == 0
        for _ in range(3):  # at half the plan: + 5 % of the ceiling per clean window
            for t in [await w.acquire() for _ in range(int(w.limit))]:
                w.release(t, OK)
        assert w.limit == 130
        for _ in range(40):
            for t in [await w.acquire() for _ in range(int(w.limit))]:
                w.release(t, OK)
        assert w.limit == 200

    run(go())


def test_a_collapsed_window_doubles_back_to_half_its_plan_and_the_floor_counts_no_decrease() -> None:
    async def go() -> None:
        w = AimdWindow(ceiling=160, limit=160.0, start=160)
        while w.limit > 1:  # a long burst: every request times out behind others
            w.release(await w.acquire(), OVERLOAD)
        shrinks = w.decreases
        assert shrinks == 8  # 160 -> 1
        for _ in range(50):  # more of the burst at the floor: nothing left to shrink, nothing counted
            w.release(await w.acquire(), OVERLOAD)
        assert w.limit == 1 and w.decreases == shrinks
        windows = 0
        while w.limit < 80:  # answers come back clean: one window of answers doubles it
            for t in [await w.acquire() for _ in range(int(w.limit))]:
                w.release(t, OK)
            windows += 1
        assert windows == 7 and w.limit == 80  # 1 2 4 8 16 32 64 80: seven request times

    run(go())


def test_the_window_never_falls_below_one_and_errors_that_are_not_overload_do_not_move_it() -> None:
    async def go() -> None:
        w = AimdWindow(ceiling=50, limit=50.0)
        for _ in range(60):
            w.release(await w.acquire(), OVERLOAD)
        assert w.limit == 1
        for _ in range(100):
            w.release(await w.acquire(), OTHER)  # e.g. a 500 or a refused connection: not the load
        assert w.limit == 1 and w.completed == 0

    run(go())


@pytest.mark.parametrize("every", [100, 50, 20])
def test_random_503s_of_a_healthy_server_do_not_shrink_the_window(every: int) -> None:
    """1 %, 2 % and 5 % of answers 503 or timeouts behind others, at random, at any window size: the
    background: the window stays, shrinking now and then for less than one signal in ten (the old rule
    halved on 2 of a 20-answer epoch)."""
    import random

    async def go() -> None:
        rng = random.Random(every)
        for ceiling in (4, 100):
            w = AimdWindow(ceiling=ceiling, limit=float(ceiling), start=ceiling)
            for _ in range(5000):
                w.release(await w.acquire(), OVERLOAD if rng.random() < 1 / every else OK)
            assert w.limit >= ceiling / 2 and w.decreases <= 500 / every, (ceiling, w.limit, w.decreases)

    run(go())


def test_requests_beyond_the_window_wait_in_order_and_a_cancelled_waiter_gives_its_turn_on() -> None:
    async def go() -> None:
        w = AimdWindow(ceiling=2, limit=2.0)
        held = [await w.acquire(), await w.acquire()]
        order: list[str] = []

        async def send(name: str) -> None:
            t = await w.acquire()
            order.append(name)
            w.release(t, OK)

        a = asyncio.create_task(send("a"))
        b = asyncio.create_task(send("b"))
        c = asyncio.create_task(send("c"))
        await asyncio.sleep(0)
        assert w.in_flight == 2 and len(w.waiters) == 3 and not order
        b.cancel()
        w.release(held[0], OK)
        w.release(held[1], OK)
        await asyncio.gather(a, c)
        assert order == ["a", "c"] and w.in_flight == 0 and not w.waiters
        assert b.cancelled()

    run(go())


def test_timeout_conflict_says_the_number_and_the_fix() -> None:
    # the case: 32,768-token answers at 671 running, ~47 ms a step, a 300-s timeout
    msg = timeout_conflict(671, 300, 32768, STEP_47MS)
    assert msg is not None
    assert "1,540 s" in msg and "671 running" in msg and "Raise request_timeout_s to 1926 (" in msg
    assert "lower --max-running-requests" not in msg and "alone takes 493 s" in msg  # 32768 x 15 ms
    assert timeout_conflict(671, 3600, 32768, STEP_47MS) is None
    near = timeout_conflict(671, 1200, 32768, STEP_47MS)
    assert near is not None and "or lower --max-running-requests to " in near
    lower = int(near.rsplit(" ", 1)[1])
    assert 0 < lower < 671 and STEP_47MS.worst_s(lower, 32768) <= 1200 < STEP_47MS.worst_s(lower + 1, 32768)
    estimate = timeout_conflict(671, 300, 32768, ESTIMATED_GPU_STEP)
    assert estimate is not None and "an estimate" in estimate


@pytest.mark.parametrize(
    ("model", "found"),
    [
        ({"fixed_s": 0.0145, "per_request_s": 0.000139, "basis": "fit"}, True),
        ({"fixed_s": 0.0, "per_request_s": 0.0}, False),
        (None, False),
        ({"fixed_s": "x"}, False),
    ],
)
def test_a_pilot_step_line_is_read_when_it_is_one(model: object, found: bool) -> None:
    got = measured_step(model)
    assert (got is not None) == found
    if got is not None:
        assert not got.estimate and got.step_s(100) == pytest.approx(0.0145 + 0.0139)


def test_a_small_window_is_judged_on_enough_answers() -> None:
    async def go() -> None:
        w = AimdWindow(ceiling=4, limit=4.0, start=4)
        for _ in range(MIN_EPOCH - 4):
            w.release(await w.acquire(), OK)
        for _ in range(3):
            w.release(await w.acquire(), OVERLOAD)
        assert w.limit == 4  # 3 of 19: what a few per cent of faults give now and then
        w.release(await w.acquire(), OVERLOAD)
        assert w.limit == 2 and w.decreases == 1  # 4 of 20: a burst

    run(go())


def test_the_whole_shard_is_offered_only_when_the_servers_own_cap_is_known_and_holds_it() -> None:
    assert whole_shard_offer(10, 64, 40)[0] == 40 and "fit under the server's cap of 64" in str(
        whole_shard_offer(10, 64, 40)[1]
    )
    assert whole_shard_offer(10, None, 40) == (10, None)  # cap unknown: the plan's count
    assert whole_shard_offer(10, 64, None) == (10, None)  # shard size unknown (a stream)
    assert whole_shard_offer(10, 64, 65) == (10, None)  # more than the server runs at once
    assert whole_shard_offer(10, 64, 8) == (10, None)  # fewer than planned: nothing to widen
