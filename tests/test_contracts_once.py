"""Each file contract is spelled once: the dataset manifest's name, the per-shard outputs' suffix, the
config schema's path and the names of the files beside another file (the journal's index and lock, a
log's verdict, the export's side files, the sweep's scratch) live in the ``regen/layout/`` package; every
other module asks it. Code only: prose (docstrings, comments) may name them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from regen.layout.beside import (
    ScratchShardFiles,
    eval_split_beside,
    failure_note,
    journal_index,
    journal_lock,
    thinking_beside,
    token_freq_beside,
    verdict_for,
)
from regen.layout.names import CONFIG_SCHEMA, MANIFEST_NAME, SHARD_OUTPUT_SUFFIX
from regen.layout.run import RunLayout
from regen.runconfig import config_schema
from regen.verdict import verdict_path_for

ROOT = Path(__file__).resolve().parent.parent
SPELLED = (
    MANIFEST_NAME,
    SHARD_OUTPUT_SUFFIX,
    CONFIG_SCHEMA.name,
    ".verdict.json",
    "token_freq.json",
    "thinking.jsonl",
    ".records.jsonl",
)
#: suffixes too short to look for inside other strings: a string (or an f-string's literal part) that is
#: exactly one of them (``f"{stem}.eval{suffix}"``)
SPELLED_EXACTLY = (".eval",)
#: suffixes appended to a file's name, as a string of their own (``p.name + ".index"``); in an f-string
#: they end another name (``f"port-{port}.lock"``: the machine-wide port locks, no run path)
APPENDED = (".index", ".lock")


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
    in_fstrings = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    return [
        f"{path}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
        if any(name in node.value for name in SPELLED)
        or node.value in SPELLED_EXACTLY
        or (node.value in APPENDED and id(node) not in in_fstrings)
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
    beside = tmp_path / "beside.py"
    beside.write_text(
        'INDEX = p.name + ".index"\nEVAL = f"{p.stem}.eval{p.suffix}"\nLOCK = p.name + ".lock"\n'
        'OK = "model.safetensors.index.json"\nPORT = f"port-{port}.lock"\n'
    )
    assert [s.split(": ", 1)[1] for s in python_spellings(beside)] == ["'.index'", "'.eval'", "'.lock'"]


def test_the_files_beside_a_file_are_named_as_before() -> None:
    """Literally what the rules spelled at their old homes produced (journal, journal_writer, verdict,
    export, sweep, pilot, generation) for a sample layout: moving them changed no path."""
    run = RunLayout.under("/srv/run")
    journal = run.journal("00007")
    assert str(journal_index(journal)) == "/srv/run/work/journal/00007.jsonl.index"
    assert str(journal_lock(journal)) == "/srv/run/work/journal/00007.jsonl.lock"
    assert str(verdict_for(run.log("reaudit"))) == "/srv/run/logs/reaudit.verdict.json"
    assert str(run.verdict("audit")) == "/srv/run/logs/audit.verdict.json"
    assert verdict_path_for("logs/audit.log") == verdict_for("logs/audit.log")  # the scripts' name
    assert str(eval_split_beside(run.export_specforge)) == "/srv/run/results/export/specforge.eval.jsonl"
    assert str(run.export_tokenized_eval) == "/srv/run/results/export/tokenized.eval.jsonl"
    assert str(thinking_beside(run.export_tokenized)) == "/srv/run/results/export/thinking.jsonl"
    assert str(run.export_thinking) == "/srv/run/results/export/thinking.jsonl"
    assert str(token_freq_beside(run.export_tokenized)) == "/srv/run/results/export/token_freq.json"
    assert str(run.export_token_freq) == "/srv/run/results/export/token_freq.json"
    cand = run.sweep_candidate(3)
    assert str(cand.root) == "/srv/run/work/sweep/cand03"
    assert str(cand.servers) == "/srv/run/work/sweep/cand03/servers"
    assert str(cand.logs) == "/srv/run/work/sweep/cand03/logs"
    assert str(cand.server_log) == "/srv/run/work/sweep/cand03/logs/gpu0.log"
    assert str(cand.warmup_dir) == "/srv/run/work/sweep/cand03/warmup"
    assert str(cand.pilot_journal) == "/srv/run/work/sweep/cand03/journal.jsonl"
    assert [str(p) for p in ScratchShardFiles.in_dir(cand.warmup_dir).all()] == [
        "/srv/run/work/sweep/cand03/warmup/journal.jsonl",
        "/srv/run/work/sweep/cand03/warmup/records.jsonl",
        "/srv/run/work/sweep/cand03/warmup/failed.jsonl",
    ]
    assert [str(p) for p in ScratchShardFiles.beside(cand.pilot_journal).all()] == [
        "/srv/run/work/sweep/cand03/journal.jsonl",
        "/srv/run/work/sweep/cand03/journal.records.jsonl",
        "/srv/run/work/sweep/cand03/journal.failed.jsonl",
    ]
    assert str(run.sweep_candidate(12).root) == "/srv/run/work/sweep/cand12"
    assert str(run.failure_notes_dir()) == "/srv/run/work/servers/failures"
    assert str(run.failure_notes_dir("4242")) == "/srv/run/work/servers/slurm-4242/failures"
    assert (
        str(failure_note(run.failure_notes_dir(), "0123abcd"))
        == "/srv/run/work/servers/failures/0123abcd.txt"
    )
    # relative, as the workflow's RUN is
    assert str(journal_index(RunLayout().journal("00000"))) == "work/journal/00000.jsonl.index"
    assert str(RunLayout().verdict("reaudit")) == "logs/reaudit.verdict.json"


@pytest.mark.parametrize("top", ["regen", "scripts", "bench"])
def test_no_python_module_but_the_layout_spells_a_contract(top: str) -> None:
    found = [
        hit
        for path in sorted((ROOT / top).rglob("*.py"))
        if not path.is_relative_to(ROOT / "regen" / "layout") and "gpu" not in path.relative_to(ROOT).parts
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
