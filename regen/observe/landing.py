"""The report's first page: READY or not, and why (the Snakefile's ``report:`` names it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regen.io import atomic_open, open_lines, read_json
from regen.layout.run import RUN, RunLayout
from regen.observe.inputs import ReportInputs
from regen.observe.pages import gate_rows, read_verdict
from regen.observe.run_numbers import RunNumbers

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
    #: the features' projection (``regen.features.projection.preview_lines``): empty when off
    features: tuple[str, ...] = ()


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
    if split and not split.get("written", True):
        parts.append("no trainer files written (export.enabled: false), so no eval split held out")
    elif split:
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
                f"{at['supervised_kept']:.1%} of supervised tokens are kept, "
                f"{_count(at['cut_in_think'], 'row')} cut inside their think block"
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


def landing_rst(
    verdict: Readiness,
    facts: RunFacts,
    rows: int | None,
    link_stages: bool = True,
    numbers: Sequence[str] = (),
) -> str:
    """The report's first page (Snakefile ``report:``): the verdict first, then the run's numbers
    (``regen.observe.run_numbers``), then what ran. Each stage links to its report category
    (``link_stages``; a failed run's report may not have them all)."""
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
    if numbers or facts.features:
        lines += [f"- {t(n)}" for n in (*numbers, *facts.features)]
        lines.append("")
    shards = _count(facts.shards, "shard") if facts.shards is not None else "? shards"
    lines += [
        f"regen regenerated completions of ``{facts.dataset}`` with ``{facts.model}`` served by SGLang "
        f"(server.mode ``{facts.mode}``) in {shards}.",
        "",
    ]
    for category, summary in verdict.stages:
        lines.append(f"- `{category}`_: {t(summary)}" if link_stages else f"- {category}: {t(summary)}")
    lines += [
        "",
        "Each category on the left holds the details: gate tables with value, limit and verdict, "
        "the memory map predicted beside what each server realized, throughput per GPU over time, "
        "length and finish-reason plots, quarantine reasons, and the reconciliation of every input id.",
        "",
    ]
    return "\n".join(lines)


def failed_run_landing(inputs: ReportInputs, facts: RunFacts, log: str | None) -> str:
    """The first page of the report of a run that failed (the workflow's ``onerror``): NOT READY, the
    failure first, then every reason the files of this run give (a failed gate's kept verdict names
    the gate, its value and its limit)."""
    verdict = readiness(inputs)
    where = f" (Snakemake's log: {log})" if log else ""
    failure = f"the last run failed before it finished{where}; rerun to resume once the cause is fixed"
    numbers = RunNumbers.of(inputs, facts.mode).lines()
    return landing_rst(
        Readiness(False, (failure, *verdict.reasons), verdict.stages), facts, None, False, numbers
    )


def _count(n: int, noun: str) -> str:
    """``1 row``, ``2 rows``: a count with its noun in the right number."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def write_failed_run_landing(layout: RunLayout, facts: RunFacts, log: str | None) -> Path:
    """After a failed run (the workflow's ``onerror``): the report's first page saying NOT READY and
    why, at ``layout.failed_run_landing``, from the run's files as they are now."""
    path = layout.failed_run_landing
    path.parent.mkdir(parents=True, exist_ok=True)
    # `snakemake --report results/report.html` writes into it, and a run that failed early left none
    layout.results.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "w") as fh:
        fh.write(failed_run_landing(ReportInputs.of(layout), facts, log))
    return path
