"""Snakemake script: plots, tables and the landing page for snakemake --report (regen.observe.report)."""

from pathlib import Path

from regen.features.projection import preview_lines_naming_errors
from regen.layout.run import RUN
from regen.layout.slots import realized_files, restart_files
from regen.observe.report import ReportInputs, RunFacts, write_report
from regen.runlog import log_to

log_to(snakemake.log[0])
given = snakemake.input
servers = snakemake.params.servers  # the GPU slots' files: the long-lived servers', listed now
write_report(
    ReportInputs(
        dataset=Path(given.dataset),
        reconcile=Path(given.reconcile),
        audit=Path(given.audit),
        audit_verdict=Path(given.audit_verdict),
        reaudit=Path(given.reaudit),
        reaudit_verdict=Path(given.reaudit_verdict),
        ready=Path(given.ready),
        plan=Path(given.plan),
        pilot=Path(given.pilot[0]) if given.pilot else None,
        records=tuple(map(Path, given.records)),
        failed=tuple(map(Path, given.failed)),
        quarantine=tuple(map(Path, given.quarantine)),
        realized=tuple(realized_files(servers)),
        restarts=tuple(restart_files(servers)),
    ),
    Path(snakemake.output.throughput).parent,
    facts=RunFacts(
        dataset=snakemake.params.dataset,
        model=snakemake.params.model,
        mode=snakemake.params.mode,
        shards=snakemake.params.shards,
        features=tuple(preview_lines_naming_errors(snakemake.config, RUN)),
    ),
)
