"""What survives the trainer's window (issue 24, item 3): coverage per window in the re-audit summary, the
report and the export manifest; export.max_length drops or keeps the rows over it, with the count."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import orjson
import pytest
from test_reaudit import merged, record
from test_reaudit import run as run_reaudit

from regen.ingest.audit import AuditConfig
from regen.io import read_json
from regen.layout.run import RunLayout
from regen.observe.report import ReportInputs, RunFacts, landing_rst, plot_trainer_window, readiness
from regen.output.export import ExportConfig, export_dataset
from regen.output.reaudit import ReauditGates, reaudit_dataset
from regen.output.window import HEADLINE_WINDOW, WINDOWS, WindowCounts, WindowCoverage

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = str(ROOT / "resources" / "demo-tokenizer")
THINK_CLOSE = 99


def test_counts_per_window_on_hand_made_rows() -> None:
    cov = WindowCoverage((4, 8, 12, 20), counts={w: WindowCounts(w) for w in (4, 8, 12, 20)})
    # 5 prompt tokens, then an answer whose think block ends at index 9 (</think>), 14 tokens in all
    ids = [1] * 5 + [2, 2, 2, 2, THINK_CLOSE] + [3] * 4
    cov.add(ids, [0] * 5 + [1] * 9, THINK_CLOSE)
    cov.add([1] * 3 + [3] * 3, [0] * 3 + [1] * 3, THINK_CLOSE)  # 6 tokens, no thinking
    doc = cov.to_json()
    assert doc["rows"] == 2 and doc["supervised_tokens"] == 12
    assert doc["configured"] is None and doc["headline"] == HEADLINE_WINDOW
    w = doc["windows"]
    assert w["4"] == {
        "rows_fit": 0.0,
        "supervised_kept": 1 / 12,
        "cut_in_think": 0,
        "cut_in_prompt": 1,
        "rows_over": 2,
    }
    assert w["8"] == {
        "rows_fit": 0.5,
        "supervised_kept": 6 / 12,
        "cut_in_think": 1,
        "cut_in_prompt": 0,
        "rows_over": 1,
    }
    assert w["12"]["cut_in_think"] == 0 and w["12"]["supervised_kept"] == 10 / 12
    assert w["20"]["rows_fit"] == 1.0 and w["20"]["supervised_kept"] == 1.0
    assert WindowCoverage.for_config(3000).windows == tuple(sorted((*WINDOWS, 3000)))


def long_records(n: int) -> list[dict[str, Any]]:
    """Answers of growing length (no server ids: the export renders them with the template)."""
    return [record(i, "word " * (60 * i + 5), "think " * (20 * i + 3)) for i in range(n)]


def export(tmp_path: Path, dataset: Path, **cfg: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    out = tmp_path / "export"
    manifest = export_dataset(
        dataset_dir=str(dataset),
        specforge_out=str(out / "specforge.jsonl"),
        tokenized_out=str(out / "tokenized.jsonl"),
        manifest_out=str(out / "manifest.json"),
        config=ExportConfig.from_dict({"eval_fraction": 0, **cfg}),
        tokenizer_dir=TOKENIZER,
        regenerate="last",
    )
    rows = [orjson.loads(x) for x in (out / "tokenized.jsonl").read_bytes().splitlines()]
    return manifest, rows


@pytest.mark.parametrize("policy", ["drop", "keep"])
def test_max_length_drops_or_keeps_rows_over_it(tmp_path: Path, policy: str) -> None:
    dataset = merged(tmp_path, long_records(30))
    _, every = export(tmp_path / "all", dataset)
    over = sum(len(r["input_ids"]) > 300 for r in every)
    assert 0 < over < len(every)
    manifest, rows = export(tmp_path, dataset, max_length=300, over_max_length=policy)
    win = manifest["trainer_window"]
    assert (
        win["max_length"] == 300 and win["configured"] == win["headline"] == 300 and "300" in win["windows"]
    )
    assert win["windows"]["300"]["rows_over"] == over
    if policy == "drop":
        assert len(rows) == len(every) - over and all(len(r["input_ids"]) <= 300 for r in rows)
        assert win["dropped"] == {"specforge_rows": over, "token_rows": over}
        assert manifest["specforge"]["rows"] == len(every) - over
    else:
        assert len(rows) == len(every) and win["dropped"] == {"specforge_rows": 0, "token_rows": 0}


def test_reaudit_coverage_matches_a_count_from_the_token_export(
    tmp_path: Path, demo_tokenizer_dir: Path
) -> None:
    dataset = merged(tmp_path, long_records(40))
    summary, _ = run_reaudit(tmp_path, dataset, demo_tokenizer_dir)
    cov = read_json(summary)["trainer_window"]
    _, rows = export(tmp_path, dataset, max_length=2048, over_max_length="keep")
    for w in (2048, 4096):
        fit = sum(len(r["input_ids"]) <= w for r in rows) / len(rows)
        assert w > 2048 or 0 < fit < 1  # the 2k window cuts some rows
        kept = sum(sum(r["loss_mask"][:w]) for r in rows) / sum(sum(r["loss_mask"]) for r in rows)
        assert cov["windows"][str(w)]["rows_fit"] == pytest.approx(fit)
        assert cov["windows"][str(w)]["supervised_kept"] == pytest.approx(kept)
    assert cov["rows"] == len(rows)
    # the report's plot draws it
    svg = tmp_path / "trainer_window.svg"
    plot_trainer_window(summary, svg)
    assert "no data" not in svg.read_text()
    assert len(ET.parse(svg).getroot().findall(".//{http://www.w3.org/2000/svg}path")) > 5


def test_landing_page_names_the_eval_split_window_coverage_and_tool_call_cuts(
    tmp_path: Path, demo_tokenizer_dir: Path
) -> None:
    recs = long_records(40)
    recs[3]["tool_call_mismatch"] = {"turn": 0, "kind": "arguments"}
    dataset = merged(tmp_path, recs)
    results = tmp_path / "results"
    summary = results / "reaudit" / "summary.json"
    summary.parent.mkdir(parents=True)
    reaudit_dataset(
        dataset_dir=str(dataset),
        summary_out=str(summary),
        ready_out=str(results / "READY.json"),
        gates=ReauditGates.from_dict(
            {"max_empty_answer_fraction": 0.05, "max_truncated_fraction": 0.2, "max_duplicate_fraction": 0.05}
        ),
        audit=AuditConfig.from_dict({"context_limit": 8192}),
        tokenizer_dir=str(demo_tokenizer_dir),
        export=ExportConfig.from_dict({"eval_fraction": 0.2, "max_length": 2048}),
    )
    doc = read_json(summary)
    page = landing_rst(readiness(ReportInputs.of(RunLayout.under(tmp_path))), RunFacts(), rows=40)
    at = doc["trainer_window"]["windows"]["2048"]
    assert f"eval split {doc['eval_split']['rows']['eval']} rows held out (20% of prompts" in page
    assert f"configured 2048-token trainer window {at['rows_fit']:.1%} of rows fit" in page
    assert "1 rows ended at a regenerated turn whose tool calls differ (arguments 1)" in page
