"""Snakemake script: every input id in exactly one of output / quarantine / excluded / failed."""

from regen.reconcile import reconcile_for_workflow
from regen.runlog import log_to

log_to(snakemake.log[0])
reconcile_for_workflow(
    flags_path=snakemake.input.flags,
    excluded_path=snakemake.input.excluded,
    failed_paths=list(snakemake.input.failed),
    quarantine_paths=list(snakemake.input.quarantine),
    dataset_dir=snakemake.input.dataset,
    out_path=snakemake.output.table,
)
