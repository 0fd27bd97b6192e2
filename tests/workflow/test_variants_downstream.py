"""Downstream of sampling variants (issue 52 items 3 and 5), from the outside: a real Snakemake run on
simulated servers with two variants of two completions each (one thinking and sampled, one greedy without
thinking), then what a user reads: the audit judged each prompt once, reconcile accounts for every
completion, every completion of a prompt sits on one side of the eval split, the greedy variant's identical
completions are flagged and left out of the exports, export lines carry the variant, and the re-audit and
``regen status`` break rows and truncation (inside the reasoning apart from inside the answer) down by
variant."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from support.workflow import copy_workflow, free_port_base, regen, snakemake

from bench.workflow import write_chats
from regen.observe.pages import reaudit_page_html
from regen.output.split import row_side
from regen.truncation import IN_ANSWER, IN_REASONING

PROMPTS = 30
LEAKED = "p-07"  # its prompt is the benchmark's: contaminated, judged once, no completion generated
BENCH = (
    "explain in detail why the planets of the inner solar system are rocky while the outer planets are "
    "mostly gas and ice"
)
VARIANTS = {"think": 2, "greedy": 2}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wd = copy_workflow(tmp_path_factory.mktemp("variants") / "wf")
    questions = [f"question {i}: how do tides and the number {i * 7} relate, briefly" for i in range(PROMPTS)]
    rows = [(f"p-{i:02d}", BENCH if f"p-{i:02d}" == LEAKED else q, "old") for i, q in enumerate(questions)]
    write_chats(wd / "data" / "variants.jsonl", rows)
    (wd / "data" / "bench.jsonl").write_text(json.dumps({"prompt": BENCH}) + "\n")
    (wd / "config" / "variants.yaml").write_text(
        f"""
dataset: {{path: data/variants.jsonl, id_column: id}}
audit:
  decontamination: {{benchmarks: [{{name: bench, path: data/bench.jsonl}}]}}
shards: {{count: 2}}
generate:
  sampling: {{max_tokens: 150}}
  truncation: {{in_answer: keep, in_reasoning: keep}}
  variants:
    - {{name: think, thinking: "on", temperature: 0.8, n: 2}}
    - {{name: greedy, thinking: "off", temperature: 0, n: 2}}
server:
  port_base: {free_port_base(2)}
  simulated: {{faults: {{enabled: false}}}}
validate: {{quarantine_truncated: false}}
reaudit: {{override_gates: true}}
export: {{eval_fraction: 0.4, drop_duplicate_completions: true, max_length: null}}
"""
    )
    done = snakemake(
        wd, "--cores", "2", "--configfile", "config/demo.yaml", "config/variants.yaml", timeout=600
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return wd


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def dataset_rows(wd: Path) -> list[dict]:
    return ds.dataset(str(wd / "results" / "dataset"), format="parquet").to_table().to_pylist()


def test_the_audit_judges_each_prompt_once_and_reconcile_counts_every_completion(run: Path) -> None:
    audit = read_json(run / "results" / "audit" / "summary.json")
    assert audit["total"] == PROMPTS and audit["contaminated"] == 1  # prompts, not completions
    excluded = [
        json.loads(x) for x in (run / "results" / "audit" / "excluded.jsonl").read_text().splitlines()
    ]
    assert [e["id"] for e in excluded] == [LEAKED]
    assert not [r for r in dataset_rows(run) if r["sample_id"] == LEAKED]
    rec = read_json(run / "results" / "reconcile.json")
    assert rec["ok"] and rec["input"] == (PROMPTS - 1) * sum(VARIANTS.values()) + 1
    assert (
        rec["counts"]["output"] + rec["counts"]["quarantine"] + rec["counts"]["failed"] == (PROMPTS - 1) * 4
    )


def test_every_completion_of_a_prompt_is_on_one_side_of_the_eval_split(run: Path) -> None:
    sides: dict[str, set[str]] = defaultdict(set)
    for r in dataset_rows(run):
        sides[r["sample_id"]].add(row_side(r["messages"], 0.4))
    assert all(len(s) == 1 for s in sides.values())
    assert {s for one in sides.values() for s in one} == {"train", "eval"}
    assert read_json(run / "results" / "reaudit" / "summary.json")["eval_split"]["prompts_on_both_sides"] == 0


def test_identical_completions_are_flagged_and_left_out_of_the_exports(run: Path) -> None:
    rows = dataset_rows(run)
    by_id = {r["id"]: r for r in rows}
    flagged = [r for r in rows if r["duplicate_of"]]
    # the greedy variant repeats itself; the sampled one does not
    assert flagged and {r["variant"] for r in flagged} == {"greedy"} and all(r["k"] == 1 for r in flagged)
    for r in flagged:
        first = by_id[r["duplicate_of"]]
        assert (first["sample_id"], first["variant"], first["k"]) == (r["sample_id"], "greedy", 0)
        assert first["messages"][-1] == r["messages"][-1]
    # the re-audit counts them apart: the duplicate-answer gate holds repeats across prompts only
    summary = read_json(run / "results" / "reaudit" / "summary.json")
    assert summary["duplicate_completions"]["rows"] == len(flagged) <= summary["duplicate_answers"]
    gate = summary["gates"]["max_duplicate_fraction"]["value"]
    assert gate == (summary["duplicate_answers"] - len(flagged)) / summary["rows"] < len(flagged) / len(rows)
    export = run / "results" / "export"
    manifest = read_json(export / "manifest.json")
    assert manifest["left_out"]["duplicate_completion"] == len(flagged)
    lines = [json.loads(x) for f in ("specforge.jsonl", "specforge.eval.jsonl") for x in (export / f).open()]
    exported = {line["id"] for line in lines}
    assert exported and not exported & {r["id"] for r in flagged}
    assert all(line["id"] == f"{line['sample_id']}/{line['variant']}/{line['k']}" for line in lines)
    tokenized = [json.loads(x) for x in (export / "tokenized.jsonl").open()]
    assert {t["variant"] for t in tokenized} == set(VARIANTS)


def test_the_reaudit_and_status_break_truncation_down_by_variant(run: Path) -> None:
    summary = read_json(run / "results" / "reaudit" / "summary.json")
    variants = summary["variants"]
    assert set(variants) == set(VARIANTS) and len(set(summary["settings_fingerprints"].values())) == 2
    think, greedy = variants["think"], variants["greedy"]
    assert think["thinking"] == think["rows"] and greedy["thinking"] == 0
    # a budget of 150 cuts some thinking answers inside the reasoning, others after it; no thinking: never
    assert think["truncated_where"][IN_REASONING] > 0 and think["truncated_where"][IN_ANSWER] > 0
    assert greedy["truncated_where"][IN_REASONING] == 0
    assert think["completion_tokens"]["p50"] > greedy["completion_tokens"]["p50"]  # thinking off: shorter
    total = summary["truncated_where"]
    assert (
        total[IN_REASONING] + total[IN_ANSWER]
        == summary["truncated"]
        == sum(v["truncated"] for v in variants.values())
    )
    status = regen(run, "status")
    assert status.returncode == 0, status.stderr
    said = status.stdout
    assert "by sampling variant" in said
    line = next(x for x in said.splitlines() if x.strip().startswith("think:"))
    assert f"in the reasoning {think['truncated_where'][IN_REASONING]:,}" in line
    page = reaudit_page_html(run / "results" / "reaudit" / "summary.json", run / "nowhere.json")
    assert "by sampling variant" in page and "truncated in reasoning" in page
