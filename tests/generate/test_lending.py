"""Spill-over (issue #16): a generate job also fills other GPU slots' servers while they have room;
each sample still goes out once and lands in its own journal. Shard count ``auto``."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import socket
from collections import Counter
from pathlib import Path

import aiohttp
import orjson
import pytest

from regen.generate.client import ShardJob, ShardStats, generate_shard
from regen.generate.lending import SlotLenders
from regen.ingest.shard_count import settle_auto_count, shard_count
from regen.runconfig import GenerateConfig, ServerConfig
from regen.serving.lifecycle import acquire_server, stop_all_servers
from regen.simulated.options import REQUEST_LOG_ENV
from regen.simulated.requestlog import read_request_log
from regen.types import Message, Sample


def free_port_base(n: int) -> int:
    rng = random.Random()
    for _ in range(200):
        base = rng.randint(20000, 60000)
        ok = True
        for port in range(base, base + n):
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
        if ok:
            return base
    raise RuntimeError("no free ports")


def samples(n: int) -> list[Sample]:
    return [
        Sample(f"s{i:04d}", (Message("user", f"question {i}"), Message("assistant", f"old answer {i}")))
        for i in range(n)
    ]


@pytest.fixture
def two_slots(tmp_workdir: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(REQUEST_LOG_ENV, str(tmp_workdir / "requests.jsonl"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cfg = {
        "mode": "simulated",
        "gpus": 2,
        "port_base": free_port_base(2),
        "idle_timeout_s": 30,
        "startup_timeout_s": 20,
        "model_path": "demo-model",
        # slow enough that the own server is full while the job still has samples to send
        "simulated": {"max_running_requests": 4, "token_rate": 400, "startup_delay_s": 0.1},
    }
    yield cfg, tmp_workdir
    stop_all_servers("work/servers", grace_s=5)


def lent_shard(cfg: dict, root: Path, count: int, sampling: dict) -> tuple[ShardStats, list[dict], str]:
    """One shard of ``count`` samples on slot 1's server, slot 0's lent to it (its job sends nothing more:
    it drains, or waits for its next shard, so its server has room): the stats, the records and the lent
    server's id."""
    with (
        acquire_server(ServerConfig.from_mapping(cfg), None, owner_pid=os.getpid(), poll_s=0.05) as other,
        acquire_server(ServerConfig.from_mapping(cfg), None, owner_pid=os.getpid(), poll_s=0.05) as own,
    ):
        assert (other.server_id, own.server_id) == ("gpu0", "gpu1")
        assert (other.slot, own.slot) == (0, 1)
        lenders = SlotLenders("work/servers", own.slot, cap=4, poll_s=0.05)
        settings = {"sampling": sampling, "max_attempts": 2, "backoff_base_s": 0.01}
        paths = (root / "journal.jsonl", root / "records.jsonl", root / "failed.jsonl")
        try:
            job = ShardJob(samples(count), *paths, GenerateConfig.from_dict(settings), own, "00000")
            stats = generate_shard(dataclasses.replace(job, lenders=lenders))
        finally:
            lenders.close()
    records = [orjson.loads(line) for line in (root / "records.jsonl").read_bytes().splitlines()]
    return stats, records, other.server_id


def test_a_job_fills_another_slots_idle_server_and_sends_each_sample_once(two_slots) -> None:
    cfg, root = two_slots
    stats, records, _ = lent_shard(cfg, root, 60, {"max_tokens": 64})
    assert stats.completed == 60 and len({r["id"] for r in records}) == 60
    servers = Counter(r["server"]["id"] for r in records)
    assert set(servers) == {"gpu0", "gpu1"}, servers  # both GPUs worked on the one shard
    events = read_request_log(root / "requests.jsonl")
    received = Counter(e["id"] for e in events if e["event"] == "received" and e["id"])  # not probes
    assert set(received) == {f"s{i:04d}" for i in range(60)} and set(received.values()) == {1}


