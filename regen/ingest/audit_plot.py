"""The audit's token histograms as SVG bar charts (matplotlib)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from regen.io import atomic_path

log = logging.getLogger(__name__)


def bucket_index(lo: int) -> int:
    """The power-of-two bucket a ``lo`` bound starts (``Log2Histogram``: bucket 0 holds 0, k holds
    [2^(k-1), 2^k))."""
    return int(lo).bit_length()


def contiguous_buckets(buckets: Sequence[Mapping[str, int]]) -> list[dict[str, int]]:
    """The summary's non-empty buckets with the empty ones between them put back (count 0), so a bar
    chart's axis is evenly spaced in powers of two and a gap in the data shows as a gap."""
    if not buckets:
        return []
    counts = {bucket_index(b["lo"]): int(b["count"]) for b in buckets}
    out = []
    for k in range(min(counts), max(counts) + 1):
        lo, hi = (0, 0) if k == 0 else (1 << (k - 1), (1 << k) - 1)
        out.append({"lo": lo, "hi": hi, "count": counts.get(k, 0)})
    return out


def plot_histogram(hist: Mapping[str, Any], title: str, path: Path) -> None:
    """One histogram of ``summary.json`` as an SVG bar chart, every bucket from the smallest to the largest
    value on the axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    buckets = contiguous_buckets(hist["buckets"])
    labels = [str(b["lo"]) if b["lo"] == b["hi"] else f"{b['lo']}-{b['hi']}" for b in buckets]
    fig, ax = plt.subplots(figsize=(8, 4))
    try:
        ax.bar(range(len(buckets)), [b["count"] for b in buckets], color="#4472c4")
        ax.set_xticks(range(len(buckets)), labels, rotation=45, ha="right", fontsize=8)
        ax.set_xlabel("tokens (power-of-two buckets)")
        ax.set_ylabel("samples")
        ax.set_title(f"{title} (n={hist['count']}, mean={hist['mean'] or 0:.1f})")
        fig.tight_layout()
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="svg")
    finally:
        plt.close(fig)
