"""Plots and tables for ``snakemake --report``.

``write_report_assets(results_dir, out_dir)`` writes the fixed file names in ``ASSET_NAMES``
(every one, always: a plot with no data says so) so the workflow can declare them as outputs.
Inputs are read streamed and only the columns/fields needed; missing inputs give "no data".
"""

from __future__ import annotations

import argparse
import html
import math
import os
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import orjson
import pyarrow.parquet as pq

from regen.io import atomic_open, atomic_path, read_json
from regen.layout import RunLayout

TOKEN_LENGTHS_SVG = "token_lengths.svg"
FINISH_REASONS_SVG = "finish_reasons.svg"
QUARANTINE_REASONS_SVG = "quarantine_reasons.svg"
THROUGHPUT_SVG = "throughput.svg"
RECONCILE_HTML = "reconcile.html"
SERVER_PLAN_HTML = "server_plan.html"
ASSET_NAMES = (
    TOKEN_LENGTHS_SVG,
    FINISH_REASONS_SVG,
    QUARANTINE_REASONS_SVG,
    THROUGHPUT_SVG,
    RECONCILE_HTML,
    SERVER_PLAN_HTML,
)


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


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Dict lines of a JSONL file; unparsable lines are skipped (they are reported elsewhere)."""
    with open(path, "rb") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                yield obj


def quarantine_reason_counts(quarantine_dir: str | os.PathLike[str]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for path in sorted(Path(quarantine_dir).glob("*.jsonl")):
        for obj in iter_jsonl(path):
            counts[str(obj.get("reason", "unknown"))] += 1
    return counts


def throughput_series(
    generations_dir: str | os.PathLike[str], bucket_s: float | None = None
) -> tuple[float, dict[str, np.ndarray]]:
    """Output tokens/s per server per time bucket, from the generation records.

    A record's completion tokens are spread evenly over its request (``started_at`` to
    ``started_at + latency_s``). Returns ``(bucket_s, {server_id: tokens_per_s array})``;
    bucket 0 starts at the earliest request.
    """
    spans: list[tuple[str, float, float, int]] = []
    for path in sorted(Path(generations_dir).glob("*.jsonl")):
        if path.name.endswith(".failed.jsonl"):
            continue
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
        bucket_s = max((t1 - t0) / 60.0, 1.0)
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


def plot_finish_reasons(dataset_dir: str | os.PathLike[str], path: Path) -> Counter[str]:
    cols = read_dataset_columns(dataset_dir, ["finish_reason"])
    counts = Counter(str(x) for x in cols["finish_reason"])
    _bar(counts, "finish reasons (output rows)", path, "rows")
    return counts


def plot_quarantine_reasons(quarantine_dir: str | os.PathLike[str], path: Path) -> Counter[str]:
    counts = quarantine_reason_counts(quarantine_dir)
    _bar(counts, "quarantine reasons", path, "records")
    return counts


def plot_throughput(generations_dir: str | os.PathLike[str], path: Path) -> dict[str, np.ndarray]:
    bucket_s, series = throughput_series(generations_dir)
    fig, ax = plt.subplots(figsize=(9, 3.8))
    if series:
        for server, values in series.items():
            x = (np.arange(len(values)) + 0.5) * bucket_s
            ax.plot(x, values, label=server)
        ax.set_xlabel("seconds since first request")
        ax.set_ylabel("output tokens/s")
        ax.legend(loc="best", fontsize="small")
        ax.set_title(f"generation throughput per server ({bucket_s:.0f} s buckets)")
    else:
        _no_data(ax, "generation records")
        ax.set_title("generation throughput per server")
    _save(fig, path)
    return series


# ---------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------


def _html_table(headers: list[str], rows: list[list[Any]], caption: str) -> str:
    esc = html.escape
    head = "".join(f"<th>{esc(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(_fmt(c))}</td>" for c in r) + "</tr>" for r in rows)
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><style>"
        "table{border-collapse:collapse;font-family:sans-serif}td,th{border:1px solid #999;padding:3px 8px}"
        f"</style></head><body><table><caption>{esc(caption)}</caption><thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table></body></html>\n"
    )


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict | list):
        return orjson.dumps(value).decode()
    return str(value)


def reconcile_table_html(reconcile_json: str | os.PathLike[str]) -> str:
    path = Path(reconcile_json)
    if not path.is_file():
        return _html_table(
            ["bucket", "count", "reasons"], [], "reconciliation: no data (reconcile.json missing)"
        )
    data = read_json(path)
    rows: list[list[Any]] = [["input", data.get("input"), ""]]
    for bucket, count in (data.get("counts") or {}).items():
        reasons = data.get("reasons", {}).get(bucket, {})
        rows.append([bucket, count, ", ".join(f"{k}={v}" for k, v in sorted(reasons.items()))])
    for key in ("lost", "duplicated", "unknown", "input_duplicates"):
        rows.append([key, data.get(f"{key}_count", 0), ""])
    verdict = "OK" if data.get("ok") else "FAILED"
    return _html_table(["bucket", "count", "reasons"], rows, f"reconciliation: {verdict}")


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: obj}


def server_plan_html(plan_json: str | os.PathLike[str], realized_paths: list[Path]) -> str:
    """Predicted (plan) vs realized (per-GPU) values, key by key; tolerant of any JSON shape."""
    plan_path = Path(plan_json)
    plan = _flatten(read_json(plan_path)) if plan_path.is_file() else {}
    realized = {p.name.split(".")[0]: _flatten(read_json(p)) for p in realized_paths if p.is_file()}
    keys = list(plan)
    for values in realized.values():
        keys += [k for k in values if k not in keys]
    headers = ["key", "predicted", *realized]
    rows = [[k, plan.get(k), *(r.get(k) for r in realized.values())] for k in keys]
    caption = (
        "server memory plan: predicted vs realized" if plan or realized else "server memory plan: no data"
    )
    return _html_table(headers, rows, caption)


PILOT_HEADERS = ["", "candidate", "args", "concurrency", "out tok/s", "req/s", "p50", "p90", "p99",
                 "truncated", "error"]  # fmt: skip


def pilot_tables_html(pilot_json: str | os.PathLike[str]) -> str:
    """Tables of ``regen tune --sweep`` (candidates, output lengths, projection); '' without a pilot."""
    path = Path(pilot_json)
    if not path.is_file():
        return ""
    esc = html.escape
    pilot = read_json(path)
    best = pilot.get("best_index")
    cand_rows = []
    for i, row in enumerate(pilot.get("candidates") or []):
        lengths = row.get("lengths") or {}
        cand_rows.append(
            ["best" if i == best else "", row.get("label"), " ".join(row.get("args") or []),
             row.get("concurrency"), row.get("out_tok_s"), row.get("req_s"), lengths.get("p50"),
             lengths.get("p90"), lengths.get("p99"), lengths.get("truncation_rate"), row.get("error")]
        )  # fmt: skip
    lengths = pilot.get("lengths") or {}
    proj = pilot.get("projection") or {}
    tables = [
        (PILOT_HEADERS, cand_rows, f"pilot sweep: {pilot.get('seconds_per_candidate')} s per candidate"),
        (["key", "value"], [[k, v] for k, v in lengths.items()], "pilot output lengths (completion tokens)"),
        (
            ["key", "value"],
            [[k, v] for k, v in proj.items()] + [["assumption", a] for a in pilot.get("assumptions") or []],
            "projection for the remaining samples",
        ),
    ]
    out = []
    for headers, rows, caption in tables:
        head = "".join(f"<th>{esc(str(h))}</th>" for h in headers)
        body = "".join("<tr>" + "".join(f"<td>{esc(_fmt(c))}</td>" for c in r) + "</tr>" for r in rows)
        out.append(f"<table><caption>{esc(caption)}</caption><thead><tr>{head}</tr></thead>")
        out.append(f"<tbody>{body}</tbody></table>")
    return "".join(out)


def with_pilot(page: str, pilot_json: str | os.PathLike[str]) -> str:
    """``page`` with the pilot tables added before ``</body>`` (unchanged without a pilot file)."""
    extra = pilot_tables_html(pilot_json)
    if not extra:
        return page
    head, sep, tail = page.rpartition("</body>")
    return head + extra + sep + tail if sep else page + extra


def contamination_table_html(audit_summary_json: str | os.PathLike[str]) -> str:
    """Samples the audit flagged ``contaminated``, per benchmark; '' when no benchmark was named."""
    path = Path(audit_summary_json)
    summary = read_json(path) if path.is_file() else {}
    decontam = summary.get("decontamination")
    if not decontam:
        return ""
    by = summary.get("contaminated_by") or {}
    rows = [
        [name, b.get("items"), b.get("too_short"), by.get(name, 0)]
        for name, b in decontam["benchmarks"].items()
    ]
    esc = html.escape
    head = "".join(f"<th>{h}</th>" for h in ("benchmark", "items", "too short to match", "samples flagged"))
    body = "".join("<tr>" + "".join(f"<td>{esc(_fmt(c))}</td>" for c in r) + "</tr>" for r in rows)
    caption = f"benchmark contamination ({decontam.get('ngram')}-word n-grams, audit): flagged samples"
    return (
        f"<table><caption>{esc(caption)}</caption><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    )


def _with_extra(page: str, extra: str) -> str:
    head, sep, tail = page.rpartition("</body>")
    return head + extra + sep + tail if sep else page + extra


def _write_text(path: Path, text: str) -> None:
    with atomic_open(path, "w") as fh:
        fh.write(text)


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def write_report_assets(
    results_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    work_dir: str | os.PathLike[str] = "work",
) -> dict[str, Path]:
    """Write every file in ``ASSET_NAMES`` under ``out_dir``; returns name -> path."""
    layout = RunLayout(results=Path(results_dir), work=Path(work_dir))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / name for name in ASSET_NAMES}
    plot_token_lengths(layout.dataset_dir, paths[TOKEN_LENGTHS_SVG])
    plot_finish_reasons(layout.dataset_dir, paths[FINISH_REASONS_SVG])
    plot_quarantine_reasons(layout.quarantine_dir, paths[QUARANTINE_REASONS_SVG])
    plot_throughput(layout.generations_dir, paths[THROUGHPUT_SVG])
    reconcile_page = reconcile_table_html(layout.reconcile)
    contamination = contamination_table_html(layout.audit_summary)
    _write_text(paths[RECONCILE_HTML], _with_extra(reconcile_page, contamination))
    realized = layout.realized_files()  # per node and per Slurm job
    plan_page = server_plan_html(layout.server_plan, realized)
    _write_text(paths[SERVER_PLAN_HTML], with_pilot(plan_page, layout.pilot))
    return paths


def cli(argv: list[str]) -> int:
    """``regen report-assets [--results results] [--work work] OUT_DIR``."""
    ap = argparse.ArgumentParser(prog="regen report-assets", description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--results", default="results")
    ap.add_argument("--work", default="work")
    args = ap.parse_args(argv)
    for name, path in write_report_assets(args.results, args.out_dir, args.work).items():
        print(f"{name}: {path}")
    return 0
