"""The simulated SGLang server: HTTP shapes (as in SGLang 0.5.23's source), queueing, faults."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from regen.simulated.faults import Faults
from regen.simulated.launcher import start_simulated_server
from regen.simulated.prefixcache import PrefillWindow

MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is two plus two"}]


@pytest.fixture
def server() -> Iterator[str]:
    url, stop = start_simulated_server(inline=True)
    yield url
    stop()


async def _post(
    url: str, body: dict[str, Any], sid: str | None = None, timeout: float = 10
) -> tuple[int, bytes]:
    headers = {"X-Regen-Sample-Id": sid} if sid else {}
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            url + "/v1/chat/completions",
            data=orjson.dumps(body),
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as r,
    ):
        return r.status, await r.read()


def chat(url: str, sid: str | None = None, **kw: Any) -> tuple[int, Any]:
    body = {"model": "m", "messages": MSGS, "max_tokens": 4096, **kw}
    status, data = asyncio.run(_post(url, body, sid))
    return status, orjson.loads(data)


def get(url: str, path: str) -> tuple[int, bytes]:
    async def go() -> tuple[int, bytes]:
        async with aiohttp.ClientSession() as s, s.get(url + path) as r:
            return r.status, await r.read()

    return asyncio.run(go())


def test_chat_completion_shape_matches_sglang(server: str) -> None:
    status, resp = chat(server, seed=7, chat_template_kwargs={"enable_thinking": True})
    assert status == 200
    assert set(resp) == {"id", "object", "created", "model", "choices", "usage", "metadata"}
    assert resp["object"] == "chat.completion" and resp["model"] == "m"
    choice = resp["choices"][0]
    assert set(choice) == {"index", "message", "logprobs", "finish_reason", "matched_stop"}
    # SGLang drops tool_calls from the message when it is None (ChatMessage._serialize)
    assert set(choice["message"]) == {"role", "content", "reasoning_content"}
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] in ("stop", "length")
    usage = resp["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"] is None
    assert usage["reasoning_tokens"] == len(choice["message"]["reasoning_content"].split())
    assert usage["completion_tokens_details"] == {"reasoning_tokens": usage["reasoning_tokens"]}


def test_text_is_deterministic_in_messages_and_seed(server: str) -> None:
    a = chat(server, seed=1)[1]["choices"][0]["message"]
    b = chat(server, seed=1)[1]["choices"][0]["message"]
    c = chat(server, seed=2)[1]["choices"][0]["message"]
    assert a == b
    assert a != c
    g1 = chat(server, seed=1, temperature=0)[1]["choices"][0]["message"]
    g2 = chat(server, seed=2, temperature=0)[1]["choices"][0]["message"]
    assert g1 == g2  # greedy ignores the seed


def test_thinking_off_gives_answer_only(server: str) -> None:
    resp = chat(server, seed=3, chat_template_kwargs={"enable_thinking": False})[1]
    msg = resp["choices"][0]["message"]
    assert msg["reasoning_content"] is None and msg["content"]
    assert resp["usage"]["reasoning_tokens"] == 0 and "completion_tokens_details" not in resp["usage"]


def test_max_tokens_ignore_eos_and_n(server: str) -> None:
    short = chat(server, seed=4, max_tokens=5)[1]
    assert short["choices"][0]["finish_reason"] == "length"
    assert short["usage"]["completion_tokens"] == 5
    assert short["choices"][0]["matched_stop"] is None
    eos = chat(server, seed=4, max_tokens=300, ignore_eos=True)[1]
    assert eos["choices"][0]["finish_reason"] == "length" and eos["usage"]["completion_tokens"] == 300
    via_new_name = chat(server, seed=4, max_completion_tokens=5)[1]
    assert via_new_name["usage"]["completion_tokens"] == 5
    two = chat(server, seed=4, n=2)[1]
    assert [c["index"] for c in two["choices"]] == [0, 1]
    lengths = {chat(server, seed=s, max_tokens=256)[1]["choices"][0]["finish_reason"] for s in range(60)}
    assert lengths == {"stop", "length"}  # the length distribution reaches the budget sometimes


def test_separate_reasoning_false_inlines_think_block(server: str) -> None:
    msg = chat(server, seed=5, separate_reasoning=False)[1]["choices"][0]["message"]
    assert msg["reasoning_content"] is None and msg["content"].startswith("<think>")


def test_error_body_shape(server: str) -> None:
    status, body = chat(server, messages=[])
    assert status == 400
    assert body == {
        "object": "error",
        "message": "Messages cannot be empty.",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }


def test_info_endpoints(server: str) -> None:
    status, raw = get(server, "/server_info")
    info = orjson.loads(raw)
    assert status == 200
    for key in (
        "max_running_requests",
        "mem_fraction_static",
        "version",
        "model_path",
        "max_total_num_tokens",
    ):
        assert key in info
    state = info["internal_states"][0]
    assert state["effective_max_running_requests_per_dp"] == 64
    assert {"max_mamba_cache_size", "memory_usage", "last_gen_throughput"} <= set(state)
    models = orjson.loads(get(server, "/v1/models")[1])
    assert models["object"] == "list" and models["data"][0]["max_model_len"] == 32768
    assert orjson.loads(get(server, "/model_info")[1])["served_model_name"] == "demo-model"
    assert get(server, "/health") == (200, b"")
    assert get(server, "/health_generate") == (200, b"")


def test_metrics_prometheus_text(server: str) -> None:
    chat(server, seed=1)
    text = get(server, "/metrics")[1].decode()
    for name in (
        "num_running_reqs",
        "num_queue_reqs",
        "gen_throughput",
        "token_usage",
        "prompt_tokens_total",
        "generation_tokens_total",
    ):
        assert re.search(rf'^sglang:{name}\{{[^}}]*model_name="demo-model"[^}}]*\}} [0-9.]+$', text, re.M), (
            name
        )
    gen = re.search(r"^sglang:generation_tokens_total\{.*\} ([0-9.]+)$", text, re.M)
    assert gen and float(gen.group(1)) > 0


def test_requests_beyond_the_cap_queue() -> None:
    url, stop = start_simulated_server(
        max_running_requests=2,
        token_rate=400,
        mean_reasoning_tokens=50,
        mean_answer_tokens=50,
        long_fraction=0.0,
    )
    try:

        async def go() -> tuple[float, dict[str, float]]:
            body = {"messages": MSGS, "max_tokens": 100, "ignore_eos": True}  # 100 tokens = 0.25 s each
            t0 = time.perf_counter()
            tasks = [asyncio.create_task(_post(url, {**body, "seed": i})) for i in range(6)]
            await asyncio.sleep(0.1)
            async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
                text = await r.text()
            metrics = {m: float(v) for m, v in re.findall(r"^(sglang:\w+)\{.*\} ([0-9.]+)$", text, re.M)}
            await asyncio.gather(*tasks)
            return time.perf_counter() - t0, metrics

        elapsed, metrics = asyncio.run(go())
        assert metrics["sglang:num_running_reqs"] == 2
        assert metrics["sglang:num_queue_reqs"] == 4
        assert elapsed >= 0.7  # three waves of 0.25 s
    finally:
        stop()


def test_a_request_whose_client_went_away_is_aborted_and_frees_its_slot(tmp_path: Path) -> None:
    """As SGLang's tokenizer manager does every SGLANG_REQUEST_STATE_WAIT_TIMEOUT seconds without an answer:
    a disconnected request is aborted, queued or running, and its slot serves the next one (a gone request
    that held its slot would slow every timeout-and-retry test down against the real engine)."""
    log = tmp_path / "requests.jsonl"
    url, stop = start_simulated_server(
        max_running_requests=1, token_rate=100, long_fraction=0.0, disconnect_check_s=0.2,
        request_log=str(log),
    )  # fmt: skip

    def body(tokens: int) -> dict[str, Any]:
        return {"messages": MSGS, "max_tokens": tokens, "ignore_eos": True}  # 100 tokens a second

    try:

        async def go() -> float:
            running = asyncio.create_task(_post(url, body(100), "running"))  # holds the slot for 1 s
            await asyncio.sleep(0.05)
            with pytest.raises(asyncio.TimeoutError):  # waits behind it, then its client goes
                await asyncio.wait_for(_post(url, body(10), "queued"), 0.3)
            assert (await running)[0] == 200
            with pytest.raises(asyncio.TimeoutError):  # 20 s of decoding, its client gone after 0.3
                await asyncio.wait_for(_post(url, body(2000), "gone"), 0.3)
            t0 = time.perf_counter()
            assert (await _post(url, body(10), "next"))[0] == 200
            return time.perf_counter() - t0

        assert asyncio.run(go()) < 2.0  # not the 20 s the gone request would have held the slot
        events = [(e["event"], e["id"]) for e in map(orjson.loads, log.read_bytes().splitlines())]
        ended = [ev for ev in events if ev[0] in ("aborted", "completed")]
        assert ended == [
            ("aborted", "queued"),
            ("completed", "running"),
            ("aborted", "gone"),
            ("completed", "next"),
        ]
    finally:
        stop()


def test_startup_delay_health_503_then_200() -> None:
    url, stop = start_simulated_server(startup_delay_s=0.6)
    try:
        assert get(url, "/health")[0] == 503
        assert chat(url)[0] == 503
        time.sleep(0.7)
        assert get(url, "/health")[0] == 200
    finally:
        stop()


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("disconnect", aiohttp.ServerDisconnectedError),
        ("truncate", aiohttp.ClientPayloadError),
    ],
)
def test_connection_faults(kind: str, expected: type[Exception]) -> None:
    url, stop = start_simulated_server(inline=True, faults={f"{kind}_rate": 1.0})
    try:
        with pytest.raises(expected):
            asyncio.run(_post(url, {"messages": MSGS}, "x"))
    finally:
        stop()


def test_error_malformed_hang_and_bad_request_faults() -> None:
    url, stop = start_simulated_server(inline=True, faults={"error_rate": 1.0})
    try:
        status, body = asyncio.run(_post(url, {"messages": MSGS}, "x"))
        assert status in (500, 503) and orjson.loads(body)["object"] == "error"
    finally:
        stop()
    url, stop = start_simulated_server(inline=True, faults={"malformed_rate": 1.0})
    try:
        status, body = asyncio.run(_post(url, {"messages": MSGS}, "x"))
        assert status == 200
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(body)
    finally:
        stop()
    url, stop = start_simulated_server(inline=True, faults={"hang_rate": 1.0})
    try:
        with pytest.raises(TimeoutError):
            asyncio.run(_post(url, {"messages": MSGS}, "x", timeout=0.3))
    finally:
        stop()
    url, stop = start_simulated_server(inline=True, faults={"bad_request_for": ["bad-.*", "exact"]})
    try:
        assert asyncio.run(_post(url, {"messages": MSGS}, "bad-1"))[0] == 400
        assert asyncio.run(_post(url, {"messages": MSGS}, "exact"))[0] == 400
        assert asyncio.run(_post(url, {"messages": MSGS}, "good"))[0] == 200
    finally:
        stop()


def test_fault_draws_are_deterministic_per_id_and_attempt() -> None:
    f = Faults(error_rate=0.3, disconnect_rate=0.2, seed=9)
    draws = [f.draw(f"id{i}", k) for i in range(200) for k in (1, 2)]
    assert draws == [f.draw(f"id{i}", k) for i in range(200) for k in (1, 2)]
    share = sum(d is not None for d in draws) / len(draws)
    assert 0.4 < share < 0.6
    with pytest.raises(ValueError, match="unknown key"):
        Faults.from_json({"eror_rate": 0.1})


def test_stats_and_crash_after() -> None:
    url, stop = start_simulated_server(inline=True, faults={"crash_after": 2})
    try:
        assert chat(url, "a")[0] == 200
        assert chat(url, "b")[0] == 200
        time.sleep(0.1)
        with pytest.raises(aiohttp.ClientConnectionError):
            chat(url, "c")
    finally:
        stop()
    url, stop = start_simulated_server(inline=True)
    try:
        chat(url, "a")
        chat(url, "a")
        chat(url, "b")
        stats = orjson.loads(get(url, "/_sim/stats")[1])
        assert stats["received"] == 3 and stats["completed"] == {"a": 2, "b": 1}
    finally:
        stop()


@pytest.mark.parametrize(
    "faults",
    [{"stall_after_tokens": 1}, {"stall_at_s": 0.3}, {}],
    ids=["after_tokens", "at_time", "on_demand"],
)
def test_a_stalled_server_stays_up_and_healthy_and_generates_nothing(faults: dict[str, Any]) -> None:
    """As SGLang stalls (#30314, PR #34705): /health and /metrics answer, requests are taken, no token
    comes out, and the token counter stands still."""
    url, stop = start_simulated_server(token_rate=2000, faults=faults)
    try:
        if "stall_after_tokens" in faults:
            assert chat(url, "first")[0] == 200  # its tokens reach the threshold
        elif "stall_at_s" in faults:
            time.sleep(0.8)  # the ticker notices the time within 0.2 s
        else:
            with urllib.request.urlopen(urllib.request.Request(url + "/_sim/stall", method="POST")) as r:
                assert r.status == 200
        tokens = _counter(url)
        with pytest.raises(TimeoutError):
            asyncio.run(_post(url, {"messages": MSGS, "max_tokens": 5}, "stuck", timeout=0.5))
        assert get(url, "/health")[0] == 200
        assert _counter(url) == tokens
    finally:
        stop()


def _counter(url: str) -> float:
    text = get(url, "/metrics")[1].decode()
    return float(re.search(r"^sglang:generation_tokens_total\{[^}]*\} (\S+)$", text, re.MULTILINE)[1])


def test_cli_subprocess_logs_sglang_lines(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    url, stop = start_simulated_server(
        subprocess_mode=True,
        log_file=str(log),
        startup_delay_s=0.3,
        token_rate=200,
        log_interval_s=0.2,
        max_running_requests=7,
    )
    try:
        while get(url, "/health")[0] != 200:
            time.sleep(0.05)

        async def burst() -> None:
            await asyncio.gather(
                *(_post(url, {"messages": MSGS, "max_tokens": 100, "seed": i}) for i in range(10))
            )

        asyncio.run(burst())
    finally:
        stop()
    text = log.read_text()
    assert re.search(
        r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP0\] max_total_num_tokens=\d+, chunked_prefill_size=\d+, "
        r"max_prefill_tokens=\d+, max_running_requests=7, context_len=\d+, available_gpu_mem=[\d.]+ GB$",
        text,
        re.M,
    )
    assert "The server is fired up and ready to roll!" in text
    assert re.search(
        r"Decode batch, #running-req: \d+, .*gen throughput \(token/s\): [\d.]+, #queue-req: \d+", text
    )


@pytest.mark.parametrize(("kind", "check"), [("think_leak", "</think>"), ("empty_answer", "")])
def test_bad_output_faults_reach_validation(kind: str, check: str, tmp_path: Path) -> None:
    """Well-formed 200 responses whose answer is bad: the validation stage must catch them."""
    from regen.output.validate import ValidateConfig, answer_problem

    url, stop = start_simulated_server(inline=True, faults={f"{kind}_rate": 1.0})
    try:
        status, body = chat(url, sid="s1", max_tokens=200)
        _, stats = get(url, "/_sim/stats")
    finally:
        stop()
    assert status == 200
    message = body["choices"][0]["message"]
    assert message["reasoning_content"]
    assert message["content"].startswith(check) if check else message["content"] == ""
    assert orjson.loads(stats)["faults"] == {kind: 1}
    limits = ValidateConfig.from_dict({})
    assert answer_problem(message["content"], message["reasoning_content"], "stop", limits) is not None


def test_virtual_time_batch_completes_each_request_at_its_modelled_time() -> None:
    from bench.sim_virtual import FluidBatch, VirtualTime

    # steps of 10 ms + 5 ms per running request; two may run, the third waits in the queue
    clock = VirtualTime(speed=1.0, epoch=0.0, step_ms=10.0, step_ms_per_running=5.0)
    loop = asyncio.new_event_loop()
    try:
        batch = FluidBatch(clock, cap=2)
        batch.at = 0.0
        a, b, c = (loop.create_future() for _ in range(3))
        batch.arrive(100, a)
        batch.arrive(200, b)
        batch.arrive(50, c)
        assert (len(batch.running), len(batch.waiting)) == (2, 1)
        batch.advance(10.0)
        # a: 100 steps of 20 ms = 2.0; c then runs beside b: 50 steps of 20 ms = 3.0;
        # b: 150 tokens by 3.0, its last 50 alone at 15 ms = 3.75
        assert a.result() == pytest.approx(2.0)
        assert c.result() == pytest.approx(3.0)
        assert b.result() == pytest.approx(3.75)
        assert clock.full_batch_tokens_per_s(2) == pytest.approx(100.0)
    finally:
        loop.close()


def ask_one(url: str, sample_id: str) -> dict[str, Any]:
    """One chat completion of ``sample_id`` (max_tokens 4096), its body."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4096}
    req = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "X-Regen-Sample-Id": sample_id},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def test_virtual_time_server_keeps_sglangs_response_shape() -> None:
    """bench's virtual-time server, plugged in through the simulated server's hook."""
    from bench.sim_virtual import VirtualSimulatedServer, VirtualTime

    virtual = {"speed": 5000.0, "epoch": time.time(), "length_mean": 50.0}
    factory = functools.partial(VirtualSimulatedServer, clock=VirtualTime.from_json(virtual))
    url, stop = start_simulated_server(max_running_requests=4, server_factory=factory)
    try:
        out = ask_one(url, "v1")
    finally:
        stop()
    expected = VirtualTime.from_json(virtual).output_tokens("v1#0", 4096)
    assert out["object"] == "chat.completion" and out["choices"][0]["finish_reason"] == "stop"
    assert out["usage"]["completion_tokens"] == expected
    assert out["choices"][0]["message"]["reasoning_content"] and out["choices"][0]["message"]["content"]


