"""Snakemake script: check every record of a shard; valid ones go on, the rest to quarantine."""

from regen.output.validate import ValidateConfig, validate_shard
from regen.runlog import log_to

log = log_to(snakemake.log[0])
stats = validate_shard(
    snakemake.input.records,
    snakemake.output.valid,
    snakemake.output.quarantine,
    ValidateConfig.from_dict(snakemake.params.validate),
)
log.info("%s", stats)
