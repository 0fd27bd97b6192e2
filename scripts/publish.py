"""Snakemake script: upload the ready dataset and its manifest to merge.output_prefix
(regen.output.publish)."""

from regen.output.publish import publish_dataset
from regen.runlog import log_to

log_to(snakemake.log[0])
publish_dataset(snakemake.input.dataset, snakemake.params.prefix, snakemake.output.record)
