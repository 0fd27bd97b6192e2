"""The client against one server slower than its plan (issue 48 item 1): thousands planned in flight, a
server that finishes few within the request timeout. The client's window shrinks on the timeouts, the
timed-out requests that only waited behind the client's own excess are sent again without using an
attempt (here ``max_attempts: 1``: one counted failure would fail the sample), and every sample ends
with exactly one record; a server that answers nothing still fails the shard."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import orjson
import pytest

from regen.generate.client import Endpoint, GenerateConfig, ShardFailedError, ShardJob, generate_shard
from regen.simulated.launcher import start_simulated_server
from regen.types import Message, Sample


def samples(n: int) -> list[Sample]:
    return [
        Sample(f"s{i}", (Message("user", f"question {i}"), Message("assistant", "old"))) for i in range(n)
    ]


def job(tmp_path: Path, url: str, n: int, **cfg: object) -> ShardJob:
    config = {"backoff_base_s": 0.001, "sampling": {"max_tokens": 8}, **cfg}
    root = tmp_path / "run"
    return ShardJob(
        samples(n),
        root / "journal.jsonl",
        root / "out.jsonl",
        root / "failed.jsonl",
        GenerateConfig.from_dict(config),
        Endpoint(url, "gpu0", max_running_requests=4),
        "00000",
    )


def test_a_plan_far_above_the_server_shrinks_the_window_and_fails_no_sample(tmp_path: Path) -> None:
    # 4 running, 8 tokens at 40 tok/s: 0.2 s a request, 20 a second; 300 sent at once need 15 s
    url, stop = start_simulated_server(max_running_requests=4, token_rate=40, disconnect_check_s=0.2)
    try:
        stats = generate_shard(
            job(tmp_path, url, 120, request_timeout_s=1.0, max_attempts=1, concurrency=300)
        )
    finally:
        stop()
    assert stats.completed == 120 and stats.failed == 0
    lines = [orjson.loads(x) for x in (tmp_path / "run" / "out.jsonl").read_bytes().splitlines()]
    assert sorted(r["id"] for r in lines) == sorted(f"s{i}" for i in range(120))
    assert stats.retried_requests > 0  # timeouts behind the excess, sent again without an attempt


def test_a_server_that_answers_nothing_still_fails_the_shard(tmp_path: Path) -> None:
    url, stop = start_simulated_server(max_running_requests=4, faults={"hang_rate": 1.0})
    try:
        with pytest.raises(ShardFailedError, match="server level"):
            generate_shard(job(tmp_path, url, 40, request_timeout_s=0.3, max_attempts=2, concurrency=300))
    finally:
        stop()


def peak_in_flight(log_file: Path) -> int:
    """The most requests the server held at once (running plus queued), from its decode lines."""
    peak = 0
    for line in log_file.read_text().splitlines():
        if m := re.search(r"#running-req: (\d+),.*#queue-req: (\d+)", line):
            peak = max(peak, int(m[1]) + int(m[2]))
    return peak


@pytest.mark.parametrize(("n", "offered"), [(40, 40), (100, 8)])
def test_a_shard_that_fits_under_the_servers_cap_is_offered_whole(
    tmp_path: Path, n: int, offered: int
) -> None:
    # the plan runs 8 on a server whose own cap is 64 (the client keeps 8 in flight: no queue headroom under
    # the cap, the server would run them past the plan's decode graphs): 40 samples fit under the cap and are
    # all sent at once (SGLang's scheduler admits by free KV, as its offline engine does); 100 do not, and
    # the plan's 8 hold. Each answer takes ~0.5 s, so every
    # request sent at once is seen running together.
    log_file = tmp_path / "server.log"
    url, stop = start_simulated_server(
        max_running_requests=64, token_rate=16, log_interval_s=0.05, log_file=str(log_file)
    )
    try:
        shard = job(tmp_path, url, n)
        shard = dataclasses.replace(
            shard, endpoint=Endpoint(url, "gpu0", max_running_requests=8, server_running_cap=64)
        )
        stats = generate_shard(shard)
    finally:
        stop()
    assert stats.completed == n and stats.failed == 0
    assert peak_in_flight(log_file) == offered
