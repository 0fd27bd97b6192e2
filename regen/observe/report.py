"""Plots and tables for ``snakemake --report``.

``write_report(inputs, out_dir)`` writes the fixed file names in ``ASSET_NAMES``
(every one, always: a plot with no data says so) so the workflow can declare them as outputs.
It reads only the files named in :class:`ReportInputs`: the report rule's declared inputs, or
(``write_report_assets``, ``regen report-assets``) the files of a run's ``RunLayout``.
Inputs are read streamed and only the columns/fields needed; missing inputs give "no data".
"""

from __future__ import annotations

import argparse
import html
import math
import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import orjson
import pyarrow.parquet as pq

from regen.io import atomic_open, atomic_path, open_lines, read_json
from regen.layout import (
    ASSET_NAMES,
    AUDIT_HTML,
    FINISH_REASONS_SVG,
    LANDING_RST,
    QUARANTINE_REASONS_SVG,
    REAUDIT_HTML,
    RECONCILE_HTML,
    RUN,
    SERVER_PLAN_HTML,
    SLURM_DIR_PREFIX,
    THROUGHPUT_SVG,
    TOKEN_LENGTHS_SVG,
    TRAINER_WINDOW_SVG,
    RunLayout,
)
from regen.serving.progress import read_restarts


@dataclass(frozen=True, slots=True)
class ReportInputs:
    """Every file the report reads: in the workflow the report rule's declared inputs
    (``scripts/report_assets.py``), from the command line a run's layout (:meth:`of`).

    The GPU slots' ``realized`` and ``restarts`` files belong to the long-lived servers, not to a
    job: the rule names their root (``RunLayout.servers_root``) and they are listed when the report runs.
    """

    dataset: Path
    reconcile: Path
    audit: Path
    audit_verdict: Path
    reaudit: Path
    reaudit_verdict: Path
    ready: Path
    plan: Path
    #: ``regen tune --sweep``'s pilot (None: none was run)
    pilot: Path | None
    records: tuple[Path, ...]
    failed: tuple[Path, ...]
    quarantine: tuple[Path, ...]
    realized: tuple[Path, ...]
    restarts: tuple[Path, ...]

    @classmethod
    def of(cls, layout: RunLayout) -> ReportInputs:
        """The files of the run laid out by ``layout``, as they are now."""
        return cls(
            dataset=layout.dataset_dir,
            reconcile=layout.reconcile,
            audit=layout.audit_summary,
            audit_verdict=layout.verdict("audit"),
            reaudit=layout.reaudit_summary,
            reaudit_verdict=layout.verdict("reaudit"),
            ready=layout.ready,
            plan=layout.server_plan,
            pilot=layout.pilot,
            records=tuple(layout.record_files()),
            failed=tuple(layout.failed_files()),
            quarantine=tuple(layout.quarantine_files()),
            realized=tuple(layout.realized_files()),  # per node and per Slurm job
            restarts=tuple(layout.restart_files()),
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
    """Dict lines of a JSONL file (plain or zstd); unparsable lines are skipped (reported elsewhere)."""
    with open_lines(path) as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                yield obj


def quarantine_reason_counts(quarantine: Iterable[Path]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for path in quarantine:
        for obj in iter_jsonl(path):
            counts[str(obj.get("reason", "unknown"))] += 1
    return counts


def throughput_series(
    records: Iterable[Path], bucket_s: float | None = None
) -> tuple[float, dict[str, np.ndarray]]:
    """Output tokens/s per server per time bucket, from the generation records (one file per shard).

    A record's completion tokens are spread evenly over its request (``started_at`` to
    ``started_at + latency_s``). Returns ``(bucket_s, {server_id: tokens_per_s array})``;
    bucket 0 starts at the earliest request.
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


def plot_throughput(records: Iterable[Path], path: Path) -> dict[str, np.ndarray]:
    bucket_s, series = throughput_series(records)
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


PAGE_STYLE = (
    "body{font-family:sans-serif;margin:1em}table{border-collapse:collapse;margin:0 0 1.5em}"
    "td,th{border:1px solid #999;padding:3px 8px;text-align:left}caption{text-align:left;font-weight:bold;"
    "padding:4px 0}.pass{color:#1a7f37;font-weight:bold}.fail{color:#cf222e;font-weight:bold}"
    ".warn{color:#9a6700}.note{color:#555;max-width:60em}.bar{display:flex;height:28px;width:100%;"
    "max-width:60em;border:1px solid #999;margin:0 0 1.5em}.bar div{overflow:hidden;white-space:nowrap;"
    "font-size:11px;padding:2px;color:#000}"
)


def _page(title: str, *parts: str) -> str:
    """A self-contained HTML page (the report shows it in an iframe)."""
    esc = html.escape
    return (
        f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{esc(title)}</title>"
        f"<style>{PAGE_STYLE}</style></head><body><h2>{esc(title)}</h2>{''.join(parts)}</body></html>\n"
    )


def _table(
    headers: list[str], rows: list[list[Any]], caption: str, classes: list[list[str]] | None = None
) -> str:
    """An HTML table; ``classes`` gives a CSS class per cell (e.g. pass/fail)."""
    esc = html.escape
    head = "".join(f"<th>{esc(str(h))}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        cls = classes[i] if classes else [""] * len(row)
        cells = "".join(
            f"<td class='{c}'>{esc(_fmt(v))}</td>" if c else f"<td>{esc(_fmt(v))}</td>"
            for v, c in zip(row, cls, strict=True)
        )
        body.append(f"<tr>{cells}</tr>")
    return (
        f"<table><caption>{esc(caption)}</caption><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict | list):
        return orjson.dumps(value).decode()
    return str(value)


def _note(text: str, cls: str = "note") -> str:
    return f"<p class='{cls}'>{html.escape(text)}</p>"


def _html_table(headers: list[str], rows: list[list[Any]], caption: str) -> str:
    return _page(caption, _table(headers, rows, caption))


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


# ---------------------------------------------------------------------------------------------
# Gate verdicts (input audit, output re-audit)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GateRow:
    """One gate of the input audit or the output re-audit, as the report shows it."""

    name: str
    value: float
    limit: float
    passed: bool
    meaning: str

    @property
    def relation(self) -> str:
        at_least = self.name.startswith("min_")
        if self.passed:
            return ">=" if at_least else "<="
        return "<" if at_least else ">"


def gate_rows(summary: Mapping[str, Any], meanings: Mapping[str, str] | None = None) -> list[GateRow]:
    """The ``gates`` block of an audit or re-audit summary, in name order."""
    rows = []
    for name, gate in sorted((summary.get("gates") or {}).items()):
        rows.append(
            GateRow(
                name=name,
                value=float(gate.get("value", 0.0)),
                limit=float(gate.get("limit", 0.0)),
                passed=bool(gate.get("passed", False)),
                meaning=str(gate.get("meaning") or (meanings or {}).get(name, "")),
            )
        )
    return rows


def read_verdict(output: Path, kept: Path) -> tuple[dict[str, Any] | None, Path | None]:
    """A gate summary: the rule's output when it exists, else the copy kept beside its log (a failed
    job's outputs are deleted); ``(None, None)`` when neither exists."""
    for path in (output, kept):
        if path.is_file():
            return read_json(path), path
    return None, None


def _gates_table(rows: list[GateRow], prefix: str) -> str:
    table_rows = [
        [f"{prefix}{g.name}", g.value, g.relation, g.limit, "PASS" if g.passed else "FAIL", g.meaning]
        for g in rows
    ]
    classes = [["", "", "", "", "pass" if g.passed else "fail", ""] for g in rows]
    return _table(["gate", "value", "", "limit", "verdict", "what it measures"], table_rows, "gates", classes)


def _verdict_line(summary: Mapping[str, Any], source: Path) -> str:
    passed, overridden = bool(summary.get("passed")), bool(summary.get("overridden"))
    if passed:
        return "<p class='pass'>PASSED: every gate holds.</p>"
    if overridden:
        return "<p class='warn'>FAILED gates, overridden by the config (override_gates: true).</p>"
    return f"<p class='fail'>FAILED: see the gates below (details kept in {html.escape(str(source))}).</p>"


def _verdict_page(
    title: str,
    paths: tuple[Path, Path],
    gate_config_prefix: str,
    meanings: Mapping[str, str] | None,
    sections: Callable[[Mapping[str, Any]], list[str]],
) -> str:
    """An audit or re-audit page: verdict line, gates table, then the page's own ``sections`` of the
    summary found at ``paths`` (the rule's output, else the copy kept beside its log)."""
    summary, source = read_verdict(*paths)
    if summary is None or source is None:
        return _page(title, _note(f"no data: neither {paths[0]} nor {paths[1]} exists"))
    gates = _gates_table(gate_rows(summary, meanings), gate_config_prefix)
    return _page(title, _verdict_line(summary, source), gates, *sections(summary))


def audit_page_html(summary_path: Path, kept_path: Path) -> str:
    """Input audit: verdict, each gate's value/limit/verdict, flag counts and exclusions."""
    from regen.ingest.audit import GATE_MEANING  # the audit owns what its gates mean

    paths = (summary_path, kept_path)
    return _verdict_page("Input audit", paths, "audit.gates.", GATE_MEANING, _audit_sections)


def _audit_sections(summary: Mapping[str, Any]) -> list[str]:
    counts = [
        ["samples audited", summary.get("total")],
        ["kept for generation", summary.get("kept")],
        ["excluded", summary.get("excluded")],
        ["unreadable rows", summary.get("bad_rows")],
        [
            "prompt tokens p50 / p99",
            f"{summary.get('prompt_tokens_p50')} / {summary.get('prompt_tokens_p99')}",
        ],
        ["context limit", summary.get("context_limit")],
    ]
    flags = [
        [k, v, (summary.get("flag_fractions") or {}).get(k)]
        for k, v in (summary.get("flag_counts") or {}).items()
    ]
    excluded = [[k, v] for k, v in sorted((summary.get("excluded_reasons") or {}).items())]
    return [
        _table(["", "count"], counts, "samples"),
        *_empty_answer_sections(summary.get("empty_old_answers")),
        _table(["flag", "samples", "fraction"], flags, "flags (a sample can have several)"),
        _table(["reason", "samples"], excluded, "excluded before generation") if excluded else "",
    ]


def _empty_answer_sections(empty: Mapping[str, Any] | None) -> list[str]:
    """Empty old answers by fate: the sentence, then the counts (the gate judges the context ones)."""
    if not empty:
        return []
    source = "assumed" if empty.get("regenerate_assumed") else "generate.regenerate"
    mode = f"{empty.get('regenerate')} ({source})"
    rows = [
        ["old answers (assistant turns)", empty.get("old_answers")],
        ["empty (template scaffolding only)", empty.get("empty")],
        ["of them regenerated by this run (replaced: never blocking)", empty.get("regenerated")],
        ["of them kept as context (not regenerated: the gate judges these)", empty.get("context")],
        ["of them in excluded samples (not generated)", empty.get("excluded")],
        ["samples keeping an empty old answer as context", empty.get("samples_with_empty_context")],
        ["regenerate", mode],
    ]
    return [
        _note(f"Empty old answers: {empty.get('in_words')}."),
        _table(["", "count"], rows, "empty old answers, by fate"),
    ]


def reaudit_page_html(summary_path: Path, kept_path: Path) -> str:
    """Output re-audit: verdict, each gate's value/limit/verdict, finish reasons."""
    title = "Output audit (re-audit of the merged dataset)"
    return _verdict_page(title, (summary_path, kept_path), "reaudit.", None, _reaudit_sections)


def _reaudit_sections(summary: Mapping[str, Any]) -> list[str]:
    counts = [
        ["rows", summary.get("rows")],
        ["empty answers", summary.get("empty_answers")],
        ["truncated (finish_reason length)", summary.get("truncated")],
        ["duplicate answers", summary.get("duplicate_answers")],
    ]
    reasons = [[k, v] for k, v in sorted((summary.get("finish_reasons") or {}).items())]
    out = [
        _table(["", "count"], counts, "rows"),
        _table(["finish reason", "rows"], reasons, "finish reasons"),
    ]
    cuts = summary.get("tool_call_mismatch")
    if cuts:
        rows = [[kind, n] for kind, n in cuts["by_kind"].items()]
        out.append(_table(["mismatch", "rows ended there"], rows, "tool-call cuts: " + cuts["meaning"]))
    return out


# ---------------------------------------------------------------------------------------------
# Server plan: the memory map, predicted and realized side by side
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MapField:
    """One named quantity of the server plan: its key in the plan and how to read it from a
    ``gpu{k}.realized.json`` ``realized`` block (None: SGLang does not report it)."""

    label: str
    predicted_key: str
    realized_keys: tuple[str, ...] = ()
    color: str = ""

    def realized(self, realized: Mapping[str, Any]) -> float | None:
        values = [realized.get(k) for k in self.realized_keys]
        present = [float(v) for v in values if v is not None]
        return sum(present) if present else None


MEMORY_MAP = (
    MapField("weights", "weights_gib", ("weights_gib",), "#4477aa"),
    MapField("state pool (mamba)", "state_pool_gib", ("conv_state_gib", "ssm_state_gib"), "#66ccee"),
    MapField("spec scratch", "spec_scratch_gib", (), "#228833"),
    MapField("KV cache", "kv_cache_gib", ("kv_cache_gib",), "#ccbb44"),
    MapField("ReplaySSM ring (from the slack)", "replay_ring_gib", ("replay_ring_gib",), "#994455"),
    MapField("CUDA graphs + activations", "reserve_gib", (), "#ee6677"),
    MapField("slack (1 - mem_fraction_static)", "slack_gib", (), "#aa3377"),
    MapField("CUDA context", "context_gib", (), "#bbbbbb"),
    MapField("VLM cache", "vlm_cache_gib", (), "#dddddd"),
    MapField("free", "free_gib", ("available_gpu_mem_gib",), "#ffffff"),
)
CAPACITY = (
    MapField("KV cache tokens", "kv_cache_tokens", ("max_total_num_tokens",)),
    MapField("max running requests", "effective_max_running_requests", ("max_running_requests",)),
    MapField("max mamba cache size", "max_mamba_cache_size", ("max_mamba_cache_size",)),
    MapField("mamba slots per request", "mamba_slots_per_request", ("mamba_slots_per_request",)),
    MapField("mem_fraction_static", "mem_fraction_static", ("mem_fraction_static",)),
    MapField("chunked prefill size", "chunked_prefill_size", ("chunked_prefill_size",)),
)
#: drift above this (relative) is highlighted, as regen.serving logs it
DRIFT_WARN = 0.05


def drift(predicted: Any, realized: float | None) -> float | None:
    """(realized - predicted) / predicted; None when either is missing or predicted is ~0."""
    if realized is None or not isinstance(predicted, int | float) or abs(predicted) < 1e-3:
        return None  # nothing predicted (a few MiB of "free" is no base for a percentage)
    return (realized - float(predicted)) / float(predicted)


def _side_by_side(
    fields: tuple[MapField, ...],
    predicted: Mapping[str, Any],
    servers: Mapping[str, Mapping[str, Any]],
    caption: str,
) -> str:
    headers = ["", "predicted"]
    for sid in servers:
        headers += [f"{sid} realized", f"{sid} drift"]
    rows, classes = [], []
    for f in fields:
        row: list[Any] = [f.label, predicted.get(f.predicted_key)]
        cls = ["", ""]
        for realized in servers.values():
            value = f.realized(realized) if f.realized_keys else None
            d = drift(predicted.get(f.predicted_key), value)
            row += [value if f.realized_keys else "not reported", None if d is None else f"{d:+.1%}"]
            cls += ["", "fail" if d is not None and abs(d) > DRIFT_WARN else ""]
        rows.append(row)
        classes.append(cls)
    return _table(headers, rows, caption, classes)


def _memory_bar(section: Mapping[str, Any], total_gib: float) -> str:
    parts = []
    for f in MEMORY_MAP:
        gib = float(section.get(f.predicted_key) or 0.0)
        if gib <= 0 or total_gib <= 0:
            continue
        pct = 100.0 * gib / total_gib
        label = html.escape(f"{f.label} {gib:.1f} GiB")
        parts.append(f"<div style='width:{pct:.2f}%;background:{f.color}' title='{label}'>{label}</div>")
    return f"<div class='bar'>{''.join(parts)}</div>"


def server_plan_html(
    plan_json: str | os.PathLike[str], realized_paths: list[Path], mode: str | None = None
) -> str:
    """The plan as a memory map (GiB per part of the GPU) and the capacities SGLang settles on,
    predicted beside each server's realized value with the drift in %."""
    title = "Server plan: memory map, predicted and realized"
    plan_path = Path(plan_json)
    if not plan_path.is_file():
        return _page(title, _note(f"no data: {plan_path} missing"))
    plan = read_json(plan_path)
    if plan.get("external"):
        return _page(
            title, _note("server.mode external: the endpoint is managed by the user; nothing was planned.")
        )
    launched = str(plan.get("launched", "recommended"))
    predicted = plan.get(launched) or {}
    servers = {}
    for p in realized_paths:
        if p.is_file():
            doc = read_json(p)
            servers[str(doc.get("server_id") or p.name.split(".")[0])] = doc.get("realized") or {}
    total_gib = float(plan.get("gpu_memory_mib") or 0) / 1024.0
    parts = [
        _note(
            f"SGLang {plan.get('sglang_version')}, {total_gib:.0f} GiB GPU, "
            f"model config {plan.get('model_config')}; servers launched with the {launched} flags: "
            + (" ".join(plan.get("launch_args") or []) or "(none)")
        ),
        _memory_bar(predicted, total_gib),
    ]
    if mode == "simulated":
        parts.append(
            _note(
                "server.mode simulated: no GPU was used. The simulated server reports the memory map of the "
                "plan it was launched with, so realized equals predicted by construction.",
                "warn",
            )
        )
    if not servers:
        parts.append(_note(f"no realized values: no server wrote {RUN.servers_root}/gpu*.realized.json"))
    parts.append(_side_by_side(MEMORY_MAP, predicted, servers, "memory map (GiB per GPU)"))
    parts.append(_side_by_side(CAPACITY, predicted, servers, "capacities"))
    given, recommended = plan.get("given") or {}, plan.get("recommended") or {}
    compare_rows = [
        [f.label, given.get(f.predicted_key), recommended.get(f.predicted_key)]
        for f in (*MEMORY_MAP, *CAPACITY)
    ]
    parts.append(
        _table(["", "given flags", "recommended"], compare_rows, "given flags vs. the tuner's recommendation")
    )
    notes = [[r] for r in recommended.get("reasons") or []] + [
        [f"warning: {w}"] for w in plan.get("warnings") or []
    ]
    if notes:
        parts.append(_table(["why"], notes, "recommendation"))
    return _page(title, *parts)


def server_restarts_table(paths: Iterable[Path]) -> str:
    """Every server restart of the run with its cause (a crash, a stall, a port lost to another process,
    a supervisor that gave up), from the slots' ``gpu{k}.restarts.jsonl`` (``regen.serving.progress``)."""
    rows = []
    for path in paths:
        slot = path.name.split(".")[0]
        per_job = path.parent.name.startswith(SLURM_DIR_PREFIX)  # a Slurm job's slot (regen.layout)
        where = f"{path.parent.name}/{slot}" if per_job else slot
        for entry in read_restarts(path):
            at = entry.get("at")
            when = (
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
                if isinstance(at, int | float)
                else None
            )
            counted = (
                f"{entry.get('restart')}/{entry.get('max_restarts')}"
                if entry.get("kind") != "port"
                else "not counted"
            )
            rows.append([when, where, entry.get("kind"), counted, entry.get("cause")])
    rows.sort(key=lambda r: r[0] or "")
    caption = f"server restarts: {sum(r[2] != 'port' for r in rows)}" if rows else "server restarts: none"
    return _table(["when", "server", "kind", "restart", "cause"], rows, caption)


PILOT_HEADERS = ["", "candidate", "args", "concurrency", "out tok/s", "req/s", "p50", "p90", "p99",
                 "truncated", "error"]  # fmt: skip


def pilot_tables_html(pilot_json: str | os.PathLike[str] | None) -> str:
    """Tables of ``regen tune --sweep`` (candidates, output lengths, projection); '' without a pilot."""
    path = Path(pilot_json) if pilot_json is not None else None
    if path is None or not path.is_file():
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


def with_pilot(page: str, pilot_json: str | os.PathLike[str] | None) -> str:
    """``page`` with the pilot tables added before ``</body>`` (unchanged without a pilot file)."""
    return _with_extra(page, pilot_tables_html(pilot_json))


# ---------------------------------------------------------------------------------------------
# The landing page: READY or not, and why
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunFacts:
    """What the landing page says about the run's set-up (from the config)."""

    dataset: str = "?"
    model: str = "?"
    mode: str = "?"
    shards: int | None = None


@dataclass(frozen=True, slots=True)
class Readiness:
    """The run's verdict: ready or not, with every reason, and one line per stage."""

    ready: bool
    reasons: tuple[str, ...]
    stages: tuple[tuple[str, str], ...]  # (report category, one-line summary)


def _count_lines(paths: list[Path]) -> int:
    n = 0
    for path in paths:
        with open_lines(path) as fh:
            n += sum(1 for line in fh if line.strip())
    return n


def _gate_verdict(
    summary: Mapping[str, Any], prefix: str, stage: str, source: Path | None
) -> tuple[str, list[str]]:
    """PASSED / gates overridden / FAILED, and the reasons (one per failed gate, ``source`` holding the
    details) that keep the dataset from READY: none when the config overrides the gates."""
    failed = _failed_gates(summary, prefix)
    overridden = bool(summary.get("overridden"))
    verdict = "PASSED" if not failed else ("gates overridden" if overridden else "FAILED")
    return verdict, [] if overridden else [f"{stage} gate failed: {f} (details: {source})" for f in failed]


def _failed_gates(summary: Mapping[str, Any], prefix: str) -> list[str]:
    return [
        f"{prefix}{g.name} = {g.value:.4g} {g.relation} limit {g.limit:.4g}"
        + (f" ({g.meaning})" if g.meaning else "")
        for g in gate_rows(summary)
        if not g.passed
    ]


def readiness(inputs: ReportInputs) -> Readiness:
    """READY when READY.json says so and reconciliation holds; otherwise every reason found."""
    reasons: list[str] = []
    stages: list[tuple[str, str]] = []
    servers = inputs.realized
    audit, audit_src = read_verdict(inputs.audit, inputs.audit_verdict)
    if audit is None:
        reasons.append("the input audit has not run")
        stages.append(("1. Input audit", "not run"))
    else:
        verdict, blocking = _gate_verdict(audit, "audit.gates.", "input audit", audit_src)
        reasons += blocking
        line = f"{verdict}: {audit.get('total')} samples, {audit.get('excluded')} excluded"
        empty = audit.get("empty_old_answers")
        stages.append(("1. Input audit", f"{line}; {empty['in_words']}" if empty else line))
    drifts = []
    for path in servers:
        if path.is_file():
            doc = read_json(path)
            for d in doc.get("drift") or []:
                drifts.append(f"{doc.get('server_id')}: {d.get('field')} {float(d.get('relative', 0)):+.1%}")
    plan_line = "planned" if inputs.plan.is_file() else "not planned"
    stages.append(
        (
            "2. Server plan",
            f"{plan_line}; {len(servers)} server(s) reported; drift over 5%: {', '.join(drifts) or 'none'}",
        )
    )
    records, failed_files, quarantine = list(inputs.records), list(inputs.failed), list(inputs.quarantine)
    stages.append(
        (
            "3. Generation",
            f"{_count_lines(records)} records from {len(records)} shard(s), "
            f"{_count_lines(failed_files)} failed requests, "
            f"{_count_lines(quarantine)} quarantined by validation",
        )
    )
    reaudit, reaudit_src = read_verdict(inputs.reaudit, inputs.reaudit_verdict)
    ready_doc = read_json(inputs.ready) if inputs.ready.is_file() else None
    if reaudit is None:
        reasons.append("the merged output has not been re-audited")
        stages.append(("4. Output audit", "not run"))
    else:
        verdict, blocking = _gate_verdict(reaudit, "reaudit.", "output re-audit", reaudit_src)
        reasons += blocking
        stages.append(("4. Output audit", f"{verdict}: {reaudit.get('rows')} rows" + _drafter_facts(reaudit)))
    if ready_doc is None and reaudit is not None and not reasons:
        reasons.append(f"{inputs.ready} is missing")
    reconcile_path = inputs.reconcile
    if reconcile_path.is_file():
        rec = read_json(reconcile_path)
        if not rec.get("ok"):
            reasons.append(
                f"reconciliation failed: {rec.get('lost_count', 0)} lost, {rec.get('duplicated_count', 0)} "
                f"duplicated, {rec.get('unknown_count', 0)} unknown ids"
            )
        counts = ", ".join(f"{k} {v}" for k, v in (rec.get("counts") or {}).items())
        stages.append(
            (
                "5. Reconciliation",
                f"{'OK' if rec.get('ok') else 'FAILED'}: {rec.get('input')} input ids: {counts}",
            )
        )
    else:
        reasons.append("reconciliation has not run")
        stages.append(("5. Reconciliation", "not run"))
    ready = bool(ready_doc and ready_doc.get("ready")) and not reasons
    if ready and ready_doc and ready_doc.get("overridden"):
        reasons.append("READY with re-audit gates overridden by the config (reaudit.override_gates: true)")
    return Readiness(ready, tuple(reasons), tuple(stages))


def _drafter_facts(reaudit: Mapping[str, Any]) -> str:
    """What the drafter will see, from the re-audit summary: the eval split, the coverage of the
    configured trainer window (4k when none is named) and the tool-call cuts."""
    parts = []
    split = reaudit.get("eval_split")
    if split:
        held, fraction = split["rows"].get("eval", 0), split["eval_fraction"]
        parts.append(
            f"eval split {held} rows held out ({fraction:.0%} of prompts, "
            f"{split['prompts_on_both_sides']} prompts on both sides)"
        )
    window = reaudit.get("trainer_window") or {}
    if window.get("windows"):
        w = window["headline"]
        at = window["windows"].get(str(w))
        if at is not None:
            named = "the configured" if window.get("configured") else "a (default)"
            parts.append(
                f"at {named} {w}-token trainer window {at['rows_fit']:.1%} of rows fit and "
                f"{at['supervised_kept']:.1%} of supervised tokens are kept, {at['cut_in_think']} rows cut "
                "inside their think block"
            )
    cuts = reaudit.get("tool_call_mismatch") or {}
    if cuts.get("rows"):
        kinds = ", ".join(f"{k} {n}" for k, n in cuts["by_kind"].items() if n)
        parts.append(f"{cuts['rows']} rows ended at a regenerated turn whose tool calls differ ({kinds})")
    elif cuts:
        parts.append("no row cut at a differing tool call")
    return "".join(f"; {p}" for p in parts)


def _rst_text(text: str) -> str:
    """Text safe inside rst and the report's Jinja pass."""
    for ch in "\\*`_|":
        text = text.replace(ch, "\\" + ch)
    return text.replace("{{", "{ {").replace("{%", "{ %")


def landing_rst(verdict: Readiness, facts: RunFacts, rows: int | None) -> str:
    """The report's first page (Snakefile ``report:``): the verdict first, then what ran."""
    t = _rst_text
    if verdict.ready:
        head = f"**READY**: {rows} training-ready rows in ``{RUN.dataset_dir}``."
    else:
        head = "**NOT READY**: the output is not training-ready yet."
    lines = [head, ""]
    if verdict.reasons:
        lines += ["Why:" if not verdict.ready else "Note:", ""]
        lines += [f"- {t(r)}" for r in verdict.reasons]
        lines.append("")
    lines += [
        f"regen regenerated completions of ``{facts.dataset}`` with ``{facts.model}`` served by SGLang "
        f"(server.mode ``{facts.mode}``) in {facts.shards if facts.shards is not None else '?'} shards.",
        "",
    ]
    for category, summary in verdict.stages:
        lines.append(f"- `{category}`_: {t(summary)}")
    lines += [
        "",
        "Each category on the left holds the details: gate tables with value, limit and verdict, "
        "the memory map predicted beside what each server realized, throughput per GPU over time, "
        "length and finish-reason plots, quarantine reasons, and the reconciliation of every input id.",
        "",
    ]
    return "\n".join(lines)


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


def write_report(
    inputs: ReportInputs, out_dir: str | os.PathLike[str], facts: RunFacts | None = None
) -> dict[str, Path]:
    """Write every file in ``ASSET_NAMES`` under ``out_dir`` from ``inputs`` alone; returns name -> path."""
    facts = facts or RunFacts()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / name for name in ASSET_NAMES}
    plot_token_lengths(inputs.dataset, paths[TOKEN_LENGTHS_SVG])
    plot_finish_reasons(inputs.dataset, paths[FINISH_REASONS_SVG])
    plot_quarantine_reasons(inputs.quarantine, paths[QUARANTINE_REASONS_SVG])
    plot_throughput(inputs.records, paths[THROUGHPUT_SVG])
    plot_trainer_window(inputs.reaudit, paths[TRAINER_WINDOW_SVG])
    reconcile_page = reconcile_table_html(inputs.reconcile)
    contamination = contamination_table_html(inputs.audit)
    _write_text(paths[RECONCILE_HTML], _with_extra(reconcile_page, contamination))
    _write_text(paths[AUDIT_HTML], audit_page_html(inputs.audit, inputs.audit_verdict))
    _write_text(paths[REAUDIT_HTML], reaudit_page_html(inputs.reaudit, inputs.reaudit_verdict))
    plan_page = server_plan_html(inputs.plan, list(inputs.realized), facts.mode)
    plan_page = _with_extra(plan_page, server_restarts_table(inputs.restarts))
    _write_text(paths[SERVER_PLAN_HTML], with_pilot(plan_page, inputs.pilot))
    verdict = readiness(inputs)
    rows = read_json(inputs.ready).get("rows") if inputs.ready.is_file() else None
    _write_text(paths[LANDING_RST], landing_rst(verdict, facts, rows))
    return paths


def write_report_assets(
    results_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    work_dir: str | os.PathLike[str] = RUN.work,
    logs_dir: str | os.PathLike[str] = RUN.logs,
    facts: RunFacts | None = None,
) -> dict[str, Path]:
    """``write_report`` from the files of the run whose directories are given, as they are now."""
    layout = RunLayout(results=Path(results_dir), work=Path(work_dir), logs=Path(logs_dir))
    return write_report(ReportInputs.of(layout), out_dir, facts)


def cli(argv: list[str]) -> int:
    """``regen report-assets [--results results] [--work work] [--logs logs] OUT_DIR``."""
    ap = argparse.ArgumentParser(prog="regen report-assets", description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", help="directory the plots, tables and landing page are written to")
    ap.add_argument(
        "--results", default=str(RUN.results), help="the run's results directory (default: %(default)s)"
    )
    ap.add_argument("--work", default=str(RUN.work), help="the run's work directory (default: %(default)s)")
    ap.add_argument(
        "--logs", default=str(RUN.logs), help="the run's log directory, where gate verdicts are kept"
    )
    args = ap.parse_args(argv)
    for name, path in write_report_assets(args.results, args.out_dir, args.work, args.logs).items():
        print(f"{name}: {path}")
    return 0
