"""Snakemake script: write the training-ready Parquet and its manifest (regen.output.merge)."""

from regen.output.merge import MergeConfig, merge_for_workflow
from regen.runlog import log_to

log_to(snakemake.log[0])
merge_for_workflow(
    valid_paths=list(snakemake.input.valid),
    plan_path=snakemake.input.plan,
    out_dir=snakemake.output.dataset,
    config=MergeConfig.from_dict(snakemake.params.merge),
    tokenizer_dir=snakemake.params.tokenizer,
    generate=snakemake.params.run.generate,
)
