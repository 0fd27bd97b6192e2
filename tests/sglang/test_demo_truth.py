"""The demo tells the truth: a simulated server launched from a plan reports that plan's memory map,
and the tuner warns only about flags the user actually gave."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

import pytest

from regen.runconfig import ServerConfig
from regen.serving.simulated_mode import build_simulated_command
from regen.sglang.config import PlanFile
from regen.sglang.models import ModelShape
from regen.sglang.plan import Workload
from regen.sglang.realized import compare, parse_startup_log, realized_from_server_info
from regen.sglang.recommend import recommend, write_plan_file

DEMO_MODEL = Path(__file__).resolve().parents[2] / "resources/demo-model/config.json"
DEMO_WORKLOAD = Workload(prompt_p50=35, prompt_p99=238, max_tokens=512)


HYBRID_MODEL = Path(__file__).resolve().parents[2] / "resources/models/gpu-qwen3.6-27b-text/config.json"


def demo_plan(tmp_path: Path, args: list[str], model: Path = DEMO_MODEL) -> PlanFile:
    shape = ModelShape.from_config(model)
    rec = recommend(shape, 81920, 1, args, DEMO_WORKLOAD, allow_fp8_kv=False, allow_bf16_state=False)
    out = tmp_path / "server.json"
    write_plan_file(out, rec, sglang_version="0.5.23", model_config=str(model), gpu_memory_mib=81920)
    return PlanFile.read(out)


@pytest.mark.parametrize(
    ("model", "args"),
    [(DEMO_MODEL, []), (HYBRID_MODEL, ["--enable-linear-replayssm", "--disable-radix-cache"])],
    ids=["demo", "hybrid-replay-ring"],
)
def test_simulated_server_reports_the_memory_map_of_its_plan(
    tmp_path: Path, model: Path, args: list[str]
) -> None:
    plan = demo_plan(tmp_path, args, model)
    cfg = {"mode": "simulated", "simulated": {"startup_delay_s": 0}}
    log_file = tmp_path / "server.log"
    argv = [
        *build_simulated_command(ServerConfig.from_mapping(cfg), 0, "demo-model", plan),
        "--print-url",
        "--log-file",
        str(log_file),
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        with urllib.request.urlopen(url + "/server_info", timeout=10) as resp:
            info = json.loads(resp.read())
    finally:
        proc.terminate()
        proc.wait(10)
    realized = realized_from_server_info(info, parse_startup_log(log_file.read_text()))
    predicted = plan.launched_section
    assert realized.weights_gib == predicted["weights_gib"]
    assert realized.max_total_num_tokens == predicted["kv_cache_tokens"]
    assert compare(predicted, realized) == []
    assert (realized.replay_ring_gib or 0.0) == pytest.approx(predicted["replay_ring_gib"], abs=1e-3)
    assert (predicted["replay_ring_gib"] > 0) == ("--enable-linear-replayssm" in args)


def test_no_warning_about_flags_nobody_gave(tmp_path: Path) -> None:
    assert not any("given flags" in w for w in demo_plan(tmp_path, []).warnings)
    given = demo_plan(tmp_path, ["--max-running-requests", "4096"]).warnings
    assert any("the given flags allow" in w for w in given), given
