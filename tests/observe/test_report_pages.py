"""The report's own pages on data the test makes: the verdict (READY or not, and why) and the
server plan's memory map with realized values and drift."""

from __future__ import annotations

import json
from pathlib import Path

from regen.layout.run import RunLayout
from regen.observe.report import ReportInputs, RunFacts, landing_rst, readiness, server_plan_html


def write(path: Path, doc: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


GATE_OK = {"value": 0.01, "limit": 0.05, "passed": True}


def test_failed_output_gate_is_not_ready_and_points_at_the_kept_verdict(tmp_path: Path) -> None:
    results, logs = tmp_path / "results", tmp_path / "logs"
    write(results / "audit" / "summary.json", {"total": 10, "excluded": 0, "passed": True, "gates": {}})
    write(results / "reconcile.json", {"ok": True, "input": 10, "counts": {"output": 10}})
    # the re-audit job failed: Snakemake removed its output; the verdict kept beside the log remains
    truncated = {"value": 0.68, "limit": 0.2, "passed": False, "meaning": "answers cut at max_tokens"}
    write(
        logs / "reaudit.verdict.json",
        {"rows": 10, "passed": False, "gates": {"max_truncated_fraction": truncated, "min_rows": GATE_OK}},
    )
    verdict = readiness(ReportInputs.of(RunLayout.under(tmp_path)))
    assert not verdict.ready
    assert any("reaudit.max_truncated_fraction = 0.68 > limit 0.2" in r for r in verdict.reasons)
    assert any(str(logs / "reaudit.verdict.json") in r for r in verdict.reasons)
    page = landing_rst(verdict, rows=None, facts=RunFacts())
    assert page.startswith("**NOT READY**") and "`4. Output audit`_: FAILED" in page


def test_ready_needs_ready_json_and_a_clean_reconciliation(tmp_path: Path) -> None:
    results = tmp_path / "results"
    write(results / "audit" / "summary.json", {"total": 10, "excluded": 0, "passed": True, "gates": {}})
    write(results / "reaudit" / "summary.json", {"rows": 10, "passed": True, "gates": {"min_rows": GATE_OK}})
    write(results / "READY.json", {"ready": True, "rows": 10})
    write(results / "reconcile.json", {"ok": True, "input": 10, "counts": {"output": 10}})
    assert readiness(ReportInputs.of(RunLayout.under(tmp_path))).ready
    write(results / "reconcile.json", {"ok": False, "input": 10, "lost_count": 1, "counts": {"output": 9}})
    verdict = readiness(ReportInputs.of(RunLayout.under(tmp_path)))
    assert not verdict.ready and any("1 lost" in r for r in verdict.reasons)


def test_memory_map_puts_realized_beside_predicted_with_drift(tmp_path: Path) -> None:
    section = {"weights_gib": 10.0, "kv_cache_gib": 50.0, "kv_cache_tokens": 1000, "reserve_gib": 5.0}
    plan = write(
        tmp_path / "server.json",
        {"launched": "recommended", "recommended": section, "given": section, "gpu_memory_mib": 81920},
    )
    realized = write(
        tmp_path / "gpu0.realized.json",
        {
            "server_id": "gpu0",
            "realized": {"weights_gib": 10.0, "kv_cache_gib": 40.0, "max_total_num_tokens": 800},
            "startup_split": {
                "imports_s": 58.0,
                "weights_s": 20.87,
                "pools_s": None,
                "graphs_s": 111.42,
                "total_s": 193.0,
                "other_s": None,
                "source": "elapsed-lines",
            },
        },
    )
    page = server_plan_html(plan, [realized], "sglang")
    start = page[page.index("server start (s)") :]
    assert "<td>CUDA graphs</td><td>111.4</td>" in start
    assert "<td>KV and state pools</td><td>unknown</td>" in start  # never a made-up number
    assert "<td>launch to ready</td><td>193</td>" in start
    assert "gpu0 realized" in page and "gpu0 drift" in page
    assert "<td class='fail'>-20.0%</td>" in page  # KV cache 50 -> 40 GiB, and 1000 -> 800 tokens
    assert "<td>+0.0%</td>" in page  # weights as planned
    assert "simulated" not in page
    # every part is named whole in the legend; a part too narrow for its label shows none inside
    bar = page[page.index("<div class='bar'>") : page.index("<div class='legend'>")]
    assert "weights 10.0 GiB</div>" in bar and "CUDA graphs + activations 5.0 GiB</div>" not in bar
    legend = page[page.index("<div class='legend'>") :]
    assert "CUDA graphs + activations 5.0 GiB (6%)" in legend and "KV cache 50.0 GiB (62%)" in legend


def test_failed_run_landing_says_not_ready_why_and_links_nothing(tmp_path: Path) -> None:
    from regen.observe.landing import failed_run_landing

    layout = RunLayout.under(tmp_path)
    over = {"value": 1.0, "limit": 0.05, "passed": False, "meaning": "prompts over context_limit"}
    write(layout.verdict("audit"), {"total": 40, "excluded": 40, "gates": {"max_over_length_fraction": over}})
    page = failed_run_landing(ReportInputs.of(layout), RunFacts(shards=2), "snakemake.log")
    assert page.startswith("**NOT READY**")
    assert "the last run failed before it finished (Snakemake's log: snakemake.log)" in page
    assert "audit.gates.max\\_over\\_length\\_fraction = 1 > limit 0.05" in page
    assert "`_" not in page and "in 2 shards" in page


def test_idle_buckets_are_gaps_not_zero_throughput() -> None:
    import numpy as np

    from regen.observe.plots import idle_as_gaps

    shown = idle_as_gaps(np.array([0.0, 5.0, 0.0, 7.0]))
    assert np.isnan(shown[0]) and np.isnan(shown[2]) and list(shown[[1, 3]]) == [5.0, 7.0]


def test_counts_on_the_landing_page_agree_in_number() -> None:
    """Issue 34 item 14: "1 rows cut", "in 1 shards"."""
    from regen.observe.landing import _count

    assert (_count(1, "row"), _count(2, "row"), _count(1, "shard"), _count(1200, "shard")) == (
        "1 row",
        "2 rows",
        "1 shard",
        "1,200 shards",
    )