def test_lenders_offer_only_room_on_other_live_servers(two_slots) -> None:
    cfg, _ = two_slots
    with acquire_server(ServerConfig.from_mapping(cfg), None, owner_pid=os.getpid(), poll_s=0.05) as own:
        assert own.slot is not None
        lenders = SlotLenders("work/servers", own.slot, cap=4, poll_s=0.05)

        async def offers() -> list:
            async with aiohttp.ClientSession() as session:
                return await lenders.spare(session)

        try:
            assert asyncio.run(offers()) == []  # no other slot has a server yet
            with acquire_server(
                ServerConfig.from_mapping(cfg), None, owner_pid=os.getpid(), poll_s=0.05
            ) as other:
                ((lent, room),) = asyncio.run(offers())
                assert lent.server_id == other.server_id and lent.url == other.url
                assert room == 4  # idle: its whole batch, for the one job that may borrow it
        finally:
            lenders.close()


def test_auto_shard_count_is_one_per_gpu_slot_and_survives_a_gpu_count_change(tmp_path: Path) -> None:
    persisted = tmp_path / "work" / "plan" / "shards.json"
    assert shard_count(12, 7, persisted) == 12 and not persisted.exists()
    assert shard_count("auto", 7, persisted) == 7 and not persisted.exists()  # parsing writes nothing
    settle_auto_count("auto", 7, 7, on_cluster=False, dry_run=True, persisted=persisted)
    assert not persisted.exists()  # a preview settles nothing
    # a first run under a cluster executor is refused: the planner knows no GPU count there
    with pytest.raises(ValueError, match=r"on a cluster set shards\.count"):
        settle_auto_count("auto", 7, 7, on_cluster=True, dry_run=False, persisted=persisted)
    settle_auto_count("auto", 7, 7, on_cluster=False, dry_run=False, persisted=persisted)
    assert shard_count("auto", 3, persisted) == 7  # the shards (and journals) of the first run stay
    # once settled on one node, a cluster run keeps that count
    settle_auto_count("auto", 7, 3, on_cluster=True, dry_run=False, persisted=persisted)
    with pytest.raises(ValueError, match=r"on a cluster set shards\.count"):
        shard_count("auto", None, tmp_path / "elsewhere.json")  # no GPU slots known to the planner
    persisted.write_text('{"count": 0}')
    with pytest.raises(ValueError, match=r"shards\.json: field 'count'"):
        shard_count("auto", 3, persisted)


def test_a_draining_job_gives_its_slot_to_the_next_job_which_shares_the_server(two_slots) -> None:
    cfg, _ = two_slots
    cfg = {**cfg, "gpus": 1}
    releases: list = []
    with acquire_server(
        ServerConfig.from_mapping(cfg), None, owner_pid=os.getpid(), poll_s=0.05, on_slot=releases.append
    ) as first:
        releases[0]()  # every sample sent: only answers are awaited from here on
        releases[0]()  # idempotent
        with acquire_server(
            ServerConfig.from_mapping(cfg), None, owner_pid=os.getpid(), poll_s=0.05
        ) as second:
            assert (second.server_id, second.url) == (first.server_id, first.url)


@pytest.mark.parametrize("n", [3, 4])
def test_a_sample_pulled_for_a_lent_server_is_prefilled_there(two_slots, n: int) -> None:
    """n completions a prompt: a sample first pulled for another slot's server has its prompt prefilled on
    that server, and its completions go there and read it from that server's radix cache (before, the
    prefill went to the own server, whose workers and the lender split a sample's completions, and every
    lent completion computed its prompt again). At n = 3 the lender's room (4) splits samples: the rest go
    there at its next room."""
    cfg, root = two_slots
    stats, records, lender_id = lent_shard(cfg, root, 40, {"max_tokens": 64, "n": n})
    assert stats.completed == 40 * n and len({r["id"] for r in records}) == 40 * n
    served_by = {r["id"]: r["server"]["id"] for r in records}
    events = read_request_log(root / "requests.jsonl")
    done = [e for e in events if e["event"] == "completed" and e["id"] in served_by]
    lent = [e["cached"] for e in done if served_by[e["id"]] == lender_id]
    assert len(lent) >= 8, "the other slot's server answered too few to tell"
    # every completion found its prompt in the cache of the server it went to, but for what a lent server
    # left unsent when the samples ran out (fewer than n), which the own server sends at once
    assert sum(1 for e in done if e["cached"] == 0) < n, [e["cached"] for e in done]
    # the prefill requests (no sample id) went where their samples went: some to each server
    prefills = Counter(e["pid"] for e in events if e["event"] == "completed" and e["id"] is None)
    assert len(prefills) == 2, prefills
