"""``regen tune --configfile``: the config is read one way (``regen.configfile.load_config``), its sections
typed; the answer budget is ``--max-tokens`` or ``generate.sampling.max_tokens``, whose one default is
the schema's."""

from __future__ import annotations

from pathlib import Path

import pytest

from regen.runconfig import section_schema
from regen.tune.tune import cli

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "resources" / "demo-model" / "config.json"


def _reason(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert cli([*argv, "--gpu-memory-mib", "81920"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "reason: client in flight" in x]
    return line


def test_a_file_with_only_server_and_generate_plans_with_its_max_tokens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(f"server: {{model_config: {MODEL}}}\ngenerate: {{sampling: {{max_tokens: 777}}}}\n")
    assert "+ max_tokens 777 " in _reason(capsys, ["--configfile", str(config)])
    assert "+ max_tokens 555 " in _reason(capsys, ["--configfile", str(config), "--max-tokens", "555"])


def test_without_a_config_the_schema_s_max_tokens_is_planned(capsys: pytest.CaptureFixture[str]) -> None:
    default = section_schema("generate")["properties"]["sampling"]["properties"]["max_tokens"]["default"]
    assert f"+ max_tokens {default:,} " in _reason(capsys, ["--model-config", str(MODEL)])


def test_a_config_error_names_the_key_and_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "typo.yaml"
    config.write_text(f"server: {{model_config: {MODEL}, gpu_memry_mib: 1}}\n")
    assert cli(["--configfile", str(config)]) == 2
    err = capsys.readouterr().err
    assert "server.gpu_memry_mib (" in err and "typo.yaml" in err and "did you mean gpu_memory_mib" in err
