"""The demo's exports read by the drafter trainers' own data code (``make test-trainers``).

The demo runs end to end (Snakemake, simulated servers), then ``tests/trainers/run_trainers.py``
runs in the trainers' venv (SpecForge 0.2.0, speculators 0.9.0, CPU torch): SpecForge's raw
conversation path (EAGLE3) on ``specforge.jsonl``, its pre-tokenized prompts path with the DFlash
minimums and ``speculators prepare-data`` on ``tokenized.jsonl``. Every row must survive, speculators
must carry regen's rows through unchanged, and on rows with a system turn SpecForge's own ids and
mask (``train_only_last_turn``) must equal regen's for at least 99% of them; a mismatch names its reason.

Every test runs twice: on the demo as it is, and on a run of sampling variants (issue 52: a thinking and a
no-thinking variant of two completions each, on the demo's first prompts), whose export lines carry their
sample id, variant and k beside what the trainers read.

Skipped unless ``REGEN_TRAINERS_PYTHON`` names the trainers' python (the Makefile sets it).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from support.readme_trainer_section import readme_section

from regen.chat import ChatTemplate
from regen.output.masks import completion_retokenizes_differently
from regen.output.serving import trainer_settings_markdown

ROOT = Path(__file__).resolve().parents[2]
TRAINERS_PYTHON = os.environ.get("REGEN_TRAINERS_PYTHON")
WORKFLOW_PARTS = ("Snakefile", "rules", "scripts", "schemas", "report", "envs", "config", "resources", "data")

pytestmark = [
    pytest.mark.skipif(
        not TRAINERS_PYTHON, reason="needs the trainers' venv: make test-trainers (REGEN_TRAINERS_PYTHON)"
    ),
    pytest.mark.timeout(1800),  # the demo, then the trainers' imports (torch, transformers, datasets)
]


#: the variants run: the demo's first prompts, two variants of two completions each
VARIANT_PROMPTS = 80
VARIANTS_CONFIG = """
dataset: {path: data/demo/variants.jsonl}
generate:
  variants:
    - {name: think, thinking: "on", n: 2}
    - {name: plain, thinking: "off", temperature: 0.7, n: 2}
