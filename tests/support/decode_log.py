"""SGLang 0.5.17 ``Decode batch`` log lines for tests that read a server log (regen.serving.metrics)."""

from __future__ import annotations

from collections.abc import Sequence

from regen.tune.closedloop import StepModel


def decode_line(running: int, tps: float, second: int) -> str:
    """One ``Decode batch`` line at ``running`` requests and ``tps`` gen throughput."""
    return (
        f"[2026-12-03 04:00:{second:02d}] Decode batch, #running-req: {running}, "
        f"#full token: {running * 600}, "
        f"full token usage: 0.20, cuda graph: True, gen throughput (token/s): {tps:.2f}, #queue-req: 0\n"
    )


def decode_log(line: StepModel, batches: Sequence[int]) -> str:
    """A server log decoding ``batches`` (one line each) on the step ``line``."""
    return "".join(decode_line(b, line.tokens_per_s(b), i) for i, b in enumerate(batches))
