"""Snakemake script: plots and tables for snakemake --report (regen.report)."""

from pathlib import Path

from regen.report import write_report_assets
from regen.runlog import log_to

log_to(snakemake.log[0])
write_report_assets("results", Path(snakemake.output.throughput).parent, work_dir="work")
