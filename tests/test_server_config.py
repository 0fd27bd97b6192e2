"""The typed server config and plan file: built once, defaults only from the schema."""

from __future__ import annotations

import pytest
import yaml

from regen.runconfig import (
    CONFIG_SCHEMA_PATH,
    ConfigError,
    GenerateConfig,
    RunConfig,
    ServerConfig,
    ServerConfigError,
)
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


def test_every_generate_default_comes_from_the_schema() -> None:
    """The generate section, typed, holds the schema's defaults (no default is written in regen/)."""
    schema = yaml.safe_load(CONFIG_SCHEMA_PATH.read_text())["properties"]["generate"]["properties"]
    cfg = GenerateConfig.from_dict({})
    for name, prop in schema.items():
        if name in ("sampling", "journal_sync", "extra_body"):
            continue
        assert getattr(cfg, name) == prop["default"], name
    for name, prop in schema["sampling"]["properties"].items():
        assert getattr(cfg.sampling, name) == prop.get("default", ()), name
    for name, prop in schema["journal_sync"]["properties"].items():
        assert getattr(cfg.journal_sync, name) == prop["default"], name
    assert cfg.extra_body == ()


@pytest.mark.parametrize(
    ("section", "where"),
    [
        ({"thinking": "maybe"}, r"generate\.thinking"),
        ({"sampling": {"n": 2}}, r"generate\.sampling\.n"),
        ({"sampling": {"max_tokens": 0}}, r"generate\.sampling\.max_tokens"),
        ({"concurrency": 0}, r"generate\.concurrency"),
        ({"retry_max_tokens_factor": 0.5}, r"generate\.retry_max_tokens_factor"),
        ({"sampling": {"thinking": {"top_q": 1}}}, r"generate\.sampling\.thinking"),
    ],
)
def test_the_schema_rules_the_generate_section(section: dict, where: str) -> None:
    with pytest.raises(ConfigError, match=where):
        GenerateConfig.from_dict(section)


def test_the_run_config_is_built_once_from_every_section() -> None:
    run = RunConfig.from_config({"generate": {"concurrency": 3}, "server": {"gpus": 4}})
    assert run.generate.concurrency == 3 and run.server.gpus == 4 and run.gpu_slots == 4
    assert RunConfig.from_config({}, gpu_slots=2).gpu_slots == 2  # --resources gpu=N wins
    assert (
        run.tokenizer == yaml.safe_load(CONFIG_SCHEMA_PATH.read_text())["properties"]["tokenizer"]["default"]
    )


def test_no_config_default_is_written_in_regen_outside_the_schema() -> None:
    """No ``.get(key, default)`` or field default in regen/ repeats a config key's schema default (the
    schema is its one home); the simulated server reads SGLang request bodies (``n``), not the config."""
    import ast
    from pathlib import Path

    import regen

    def defaults(schema: dict, out: dict) -> dict:
        for key, prop in (schema.get("properties") or {}).items():
            if "default" in prop:
                out.setdefault(key, []).append(prop["default"])
            defaults(prop, out)
        if isinstance(schema.get("items"), dict):
            defaults(schema["items"], out)
        return out

    schema_defaults = defaults(yaml.safe_load(CONFIG_SCHEMA_PATH.read_text()), {})
    root = Path(regen.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "simulated.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):  # a field's default
                value = node.value
                named = schema_defaults.get(node.target.id, [])
                if isinstance(value, ast.Constant) and value.value is not None and value.value in named:
                    found.append(
                        f"{path.relative_to(root)}:{node.lineno}: {node.target.id} = {value.value!r}"
                    )
                continue
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr != "get" or len(node.args) != 2:
                continue
            key, default = node.args
            if not (isinstance(key, ast.Constant) and isinstance(default, ast.Constant)):
                continue
            if default.value is not None and default.value in schema_defaults.get(key.value, []):
                found.append(f"{path.relative_to(root)}:{node.lineno}: get({key.value!r}, {default.value!r})")
    assert not found, found
