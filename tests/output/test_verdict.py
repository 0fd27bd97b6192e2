"""A failed gate's details survive the failed job: kept beside the log, and the message points there."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_reaudit import GATES, merged, record

from regen.ingest.audit import AuditConfig
from regen.io import read_json
from regen.output.export import ExportConfig
from regen.output.reaudit import OutputGateError, ReauditGates, reaudit_dataset
from regen.verdict import verdict_path_for


def test_failed_output_gate_keeps_its_verdict_beside_the_log(
    tmp_path: Path, demo_tokenizer_dir: Path
) -> None:
    records = [record(i, f"Cut short {i}", f"thinking {i}", finish="length") for i in range(20)]
    dataset = merged(tmp_path, records)
    verdict = verdict_path_for(tmp_path / "logs" / "reaudit.log")
    assert verdict == tmp_path / "logs" / "reaudit.verdict.json"
    summary = tmp_path / "results" / "reaudit" / "summary.json"
    with pytest.raises(OutputGateError) as info:
        reaudit_dataset(
            dataset_dir=str(dataset),
            summary_out=str(summary),
            ready_out=str(tmp_path / "READY.json"),
            gates=ReauditGates.from_dict(GATES),
            audit=AuditConfig.from_dict({"context_limit": 4096}),
            tokenizer_dir=str(demo_tokenizer_dir),
            export=ExportConfig.from_dict({}),
            verdict_out=verdict,
        )
    assert f"Details: {verdict}" in str(info.value)
    summary.unlink()  # what Snakemake does to a failed job's outputs
    kept = read_json(verdict)
    assert kept["passed"] is False and kept["gates"]["max_truncated_fraction"]["value"] == 1.0
