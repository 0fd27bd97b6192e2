"""The report's plots (matplotlib, SVG): token lengths, finish and quarantine reasons, throughput per
server, the trainer window; and the streamed readers they draw from. A plot with no data says so."""

from __future__ import annotations

import math
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pyarrow.parquet as pq

from regen.io import atomic_path, read_json
from regen.observe.run_numbers import iter_jsonl, quarantine_reason_counts

# ---------------------------------------------------------------------------------------------
# Readers
# ---------------------------------------------------------------------------------------------


def read_dataset_columns(dataset_dir: str | os.PathLike[str], columns: list[str]) -> dict[str, np.ndarray]:
    """Selected numeric/string columns of the merged dataset (token counts are small per row)."""
    parts = sorted(Path(dataset_dir).glob("part-*.parquet"))
    out: dict[str, list[Any]] = {c: [] for c in columns}
    for part in parts:
        for batch in pq.ParquetFile(part).iter_batches(columns=columns, batch_size=65536):
            for c in columns:
                out[c].extend(batch.column(c).to_pylist())
    return {c: np.array(v, dtype=object) for c, v in out.items()}


def throughput_series(
    records: Iterable[Path], bucket_s: float | None = None
) -> tuple[float, dict[str, np.ndarray]]:
    """Output tokens/s per server per time bucket, from the generation records (one file per shard).

    A record's completion tokens are spread evenly over its request (``started_at`` to
    ``started_at + latency_s``). Returns ``(bucket_s, {server_id: tokens_per_s array})``;
    bucket 0 starts at the earliest request. The bucket (None: :func:`bucket_for`) suits the run's
    length, whatever it is.
    """
    spans: list[tuple[str, float, float, int]] = []
    for path in records:
        for rec in iter_jsonl(path):
            try:
                server = str(rec["server"]["id"])
                start = float(rec["timings"]["started_at"])
                latency = max(float(rec["timings"]["latency_s"]), 0.0)
                tokens = int(rec["usage"]["completion_tokens"])
            except (KeyError, TypeError, ValueError):
                continue
            spans.append((server, start, start + latency, tokens))
    if not spans:
        return (bucket_s or 1.0), {}
    t0 = min(s[1] for s in spans)
    t1 = max(s[2] for s in spans)
    if bucket_s is None:
        bucket_s = bucket_for(t1 - t0)
    n = max(math.ceil((t1 - t0) / bucket_s), 1)
    series: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(n))
    for server, start, end, tokens in spans:
        arr = series[server]
        a, b = (start - t0) / bucket_s, (end - t0) / bucket_s
        if b - a < 1e-12:
            arr[min(int(a), n - 1)] += tokens
            continue
        rate = tokens / (b - a)  # tokens per bucket-width unit
        for k in range(int(a), min(math.ceil(b), n)):
            overlap = min(b, k + 1) - max(a, k)
            if overlap > 0:
                arr[k] += rate * overlap
    return bucket_s, {k: v / bucket_s for k, v in sorted(series.items())}


#: buckets across a run's generation in the throughput plot, at most
THROUGHPUT_BUCKETS = 60


def bucket_for(span_s: float) -> float:
    """The throughput plot's time bucket for a generation of ``span_s`` seconds: a sixtieth of it, whatever
    its length (a 3.5 s demo: 0.06 s, where a one-second floor left each server's burst of shards one or
    two points that no line joins; ten hours: 10 min). A server with a request in flight throughout a
    bucket has tokens in it, so a busy stretch is a joined line and only idle time is a gap."""
    return max(span_s / THROUGHPUT_BUCKETS, 1e-3)


def time_axis(span_s: float) -> tuple[float, str]:
    """(seconds per unit, unit name) for a time axis of ``span_s`` seconds: seconds, minutes or hours."""
    if span_s < 180:
        return 1.0, "seconds"
    if span_s < 3 * 3600:
        return 60.0, "minutes"
    return 3600.0, "hours"


def _seconds(value: float) -> str:
    """A bucket width in words: ``0.35 s``, ``12 s``, ``5 min``."""
    if value < 60:
        return f"{value:.2g} s" if value < 10 else f"{value:.0f} s"
    return f"{value / 60:.3g} min" if value < 3600 else f"{value / 3600:.3g} h"


# ---------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------


def _save(fig: Any, path: Path) -> None:
    fmt = path.suffix.lstrip(".") or "svg"
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=fmt, bbox_inches="tight")
    plt.close(fig)


