"""Snakemake script: write the trainer exports of the merged dataset (regen.output.export)."""

from pathlib import Path

from regen.observe.stage_progress import StageProgress, parquet_rows
from regen.output.export import ExportConfig, export_dataset
from regen.runlog import log_to

log_to(snakemake.log[0])
export_dataset(
    dataset_dir=snakemake.input.dataset,
    specforge_out=snakemake.output.specforge,
    tokenized_out=snakemake.output.tokenized,
    manifest_out=snakemake.output.manifest,
    config=ExportConfig.from_dict(snakemake.params.export),
    tokenizer_dir=snakemake.params.tokenizer,
    regenerate=snakemake.params.regenerate,
    progress=StageProgress.for_workflow(
        "export", parquet_rows(sorted(Path(snakemake.input.dataset).glob("part-*.parquet")))
    ),
)
