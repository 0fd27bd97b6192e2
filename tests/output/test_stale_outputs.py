"""regen.output.stale on a run tree the test makes: what another plan left is moved aside and named,
what this run remakes is removed, the journals stay."""

from __future__ import annotations

from pathlib import Path

from regen.layout import RunLayout
from regen.output.stale import PlannedOutputs, RemadeOutputs, orphan_outputs, settle_outputs


def touch(path: Path, text: str = "x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def four_shard_run(layout: RunLayout) -> None:
    for k in ("00000", "00001", "00002", "00003"):
        touch(layout.shard(k))
        touch(layout.records(k))
        touch(layout.failed(k))
        touch(layout.valid(k))
        touch(layout.quarantine(k))
        touch(layout.status(k))
        touch(layout.journal(k))
    touch(layout.export_manifest)
    touch(layout.ready, '{"ready": true}')
    touch(layout.report_html)
    touch(layout.verdict("reaudit"))
    touch(layout.failed_run_landing)


TWO_SHARDS = PlannedOutputs(shards=frozenset({"00000", "00001"}), export=False, publish=False)


def test_orphans_are_the_shards_and_exports_the_plan_does_not_name(tmp_path: Path) -> None:
    layout = RunLayout.under(tmp_path)
    four_shard_run(layout)
    orphans = {str(p.relative_to(tmp_path)) for p in orphan_outputs(layout, TWO_SHARDS)}
    assert (
        "results/generations/00002.jsonl.zst" in orphans
        and "results/generations/00003.failed.jsonl" in orphans
    )
    assert "results/shards/00003.parquet" in orphans and "work/status/00002.json" in orphans
    assert "results/export" in orphans
    assert not any("00000" in o or "00001" in o or "journal" in o for o in orphans)
    with_export = PlannedOutputs(TWO_SHARDS.shards, export=True, publish=False)
    assert "results/export" not in {str(p.relative_to(tmp_path)) for p in orphan_outputs(layout, with_export)}


def test_settle_moves_orphans_aside_and_removes_what_the_run_remakes(tmp_path: Path) -> None:
    layout = RunLayout.under(tmp_path)
    four_shard_run(layout)
    remade = RemadeOutputs(
        outputs=(layout.ready, layout.records("00001")),
        rules=frozenset({"reaudit", "generate", "report_assets"}),
        generated_shards=frozenset({"00001"}),
    )
    lines = settle_outputs(layout, TWO_SHARDS, remade, "report_assets", now=0)
    text = "\n".join(lines)
    assert "belong to another config or plan" in text and str(layout.records("00002")) in text
    stale = layout.stale_dir / "19700101-000000"
    assert (stale / "results/generations/00002.jsonl.zst").is_file()
    assert (stale / "results/export/manifest.json").is_file()
    assert (stale / "results/report.html").is_file() and str(layout.report_html) in text
    assert not layout.records("00002").exists() and not layout.export_dir.exists()
    # remade: removed, not moved; the other shards' files and every journal stay
    assert not layout.ready.exists() and not layout.records("00001").exists()
    assert not layout.status("00001").exists() and not layout.verdict("reaudit").exists()
    assert not layout.failed_run_landing.exists()
    assert layout.records("00000").is_file() and layout.status("00000").is_file()
    assert all(layout.journal(k).is_file() for k in ("00000", "00001", "00002", "00003"))
    # a second start finds nothing of another plan
    assert (
        settle_outputs(layout, TWO_SHARDS, RemadeOutputs((), frozenset(), frozenset()), "report_assets") == []
    )