def test_a_server_process_takes_its_server_from_the_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    """``$REGEN_SIM_SERVER`` swaps in a bench's server in a server process (as a workflow's servers
    inherit it): bench's virtual time answers with its modelled length, not the synthetic one."""
    from bench.sim_virtual import VIRTUAL_ENV, VIRTUAL_HOOK, VirtualTime
    from regen.simulated.launcher import SERVER_HOOK_ENV

    repo = str(Path(__file__).resolve().parents[2])
    virtual = {"speed": 5000.0, "epoch": time.time(), "length_mean": 50.0}
    monkeypatch.setenv(SERVER_HOOK_ENV, VIRTUAL_HOOK)
    monkeypatch.setenv(VIRTUAL_ENV, json.dumps(virtual))
    monkeypatch.setenv("PYTHONPATH", repo + ":" + os.environ.get("PYTHONPATH", ""))
    url, stop = start_simulated_server(subprocess_mode=True, max_running_requests=4)
    try:
        out = ask_one(url, "h1")
    finally:
        stop()
    assert out["usage"]["completion_tokens"] == VirtualTime.from_json(virtual).output_tokens("h1#0", 4096)


def _burst_wall_s(url: str, n: int, max_tokens: int) -> float:
    async def burst() -> None:
        body = {"messages": MSGS, "max_tokens": max_tokens, "ignore_eos": True}
        await asyncio.gather(*(_post(url, {**body, "seed": i}) for i in range(n)))

    t0 = time.monotonic()
    asyncio.run(burst())
    return time.monotonic() - t0


