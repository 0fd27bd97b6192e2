"""The pilot file's one reader (regen.pilot_file.PilotFile) against files the test writes: the sweep's
report read back typed, an old or hand-made pilot with fewer sections read as absent, a field of the wrong
type refused with the file and the field named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from regen.pilot_file import PilotFile, PilotFileError
from regen.tune.sweep import write_pilot

REPORT = {
    "created_at": 1.0e9,
    "candidates": [
        {"label": "recommended", "args": ["--max-running-requests", "64"], "ok": True, "error": None,
         "concurrency": 64, "out_tok_s": 900.0, "rate_tok_s": 1000.0, "req_s": 2.5,
         "lengths": {"p50": 300, "p99": 900}, "ramp_s": 4.0},
        {"label": "given", "args": [], "ok": False, "error": "out of memory"},
    ],
    "best_index": 0,
    "best_args": ["--max-running-requests", "64"],
    "remaining": {"completions_per_sample": 4},
    "projection": {"remaining_samples": 40, "tokens_per_sample": 500.0, "out_tok_s_per_server": 1000.0,
                   "gpus": 2, "tp": 1, "servers": 2, "wall_s": 10.0, "gpu_hours": 0.01, "lower_bound": True},
    "projection_closed_loop": {"step_model": {"fixed_s": 0.01, "per_request_s": 0.0001, "basis": "fit"}},
}  # fmt: skip


def test_the_sweeps_report_reads_back_typed(tmp_path: Path) -> None:
    path = tmp_path / "plan" / "pilot.json"
    written = write_pilot(path, REPORT)
    read = PilotFile.read(path)
    assert read == written
    assert read is not None and read.best is not None and read.best.label == "recommended"
    assert read.best.rate == 1000.0 and read.best.ramp_s == 4.0 and read.candidates[1].rate == 0.0
    assert read.projection is not None and read.projection.lower_bound
    assert read.projection.projection.servers == 2
    assert read.completions_per_sample == 4 and read.best_args == ("--max-running-requests", "64")
    assert read.step_model == {"fixed_s": 0.01, "per_request_s": 0.0001, "basis": "fit"}


def test_missing_sections_read_as_absent(tmp_path: Path) -> None:
    assert PilotFile.read(tmp_path / "none.json") is None
    path = tmp_path / "pilot.json"
    path.write_text(json.dumps({"candidates": [], "projection": {}}))
    pilot = PilotFile.read(path)
    assert pilot is not None and pilot.best is None and pilot.projection is None
    assert pilot.step_model is None and pilot.completions_per_sample == 1


@pytest.mark.parametrize(
    ("doc", "named"),
    [
        ([], "not a JSON object"),
        ({"candidates": {}}, "candidates is dict"),
        ({"projection_closed_loop": [1]}, "projection_closed_loop is list"),
        ({"candidates": [{"label": "x", "concurrency": "many"}]}, "candidate 'x'"),
    ],
)
def test_a_wrong_field_is_refused_naming_file_and_field(tmp_path: Path, doc: object, named: str) -> None:
    path = tmp_path / "pilot.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(PilotFileError, match=named) as err:
        PilotFile.read(path)
    assert str(path) in str(err.value)
    with pytest.raises(PilotFileError):
        write_pilot(tmp_path / "out.json", doc)  # type: ignore[arg-type]
    assert not (tmp_path / "out.json").exists()  # the writer never writes what the reader refuses


def test_the_projection_written_is_the_one_read(tmp_path: Path) -> None:
    """tune's projection is the pilot file's class (one definition): what ``project`` makes, written as
    the sweep writes it, reads back equal, ``lower_bound`` beside it."""
    from regen.tune.projection import project

    made = project(40, 500.0, 1000.0, gpus=2, tp=1)
    path = tmp_path / "pilot.json"
    path.write_text(json.dumps({"candidates": [], "projection": {**made.to_json(), "lower_bound": False}}))
    pilot = PilotFile.read(path)
    assert pilot is not None and pilot.projection is not None and not pilot.projection.lower_bound
    assert pilot.projection.projection == made and pilot.projection.fields["wall_h"] == made.wall_s / 3600
