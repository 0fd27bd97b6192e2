"""Snakemake script: split the audited prompts into deterministic shards (regen.shards)."""

from regen.runlog import log_to
from regen.shards import make_shards

log_to(snakemake.log[0])
dataset = snakemake.params.dataset
make_shards(
    snakemake.input.dataset,
    snakemake.input.excluded,
    list(snakemake.output.shards),
    fmt=dataset["format"],
    id_column=dataset["id_column"],
    on_bad_row="skip",
    tokenizer_dir=snakemake.params.tokenizer,
)
