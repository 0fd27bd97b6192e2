"""The README's count of the demo's planted benchmark prompts is the count the audit flags."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from regen.ingest.dataset import iter_samples
from regen.ingest.decontam import BenchmarkIndex, DecontaminationConfig

ROOT = Path(__file__).resolve().parents[2]
WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5}


def test_the_readme_counts_the_benchmark_prompts_the_audit_flags(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(ROOT)
    demo = yaml.safe_load((ROOT / "config" / "demo.yaml").read_text())
    index = BenchmarkIndex.build(DecontaminationConfig.from_dict(demo["audit"]["decontamination"]))
    samples = iter_samples(ROOT / "data/demo/dataset.jsonl", "auto", "id", "skip", demo["tokenizer"], [])
    convs = [s.messages for s in samples]
    assert len(convs) > 250
    flagged = sum(c is not None for c in index.check(convs))
    readme = (ROOT / "README.md").read_text()
    said = re.search(r"plus (\w+) carrying prompts of the made-up benchmark", readme)
    assert said is not None and WORDS[said.group(1)] == flagged == 3
