"""The file contract: the workflow, loaded by Snakemake itself, declares every rule's outputs, logs and
benchmarks at the paths ``RunLayout`` names; every input under the run's directories is another rule's
output or log; the report rule declares every file the report reads."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from support.workflow import copy_workflow

from regen.layout.names import ASSET_NAMES, SHARD_PATTERN, shard_name
from regen.layout.run import RUN
from regen.observe.report import ReportInputs
from regen.verdict import verdict_path_for

# Loads the workflow through Snakemake's API (the Workflow every `snakemake` command builds, with the
# Snakefile's includes, config validation and input functions) and prints each rule's declared files.
LOAD = r"""
import json, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings

def files(items):  # {name: [path, ...]} of a rule's named files, and "*": all of them in order
    out = {name: [str(v)] if isinstance(v, str) else [str(f) for f in v] for name, v in items.items()}
    out["*"] = [str(f) for f in items]
    return out

with SnakemakeApi(OutputSettings()) as api:
    workflow = api.workflow(
        resource_settings=ResourceSettings(),
        config_settings=ConfigSettings(configfiles=[Path(p) for p in sys.argv[1:]]),
        snakefile=Path("Snakefile"),
        workdir=Path.cwd(),
    )._workflow
    rules = {}
    for rule in workflow.rules:
        rules[rule.name] = {
            "output": files(rule.output),
            "log": files(rule.log),
            "benchmark": str(rule.benchmark) if rule.benchmark else None,
            "input": files(rule.input),
            "input_all": [str(f) for f in rule.input],
            "params": {k: str(v) for k, v in rule.params.items() if isinstance(v, (str, Path))},
        }
    print("RULES=" + json.dumps(rules))
