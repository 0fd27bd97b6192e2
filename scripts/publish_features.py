"""Snakemake script: upload one shard's features and manifest to features.output_prefix
(regen.features.publish)."""

from pathlib import Path

from regen.features.publish import publish_shard
from regen.runlog import log_to

log_to(snakemake.log[0])
publish_shard(Path(snakemake.input.manifest).parent, snakemake.params.prefix, snakemake.output.record)
