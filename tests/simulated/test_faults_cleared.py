"""A config that clears the stand-in's faults clears them (issue 58 item 7): config files merge key by key
(as Snakemake merges them), so a later file's ``faults: {}`` keeps the demo's rates, and
``faults: {enabled: false}`` turns every fault off, down to the ``--faults`` the server is launched with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from regen.configfile import load_config
from regen.runconfig import RunConfig
from regen.serving.simulated_mode import build_simulated_command
from regen.simulated.faults import Faults

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "config" / "demo.yaml"


def launched_faults(tmp_path: Path, faults_yaml: str) -> Faults:
    """The faults the simulated server gets for the demo config plus a file setting ``faults_yaml``."""
    over = tmp_path / "over.yaml"
    over.write_text(f"server: {{simulated: {{faults: {faults_yaml}}}}}\n")
    run = RunConfig.from_config(load_config([DEMO, over]))
    argv = build_simulated_command(run.server, 31000, "demo-model")
    return Faults.from_json(json.loads(argv[argv.index("--faults") + 1]))


def test_enabled_false_clears_the_demo_s_faults(tmp_path: Path) -> None:
    demo = launched_faults(tmp_path, "{seed: 7}")
    assert demo.error_rate > 0 and demo.think_leak_rate > 0  # the demo's rates: what must be cleared
    assert launched_faults(tmp_path, "{}") == demo  # the trap: an empty mapping merges into the demo's
    assert launched_faults(tmp_path, "{enabled: false}") == Faults()


def test_enabled_true_keeps_the_rates_and_a_bad_value_is_named() -> None:
    assert Faults.from_json({"error_rate": 0.1, "enabled": True}) == Faults(error_rate=0.1)
    with pytest.raises(ValueError, match="enabled must be true or false"):
        Faults.from_json({"enabled": "no"})
