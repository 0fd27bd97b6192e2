"""Snakemake script: audit the input dataset before any GPU time (regen.ingest.audit); its progress goes to
the console and to ``regen status`` (regen.observe.stage_progress)."""

from regen.ingest.audit import AuditConfig, run_audit
from regen.ingest.dataset import DatasetConfig
from regen.layout.beside import AuditFiles
from regen.observe.stage_progress import StageProgress, dataset_rows
from regen.runlog import log_to
from regen.verdict import verdict_path_for

log_to(snakemake.log[0])
run_audit(
    snakemake.input.dataset,
    out_dir=AuditFiles.beside(snakemake.output.summary).out_dir,
    config=AuditConfig.from_dict(snakemake.params.audit, snakemake.params.regenerate),
    tokenizer_dir=snakemake.params.tokenizer,
    dataset=DatasetConfig.from_dict(snakemake.params.dataset),
    verdict_out=verdict_path_for(snakemake.log[0]),
    excluded_out=snakemake.log.excluded,
    progress=StageProgress.for_workflow("audit", dataset_rows(snakemake.input.dataset)),
)
