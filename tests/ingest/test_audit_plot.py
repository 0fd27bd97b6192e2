"""The audit's histogram plot (regen.ingest.audit_plot): the axis keeps the empty buckets between values."""

from __future__ import annotations

from pathlib import Path

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
