"""Snakemake script: check every record of a shard; valid ones go on, the rest to quarantine."""

from regen.output.validate import validate_shard
from regen.runlog import log_to

log = log_to(snakemake.log[0])
stats = validate_shard(
    snakemake.input.records,
    snakemake.output.valid,
    snakemake.output.quarantine,
    snakemake.params.validate,
)
log.info("%s", stats)
