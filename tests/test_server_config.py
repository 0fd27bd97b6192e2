"""The typed server config and plan file: built once, defaults only from the schema."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

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
from regen.serving.simulated_mode import build_simulated_command, simulated_running_cap
from regen.sglang.config import PlanFile


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
        if name == "variants":  # typed as the configured list; variants() adds the implicit default
            assert list(cfg.configured_variants) == prop["default"]
            continue
        if name == "truncation":  # typed as a policy; its setting is the schema's string form
            assert cfg.truncation.setting == prop["default"]
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
        ({"sampling": {"n": 0}}, r"generate\.sampling\.n"),
        ({"variants": [{"name": "Hot"}]}, r"generate\.variants"),
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


#: Parameters named like a config key whose default equals that key's schema default but which are not
#: that key's value (no config value reaches them; follow the callers): (file under regen/, function,
#: parameter) -> why. Every other such default is refused: the caller passes the typed config's value.
PARAMETERS_NOT_FROM_THE_CONFIG = {
    # the in-process simulated server of tests and benches binds loopback; the workflow launches the
    # simulated server by command line with server.host (regen.serving.simulated_mode.build_simulated_command)
    ("simulated/launcher.py", "start_simulated_server", "host"): "loopback host of a throwaway test server",
    # a free loopback port for a test's throwaway server (tests/generate/test_client.py); the workflow picks
    # its ports on server.host through regen.serving.ports.any_free_port(host)
    ("simulated/launcher.py", "free_port", "host"): "loopback host of a throwaway test server",
    # the seed of the random draw of output lengths from the pilot's completed lengths, not the
    # generate.sampling.seed that requests carry
    ("tune/sweep.py", "closed_loop_projection", "seed"): "random seed of the projection's length draw",
    # the same for the lengths of the truncation retries the projection counts
    ("tune/closedloop.py", "slot_tokens", "seed"): "random seed of the retries' length draw",
    # the variants' thinking shares (VariantShare, from generate.variants by variant_shares), not the config's
    # list; none: a plan without variants, exactly as before them
    **{
        (path, function, "variants"): "the variants' thinking shares, derived from generate.variants"
        for path, function in (
            ("sglang/workload.py", "workload_from_audit"),
            ("sglang/workload.py", "old_answers_expected"),
            ("tune/tune.py", "write_plan_for_workflow"),
            ("tune/workload_plan.py", "workload_from_audit_histogram"),
        )
    },
}

#: parameters that carry a config key's value under another name: parameter -> config key
PARAMETER_CONFIG_KEYS = {"fmt": "format"}


def _schema_defaults() -> dict[str, list]:
    """Every config key's schema default, by key name (a name in several sections has several)."""

    def walk(schema: dict, out: dict) -> dict:
        for key, prop in (schema.get("properties") or {}).items():
            if "default" in prop:
                out.setdefault(key, []).append(prop["default"])
            walk(prop, out)
        if isinstance(schema.get("items"), dict):
            walk(schema["items"], out)
        return out

    return walk(yaml.safe_load(CONFIG_SCHEMA_PATH.read_text()), {})


def _repeats(value: object, defaults: list) -> bool:
    """``value`` is one of ``defaults`` (a tuple as the list the schema writes; True is not 1)."""
    value = list(value) if isinstance(value, tuple) else value
    return value is not None and any(
        isinstance(value, bool) == isinstance(d, bool) and value == d for d in defaults
    )


def _parameter_defaults(tree: ast.AST) -> Iterator[tuple[str, int, ast.arg, ast.expr]]:
    """``(function, line, parameter, default)`` of every defaulted parameter, positional or keyword-only,
    of every function, method and lambda."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            positional = a.posonlyargs + a.args
            pairs = [*zip(positional[len(positional) - len(a.defaults) :], a.defaults, strict=True)]
            pairs += [(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None]
            for arg, default in pairs:
                yield getattr(node, "name", "<lambda>"), node.lineno, arg, default


def test_no_config_default_is_written_in_regen_outside_the_schema() -> None:
    """No ``.get(key, default)``, field default or parameter default in regen/ repeats a config key's
    schema default (the schema is its one home); the simulated server reads SGLang request bodies
    (``n``), not the config, so its ``.get``s and fields are not checked (its parameters are)."""
    import regen

    schema_defaults = _schema_defaults()
    root = Path(regen.__file__).parent
    found, allowed = [], set()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text())
        for function, line, arg, default in _parameter_defaults(tree):
            try:
                value = ast.literal_eval(default)
            except ValueError:  # a name or a call: no literal written here
                continue
            key = PARAMETER_CONFIG_KEYS.get(arg.arg, arg.arg)
            if not _repeats(value, schema_defaults.get(key, [])):
                continue
            if (rel, function, arg.arg) in PARAMETERS_NOT_FROM_THE_CONFIG:
                allowed.add((rel, function, arg.arg))
            else:
                found.append(f"{rel}:{line}: {function}({arg.arg}={value!r})")
        if rel.startswith("simulated/"):  # SGLang's request bodies and the stand-in's own fields
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):  # a field's default
                value = node.value
                named = schema_defaults.get(node.target.id, [])
                if isinstance(value, ast.Constant) and value.value is not None and value.value in named:
                    found.append(f"{rel}:{node.lineno}: {node.target.id} = {value.value!r}")
                continue
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr != "get" or len(node.args) != 2:
                continue
            key, default = node.args
            if not (isinstance(key, ast.Constant) and isinstance(default, ast.Constant)):
                continue
            if default.value is not None and default.value in schema_defaults.get(key.value, []):
                found.append(f"{rel}:{node.lineno}: get({key.value!r}, {default.value!r})")
    assert not found, found
    # an entry whose default is gone (or renamed) leaves the list, so the list names only what is there
    assert allowed == set(PARAMETERS_NOT_FROM_THE_CONFIG), set(PARAMETERS_NOT_FROM_THE_CONFIG) - allowed
