"""Snakemake script: generate one shard on this job's GPU server (regen.generate.generation)."""

from regen.generate.generation import run_generate_job
from regen.runlog import log_to

log_to(snakemake.log[0])
run_generate_job(
    shard_path=snakemake.input.shard,
    plan_path=snakemake.input.plan,
    records_out=snakemake.output.records,
    failed_out=snakemake.output.failed,
    journal_path=snakemake.params.journal,
    shard=snakemake.wildcards.shard,
    run=snakemake.params.settings.run,  # the typed run config the tracked param carries
    log_path=snakemake.log[0],
)
