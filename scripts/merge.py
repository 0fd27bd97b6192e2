"""Snakemake script: write the training-ready Parquet and its manifest (regen.output.merge)."""

from regen.output.merge import merge_for_workflow
from regen.runlog import log_to

log_to(snakemake.log[0])
merge_for_workflow(
    valid_paths=list(snakemake.input.valid),
    plan_path=snakemake.input.plan,
    out_dir=snakemake.output.dataset,
    merge_cfg=snakemake.params.merge,
    tokenizer_dir=snakemake.params.tokenizer,
)
