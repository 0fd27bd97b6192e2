"""The features' projection where a user looks before anything runs: ``snakemake -n`` and the report's first
page; its token counts from the audit, then the generated answers' real lengths, then the token export."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from support.workflow import copy_workflow, job_counts, snakemake

from regen.configfile import load_config
from regen.features.projection import preview_lines, token_counts_for_run
from regen.features.store import record_pace
from regen.layout.names import LANDING_RST, dataset_part
from regen.layout.run import RunLayout
from regen.observe.landing import RunFacts
from regen.observe.report import write_report_assets

ROOT = Path(__file__).resolve().parents[2]
AUDIT = {
    "kept": 10,
    "total": 12,
    "histograms": {"prompt_tokens": {"mean": 30}, "supervised_tokens": {"mean": 70}},
}


def write_audit(results: Path) -> RunLayout:
    layout = RunLayout(results=results)
    layout.audit_summary.parent.mkdir(parents=True)
    layout.audit_summary.write_text(json.dumps(AUDIT))
    return layout


def write_answers(path: Path, prompt: list[int], answer: list[int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.table(
            {"prompt_tokens": pa.array(prompt, pa.int64()), "completion_tokens": pa.array(answer, pa.int64())}
        ),
        path,
    )


def test_a_dry_run_prints_the_features_bytes_and_gpu_hours(tmp_path: Path) -> None:
    wd = copy_workflow(tmp_path / "wf")
    write_audit(wd / "results")
    # with an upload prefix, one upload job per shard follows its features job (regen.features.publish)
    (wd / "config" / "features.yaml").write_text("features: {enabled: true, output_prefix: s3://b/f}\n")
    run = snakemake(wd, "-n", "--cores", "1", "--configfile", "config/demo.yaml", "config/features.yaml")
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    # demo model: 28 layers, hidden 1024; EAGLE-3's [2, 14, 25] plus the last, bf16: 8,200 B a token
    # 10 kept samples x 1 completion (the demo's) x (30 + 70) tokens = 1,000 tokens
    assert "features: 10 rows, 1,000 tokens (the audit's prompt and old-answer means" in out, out[-3000:]
    assert "features: layers [2, 14, 25, 28] x hidden 1024 x bf16: 8,200 B a token, 8.2 MB in all" in out
    assert any(line.startswith("features: ") and "GPU-hours of prefill" in line for line in out.splitlines())
    jobs = job_counts(out)
    assert jobs["features"] == jobs["publish_features"] == jobs["generate"], jobs


def test_the_reports_first_page_carries_the_projection(tmp_path: Path) -> None:
    layout = write_audit(tmp_path / "results")
    config = load_config([str(ROOT / "config/demo.yaml")])
    config["features"] = {"enabled": True, "max_storage": "1MB"}
    lines = tuple(preview_lines(config, layout))
    assert any("GPU-hours" in line for line in lines) and "REFUSED" in lines[-1]
    paths = write_report_assets(
        layout.results, tmp_path / "assets", work_dir=tmp_path / "work", facts=RunFacts(features=lines)
    )
    page = paths[LANDING_RST].read_text()
    assert "GPU-hours of prefill" in page and "features.max\\_storage" in page, page
    assert "8,200 B a token" in page


def test_generated_answers_replace_the_audits_means(tmp_path: Path) -> None:
    layout = write_audit(tmp_path / "results")
    counts = token_counts_for_run(layout, completions_per_prompt=2)
    assert counts is not None and (counts.rows, counts.tokens) == (20, 2000) and "audit" in counts.source
    # one shard validated so far: its 3 rows' real lengths, the other 17 at the audit's mean of 100
    write_answers(layout.valid("00000"), [10, 20, 30], [100, 200, 300])
    counts = token_counts_for_run(layout, completions_per_prompt=2)
    assert counts is not None and (counts.rows, counts.tokens) == (20, 660 + 17 * 100)
    assert "real lengths" in counts.source and "17 more" in counts.source
    # merged: the dataset's rows alone (fewer than the audit's: some quarantined)
    write_answers(dataset_part(layout.dataset_dir, 0), [10] * 4, [5] * 4)
    layout.dataset_manifest.write_text("{}")
    counts = token_counts_for_run(layout, completions_per_prompt=2)
    assert counts is not None and (counts.rows, counts.tokens) == (4, 60)
    # the token export's exact ids decide once it exists
    layout.export_tokenized.parent.mkdir(parents=True)
    layout.export_tokenized.write_text(
        json.dumps({"id": "a", "input_ids": [1] * 7, "loss_mask": [1] * 7}) + "\n"
    )
    counts = token_counts_for_run(layout, completions_per_prompt=2)
    assert counts is not None and (counts.rows, counts.tokens) == (1, 7)
    # the export's manifest counted them while writing: read there, the export not parsed again
    layout.export_manifest.write_text(json.dumps({"tokenized": {"rows": 1, "tokens": 9}}))
    counts = token_counts_for_run(layout, completions_per_prompt=2)
    assert counts is not None and (counts.rows, counts.tokens) == (1, 9) and "manifest" in counts.source


def test_once_a_job_has_run_the_preview_rates_the_rest_at_its_pace_and_counts_each_jobs_start(
    tmp_path: Path,
) -> None:
    layout = write_audit(tmp_path / "results")
    config = load_config([str(ROOT / "config/demo.yaml")])  # shards.count: 4
    config["features"] = {"enabled": True}
    # a finished job: 1,000 tokens in 12 s, its first batch (200 tokens) written after 4 s, its engine 20 s
    pace = {"tokens": 1000, "seconds": 12.0, "prefill_s": 8.0, "waited_on_writer_s": 1.0}
    record_pace(layout.features_shard_dir("00000"), pace | {"first_batch_tokens": 200, "first_batch_s": 4.0})
    lines = preview_lines(config, layout)
    gpu = next(line for line in lines if "GPU-hours" in line)
    # after the first batch: 800 tokens in 8 s; each start: 20 s + 4 s less its 200 tokens at that pace
    assert (
        "at 100 tokens/s (measured: 800 tokens prefilled and written in 8.0 s after each job's first" in gpu
    )
    assert "with 4 job starts of 2 s" in gpu, gpu
    record_pace(
        layout.features_shard_dir("00000"),
        pace | {"first_batch_tokens": 200, "first_batch_s": 4.0, "engine_s": 20.0},
    )
    gpu = next(line for line in preview_lines(config, layout) if "GPU-hours" in line)
    assert "with 4 job starts of 22 s (engine build and first batch, measured)" in gpu, gpu
    # 1,000 tokens (the audit's) at 100 tokens/s, and 4 x 22 s: 98 s
    assert "features: 0.03 GPU-hours of prefill" in gpu, gpu
