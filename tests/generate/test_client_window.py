"""The client against one server slower than its plan (issue 48 item 1): thousands planned in flight, a
server that finishes few within the request timeout. The client's window shrinks on the timeouts, the
timed-out requests that only waited behind the client's own excess are sent again without using an
attempt (here ``max_attempts: 1``: one counted failure would fail the sample), and every sample ends
with exactly one record; a server that answers nothing still fails the shard."""

from __future__ import annotations

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