"""

SHARD = "{shard}"
#: how Snakemake spells the wildcard once the workflow's constraint is applied: the layout's shard name
CONSTRAINED = f"{{shard,{SHARD_PATTERN}}}"
SHARDS = [shard_name(k) for k in range(4)]  # config/demo.yaml: shards.count 4


def s(*paths: Path) -> list[str]:
    return [str(p) for p in paths]


def per_shard(pattern: Path) -> list[str]:
    return [str(pattern).replace(SHARD, k) for k in SHARDS]


#: what RunLayout says each rule writes: {rule: ({output key: paths}, {log key: paths}, benchmark)}
EXPECTED: dict[str, tuple[dict[str, list[str]], dict[str, list[str]], str | None]] = {
    "audit": (
        {
            "summary": s(RUN.audit.summary),
            "flags": s(RUN.audit.flags),
            "excluded": s(RUN.audit.excluded),
            "samples": s(RUN.audit.samples),
            "supervised_plot": s(RUN.audit.supervised_plot),
            "prompt_plot": s(RUN.audit.prompt_plot),
        },
        {
            "verdict": s(RUN.verdict("audit")),
            "excluded": s(RUN.kept_excluded("audit")),
            "*": s(RUN.log("audit"), RUN.verdict("audit"), RUN.kept_excluded("audit")),
        },
        str(RUN.benchmark("audit")),
    ),
    "shard": (
        {"shards": per_shard(RUN.shard(SHARD))},
        {"*": s(RUN.log("shard"))},
        str(RUN.benchmark("shard")),
    ),
    "shard_count": ({"settled": s(RUN.shard_count_file)}, {"*": s(RUN.log("shard_count"))}, None),
    "tune": ({"plan": s(RUN.server_plan)}, {"*": s(RUN.log("tune"))}, None),
    "generate": (
        {"records": s(RUN.records(SHARD)), "failed": s(RUN.failed(SHARD))},
        {"*": s(RUN.log("generate", SHARD))},
        str(RUN.benchmark("generate", SHARD)),
    ),
    "validate": (
        {"valid": s(RUN.valid(SHARD)), "quarantine": s(RUN.quarantine(SHARD))},
        {"*": s(RUN.log("validate", SHARD))},
        None,
    ),
    "merge": ({"dataset": s(RUN.dataset_dir)}, {"*": s(RUN.log("merge"))}, str(RUN.benchmark("merge"))),
    "reaudit": (
        {"summary": s(RUN.reaudit_summary), "ready": s(RUN.ready)},
        {"verdict": s(RUN.verdict("reaudit")), "*": s(RUN.log("reaudit"), RUN.verdict("reaudit"))},
        None,
    ),
    "reconcile": ({"table": s(RUN.reconcile)}, {"*": s(RUN.log("reconcile"))}, None),
    "report_assets": (
        {"*": s(*(RUN.report_asset(n) for n in ASSET_NAMES))},
        {"*": s(RUN.log("report_assets"))},
        None,
    ),
    "publish": ({"record": s(RUN.published)}, {"*": s(RUN.log("publish"))}, None),
    "export": (
        {
            "specforge": s(RUN.export_specforge),
            "tokenized": s(RUN.export_tokenized),
            "specforge_eval": s(RUN.export_specforge_eval),
            "tokenized_eval": s(RUN.export_tokenized_eval),
            "token_freq": s(RUN.export_token_freq),
            "thinking": s(RUN.export_thinking),
            "manifest": s(RUN.export_manifest),
        },
        {"*": s(RUN.log("export"))},
        None,
    ),
    "features": (
        {"manifest": s(RUN.features_manifest(SHARD))},
        {"*": s(RUN.log("features", SHARD))},
        str(RUN.benchmark("features", SHARD)),
    ),
    "features_all": ({"*": []}, {"*": []}, None),
    "publish_features": (
        {"record": s(RUN.features_published(SHARD))},
        {"*": s(RUN.log("publish_features", SHARD))},
        None,
    ),
    "all": ({"*": []}, {"*": []}, None),
}


@pytest.fixture(scope="module")
def rules(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    wd = copy_workflow(tmp_path_factory.mktemp("contract") / "wd")
    run = subprocess.run(
        [sys.executable, "-c", LOAD, "config/demo.yaml"], cwd=wd, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-4000:]
    line = next(x for x in run.stdout.splitlines() if x.startswith("RULES="))
    # the per-shard outputs carry the workflow's shard-name constraint; compared without it below
    declared, constrained = line.removeprefix("RULES="), json.dumps(CONSTRAINED)[1:-1]
    assert constrained in declared
    return json.loads(declared.replace(constrained, SHARD))


def same_files(declared: dict[str, list[str]], expected: dict[str, list[str]], what: str) -> None:
    """Each named entry as expected, and nothing declared beyond the expected files."""
    named = {k: v for k, v in expected.items() if k != "*"}
    for key, paths in named.items():
        assert declared.get(key) == paths, f"{what} {key}: {declared.get(key)} (layout: {paths})"
    every = expected.get("*", [p for v in named.values() for p in v])
    assert sorted(declared["*"]) == sorted(every), f"{what}: {declared['*']} (layout: {every})"


def test_every_rule_writes_where_the_layout_says(rules: dict[str, Any]) -> None:
    assert sorted(rules) == sorted(EXPECTED), "a rule without a layout entry here, or one gone"
    for name, (outputs, logs, benchmark) in EXPECTED.items():
        same_files(rules[name]["output"], outputs, f"rule {name}: output")
        same_files(rules[name]["log"], logs, f"rule {name}: log")
        assert rules[name]["benchmark"] == benchmark, f"rule {name}: benchmark"


def test_every_input_under_the_run_is_declared_upstream(rules: dict[str, Any]) -> None:
    made = {p for r in rules.values() for p in r["output"]["*"] + r["log"]["*"]}
    made |= {p.replace(SHARD, k) for p in made if SHARD in p for k in SHARDS}
    run_dirs = tuple(f"{d}/" for d in (RUN.results, RUN.work, RUN.logs))
    for name, rule in rules.items():
        for path in rule["input_all"]:
            if path.startswith(run_dirs) or path == str(RUN.dataset_dir):
                for concrete in per_shard(Path(path)) if SHARD in path else [path]:
                    assert concrete in made, f"rule {name}: input {concrete} is no rule's output or log"


def test_the_report_rule_declares_every_file_the_report_reads(rules: dict[str, Any]) -> None:
    report = rules["report_assets"]
    # the GPU slots' files belong to the long-lived servers, not to a job: the rule names their root
    from_servers = {"realized", "restarts"}
    for f in fields(ReportInputs):
        if f.name in from_servers:
            continue
        assert f.name in report["input"], f"the report reads {f.name}, which its rule does not declare"
    assert report["params"]["servers"] == str(RUN.servers_root)
    assert report["input"]["audit_verdict"] == rules["audit"]["log"]["verdict"]
    assert report["input"]["reaudit_verdict"] == rules["reaudit"]["log"]["verdict"]
    assert report["input"]["records"] == per_shard(RUN.records(SHARD))
    assert report["input"]["failed"] == per_shard(RUN.failed(SHARD))
    assert report["input"]["quarantine"] == per_shard(RUN.quarantine(SHARD))


def test_the_names_derived_elsewhere_agree_with_the_layout() -> None:
    # the gate scripts keep their verdict beside their log (regen.verdict); the rules declare that file
    for rule in ("audit", "reaudit"):
        assert verdict_path_for(RUN.log(rule)) == RUN.verdict(rule)
    # the exporter derives its side files from the two it is given (regen.layout.*_beside): where the
    # rules declare them
    assert str(RUN.export_specforge_eval) == "results/export/specforge.eval.jsonl"
    assert str(RUN.export_tokenized_eval) == "results/export/tokenized.eval.jsonl"
    assert str(RUN.export_token_freq) == "results/export/token_freq.json"
    assert str(RUN.export_thinking) == "results/export/thinking.jsonl"
    assert Path(RUN.journal(SHARD)).parent == RUN.journal_dir
