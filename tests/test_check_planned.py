"""``regen check`` repeats the last plan's headline numbers, each with the SGLang rule it follows (issue 33
item 6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from regen.check import cli, planned_notes
from regen.layout.run import RunLayout
from regen.sglang.models import ModelShape
from regen.sglang.plan import Workload
from regen.sglang.recommend import recommend, write_plan_file

ROOT = Path(__file__).resolve().parent.parent
DEMO_MODEL = ROOT / "resources/demo-model/config.json"


def test_check_names_the_rule_of_the_planned_kv_tokens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "results"
    assert planned_notes(results) == []  # no plan yet: nothing said
    workload = Workload(prompt_p50=35, prompt_p99=238, max_tokens=512)
    rec = recommend(ModelShape.from_config(DEMO_MODEL), 81920, 1, [], workload, allow_fp8_kv=False,
                    allow_bf16_state=False)  # fmt: skip
    plan = RunLayout(results=results).server_plan
    write_plan_file(plan, rec, sglang_version="0.5.23", model_config=str(DEMO_MODEL), gpu_memory_mib=81920)
    kv_rule = rec.recommended.rules()["kv_cache_tokens"]
    assert kv_rule
    cli(["--configfile", str(ROOT / "config" / "demo.yaml"), "--results", str(results)])
    out = capsys.readouterr()
    (line,) = [ln for ln in (out.out + out.err).splitlines() if "planned (" in ln]
    assert f"KV tokens {rec.recommended.kv_cache_tokens:,} ({kv_rule})" in line
    assert "running cap " in line and "weights (GiB) " in line
