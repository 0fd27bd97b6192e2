"""Snakemake script: write the count of shards.count auto this run settled (regen.ingest.shard_count)."""

from regen.ingest.shard_count import AUTO, settle_auto_count
from regen.runlog import log_to

log_to(snakemake.log[0])
count = snakemake.params.shards
settle_auto_count(AUTO, count, count, on_cluster=False, dry_run=False, persisted=snakemake.output.settled)
