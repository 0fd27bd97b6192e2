"""Snakemake script: plots, tables and the landing page for snakemake --report (regen.report)."""

from pathlib import Path

from regen.report import RunFacts, write_report_assets
from regen.runlog import log_to

log_to(snakemake.log[0])
write_report_assets(
    "results",
    Path(snakemake.output.throughput).parent,
    work_dir="work",
    logs_dir="logs",
    facts=RunFacts(
        dataset=snakemake.params.dataset,
        model=snakemake.params.model,
        mode=snakemake.params.mode,
        shards=snakemake.params.shards,
    ),
)