def _no_data(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, f"no data: {what}", ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def plot_token_lengths(dataset_dir: str | os.PathLike[str], path: Path) -> None:
    """Histograms of prompt, reasoning and answer tokens per output row."""
    cols = read_dataset_columns(dataset_dir, ["prompt_tokens", "completion_tokens", "reasoning_tokens"])
    prompt = np.array([x for x in cols["prompt_tokens"] if x is not None], dtype=float)
    reasoning = np.array([x for x in cols["reasoning_tokens"] if x is not None], dtype=float)
    answer = np.array(
        [c - (r or 0) for c, r in zip(cols["completion_tokens"], cols["reasoning_tokens"], strict=True)],
        dtype=float,
    )
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, values, title in zip(
        axes, (prompt, reasoning, answer), ("prompt", "reasoning", "answer"), strict=True
    ):
        if len(values):
            ax.hist(values, bins=min(50, max(len(np.unique(values)), 1)), color="#4477aa")
            ax.set_title(f"{title} tokens (n={len(values)}, median={np.median(values):.0f})")
            ax.set_xlabel("tokens")
            ax.set_ylabel("rows")
        else:
            _no_data(ax, f"{title} tokens")
    _save(fig, path)


def _bar(counts: Mapping[str, int], title: str, path: Path, xlabel: str) -> None:
    fig, ax = plt.subplots(figsize=(7, max(2.0, 0.4 * len(counts) + 1)))
    if counts:
        items = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        ax.barh([k for k, _ in items][::-1], [v for _, v in items][::-1], color="#cc6677")
        ax.set_xlabel(xlabel)
        for i, (_, v) in enumerate(items[::-1]):
            ax.text(v, i, f" {v}", va="center")
    else:
        _no_data(ax, title)
    ax.set_title(title)
    _save(fig, path)


def plot_trainer_window(reaudit_summary: str | os.PathLike[str], path: Path) -> None:
    """Per trainer window: the share of rows that fit and of supervised tokens kept, and the rows cut
    inside their think block (the re-audit's ``trainer_window``); the configured window marked."""
    summary = read_json(reaudit_summary) if Path(reaudit_summary).is_file() else {}
    cov = summary.get("trainer_window") or {}
    windows = cov.get("windows") or {}
    fig, ax = plt.subplots(figsize=(8, 3.8))
    if not windows or not cov.get("rows"):
        _no_data(ax, "trainer window coverage (re-audit)")
        _save(fig, path)
        return
    names = sorted(windows, key=int)
    x = np.arange(len(names))
    fit = [100 * windows[w]["rows_fit"] for w in names]
    kept = [100 * windows[w]["supervised_kept"] for w in names]
    ax.bar(x - 0.2, fit, 0.4, color="#4477aa", label="rows that fit whole")
    ax.bar(x + 0.2, kept, 0.4, color="#228833", label="supervised tokens kept")
    for i, w in enumerate(names):
        ax.text(x[i] - 0.2, fit[i], f"{fit[i]:.0f}%", ha="center", va="bottom", fontsize=8)
        ax.text(x[i] + 0.2, kept[i], f"{kept[i]:.0f}%", ha="center", va="bottom", fontsize=8)
        cut = windows[w]["cut_in_think"]
        if cut:
            ax.text(x[i], 4, f"{cut} cut\nin think", ha="center", va="bottom", fontsize=7, color="white")
    configured = cov.get("configured")
    labels = [
        (f"{int(w) // 1024}k" if int(w) % 1024 == 0 else w) + (" (config)" if int(w) == configured else "")
        for w in names
    ]
    ax.set_xticks(x, labels)
    ax.set_ylim(0, 112)
    ax.set_ylabel("% of token rows / supervised tokens")
    ax.set_xlabel("trainer window (tokens)")
    ax.set_title(f"what survives the trainer's window ({cov['rows']} token rows)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=8)
    _save(fig, path)


def plot_finish_reasons(dataset_dir: str | os.PathLike[str], path: Path) -> Counter[str]:
    cols = read_dataset_columns(dataset_dir, ["finish_reason"])
    counts = Counter(str(x) for x in cols["finish_reason"])
    _bar(counts, "finish reasons (output rows)", path, "rows")
    return counts


def plot_quarantine_reasons(quarantine: Iterable[Path], path: Path) -> Counter[str]:
    counts = quarantine_reason_counts(quarantine)
    _bar(counts, "quarantine reasons", path, "records")
    return counts


def idle_as_gaps(values: np.ndarray) -> np.ndarray:
    """A server's tokens/s with the buckets in which no request of it was in flight (between shards,
    before its first and after its last) as gaps (NaN) rather than a drop to 0 tokens/s."""
    return np.where(values > 0, values, np.nan)


def plot_throughput(records: Iterable[Path], path: Path) -> dict[str, np.ndarray]:
    """Output tokens/s per server over the run, in buckets suited to its length (:func:`bucket_for`) and a
    time axis in seconds, minutes or hours; each bucket marked as well as joined, so that a lone busy bucket
    still shows."""
    bucket_s, series = throughput_series(records)
    fig, ax = plt.subplots(figsize=(9, 3.8))
    if series:
        span = bucket_s * max(len(v) for v in series.values())
        per_unit, unit = time_axis(span)
        for server, values in series.items():
            x = (np.arange(len(values)) + 0.5) * bucket_s / per_unit
            ax.plot(x, idle_as_gaps(values), label=server, marker="o", markersize=3, linewidth=1.5)
        ax.set_xlim(0, span / per_unit)
        ax.set_ylim(bottom=0)
        ax.set_xlabel(f"{unit} since first request")
        ax.set_ylabel("output tokens/s")
        ax.legend(loc="best", fontsize="small")
        ax.set_title(
            f"generation throughput per server ({_seconds(bucket_s)} buckets; a gap: no request in flight)"
        )
    else:
        _no_data(ax, "generation records")
        ax.set_title("generation throughput per server")
    _save(fig, path)
    return series
