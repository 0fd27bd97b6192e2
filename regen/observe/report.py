"""Plots and tables for ``snakemake --report``.

``write_report(inputs, out_dir)`` writes the fixed file names in ``ASSET_NAMES``
(every one, always: a plot with no data says so) so the workflow can declare them as outputs.
It reads only the files named in :class:`ReportInputs`: the report rule's declared inputs, or
(``write_report_assets``, ``regen report-assets``) the files of a run's ``RunLayout``.
Inputs are read streamed and only the columns/fields needed; missing inputs give "no data".
The plots are :mod:`regen.observe.plots`, the HTML pages :mod:`regen.observe.pages`, the first page
:mod:`regen.observe.landing`.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from regen.io import atomic_open, read_json
from regen.layout.names import (
    ASSET_NAMES,
    AUDIT_HTML,
    FINISH_REASONS_SVG,
    LANDING_RST,
    QUARANTINE_REASONS_SVG,
    REAUDIT_HTML,
    RECONCILE_HTML,
    SERVER_PLAN_HTML,
    THROUGHPUT_SVG,
    TOKEN_LENGTHS_SVG,
    TRAINER_WINDOW_SVG,
)
from regen.layout.run import RUN, RunLayout
from regen.observe.inputs import ReportInputs
from regen.observe.landing import Readiness, RunFacts, landing_rst, readiness, write_failed_run_landing
from regen.observe.pages import (
    audit_page_html,
    contamination_table_html,
    reaudit_page_html,
    reconcile_table_html,
    server_plan_html,
    server_restarts_table,
    with_extra,
    with_pilot,
)
from regen.observe.plots import (
    plot_finish_reasons,
    plot_quarantine_reasons,
    plot_throughput,
    plot_token_lengths,
    plot_trainer_window,
    throughput_series,
)
from regen.observe.run_numbers import RunNumbers

__all__ = [
    "ASSET_NAMES",
    "FINISH_REASONS_SVG",
    "QUARANTINE_REASONS_SVG",
    "RECONCILE_HTML",
    "SERVER_PLAN_HTML",
    "THROUGHPUT_SVG",
    "TOKEN_LENGTHS_SVG",
    "Readiness",
    "ReportInputs",
    "RunFacts",
    "audit_page_html",
    "landing_rst",
    "plot_trainer_window",
    "readiness",
    "server_plan_html",
    "server_restarts_table",
    "throughput_series",
    "write_failed_run_landing",
    "write_report",
    "write_report_assets",
]


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
    _write_text(paths[RECONCILE_HTML], with_extra(reconcile_page, contamination))
    _write_text(paths[AUDIT_HTML], audit_page_html(inputs.audit, inputs.audit_verdict))
    _write_text(paths[REAUDIT_HTML], reaudit_page_html(inputs.reaudit, inputs.reaudit_verdict))
    plan_page = server_plan_html(inputs.plan, list(inputs.realized), facts.mode)
    plan_page = with_extra(plan_page, server_restarts_table(inputs.restarts))
    _write_text(paths[SERVER_PLAN_HTML], with_pilot(plan_page, inputs.pilot))
    verdict = readiness(inputs)
    rows = read_json(inputs.ready).get("rows") if inputs.ready.is_file() else None
    numbers = RunNumbers.of(inputs, facts.mode).lines()
    _write_text(paths[LANDING_RST], landing_rst(verdict, facts, rows, numbers=numbers))
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
