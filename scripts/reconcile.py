"""Snakemake script: every input id in exactly one of output / quarantine / excluded / failed."""

from regen.io import write_json
from regen.output.reconcile import check, completion_keys, reconcile
from regen.runlog import log_to

log = log_to(snakemake.log[0])
result = reconcile(
    snakemake.input.flags,
    snakemake.input.excluded,
    list(snakemake.input.failed),
    list(snakemake.input.quarantine),
    snakemake.input.dataset,
    strict=False,
    completions=completion_keys(snakemake.params.run.generate),
)
log.info("\n%s", result.table())
write_json(snakemake.output.table, result.to_json())
check(result)
