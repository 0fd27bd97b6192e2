"""Snakemake script: split the audited samples into deterministic shards (regen.shards)."""

from regen.runlog import log_to
from regen.shards import shard_audited

log_to(snakemake.log[0])
shard_audited(snakemake.input.samples, list(snakemake.output.shards))
