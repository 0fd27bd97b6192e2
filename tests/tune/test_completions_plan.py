"""The plan counts completions, not prompts (issue 52 item 4): the remaining work of a run of sampling
variants is prompts x the variants' n less the completions journaled, the whole-run projection and its
GPU-hours scale with it, and ``regen check`` says so (and that a pilot made for another count is stale)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from regen.io import write_json
from regen.runconfig import GenerateConfig
from regen.tune.projection import completion_notes, count_remaining, project
from tests.tune.test_sweep import make_samples, write_shards

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = {"variants": [{"name": "hot", "temperature": 0.9, "n": 3}, {"name": "plain", "thinking": "off"}]}


def journal_run(root: Path, ids: list[str]) -> tuple[Path, Path, list[str]]:
    """Two prompt shards of 10 prompts; ``ids`` of the first shard's completions journaled."""
    results, work = root / "results", root / "work"
    samples = make_samples(10, prefix="p")
    write_shards(samples, (), [results / "shards" / "00000.parquet", results / "shards" / "00001.parquet"])
    from regen.ingest.shards import read_shard

    first = [s.id for s in read_shard(results / "shards" / "00000.parquet")]
    journal = work / "journal" / "00000.jsonl"
    journal.parent.mkdir(parents=True)
    with open(journal, "w") as fh:
        for rid in ids:
            fh.write(json.dumps({"kind": "record", "id": rid.format(first=first[0])}) + "\n")
    return results, work, first


def test_remaining_counts_every_completion_of_every_variant(tmp_path: Path) -> None:
    done = ["{first}/hot/0", "{first}/hot/2", "{first}/plain/0", "{first}"]  # the bare id is no completion
    results, work, _ = journal_run(tmp_path, done)
    generate = GenerateConfig.from_dict(VARIANTS)
    assert generate.completions_per_prompt == 4
    remaining = count_remaining(results, work, generate)
    assert (remaining.samples, remaining.completions, remaining.finished) == (10, 40, 3)
    assert remaining.remaining == 37
    # one completion per prompt (no variants): the sample ids themselves, as before
    plain = count_remaining(results, work, GenerateConfig.from_dict({}))
    assert (plain.completions, plain.finished, plain.remaining) == (10, 1, 9)
    # GPU-hours of the whole run grow with the completions at the same rate and tokens per completion
    one, four = (project(n, 100.0, 50.0, gpus=2, tp=1) for n in (plain.completions, remaining.completions))
    assert four.gpu_hours == 4 * one.gpu_hours


def test_regen_check_says_the_completions_and_a_stale_pilot(tmp_path: Path) -> None:
    generate = GenerateConfig.from_dict(VARIANTS)
    pilot = tmp_path / "results" / "plan" / "pilot.json"
    (note,) = completion_notes(generate, pilot)
    assert "4 completions per prompt (hot 3, plain 1)" in note and "4 x the prompts" in note
    write_json(pilot, {"projection": {}, "remaining": {"completions_per_sample": 1}})
    assert "counted 1 completion(s) per prompt, the config asks for 4" in completion_notes(generate, pilot)[1]
    assert completion_notes(GenerateConfig.from_dict({}), pilot) == []
    variants = tmp_path / "variants.yaml"
    variants.write_text(json.dumps({"generate": VARIANTS}))
    args = [
        "check",
        "--configfile",
        "config/demo.yaml",
        str(variants),
        "--results",
        str(tmp_path / "results"),
    ]
    run = subprocess.run([sys.executable, "-m", "regen.cli", *args], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert (
        "4 completions per prompt (hot 3, plain 1)" in run.stdout and "counted 1 completion(s)" in run.stdout
    )
