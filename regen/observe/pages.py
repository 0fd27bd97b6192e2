"""The report's HTML pages: the gate tables of the input audit and the output re-audit, the
reconciliation, the server plan's memory map predicted beside what each server realized, the server
restarts, the pilot sweep and the contamination table. Each page is self-contained (the report shows it
in an iframe)."""

from __future__ import annotations

import html
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from regen.io import read_json
from regen.layout.names import REALIZED_SUFFIX, SLURM_DIR_PREFIX
from regen.layout.run import RUN
from regen.pilot_file import PilotFile
from regen.serving.progress import read_restarts

# ---------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------


PAGE_STYLE = (
    "body{font-family:sans-serif;margin:1em}table{border-collapse:collapse;margin:0 0 1.5em}"
    "td,th{border:1px solid #999;padding:3px 8px;text-align:left}caption{text-align:left;font-weight:bold;"
    "padding:4px 0}.pass{color:#1a7f37;font-weight:bold}.fail{color:#cf222e;font-weight:bold}"
    ".warn{color:#9a6700}.note{color:#555;max-width:60em}.bar{display:flex;height:28px;width:100%;"
    "max-width:60em;border:1px solid #999;margin:0 0 0.5em}.bar div{overflow:hidden;white-space:nowrap;"
    "font-size:11px;padding:2px;color:#000}.legend{max-width:60em;margin:0 0 1.5em;font-size:12px}"
    ".legend span{display:inline-block;margin:0 1em 0.3em 0;white-space:nowrap}"
    ".legend i{display:inline-block;"
    "width:0.9em;height:0.9em;border:1px solid #999;margin-right:0.3em;vertical-align:middle}"
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


VARIANT_COLUMNS = [
    "variant",
    "rows",
    "thinking",
    "completion tokens p50 / p90 / max",
    "finish reasons",
    "truncated in reasoning",
    "truncated in answer",
    "identical completions",
]


def variant_rows(variants: Mapping[str, Mapping[str, Any]]) -> list[list[Any]]:
    """One row per sampling variant of the re-audit summary's ``variants`` block."""
    rows = []
    for name, v in variants.items():
        lengths = v.get("completion_tokens") or {}
        where = v.get("truncated_where") or {}
        reasons = ", ".join(f"{k} {n}" for k, n in sorted((v.get("finish_reasons") or {}).items()))
        span = " / ".join(str(lengths.get(k)) for k in ("p50", "p90", "max"))
        counts = [where.get("in_reasoning"), where.get("in_answer"), v.get("duplicate_completions")]
        rows.append([name, v.get("rows"), v.get("thinking"), span, reasons, *counts])
    return rows


def _reaudit_sections(summary: Mapping[str, Any]) -> list[str]:
    counts = [
        ["rows", summary.get("rows")],
        ["empty answers", summary.get("empty_answers")],
        ["truncated (finish_reason length)", summary.get("truncated")],
        *[[f"… {where.replace('_', ' ')}", n] for where, n in (summary.get("truncated_where") or {}).items()],
        ["duplicate answers", summary.get("duplicate_answers")],
        ["identical completions of one prompt", (summary.get("duplicate_completions") or {}).get("rows")],
    ]
    reasons = [[k, v] for k, v in sorted((summary.get("finish_reasons") or {}).items())]
    out = [
        _table(["", "count"], counts, "rows"),
        _table(["finish reason", "rows"], reasons, "finish reasons"),
    ]
    variants = summary.get("variants") or {}
    if variants:
        out.append(_table(VARIANT_COLUMNS, variant_rows(variants), "by sampling variant"))
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
#: the rows of the server-start table: (label, key of a ``gpu{k}.realized.json`` ``startup_split`` block,
#: ``regen.serving.startup_split.StartupSplit``)
STARTUP_ROWS = (
    ("interpreter, imports, scheduler and model config", "imports_s"),
    ("weights (target and draft)", "weights_s"),
    ("KV and state pools", "pools_s"),
    ("CUDA graphs", "graphs_s"),
    ("the rest (set-up, warm-up, readiness probe)", "other_s"),
    ("launch to ready", "total_s"),
)
#: drift above this (relative) is highlighted, as regen.serving logs it
DRIFT_WARN = 0.05


def drift(predicted: Any, realized: float | None) -> float | None:
    """(realized - predicted) / predicted; None when either is missing or predicted is ~0."""
    if realized is None or not isinstance(predicted, int | float) or abs(predicted) < 1e-3:
        return None  # nothing predicted (a few MiB of "free" is no base for a percentage)
    return (realized - float(predicted)) / float(predicted)


def _startup_table(starts: Mapping[str, Mapping[str, Any]]) -> str:
    """Seconds of each server's start per part; "unknown" where its log did not say."""
    rows = [
        [label, *("unknown" if split.get(key) is None else split[key] for split in starts.values())]
        for label, key in STARTUP_ROWS
    ]
    rows.append(["read from", *(split.get("source", "none") for split in starts.values())])
    return _table(["", *starts], rows, "server start (s), from each server's log")


def _side_by_side(
    fields: tuple[MapField, ...],
    predicted: Mapping[str, Any],
    servers: Mapping[str, Mapping[str, Any]],
    caption: str,
) -> str:
    headers = ["", "predicted"]
    for sid in servers:
        headers += [f"{sid} realized", f"{sid} drift"]
    headers.append("SGLang rule")
    rules = predicted.get("rules") or {}  # per number, the rule the planner followed (regen.sglang.plan)
    rows, classes = [], []
    for f in fields:
        row: list[Any] = [f.label, predicted.get(f.predicted_key)]
        cls = ["", ""]
        for realized in servers.values():
            value = f.realized(realized) if f.realized_keys else None
            d = drift(predicted.get(f.predicted_key), value)
            row += [value if f.realized_keys else "not reported", None if d is None else f"{d:+.1%}"]
            cls += ["", "fail" if d is not None and abs(d) > DRIFT_WARN else ""]
        row.append(rules.get(f.predicted_key))
        cls.append("")
        rows.append(row)
        classes.append(cls)
    return _table(headers, rows, caption, classes)


#: a part of the memory bar narrower than this (% of the GPU) shows no text inside: the legend names it
BAR_LABEL_MIN_PCT = 12.0


def _memory_bar(section: Mapping[str, Any], total_gib: float) -> str:
    """The memory map as one bar (a part per quantity, its label inside when it fits) and a legend that
    names every part with its GiB, so no label is cut."""
    parts, legend = [], []
    for f in MEMORY_MAP:
        gib = float(section.get(f.predicted_key) or 0.0)
        if gib <= 0 or total_gib <= 0:
            continue
        pct = 100.0 * gib / total_gib
        label = html.escape(f"{f.label} {gib:.1f} GiB")
        inside = label if pct >= BAR_LABEL_MIN_PCT else ""
        parts.append(f"<div style='width:{pct:.2f}%;background:{f.color}' title='{label}'>{inside}</div>")
        legend.append(f"<span><i style='background:{f.color}'></i>{label} ({pct:.0f}%)</span>")
    return f"<div class='bar'>{''.join(parts)}</div><div class='legend'>{''.join(legend)}</div>"


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
    servers, starts = {}, {}
    for p in realized_paths:
        if p.is_file():
            doc = read_json(p)
            sid = str(doc.get("server_id") or p.name.split(".")[0])
            servers[sid] = doc.get("realized") or {}
            starts[sid] = doc.get("startup_split") or {}
    total_gib = float(plan.get("gpu_memory_mib") or 0) / 1024.0
    parts = [
        _note(
            f"SGLang {plan.get('sglang_version')}, {total_gib:.0f} GiB GPU, "
            f"model config {plan.get('model_config')}; servers launched with the {launched} flags: "
            + (" ".join(plan.get("launch_args") or []) or "(none)")
        ),
        _memory_bar(predicted, total_gib),
    ]
    if prestart := plan.get("prestart"):  # servers started while the data was audited: regen.tune.prestart
        adopted = prestart.get("adopted")
        verdict = "adopted by the tune rule" if adopted else "not adopted: stopped, started again"
        parts.append(
            _note(
                f"servers prestarted while the data was audited (plan from the {prestart.get('source')}), "
                f"{verdict}: {prestart.get('reason')}",
                "note" if adopted else "warn",
            )
        )
    if mode == "simulated":
        parts.append(
            _note(
                "server.mode simulated: no GPU was used. The simulated server reports the memory map of the "
                "plan it was launched with, so realized equals predicted by construction.",
                "warn",
            )
        )
    if not servers:
        parts.append(_note(f"no realized values: no server wrote {RUN.servers_root}/gpu*{REALIZED_SUFFIX}"))
    parts.append(_side_by_side(MEMORY_MAP, predicted, servers, "memory map (GiB per GPU)"))
    parts.append(_side_by_side(CAPACITY, predicted, servers, "capacities"))
    if starts:
        parts.append(_startup_table(starts))
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
    pilot = PilotFile.read(path)
    if pilot is None:
        return ""
    cand_rows = []
    for i, row in enumerate(pilot.candidates):
        lengths = row.lengths
        cand_rows.append(
            ["best" if i == pilot.best_index else "", row.label, " ".join(row.args),
             row.concurrency, row.out_tok_s, row.req_s, lengths.get("p50"),
             lengths.get("p90"), lengths.get("p99"), lengths.get("truncation_rate"), row.error]
        )  # fmt: skip
    lengths = pilot.lengths
    proj = pilot.projection.fields if pilot.projection is not None else {}
    tables = [
        (PILOT_HEADERS, cand_rows, f"pilot sweep: {pilot.seconds_per_candidate} s per candidate"),
        (["key", "value"], [[k, v] for k, v in lengths.items()], "pilot output lengths (completion tokens)"),
        (
            ["key", "value"],
            [[k, v] for k, v in proj.items()] + [["assumption", a] for a in pilot.assumptions],
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
    return with_extra(page, pilot_tables_html(pilot_json))


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


def with_extra(page: str, extra: str) -> str:
    head, sep, tail = page.rpartition("</body>")
    return head + extra + sep + tail if sep else page + extra
