"""Snakemake script: upload the ready dataset and its manifest to merge.output_prefix (regen.storage)."""

from regen.runlog import log_to
from regen.storage import publish_dataset

log_to(snakemake.log[0])
publish_dataset(snakemake.input.dataset, snakemake.params.prefix, snakemake.output.record)
