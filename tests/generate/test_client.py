"""The generation client against the simulated SGLang server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
import orjson
import pytest

from regen.generate.client import (
    Endpoint,
    GenerateConfig,
    ProgressOptions,
    ShardFailedError,
    ShardJob,
    generate_shard,
    generate_shard_async,
)
from regen.generate.run_progress import read_shard_statuses
from regen.generate.sample_record import derive_seed, thinking_for
from regen.prompts import prompt_for_last, turn_prefixes
from regen.simulated.launcher import free_port, start_simulated_server
from regen.types import Message, Sample

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "record.schema.json").read_text())
FAST = {"backoff_base_s": 0.001, "request_timeout_s": 5, "sampling": {"max_tokens": 4096}}


def make_samples(n: int, prefix: str = "s") -> list[Sample]:
    return [
        Sample(
            id=f"{prefix}{i}",
            messages=(
                Message("system", "you are terse"),
                Message("user", f"question number {i}"),
                Message("assistant", "old answer", "old reasoning"),
            ),
        )
        for i in range(n)
    ]


def stats_of(url: str) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        async with aiohttp.ClientSession() as s, s.get(url + "/_sim/stats") as r:
            return orjson.loads(await r.read())

    return asyncio.run(go())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines()] if path.exists() else []


class Shard:
    def __init__(self, root: Path, shard: str = "00000") -> None:
        self.shard = shard
        self.journal = root / "work" / "journal" / f"{shard}.jsonl"
        self.out = root / "results" / "generations" / f"{shard}.jsonl"
        self.failed = root / "results" / "generations" / f"{shard}.failed.jsonl"
        self.status = root / "work" / "status" / f"{shard}.json"

    def run(self, samples: list[Sample], url: str, **cfg: Any):
        merged = {**FAST, **cfg}
        return generate_shard(
            ShardJob(
                samples,
                self.journal,
                self.out,
                self.failed,
                GenerateConfig.from_dict(merged),
                Endpoint(url, "gpu0"),
                self.shard,
            )
        )


@pytest.fixture
def sim() -> Iterator[str]:
    url, stop = start_simulated_server(inline=True, mean_answer_tokens=10, mean_reasoning_tokens=10)
    yield url
    stop()


def test_records_complete_and_valid(sim: str, tmp_path: Path) -> None:
    sh = Shard(tmp_path)
    samples = make_samples(50)
    stats = sh.run(samples, sim)
    recs = read_jsonl(sh.out)
    assert (stats.total, stats.completed, stats.failed) == (50, 50, 0)
    assert sorted(r["id"] for r in recs) == sorted(s.id for s in samples)
    for r in recs:
        jsonschema.validate(r, SCHEMA)
        assert r["messages"] == [
            {"role": "system", "content": "you are terse"},
            {"role": "user", "content": f"question number {r['id'][1:]}"},
        ]
        assert r["seed"] == derive_seed(0, r["id"]) and r["thinking"] is True
        assert r["server"] == {"id": "gpu0", "url": sim, "version": "0.5.23"} and r["model"] == "demo-model"
        assert r["attempts"] == 1 and r["reasoning_content"]
    assert sh.failed.read_bytes() == b""
    status = orjson.loads(sh.status.read_bytes())
    assert status["done"] == 50 and status["total"] == 50 and status["shard"] == "00000"
    # the file's shape, as regen status has always read it, and read back by regen status's reader
    assert set(status) == {"shard", "server", "done", "total", "failed", "truncated", "req_s", "out_tok_s",
                           "eta_s", "updated_at", "in_flight", "retrying", "retried_requests",
                           "oldest_in_flight_at", "completions_per_sample", "finished"}  # fmt: skip
    (read,) = read_shard_statuses(sh.status.parent)
    assert (read.shard, read.server_id, read.server_url, read.done, read.failed, read.finished) == (
        "00000", "gpu0", sim, 50, 0, True)  # fmt: skip
    assert read.in_flight == 0 and read.oldest_in_flight_at is None
    assert stats.output_tokens == sum(r["usage"]["completion_tokens"] for r in recs)


def test_outputs_are_deterministic(sim: str, tmp_path: Path) -> None:
    a, b = Shard(tmp_path / "a"), Shard(tmp_path / "b")
    a.run(make_samples(20), sim)
    b.run(make_samples(20), sim)
    strip = lambda recs: sorted((r["id"], r["seed"], r["content"], r["reasoning_content"]) for r in recs)  # noqa: E731
    assert strip(read_jsonl(a.out)) == strip(read_jsonl(b.out))
    c = Shard(tmp_path / "c")
    c.run(make_samples(20), sim, sampling={"seed": 1})
    assert strip(read_jsonl(c.out)) != strip(read_jsonl(a.out))


def test_seed_and_thinking_helpers() -> None:
    assert derive_seed(0, "x") == derive_seed(0, "x") != derive_seed(1, "x")
    assert all(0 <= derive_seed(7, f"id{i}") < 2**31 for i in range(100))
    on = sum(thinking_for(f"id{i}", "mix", 0.3) for i in range(2000)) / 2000
    assert 0.27 < on < 0.33
    assert thinking_for("a", "on", 0.0) and not thinking_for("a", "off", 1.0)


def test_thinking_mix_and_off(sim: str, tmp_path: Path) -> None:
    sh = Shard(tmp_path / "mix")
    sh.run(make_samples(300), sim, thinking="mix", thinking_fraction=0.25)
    recs = read_jsonl(sh.out)
    share = sum(r["thinking"] for r in recs) / len(recs)
    assert 0.17 < share < 0.33
    for r in recs:
        assert r["thinking"] == thinking_for(r["id"], "mix", 0.25)
        assert (r["reasoning_content"] is None) == (not r["thinking"])
    off = Shard(tmp_path / "off")
    off.run(make_samples(10), sim, thinking="off")
    assert all(r["reasoning_content"] is None and not r["thinking"] for r in read_jsonl(off.out))


def test_truncation_policies(sim: str, tmp_path: Path) -> None:
    samples = make_samples(80)
    keep = Shard(tmp_path / "keep")
    st = keep.run(samples, sim, sampling={"max_tokens": 20})
    kept = read_jsonl(keep.out)
    n_len = sum(r["finish_reason"] == "length" for r in kept)
    assert 0 < n_len < 80 and st.truncated == n_len
    assert all(r["truncated"] == (r["finish_reason"] == "length") for r in kept)

    drop = Shard(tmp_path / "drop")
    st = drop.run(samples, sim, sampling={"max_tokens": 20}, truncation="drop")
    failed = read_jsonl(drop.failed)
    assert {f["id"] for f in failed} == {r["id"] for r in kept if r["truncated"]}
    assert all(f["reason"] == "truncated" for f in failed) and st.failed == n_len == st.truncated
    assert not any(r["truncated"] for r in read_jsonl(drop.out))

    retry = Shard(tmp_path / "retry")
    st = retry.run(samples, sim, sampling={"max_tokens": 20}, truncation="retry", retry_max_tokens_factor=3)
    recs = {r["id"]: r for r in read_jsonl(retry.out)}
    assert len(recs) == 80
    for r in kept:
        again = recs[r["id"]]
        if r["truncated"]:
            assert again["attempts"] == 2 and again["sampling"]["max_tokens"] == 60
        else:
            assert again["attempts"] == 1 and again["sampling"]["max_tokens"] == 20 and not again["truncated"]
    assert 0 < st.truncated < n_len  # some fit in 60 tokens, some still do not


@pytest.mark.parametrize("kind", ["error", "disconnect", "malformed", "truncate", "hang"])
def test_retries_on_server_faults(kind: str, tmp_path: Path) -> None:
    url, stop = start_simulated_server(inline=True, faults={f"{kind}_rate": 0.4, "seed": 5})
    try:
        sh = Shard(tmp_path)
        timeout = 0.3 if kind == "hang" else 5
        st = sh.run(make_samples(40), url, max_attempts=12, request_timeout_s=timeout)
        server = stats_of(url)
    finally:
        stop()
    recs = read_jsonl(sh.out)
    assert len(recs) == 40 and st.failed == 0
    assert st.retried_requests == sum(r["attempts"] - 1 for r in recs) > 0
    for r in recs:
        assert server["received_by_id"][r["id"]] == r["attempts"]
        assert server["completed"][r["id"]] == 1


def test_no_retry_on_client_error(tmp_path: Path) -> None:
    url, stop = start_simulated_server(inline=True, faults={"bad_request_for": ["s1", "s2"]})
    try:
        sh = Shard(tmp_path)
        st = sh.run(make_samples(10), url)
        server = stats_of(url)
    finally:
        stop()
    failed = read_jsonl(sh.failed)
    assert sorted(f["id"] for f in failed) == ["s1", "s2"] and st.failed == 2 and st.completed == 8
    for f in failed:
        assert f["reason"].startswith("client_error: HTTP 400: Invalid request") and f["attempts"] == 1
        assert server["received_by_id"][f["id"]] == 1


def test_poison_sample_is_journaled_as_failure(tmp_path: Path) -> None:
    # one sample that always gets a 500 is a per-sample failure, not a dead server
    url, stop = start_simulated_server(inline=True, faults={"error_for": ["s3"]})
    try:
        sh = Shard(tmp_path)
        st = sh.run(make_samples(30), url, max_attempts=3)
        server = stats_of(url)
    finally:
        stop()
    assert (st.completed, st.failed) == (29, 1)
    [failed] = read_jsonl(sh.failed)
    assert failed["id"] == "s3" and failed["reason"] == "server_error" and failed["attempts"] == 3
    assert "HTTP 500" in failed["error"] and server["received_by_id"]["s3"] == 3


def test_server_down_raises_and_writes_no_outputs(tmp_path: Path) -> None:
    sh = Shard(tmp_path)
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ShardFailedError, match="server level"):
        sh.run(make_samples(20), url, max_attempts=2, concurrency=4)
    assert not sh.out.exists() and not sh.failed.exists()
    assert sh.journal.read_bytes() == b""  # held failures are not journaled: a rerun retries them


def test_crash_midway_then_resume_never_resends_finished(tmp_path: Path) -> None:
    samples = make_samples(120)
    sh = Shard(tmp_path)
    url, stop = start_simulated_server(inline=True, faults={"crash_after": 50})
    try:
        with pytest.raises(ShardFailedError):
            sh.run(samples, url, max_attempts=2, concurrency=8)
        first = stats_of_dead = None  # the server is gone; its counts are not readable
        del first, stats_of_dead
    finally:
        stop()
    journaled = {e["id"] for e in read_jsonl(sh.journal)}
    assert 40 <= len(journaled) <= 50
    assert not sh.out.exists()
    url2, stop2 = start_simulated_server(inline=True)
    try:
        st = sh.run(samples, url2, concurrency=8)
        server = stats_of(url2)
    finally:
        stop2()
    assert st.skipped_resumed == len(journaled) and st.completed == 120 - len(journaled)
    assert not journaled & set(server["received_by_id"])
    assert sorted(r["id"] for r in read_jsonl(sh.out)) == sorted(s.id for s in samples)


def test_resume_after_abrupt_cancel(tmp_path: Path) -> None:
    samples = make_samples(60)
    sh = Shard(tmp_path)
    url, stop = start_simulated_server(
        token_rate=2000,
        mean_answer_tokens=20,
        mean_reasoning_tokens=20,
        long_fraction=0.0,
        max_running_requests=8,
    )
    try:

        async def part() -> None:
            task = asyncio.create_task(
                generate_shard_async(
                    ShardJob(
                        samples,
                        sh.journal,
                        sh.out,
                        sh.failed,
                        GenerateConfig.from_dict({**FAST, "concurrency": 8}),
                        Endpoint(url, "gpu0"),
                        "00000",
                        ProgressOptions(),
                    )
                )
            )
            while not sh.journal.exists() or sh.journal.read_bytes().count(b"\n") < 15:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(part())
        after_kill = {e["id"] for e in read_jsonl(sh.journal)}
        assert 15 <= len(after_kill) < 60 and not sh.out.exists()
        st = sh.run(samples, url, concurrency=8)
        server = stats_of(url)
    finally:
        stop()
    assert st.skipped_resumed == len(after_kill)
    for sid in after_kill:
        assert server["completed"][sid] == 1 and server["received_by_id"][sid] == 1
    out = read_jsonl(sh.out)
    assert len(out) == 60 and len({r["id"] for r in out}) == 60


def test_torn_journal_line_is_redone(sim: str, tmp_path: Path) -> None:
    sh = Shard(tmp_path)
    sh.run(make_samples(5), sim)
    data = sh.journal.read_bytes()
    sh.journal.write_bytes(data[: len(data) - 30])  # tear the last line
    torn_id = orjson.loads(data.splitlines()[-1])["id"]
    st = sh.run(make_samples(5), sim)
    assert st.skipped_resumed == 4 and st.completed == 1
    assert [r["id"] for r in read_jsonl(sh.out)].count(torn_id) == 1 and len(read_jsonl(sh.out)) == 5


def test_multi_turn_modes(sim: str, tmp_path: Path) -> None:
    conv = (
        Message("system", "sys"),
        Message("user", "u1"),
        Message("assistant", "a1"),
        Message("user", "u2"),
        Message("assistant", "a2"),
        Message("user", "u3"),
        Message("assistant", "a3"),
        Message("user", "trailing"),
    )
    # the trailing user turn is answered (issue 14: never dropped); without it, a3 is regenerated
    assert prompt_for_last(conv) == [{"role": m.role, "content": m.content} for m in conv]
    assert prompt_for_last(conv[:7]) == [{"role": m.role, "content": m.content} for m in conv[:6]]
    assert prompt_for_last(conv[:2]) == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "u1"},
    ]
    assert [len(s) for s in turn_prefixes(conv)] == [2, 1, 1, 1]
    sh = Shard(tmp_path)
    sh.run([Sample("c1", conv), Sample("c2", conv[:2])], sim, regenerate="all")
    recs = {r["id"]: r for r in read_jsonl(sh.out)}
    r = recs["c1"]
    jsonschema.validate(r, SCHEMA)
    assert len(r["turns"]) == 4 and r["attempts"] == 4
    roles = [m["role"] for m in r["messages"]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user", "assistant", "user"]
    assert r["messages"][2]["content"] == r["turns"][0]["content"] != "a1"
    assert r["messages"][2]["reasoning_content"] == r["turns"][0]["reasoning_content"]
    assert r["messages"][4]["content"] == r["turns"][1]["content"]
    assert r["messages"][6]["content"] == r["turns"][2]["content"]
    assert r["messages"][-1]["content"] == "trailing" and r["content"] == r["turns"][3]["content"]
    assert len(recs["c2"]["turns"]) == 1


@pytest.mark.parametrize(
    ("known", "expected"),
    [
        ({}, 4),  # the effective cap of 3 running, plus ceil(3 x queue_headroom 0.25) waiting in its queue
        # a plan's client concurrency of 2 under the cap (the KV filled at the expected context): kept as it
        # is, as the server would run a third past the decode graphs planned for 2
        ({"max_running_requests": 2, "server_running_cap": 3, "version": "0.5.17", "numerics": {}}, 2),
    ],
    ids=["server-cap", "planned-fill"],
)
def test_concurrency_from_server_info(tmp_path: Path, known: dict[str, Any], expected: int) -> None:
    url, stop = start_simulated_server(
        max_running_requests=64, effective_max_running_requests=3, token_rate=1000, long_fraction=0.0
    )
    peak = 0
    try:

        async def go() -> None:
            nonlocal peak
            task = asyncio.create_task(
                generate_shard_async(
                    ShardJob(
                        make_samples(12),
                        tmp_path / "j.jsonl",
                        tmp_path / "o.jsonl",
                        tmp_path / "f.jsonl",
                        GenerateConfig.from_dict(FAST),
                        Endpoint(url, "gpu0", **known),
                        "00000",
                        ProgressOptions(),
                    )
                )
            )
            while not task.done():
                async with aiohttp.ClientSession() as s, s.get(url + "/_sim/stats") as r:
                    st = orjson.loads(await r.read())
                peak = max(peak, st["running"] + st["queued"])
                await asyncio.sleep(0.01)
            await task

        asyncio.run(go())
    finally:
        stop()
    assert peak == expected


def test_ids_are_data_not_header_syntax(sim: str, tmp_path: Path) -> None:
    """An id with a newline (or any character) travels percent-encoded; its shard completes (issue 14)."""
    odd = ["line\nbreak", "cr\r\nlf: injected", "ünï code", "sp ace;%20"]
    samples = [Sample(i, (Message("user", f"q {k}"),)) for k, i in enumerate(odd)]
    sh = Shard(tmp_path)
    stats = sh.run(samples, sim)
    assert (stats.completed, stats.failed) == (4, 0)
    assert sorted(r["id"] for r in read_jsonl(sh.out)) == sorted(odd)
    assert set(stats_of(sim)["completed"]) == set(odd)  # the server decoded the very same ids


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
}


def test_tool_calls_and_tools_reach_the_server_and_the_record(sim: str, tmp_path: Path) -> None:
    conv = (
        Message("user", "Weather in Oslo?"),
        Message("assistant", "", tool_calls=(CALL,)),
        Message("tool", '{"temp_c": 3}', tool_call_id="call_1"),
        Message("assistant", "3 degrees."),
    )
    sh = Shard(tmp_path)
    sh.run([Sample("t1", conv, tools=tuple(TOOLS)), Sample("t2", conv[:3])], sim)
    recs = {r["id"]: r for r in read_jsonl(sh.out)}
    for r in recs.values():
        jsonschema.validate(r, SCHEMA)
        assert r["messages"] == [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "content": '{"temp_c": 3}', "tool_call_id": "call_1"},
        ]
    assert recs["t1"]["tools"] == TOOLS and "tools" not in recs["t2"]


@pytest.mark.parametrize("ids", [[1, True], [3, -1], [1.0], "12", {"a": 1}])
def test_bad_token_ids_are_a_malformed_answer(ids: Any) -> None:
    """Token ids that are not a list of non-negative integers (a bool is not one) make the answer
    malformed (retried), never a record; an empty list and a long valid one are kept as they are."""
    from regen.generate.request import RequestError, parse_answer

    def answer(completion_ids: Any) -> bytes:
        choice = {"message": {"content": "x"}, "finish_reason": "stop", "response_token_ids": completion_ids,
                  "prompt_token_ids": [0, 5]}  # fmt: skip
        return orjson.dumps({"choices": [choice], "usage": {"completion_tokens": 1}})

    bad = r"malformed_response: ValueError: choices\[0\]\.response_token_ids"
    with pytest.raises(RequestError, match=bad):
        parse_answer(answer(ids), 0.0, 0.1, 16)
    assert parse_answer(answer([]), 0.0, 0.1, 16).completion_token_ids == []
    long = list(range(5000))
    assert parse_answer(answer(long), 0.0, 0.1, 16).completion_token_ids == long
