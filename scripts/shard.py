"""Snakemake script: split the audited samples into deterministic shards, each longest expected answer
first (regen.ingest.shards)."""

from regen.ingest.shards import shard_audited
from regen.runlog import log_to

log_to(snakemake.log[0])
shard_audited(snakemake.input.samples, list(snakemake.output.shards), snakemake.input.flags)
