"""Long stages (the audit, the merge, the export) show rows/s and an ETA on the console and in
``regen status``, from one progress file per stage under ``work/status/stages/``."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from support.valid_shards import make_valid_shards

from regen.layout.run import RunLayout
from regen.observe.stage_progress import (
    StageProgress,
    dataset_rows,
    parquet_rows,
    read_stages,
    stage_lines,
    tracked,
)
from regen.observe.status import status_report
from regen.output.merge import MergeConfig, merge


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_a_stage_prints_rows_per_second_and_eta_and_writes_its_file(tmp_path: Path) -> None:
    layout = RunLayout.under(tmp_path)
    clock, console = Clock(), io.StringIO()
    progress = StageProgress("merge", 1000, layout.stage_progress("merge"), every_s=10, console=console,
                             clock=clock)  # fmt: skip
    for _ in range(5):
        clock.t += 5
        progress.advance(100)  # 100 rows every 5 s: 20 rows/s
    lines = console.getvalue().splitlines()
    assert lines[0] == "regen: merge: started, 1,000 rows to go"
    assert len(lines) == 3  # at the start, then every 10 s, not once per call
    assert lines[-1].startswith("regen: merge: 400/1,000 rows (40.0%), 20 rows/s, ETA ")
    assert lines[-1].endswith("(in 30s)")
    (state,) = read_stages(layout)
    assert (state.stage, state.done, state.total, state.finished) == ("merge", 400, 1000, False)
    clock.t += 2
    # the file (400 rows at +20 s) is 7 s old: 600 rows at 20 rows/s, less those 7 s
    assert stage_lines(layout, clock.t)[0].endswith("(in 23s)")
    progress.advance(500)
    progress.finish()
    assert console.getvalue().splitlines()[-1] == "regen: merge: done, 1,000 rows in 27s (37 rows/s)"
    assert stage_lines(layout, clock.t + 3600) == ["merge: done, 1,000 rows in 27s (37 rows/s)"]


def test_regen_status_shows_a_running_stage_and_a_stopped_one(tmp_path: Path) -> None:
    layout = RunLayout.under(tmp_path)
    clock = Clock()
    export = StageProgress("export", 10_000, layout.stage_progress("export"), every_s=0, clock=clock)
    clock.t += 10
    export.advance(2_500)
    text = status_report(layout.work, layout.results, now=clock.t + 1)
    assert "export: 2,500/10,000 rows (25.0%), 250 rows/s, ETA " in text and "(in 29s)" in text
    text = status_report(layout.work, layout.results, now=clock.t + 600)
    assert "export: 2,500/10,000 rows (25.0%); no update for 10m00s (stopped?)" in text
    assert not list(layout.status_dir.glob("*.json")), "stage files must not read as shard statuses"


def test_the_merge_counts_every_row_it_writes(tmp_path: Path) -> None:
    valid = make_valid_shards(tmp_path, [3, 4])
    layout = RunLayout.under(tmp_path)
    total = parquet_rows(valid)
    assert total == 7
    progress = StageProgress("merge", total, layout.stage_progress("merge"), console=io.StringIO())
    merge(valid, tmp_path / "dataset", MergeConfig.from_dict({}), {}, progress=progress)
    state = json.loads(layout.stage_progress("merge").read_text())
    assert (state["done"], state["total"], state["finished"]) == (7, 7, True)


def test_the_audit_hook_counts_a_stream_and_finishes_it(tmp_path: Path) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(12)))
    assert dataset_rows(data) == 12 and dataset_rows(tmp_path / "x.json") is None
    layout = RunLayout.under(tmp_path)
    progress = StageProgress("audit", dataset_rows(data), layout.stage_progress("audit"))
    assert list(tracked(iter(range(12)), progress)) == list(range(12))
    (state,) = read_stages(layout)
    assert (state.done, state.total, state.finished) == (12, 12, True)


@pytest.mark.parametrize("stage", ["merge", "export"])
def test_a_silent_stage_writes_nothing(tmp_path: Path, stage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    progress = StageProgress.silent(stage)
    progress.advance(5)
    progress.finish()
    assert not (tmp_path / "work").exists()
