"""The benches' one steady-window rule (bench.gpu.serverlog.steady_window, issue 57 item 3): the KV in
use moved less than 5% of itself, not of the pool, and the running count is flat."""

from __future__ import annotations

from pathlib import Path

from bench.gpu.serverlog import decode_lines, steady_count, steady_window, window_ends

LOG = Path(__file__).parents[1] / "data" / "sglang" / "decode-0.5.17-h200-bf16-512.log"


def _line(running: int, tokens: int) -> str:
    return (
        f"[2026-12-05 10:00:00] Decode batch, #running-req: {running}, #token: {tokens}, token usage: 0.30, "
        f"cuda graph: True, gen throughput (token/s): 9000.00, #queue-req: 0\n"
    )


def test_a_real_ramp_is_not_steady_though_its_running_count_is_flat() -> None:
    lines = decode_lines(LOG.read_text())
    ends = window_ends(lines)
    assert ends["log_running_first"] == ends["log_running_last"] == 512
    assert not steady_window(ends)  # every request decoding from the start: the KV climbs each line
    # its last lines alone, where the rise is a small share of what is held, still move more than 5%
    assert not steady_window(window_ends(lines[-6:]))


def test_the_share_is_of_the_kv_in_use_not_of_the_pool() -> None:
    # 1.0M -> 1.09M in use: 9% of itself, 2.25% of a 4M pool (issue 57's windows called steady)
    rising = decode_lines("".join(_line(1024, t) for t in (1_000_000, 1_000_000, 1_000_000, 1_090_000,
                                                           1_090_000, 1_090_000)))  # fmt: skip
    flat = decode_lines("".join(_line(1024, t) for t in (1_000_000, 1_010_000, 1_020_000, 1_030_000)))
    dipped = decode_lines("".join(_line(r, 1_000_000) for r in (1024, 1024, 1024, 900, 900, 900)))
    assert not steady_window(window_ends(rising))
    assert steady_window(window_ends(flat))
    assert not steady_window(window_ends(dipped))  # the running count fell 12%: a retraction or a drain
    assert not steady_window(window_ends([])) and not steady_window({"log_tokens_first": 5})
    assert steady_count([window_ends(rising), window_ends(flat), window_ends(dipped)]) == "1/3"
