"""Snakemake script: re-audit the merged output; READY.json only if its gates pass."""

from regen.ingest.audit import AuditConfig
from regen.output.export import ExportConfig
from regen.output.reaudit import ReauditGates, reaudit_dataset
from regen.runlog import log_to
from regen.verdict import verdict_path_for

log_to(snakemake.log[0])
reaudit_dataset(
    dataset_dir=snakemake.input.dataset,
    summary_out=snakemake.output.summary,
    ready_out=snakemake.output.ready,
    gates=ReauditGates.from_dict(snakemake.params.reaudit),
    audit=AuditConfig.from_dict(snakemake.params.audit),
    tokenizer_dir=snakemake.params.tokenizer,
    export=ExportConfig.from_dict(snakemake.params.export),
    verdict_out=verdict_path_for(snakemake.log[0]),
)
