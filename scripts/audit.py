"""Snakemake script: audit the input dataset before any GPU time (regen.ingest.audit)."""

from regen.ingest.audit import run_audit
from regen.runlog import log_to
from regen.verdict import verdict_path_for

log_to(snakemake.log[0])
dataset = snakemake.params.dataset
run_audit(
    snakemake.input.dataset,
    out_dir=str(snakemake.output.summary).rsplit("/", 1)[0],
    cfg=snakemake.params.audit,
    tokenizer_dir=snakemake.params.tokenizer,
    fmt=dataset["format"],
    id_column=dataset["id_column"],
    on_bad_row=dataset["on_bad_row"],
    verdict_out=verdict_path_for(snakemake.log[0]),
    regenerate=snakemake.params.regenerate,
)
