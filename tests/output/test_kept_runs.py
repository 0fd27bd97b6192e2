"""Earlier runs kept in ``work/earlier-runs/`` share their unchanged files, are not kept twice and are
pruned to the last ``keep.earlier_runs`` (issue 58 item 5), through ``settle_outputs`` as a run's start
calls it: a checkout switched between two configs many times grows by far less than a copy a switch."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest

from regen.layout.names import KEPT_INDEX
from regen.layout.run import RunLayout
from regen.output.kept_runs import KeepConfig, kept_runs, prune_kept_runs
from regen.output.stale import Identities, KeptOutputs, PlannedOutputs, RemadeOutputs, settle_outputs
from regen.run_marker import ResultsOf

BIG = 2 << 20  # each config's dataset: 2 MiB (above the hard-link size, so the live file is linked too)
PLAN = PlannedOutputs(shards=frozenset({"00000"}), export=False, publish=False)
NOTHING_REMADE = RemadeOutputs((), frozenset(), frozenset())
CONFIGS = {"a": ResultsOf("a", "id-a"), "b": ResultsOf("b", "id-b")}


def write_run(layout: RunLayout, config: str, run_no: int) -> None:
    """What a READY run of ``config`` leaves in results/: its dataset (the same bytes every time the config
    runs, written anew: a new inode), generations, and a READY.json that names the run (differs)."""
    part = layout.dataset_dir / "part-00000.parquet"
    part.parent.mkdir(parents=True, exist_ok=True)
    part.write_bytes(config.encode() * BIG)
    small = layout.records("00000")
    small.parent.mkdir(parents=True, exist_ok=True)
    small.write_text(f"records of config {config}\n" * 100)
    (layout.results / "empty").mkdir(exist_ok=True)
    layout.ready.write_text(json.dumps({"ready": True, "run": run_no, "config": config}))


def start_run(layout: RunLayout, before: str, now: str, t: float, keep_last: int) -> list[str]:
    """A run of config ``now`` starts where ``before``'s outputs lie (nothing reused)."""
    ids = Identities(CONFIGS[before], CONFIGS[now], KeptOutputs())
    return settle_outputs(layout, PLAN, NOTHING_REMADE, "r", now=t, identities=ids, keep_last=keep_last)


def bytes_on_disk(root: Path) -> int:
    """The bytes of the distinct files (inodes) under ``root``, as ``du`` counts hard links once."""
    seen: dict[tuple[int, int], int] = {}
    for path in root.rglob("*"):
        st = path.lstat()
        if path.is_file():
            seen[(st.st_dev, st.st_ino)] = st.st_size
    return sum(seen.values())


def test_many_switches_share_files_and_keep_the_last_k(tmp_path: Path) -> None:
    layout = RunLayout.under(tmp_path)
    keep = 3
    order = ["a", "b"] * 5  # 9 switches
    write_run(layout, order[0], 0)
    pruned: list[str] = []
    for i, (before, now) in enumerate(itertools.pairwise(order), start=1):
        lines = start_run(layout, before, now, t=1000.0 * i, keep_last=keep)
        assert f"the earlier READY run of config {before} is kept whole in" in lines[0], lines
        pruned += [line for line in lines[1:] if not line.startswith("  ")]
        assert not layout.ready.exists()  # results/ left to the starting run
        write_run(layout, now, i)
    runs = kept_runs(layout)
    assert len(runs) == keep
    assert [json.loads((r.results / "READY.json").read_text())["run"] for r in runs] == [6, 7, 8]
    # every kept run whole and as it was
    for r in runs:
        config = json.loads((r.results / "READY.json").read_text())["config"]
        assert (r.results / "dataset/part-00000.parquet").read_bytes() == config.encode() * BIG
        assert (r.results / "empty").is_dir()
        assert json.loads((r.folder / KEPT_INDEX).read_text())["config"] == config
    # one copy of each config's dataset among the kept runs: runs 6 and 8 (both of config a) share the inode
    inode = [(r.results / "dataset/part-00000.parquet").stat().st_ino for r in runs]
    assert inode[0] == inode[2] != inode[1]
    kept_bytes = bytes_on_disk(layout.earlier_runs_dir)
    assert kept_bytes < 2 * BIG + 100_000, kept_bytes  # a copy a switch would be 9 x 2 MiB
    # 9 runs kept, 3 stay: each pruning said what went, as older kept copies, and the folders are gone
    assert len(pruned) == 9 - keep and all("older kept cop" in p and "keep.earlier_runs" in p for p in pruned)
    # the first pruning freed run 0's small files only: its dataset (config a's) lives on in run 2
    assert "freeing 0.0 MB" in pruned[0]
    assert len([d for d in layout.earlier_runs_dir.iterdir()]) == keep


