"""bench/projection_replay.py on a race bundle the test writes: a pilot whose unfinished answers run past
max_tokens, the run's server log, the measured generation phase."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support.decode_log import decode_log

from bench import projection_replay
from regen.tune.closedloop import StepModel


def test_the_replay_counts_retries_and_says_it_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = StepModel(0.014, 0.00015)
    batches = [64, 128] + [265] * 8 + [200, 120, 60, 20, 5, 1]
    log = decode_log(line, batches)
    (tmp_path / "run-logs" / "servers").mkdir(parents=True)
    (tmp_path / "run-logs" / "servers" / "gpu0.log").write_text(log)
    finished = [100 + 7 * k for k in range(250)]  # up to 1,843 tokens; 50 more unfinished: a long tail
    pilot = {
        "best_index": 0,
        "best_args": ["--max-running-requests", "265"],
        "candidates": [{"ramp_s": 5.0}],
        "censored_lengths": {"first_attempts": 300, "finished_lengths": finished, "unfinished": 50},
        "projection_closed_loop": {"requests": 800, "concurrency": 265, "gpu_hours": 100.0 / 3600,
                                   "step_model": {"fixed_s": 0.0, "per_request_s": 0.0002}},
    }  # fmt: skip
    (tmp_path / "pilot.json").write_text(json.dumps(pilot))
    generate = {"sampling": {"max_tokens": 2048}, "truncation": "retry", "retry_max_tokens_factor": 2}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"generate": generate}))
    measured = tmp_path / "measured.json"
    measured.write_text(json.dumps({"sweep_projection": {"measured_gpu_s": 150.0}}))

    assert projection_replay.main([str(tmp_path), str(measured), "--draws", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("step line (run): 14.00 ms + 0.1500 ms a request;")
    fields = dict(kv.split("=") for kv in out[-1].removeprefix("projection_replay: ").split())
    assert fields["measured_gpu_s"] == "150.0" and fields["recorded_gpu_s"] == "100.0"
    assert float(fields["now_gpu_s"]) > float(fields["capped_gpu_s"])  # the retries' slots, counted
    assert float(fields["ratio"]) == pytest.approx(float(fields["now_gpu_s"]) / 150.0, abs=1e-3)
    assert float(fields["error_recorded"]) == pytest.approx(-1 / 3, abs=1e-4)
