"""Snakemake script: one shard's target hidden states over the token export (regen.features.job)."""

from regen.features.job import features_job
from regen.runlog import log_to

log_to(snakemake.log[0])
features_job(
    tokenized=snakemake.input.tokenized,
    manifest=snakemake.output.manifest,
    shard=snakemake.wildcards.shard,
    shards=snakemake.params.shards,
    section=snakemake.params.features,
    model_path=snakemake.params.model_path,
    model_config=snakemake.params.model_config,
)
