"""The typed server config and plan file: built once, defaults only from the schema."""

from __future__ import annotations

import pytest
import yaml

from regen.runconfig import CONFIG_SCHEMA_PATH, ServerConfig, ServerConfigError
from regen.sglang.config import PlanFile
from regen.sglang.server import build_simulated_command, simulated_running_cap


def test_every_default_comes_from_the_schema() -> None:
    schema = yaml.safe_load(CONFIG_SCHEMA_PATH.read_text())["properties"]["server"]["properties"]
    cfg = ServerConfig.from_mapping({})
    for name, prop in schema.items():
        if name == "simulated":
            continue
        value = getattr(cfg, name)
        assert (list(value) if isinstance(value, tuple) else value) == prop["default"], name
    assert cfg.simulated.token_rate == schema["simulated"]["properties"]["token_rate"]["default"]
    assert cfg.planned_model == cfg.model_path == "Qwen/Qwen3-8B"


def test_a_bad_value_names_its_field() -> None:
    with pytest.raises(ServerConfigError, match=r"server\.port_base"):
        ServerConfig.from_mapping({"port_base": "eighty"})
    with pytest.raises(ServerConfigError, match="not_a_field"):
        ServerConfig.from_mapping({"not_a_field": 1})


def test_the_launched_section_is_the_one_the_tuner_recorded() -> None:
    plan = {
        "launch_args": ["--max-running-requests", "8"],
        "launched": "given",
        "given": {"effective_max_running_requests": 8},
        "recommended": {"effective_max_running_requests": 32},
    }
    given = PlanFile.from_json(plan)
    assert given is not None and given.launched_section == {"effective_max_running_requests": 8}
    cfg = ServerConfig.from_mapping({"mode": "simulated"})
    assert simulated_running_cap(cfg, given) == 8  # the simulated server runs what was launched
    assert simulated_running_cap(cfg, PlanFile.from_json({**plan, "launched": "recommended"})) == 32
    argv = build_simulated_command(cfg, 31000, "demo-model", given)
    assert argv[argv.index("--max-running-requests") + 1] == "8"
    with pytest.raises(ValueError, match="launched"):
        PlanFile.from_json({**plan, "launched": "both"})
