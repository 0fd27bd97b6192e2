"""regen.output.stale on a run tree the test makes: what another plan left is moved aside and named,
what this run remakes is removed, the journals stay."""

from __future__ import annotations

from pathlib import Path

from regen.layout.run import RunLayout
from regen.output.kept_runs import Kept, keep_run, kept_line
from regen.output.stale import (
    Identities,
    KeptOutputs,
    PlannedOutputs,
    RemadeOutputs,
    orphan_outputs,
    settle_outputs,
)
from regen.run_marker import ResultsOf


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
    """The same config's own partial work (no READY): orphans moved aside, remade outputs removed."""
    layout = RunLayout.under(tmp_path)
    four_shard_run(layout)
    layout.ready.unlink()
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
    assert not layout.records("00001").exists()
    assert not layout.status("00001").exists() and not layout.verdict("reaudit").exists()
    assert not layout.failed_run_landing.exists()
    assert layout.records("00000").is_file() and layout.status("00000").is_file()
    assert all(layout.journal(k).is_file() for k in ("00000", "00001", "00002", "00003"))
    assert not layout.earlier_runs_dir.exists()
    # a second start finds nothing of another plan
    assert (
        settle_outputs(layout, TWO_SHARDS, RemadeOutputs((), frozenset(), frozenset()), "report_assets") == []
    )


def test_a_ready_run_the_same_config_remakes_is_kept_whole(tmp_path: Path) -> None:
    layout = RunLayout.under(tmp_path)
    four_shard_run(layout)
    remade = RemadeOutputs(
        outputs=(layout.ready, layout.records("00001")),
        rules=frozenset({"reaudit", "generate"}),
        generated_shards=frozenset({"00001"}),
    )
    ours = ResultsOf("demo", "id-a")
    lines = settle_outputs(
        layout, TWO_SHARDS, remade, "report_assets", now=0, identities=Identities(ours, ours)
    )
    kept = layout.earlier_run("19700101-000000", "demo") / "results"
    assert lines == [kept_line(Kept(kept, new=True), ours, layout)] and "READY run of config demo" in lines[0]
    assert f"regen reconcile --results {kept}" in lines[0]
    for k in ("00000", "00001", "00002", "00003"):
        assert (kept / "generations" / f"{k}.jsonl.zst").is_file()
    assert (kept / "READY.json").read_text() == '{"ready": true}' and (
        kept / "export/manifest.json"
    ).is_file()
    # the live tree: READY and the remade shard gone, the orphans gone, what is reused stays
    assert not layout.ready.exists() and not layout.records("00001").exists()
    assert not layout.records("00002").exists() and not layout.export_dir.exists()
    assert layout.records("00000").is_file()
    assert all(layout.journal(k).is_file() for k in ("00000", "00001", "00002", "00003"))


def test_another_configs_run_is_kept_whole_and_leaves_results(tmp_path: Path) -> None:
    layout = RunLayout.under(tmp_path)
    four_shard_run(layout)
    layout.ready.unlink()  # a failed run of config A: finished generations, no READY
    reused = KeptOutputs(
        paths=frozenset({layout.shard("00000"), layout.shard("00001")}), rules=frozenset({"shard"})
    )
    ids = Identities(ResultsOf("a", "id-a"), ResultsOf("b", "id-b"), reused)
    lines = settle_outputs(
        layout, TWO_SHARDS, RemadeOutputs((), frozenset(), frozenset()), "r", now=0, identities=ids
    )
    kept = layout.earlier_run("19700101-000000", "a") / "results"
    assert len(lines) == 1 and "the earlier run of config a is kept whole in" in lines[0]
    assert (kept / "generations" / "00003.jsonl.zst").is_file() and (
        kept / "shards" / "00002.parquet"
    ).is_file()
    # only what the current DAG reuses is left in results/
    left = sorted(str(p.relative_to(tmp_path)) for p in layout.results.rglob("*") if p.is_file())
    assert left == ["results/shards/00000.parquet", "results/shards/00001.parquet"]
    assert not any(layout.status_dir.glob("*.json")) and not layout.verdict("reaudit").exists()
    assert all(layout.journal(k).is_file() for k in ("00000", "00001", "00002", "00003"))


def test_large_files_are_kept_by_hard_link_small_ones_by_copy(tmp_path: Path) -> None:
    """A kept run costs no copy of its large files, and a tool rewriting a small one in place
    (``snakemake --report`` over report.html) cannot change the kept copy."""
    layout = RunLayout.under(tmp_path)
    four_shard_run(layout)
    big = layout.records("00000")
    big.write_bytes(b"x" * (1 << 20))
    kept = keep_run(layout, ResultsOf("demo", "id"), now=0).results
    assert (kept / "generations" / big.name).stat().st_ino == big.stat().st_ino
    assert (kept / "report.html").stat().st_ino != layout.report_html.stat().st_ino
    layout.report_html.write_text("a newer report")
    assert (kept / "report.html").read_text() == "x"