"""


@pytest.fixture(scope="module", params=["demo", "variants"])
def demo(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled demo (or its variants run), end to end in a copy of the workflow; returns its directory."""
    wd = tmp_path_factory.mktemp(request.param)
    for part in WORKFLOW_PARTS:
        src = ROOT / part
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, wd / part)
    ports = wd / "ports.yaml"  # away from other demos on this machine
    ports.write_text(f"server:\n  port_base: {random.randrange(36000, 46000, 2)}\n")
    configs = ["config/demo.yaml", str(ports)]
    if request.param == "variants":
        lines = (wd / "data/demo/dataset.jsonl").read_text().splitlines(keepends=True)
        (wd / "data/demo/variants.jsonl").write_text("".join(lines[:VARIANT_PROMPTS]))
        (wd / "config/variants.yaml").write_text(VARIANTS_CONFIG)
        configs.append("config/variants.yaml")
    snakemake = str(Path(sys.executable).with_name("snakemake"))
    run = subprocess.run(
        [snakemake, "--cores", "2", "--configfile", *configs],
        cwd=wd,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return wd


@pytest.fixture(scope="module")
def trainers(demo: Path) -> dict[str, Any]:
    work = demo / "trainers"
    work.mkdir()
    script = ROOT / "tests" / "trainers" / "run_trainers.py"
    run = subprocess.run(
        [
            TRAINERS_PYTHON,
            str(script),
            "results/export",
            "resources/demo-tokenizer",
            str(work),  # type: ignore[list-item]
            "resources/demo-model/config.json",
        ],
        cwd=demo,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads((work / "trainers.json").read_text())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_row_survives_the_trainers_minimums(demo: Path, trainers: dict[str, Any]) -> None:
    manifest = json.loads((demo / "results/export/manifest.json").read_text())
    assert manifest["specforge"]["rows"] > 0 and manifest["tokenized"]["rows"] > 0
    assert trainers["eagle3_rows"] == manifest["specforge"]["rows"]
    assert trainers["dflash_rows"] == manifest["tokenized"]["rows"]
    assert len(trainers["speculators_rows"]) == manifest["tokenized"]["rows"]


def test_the_eval_split_goes_through_the_trainers_too(demo: Path, trainers: dict[str, Any]) -> None:
    manifest = json.loads((demo / "results/export/manifest.json").read_text())
    split = manifest["eval_split"]
    assert split["specforge_rows"] > 0 and split["prompts_on_both_sides"] == 0
    assert trainers["eval"]["eagle3_rows"] == split["specforge_rows"]
    assert trainers["eval"]["dflash_rows"] == split["tokenized_rows"]
    ours = sorted(
        [r["input_ids"], r["loss_mask"]] for r in read_jsonl(demo / "results/export/tokenized.eval.jsonl")
    )
    assert ours == sorted(trainers["eval"]["speculators_rows"])
    train = {str(r["input_ids"]) for r in read_jsonl(demo / "results/export/tokenized.jsonl")}
    assert not train & {str(r[0]) for r in ours}


def test_the_draft_vocabulary_loads_in_both_trainers(demo: Path, trainers: dict[str, Any]) -> None:
    """regen's counts equal speculators' own count over tokenized.jsonl; its d2t/t2d load through
    speculators' loader and SpecForge's draft-model loader and consistency check, and equal the mapping
    speculators builds from its own count."""
    vocab = trainers["vocab"]
    freq = json.loads((demo / "results/export/token_freq.json").read_text())
    assert vocab["counts_equal"] and vocab["total"] == freq["total"] > 0
    assert vocab["speculators_draft_vocab_size"] == 256 and vocab["speculators_mapping_equal"]
    assert vocab["specforge_vocab_loaded"] and vocab["specforge_equals_speculators"]
    assert vocab["npy_dtypes"] == ["int64", "bool"]


def test_variants_carry_through_the_trainers(demo: Path, trainers: dict[str, Any]) -> None:
    """On the variants run: both variants reach both exports, every line names its completion, and no prompt
    has completions on both sides of the eval split; the counts above held for these files too."""
    if demo.name.startswith("demo"):
        pytest.skip("the variants run only")
    export = demo / "results/export"
    manifest = json.loads((export / "manifest.json").read_text())
    assert set(manifest["variants"]) == {"think", "plain"}
    assert all(v["specforge_train"] > 0 and v["tokenized_train"] > 0 for v in manifest["variants"].values())
    sides: dict[str, set[str]] = {}
    for name, side in (("specforge", "train"), ("specforge.eval", "eval"), ("tokenized", "train")):
        for line in read_jsonl(export / f"{name}.jsonl"):
            assert line["id"] == f"{line['sample_id']}/{line['variant']}/{line['k']}"
            sides.setdefault(line["sample_id"], set()).add(side)
    assert all(len(s) == 1 for s in sides.values())
    assert len(trainers["speculators_rows"]) == manifest["tokenized"]["rows"]


def test_the_readme_shows_the_settings_of_the_demos_manifest(demo: Path) -> None:
    """The README's trainer settings are generated from the manifest
    (tests/support/readme_trainer_section.py): a fresh demo's manifest renders the same text."""
    if not demo.name.startswith("demo"):
        pytest.skip("the README shows the demo's own run")
    manifest = json.loads((demo / "results/export/manifest.json").read_text())
    assert readme_section((ROOT / "README.md").read_text()) == trainer_settings_markdown(manifest)


def test_speculators_carries_regens_rows_through(demo: Path, trainers: dict[str, Any]) -> None:
    ours = sorted(
        [r["input_ids"], r["loss_mask"]] for r in read_jsonl(demo / "results/export/tokenized.jsonl")
    )
    assert ours == sorted(trainers["speculators_rows"])


def mismatch_reason(
    ours: dict[str, Any], theirs: dict[str, Any], row: dict[str, Any], tpl: ChatTemplate
) -> str:
    if completion_retokenizes_differently(tpl, row["completion_token_ids"]):
        return "the model's ids are not its text's canonical encoding (SpecForge re-tokenizes text)"
    n = len(row["prompt_token_ids"])
    if theirs["input_ids"][:n] != ours["input_ids"][:n]:
        return "the prompt renders differently"
    if theirs["input_ids"] != ours["input_ids"]:
        return "the answer renders differently"
    first = [i for i, (a, b) in enumerate(zip(ours["loss_mask"], theirs["loss_mask"], strict=True)) if a != b]
    differing = tpl.tokenizer.decode([ours["input_ids"][i] for i in first], skip_special_tokens=False)
    if not row["thinking"] and differing == EMPTY_THINK and all(theirs["loss_mask"][i] for i in first):
        return THINKING_OFF_SCAFFOLD
    return f"masks differ from token {first[0]} of {len(ours['loss_mask'])}"


#: the block a thinking-off turn opens with: the server's chat template puts it in the generation prompt
EMPTY_THINK = "<think>\n\n</think>\n\n"
THINKING_OFF_SCAFFOLD = (
    "the empty think block of a thinking-off answer: in the prompt the server rendered (regen leaves it "
    "unsupervised), supervised by SpecForge's template (the export manifest says so)"
)


def test_specforge_ids_and_masks_equal_regens_on_rows_with_a_system_turn(
    demo: Path, trainers: dict[str, Any]
) -> None:
    tpl = ChatTemplate.from_dir(demo / "resources/demo-tokenizer")
    ours = {r["id"]: r for r in read_jsonl(demo / "results/export/tokenized.jsonl")}
    dataset = {r["id"]: r for r in ds.dataset(str(demo / "results/dataset")).to_table().to_pylist()}
    theirs = trainers["specforge_rows"]
    assert len(theirs) >= 50
    mismatches = {
        rid: mismatch_reason(ours[rid], got, dataset[rid], tpl)
        for rid, got in theirs.items()
        if got["input_ids"] != ours[rid]["input_ids"] or got["loss_mask"] != ours[rid]["loss_mask"]
    }
    print(f"SpecForge == regen on {len(theirs) - len(mismatches)}/{len(theirs)} rows with a system turn")
    for rid, why in sorted(mismatches.items()):
        print(f"  {rid}: {why}")
    # thinking-off rows (the variants run) differ by their empty think block alone, and every one of them
    scaffold = {rid for rid, why in mismatches.items() if why == THINKING_OFF_SCAFFOLD}
    off = {rid for rid in theirs if not dataset[rid]["thinking"]}
    assert scaffold <= off and all(
        rid in scaffold or mismatches[rid].startswith("the model's ids") for rid in off
    )
    manifest = json.loads((demo / "results/export/manifest.json").read_text())
    assert bool(scaffold) == ("empty think block" in manifest["specforge"]["note"])
    others = {rid: why for rid, why in mismatches.items() if rid not in scaffold}
    equal = 1 - len(others) / (len(theirs) - len(scaffold))
    assert equal >= 0.99, f"{len(others)}/{len(theirs) - len(scaffold)} rows differ: {others}"
    # every other difference is one the token export exists for, never the mask policy
    assert all(why.startswith("the model's ids") for why in others.values()), others
