"""The audit's histogram plot (regen.ingest.audit_plot): the axis keeps the empty buckets between values."""

from __future__ import annotations

from pathlib import Path

import pytest

from regen.ingest.audit_plot import contiguous_buckets, plot_histogram
from regen.ingest.audit_summary import Log2Histogram


def test_empty_buckets_between_values_are_on_the_axis(tmp_path: Path) -> None:
    hist = Log2Histogram()
    for value in (0, 3, 100, 100):
        hist.add(value)
    summary = hist.to_json()
    assert len(summary["buckets"]) == 3  # summary.json keeps only the non-empty ones
    axis = contiguous_buckets(summary["buckets"])
    assert [(b["lo"], b["hi"]) for b in axis] == [
        (0, 0), (1, 1), (2, 3), (4, 7), (8, 15), (16, 31), (32, 63), (64, 127)
    ]  # fmt: skip
    assert [b["count"] for b in axis] == [1, 0, 1, 0, 0, 0, 0, 2]
    out = tmp_path / "h.svg"
    plot_histogram(summary, "prompt tokens", out)
    # figure, axes and four spines are patches too: 6 + one bar per bucket, the empty ones included
    assert out.read_text().count('id="patch_') == 6 + len(axis)


def test_no_values_gives_an_empty_axis() -> None:
    assert contiguous_buckets([]) == []


def test_the_histogram_keeps_the_exact_mean_and_std() -> None:
    """The tuner plans the running set's context from the old answers' mean and spread (std / mean)."""
    import statistics

    values = [0, 1, 7, 300, 1200, 1201, 8192, 40_000]
    hist = Log2Histogram()
    for v in values:
        hist.add(v)
    out = hist.to_json()
    assert out["mean"] == statistics.fmean(values)
    assert out["std"] == pytest.approx(statistics.pstdev(values), rel=1e-12)
    assert Log2Histogram().to_json()["std"] is None
