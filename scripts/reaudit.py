"""Snakemake script: re-audit the merged output; READY.json only if its gates pass."""

from regen.output.reaudit import reaudit_dataset
from regen.runlog import log_to
from regen.verdict import verdict_path_for

log_to(snakemake.log[0])
reaudit_dataset(
    dataset_dir=snakemake.input.dataset,
    summary_out=snakemake.output.summary,
    ready_out=snakemake.output.ready,
    gates=snakemake.params.reaudit,
    audit_cfg=snakemake.params.audit,
    tokenizer_dir=snakemake.params.tokenizer,
    verdict_out=verdict_path_for(snakemake.log[0]),
    export_cfg=snakemake.params.export,
)