def test_speculative_decoding_reports_accept_length_and_decodes_faster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Launched with speculative steps (REGEN_SIM_OPTIONS, as a bench passes them) and SGLang's
    SGLANG_SIMULATE_ACC_LEN: decode lines carry ``accept len``, /server_info and /metrics the accept length,
    the startup log SGLang 0.5.17's speculative memory lines, and the same burst ends sooner."""
    from regen.sglang.realized import parse_startup_log

    common = {"token_rate": 400, "half_speed_running": 8, "log_interval_s": 0.1, "max_running_requests": 8}
    walls, texts, infos, metrics = {}, {}, {}, {}
    memory = {
        "spec_scratch_gib": 36.92,
        "draft_weights_gib": 5.53,
        "draft_kv_gib": 0.48,
        "state_pool_gib": 28.8,
    }
    for name, steps in (("plain", 0), ("mtp", 3)):
        monkeypatch.setenv("SGLANG_SIMULATE_ACC_LEN", "2.5")  # SGLang ignores it without speculative decoding
        monkeypatch.setenv("REGEN_SIM_OPTIONS", json.dumps({"speculative_num_steps": steps, **memory}))
        log = tmp_path / f"{name}.log"
        url, stop = start_simulated_server(subprocess_mode=True, log_file=str(log), **common)
        try:
            walls[name] = _burst_wall_s(url, 8, 120)
            infos[name] = json.loads(get(url, "/server_info")[1])
            metrics[name] = get(url, "/metrics")[1].decode()
        finally:
            stop()
        texts[name] = log.read_text()
    assert "accept len" not in texts["plain"]
    assert infos["plain"]["internal_states"][0]["avg_spec_accept_length"] is None
    assert re.search(
        r"Decode batch, .*accept len: 2\.50, accept rate: 0\.50, cuda graph: True, gen throughput",
        texts["mtp"],
    )
    assert infos["mtp"]["internal_states"][0]["avg_spec_accept_length"] == 2.5
    assert re.search(r"^sglang:spec_accept_length\{[^}]*\} 2\.5$", metrics["mtp"], re.M)
    # at 8 running (load 1): 2.5 accepted per step x 2 / (1 + 0.3 + 1 x 2.5) = 1.32x the plain rate
    assert walls["mtp"] < walls["plain"] / 1.15
    realized = parse_startup_log(texts["mtp"])
    assert realized.spec_scratch_gib == 36.92 and realized.draft_weights_gib == 5.53
    assert realized.draft_kv_cache_gib == 0.48 and parse_startup_log(texts["plain"]).spec_scratch_gib is None


