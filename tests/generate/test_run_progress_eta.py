"""The run's ETA says nothing it does not know: no 'in 0s' with half the samples left."""

from __future__ import annotations

from regen.generate.run_progress import fmt_eta, run_totals, summary_line
from regen.records import ShardStatus

NOW = 1_000_000.0


def status(shard: str, done: int, total: int, *, finished: bool, req_s: float, age_s: float) -> ShardStatus:
    return ShardStatus(shard=shard, server_id="gpu0", server_url=None, done=done, total=total, failed=0,
                       truncated=0, req_s=req_s, out_tok_s=1000.0, eta_s=None, updated_at=NOW - age_s,
                       finished=finished)  # fmt: skip


def test_no_eta_that_should_already_have_passed() -> None:
    # shard 00000 finished fast (a simulated server) 5 s ago; 00001 has not started or its job was
    # stopped: at 600 req/s the rest would have taken 0.04 s, so the rate no longer says when it ends
    statuses = [status("00000", 25, 25, finished=True, req_s=600.0, age_s=5)]
    t = run_totals(statuses, {"00000": 25, "00001": 26}, set(), NOW)
    line = summary_line(t, NOW)
    assert "25/51 (49.0%)" in line and line.endswith("ETA ?"), line
    running = [*statuses, status("00001", 1, 26, finished=False, req_s=600.0, age_s=0.0)]
    t = run_totals(running, {"00000": 25, "00001": 26}, set(), NOW)
    assert "(in 0s)" not in summary_line(t, NOW) and "(in <1s)" in summary_line(t, NOW)


def test_an_eta_under_half_a_second_is_not_zero() -> None:
    assert fmt_eta(0.3, NOW).endswith("(in <1s)")
    assert fmt_eta(0.0, NOW).endswith("(in 0s)")
