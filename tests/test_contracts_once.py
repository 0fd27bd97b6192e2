"""Each file contract is spelled once: the dataset manifest's name, the per-shard outputs' suffix and
the config schema's path live in ``regen/layout.py``; every other module asks it. Code only: prose
(docstrings, comments) may name them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from regen.layout import CONFIG_SCHEMA, MANIFEST_NAME, SHARD_OUTPUT_SUFFIX
from regen.runconfig import config_schema

ROOT = Path(__file__).resolve().parent.parent
SPELLED = (MANIFEST_NAME, SHARD_OUTPUT_SUFFIX, CONFIG_SCHEMA.name)


def docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (or bare string statements)."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }


def python_spellings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    prose = docstrings(tree)
    return [
        f"{path}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
        if any(name in node.value for name in SPELLED)
    ]


def snakemake_spellings(path: Path) -> list[str]:
    """Lines of a rule file that spell a contract outside a comment."""
    return [
        f"{path}:{n}: {line.strip()}"
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if any(name in line.split("#", 1)[0] for name in SPELLED)
    ]


def test_the_detector_sees_a_spelled_contract(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        '"""Names _manifest.json in prose."""\nPATH = f"{ROOT}/results/generations/00000.jsonl.zst"\n'
    )
    assert [s.split(": ", 1)[1] for s in python_spellings(probe)] == [
        "'/results/generations/00000.jsonl.zst'"
    ]
    rule = tmp_path / "x.smk"
    rule.write_text('# prose: config.schema.yaml\nvalidate(config, schema="../schemas/config.schema.yaml")\n')
    assert len(snakemake_spellings(rule)) == 1


@pytest.mark.parametrize("top", ["regen", "scripts", "bench"])
def test_no_python_module_but_the_layout_spells_a_contract(top: str) -> None:
    found = [
        hit
        for path in sorted((ROOT / top).rglob("*.py"))
        if path != ROOT / "regen" / "layout.py" and "gpu" not in path.relative_to(ROOT).parts
        for hit in python_spellings(path)
    ]
    assert found == []


def test_no_rule_spells_a_contract() -> None:
    paths = [ROOT / "Snakefile", *sorted((ROOT / "rules").glob("*.smk"))]
    assert [hit for path in paths for hit in snakemake_spellings(path)] == []


def test_the_schema_is_inside_the_package_and_is_the_one_snakemake_validates_against() -> None:
    assert CONFIG_SCHEMA.is_relative_to(ROOT / "regen") and CONFIG_SCHEMA.is_file()
    assert CONFIG_SCHEMA.read_bytes() == (ROOT / "schemas" / "config.schema.yaml").read_bytes()
    # the workflow validates through regen.configfile (one line per error), whose schema is this file
    assert re.search(
        r"^    validate_config\(config, config_layers\(\)\)$",
        (ROOT / "rules" / "common.smk").read_text(),
        re.M,
    )
    assert config_schema() == yaml.safe_load(CONFIG_SCHEMA.read_text())