def test_accept_length_is_clamped_to_the_draft_tokens_as_sglang_does() -> None:
    from regen.simulated.options import SimOptions, accept_length, env_options

    assert accept_length(SimOptions(speculative_num_steps=1, simulated_accept_len=2.9)) == 2.0
    assert accept_length(SimOptions(speculative_num_steps=3, simulated_accept_len=0.5)) == 1.0
    assert accept_length(SimOptions(speculative_num_steps=0, simulated_accept_len=2.9)) is None
    assert env_options({"SGLANG_SIMULATE_ACC_LEN": "-1"}) == {}  # SGLang's default: off
    assert env_options(
        {"SGLANG_SIMULATE_ACC_LEN": "2.9", "REGEN_SIM_OPTIONS": '{"speculative_num_steps": 2}'}
    ) == {
        "speculative_num_steps": 2,
        "simulated_accept_len": 2.9,
    }


def test_each_server_lifetime_draws_its_own_faults() -> None:
    """Issue 58: a retried sample on another server, or after a restart, does not meet the same fault."""
    f = Faults(error_rate=0.5, seed=9)
    a = [f.draw(f"id{i}", 1, "lifetime-a") for i in range(200)]
    b = [f.draw(f"id{i}", 1, "lifetime-b") for i in range(200)]
    both = sum(x is not None and y is not None for x, y in zip(a, b, strict=True))
    assert 25 < both < 75  # about a quarter: independent, not the same draw again


def test_a_request_of_several_choices_is_prefilled_as_sglang_splits_it() -> None:
    """n > 1 is one prefix request and n copies (SGLang's TokenizerManager): with the radix cache each copy
    finds the whole pages of all of the prompt but its last token; without it (ChunkCache) each computes it
    all."""
    kept, paged, off = PrefillWindow(), PrefillWindow(), PrefillWindow()
    kept.add(100, 0, 3, page=1)
    paged.add(100, 0, 3, page=64)  # 99 tokens are one whole page of 64
    off.add(100, 0, 3, page=None)
    assert (kept.seqs, kept.new_tokens, kept.cached_tokens) == (4, 103, 297)
    assert (paged.seqs, paged.new_tokens, paged.cached_tokens) == (4, 100 + 3 * 36, 3 * 64)
    assert (off.seqs, off.new_tokens, off.cached_tokens) == (4, 400, 0)
    one = PrefillWindow()
    one.add(100, 40, 1, page=1)
    assert (one.seqs, one.new_tokens, one.cached_tokens) == (1, 60, 40)