def test_a_run_identical_to_one_kept_is_not_kept_again(tmp_path: Path) -> None:
    layout = RunLayout.under(tmp_path)
    write_run(layout, "a", 1)
    start_run(layout, "a", "b", t=1.0, keep_last=5)
    write_run(layout, "a", 1)  # the same files again (a rerun of a that remade them alike)
    lines = start_run(layout, "a", "b", t=2.0, keep_last=5)
    (first,) = kept_runs(layout)
    assert lines == [lines[0]] and "is already kept whole, file for file, in" in lines[0]
    assert str(first.results) in lines[0] and f"regen reconcile --results {first.results}" in lines[0]
    assert not layout.ready.exists()
    # one byte different: kept, sharing the dataset
    write_run(layout, "a", 2)
    lines = start_run(layout, "a", "b", t=3.0, keep_last=5)
    first, second = kept_runs(layout)
    assert "is kept whole in" in lines[0] and str(second.results) in lines[0]
    shared = second.results / "dataset/part-00000.parquet"
    assert shared.stat().st_ino == (first.results / "dataset/part-00000.parquet").stat().st_ino


def test_pruning_keeps_the_run_just_kept_and_clears_a_half_kept_one(tmp_path: Path) -> None:
    layout = RunLayout.under(tmp_path)
    write_run(layout, "a", 1)
    start_run(layout, "a", "b", t=5.0, keep_last=1)
    (only,) = kept_runs(layout)
    half = layout.earlier_runs_dir / ".partial-19700101-000000-b"
    (half / "results").mkdir(parents=True)
    lines = prune_kept_runs(layout, 1, only.results)
    assert not half.exists() and "half kept" in lines[0]
    assert kept_runs(layout) == [only]
    assert prune_kept_runs(layout, 1) == []


def test_a_small_kept_file_is_a_copy_of_the_live_one(tmp_path: Path) -> None:
    """A tool that rewrites a live file in place cannot change a kept one."""
    layout = RunLayout.under(tmp_path)
    write_run(layout, "a", 1)
    live = layout.records("00000")
    before = live.read_text()
    ids = Identities(CONFIGS["a"], CONFIGS["b"], KeptOutputs(paths=frozenset({live})))
    settle_outputs(layout, PLAN, NOTHING_REMADE, "r", now=1.0, identities=ids)
    (run,) = kept_runs(layout)
    with open(live, "r+") as fh:  # rewritten in place
        fh.write("changed")
    assert (run.results / live.relative_to(layout.results)).read_text() == before
    assert os.stat(live).st_ino != os.stat(run.results / live.relative_to(layout.results)).st_ino


def test_the_keep_section_is_typed_from_the_schema() -> None:
    assert KeepConfig.from_dict(None).earlier_runs == 5
    assert KeepConfig.from_dict({"earlier_runs": 2}).earlier_runs == 2
    with pytest.raises(ValueError, match=r"keep\.earlier_runs"):
        KeepConfig.from_dict({"earlier_runs": 0})


def test_a_kept_file_rewritten_since_is_never_a_link_target(tmp_path: Path) -> None:
    """``regen reconcile --results KEPT`` rewrites reconcile.json there: a later run holding what that file
    held when kept gets its own copy, not a link to the rewritten file."""
    layout = RunLayout.under(tmp_path)
    write_run(layout, "a", 1)
    reconcile = layout.results / "reconcile.json"
    reconcile.write_text('{"ok": true, "as": "kept"}')
    start_run(layout, "a", "b", t=1.0, keep_last=5)
    (first,) = kept_runs(layout)
    (first.results / "reconcile.json").write_text('{"ok": true, "as": "rewritten in place"}')
    write_run(layout, "a", 2)
    reconcile.write_text('{"ok": true, "as": "kept"}')
    start_run(layout, "a", "b", t=2.0, keep_last=5)
    second = kept_runs(layout)[1]
    assert (second.results / "reconcile.json").read_text() == '{"ok": true, "as": "kept"}'
    assert set(first.unchanged()) == set(first.files or {}) - {"reconcile.json"}
