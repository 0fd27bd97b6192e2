"""drain_token_share (bench.gpu.serverlog) on decode lines the test writes, the virtual server's
SGLang-cadenced decode lines, and bench/tail.py: longest-first shortens the tail of a log-normal workload."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench import tail
from bench.gpu.serverlog import decode_lines, drain_token_share, generation_phases, line_tokens
from bench.sim_virtual import FluidBatch, VirtualTime


def line(running: int, accept: float | None = None) -> str:
    """A ``Decode batch`` line as SGLang 0.5.17 prints it (speculative: with ``accept len``)."""
    spec = f"accept len: {accept:.2f}, accept rate: 0.50, " if accept is not None else ""
    return (
        f"[2026-12-01 05:30:00 TP0] Decode batch, #running-req: {running}, #full token: {running * 100}, "
        f"full token usage: 0.10, mamba num: {running}, mamba usage: 0.10, {spec}cuda graph: True, "
        f"gen throughput (token/s): 1000.00, #queue-req: 0"
    )


def test_drain_token_share_weighs_each_line_by_its_running_requests_and_accept_length() -> None:
    # the full batch is 100: a ramp line at 50, three lines at 100 and 95 (>= 90), a drain at 89 and 10
    text = "\n".join(line(r) for r in (50, 100, 100, 95, 89, 10))
    lines = decode_lines(text)
    assert [line_tokens(x) for x in lines] == [50, 100, 100, 95, 89, 10]
    assert drain_token_share(lines) == pytest.approx((50 + 89 + 10) / 444)
    assert drain_token_share(decode_lines("\n".join(line(r) for r in (64, 64, 60)))) == 0.0
    assert drain_token_share([]) == 0.0
    # speculative decoding: a line's tokens are running x accept len
    spec = decode_lines("\n".join([line(100, 3.0), line(20, 1.5)]))
    assert drain_token_share(spec) == pytest.approx(30 / 330)
    assert drain_token_share(spec, below=0.1) == 0.0


def test_virtual_batch_logs_every_n_steps_and_its_lines_hold_every_token() -> None:
    clock = VirtualTime(speed=1.0, epoch=0.0, step_ms=10.0, step_ms_per_running=5.0, decode_log_steps=10)
    got: list[tuple[int, float, float]] = []
    loop = asyncio.new_event_loop()
    try:
        batch = FluidBatch(clock, cap=2, on_line=lambda *a: got.append(a))
        batch.at = batch.line_at = 0.0
        futures = [loop.create_future() for _ in range(3)]
        for tokens, fut in zip((100, 200, 50), futures, strict=True):
            batch.arrive(tokens, fut)
        batch.advance(100.0)
        assert all(f.done() for f in futures)
    finally:
        loop.close()
    # 200 steps in all (a and c beside b for 150, b alone for 50): a line every 10 steps
    assert len(got) == 20
    assert [r for r, _, _ in got] == [2] * 15 + [1] * 5
    assert sum(t for _, t, _ in got) == pytest.approx(350)  # every request's tokens, once
    assert [s for _, _, s in got[:15]] == pytest.approx([0.2] * 15)  # 10 steps of 20 ms
    assert [s for _, _, s in got[15:]] == pytest.approx([0.15] * 5)  # 10 steps of 15 ms


def test_longest_first_lowers_the_drain_share_and_the_wall(tmp_path: Path) -> None:
    runs = tail.measure(tmp_path, requests=96, cap=12, speed=20.0, length_mean=300.0, sigma=1.0,
                        length_cap=2048, noise=0.5)  # fmt: skip
    d, s = runs["dataset_order"], runs["longest_first"]
    assert d.decode_lines > 20 and s.decode_lines > 20
    assert s.drain_share < d.drain_share
    assert s.wall_s < d.wall_s
    out = tail.tail_line(96, runs)
    keys = [kv.split("=")[0] for kv in out.removeprefix("tail: ").split()]
    assert keys == ["requests", "drain_share_dataset_order", "drain_share_longest_first",
                    "wall_dataset_order_s", "wall_longest_first_s", "ratio"]  # fmt: skip


def test_generation_phases_carry_the_drain_token_share() -> None:
    """where_time_went's table reads it from the one function (the shipped regen log: 19.5%)."""
    from bench.gpu.where_time_went import read_logs

    text = read_logs(Path(__file__).resolve().parents[2] / "measurements/known-target-2026-12-01")["regen"]
    phases = generation_phases(text)
    assert phases is not None
    assert phases.drain_token_share == pytest.approx(0.1945, abs=0.001)
