"""The audit records the most common system prompt of the samples that go on to generation (issue 57
item 4), and the plan reads it: a long system prompt every sample starts with keeps SGLang's radix cache
on, with the reason; without it the prompts are unique and the cache goes off."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import orjson

from regen.chat import ChatTemplate
from regen.ingest.audit import AuditConfig, audit_records
from regen.ingest.audit_summary import SYSTEM_PROMPTS
from regen.io import read_json
from regen.runconfig import ServerConfig
from regen.sglang.workload import VariantShare, shared_prefixes
from regen.tune.tune import write_plan_for_workflow
from regen.tune.workload_plan import plan_for_workload, workload_from_audit_histogram
from regen.types import Message, Sample

MODELS = Path(__file__).parents[2] / "resources" / "models"
SYSTEM = "You are a careful assistant. " + "Follow the house rules to the letter. " * 20


def _samples(system: bool) -> list[Sample]:
    head = (Message("system", SYSTEM),) if system else ()
    return [
        Sample(
            f"s{i}",
            (*head, Message("user", f"question {i} " + "w " * i), Message("assistant", f"answer {i}")),
        )
        for i in range(30)
    ]


SERVER = {
    "mode": "sglang", "model_path": "unused", "model_config": str(MODELS / "qwen3-8b"),
    "gpu_memory_mib": 81920, "tp": 1, "args": [], "use_tuner": True, "sglang_version": "0.5.23",
}  # fmt: skip


def _summary(tmp_path: Path, demo_tokenizer_dir: Path, system: bool) -> Path:
    chat = ChatTemplate.from_dir(demo_tokenizer_dir)
    _, summary = audit_records(_samples(system), AuditConfig.from_dict({}), chat)
    path = tmp_path / f"summary-{system}.json"
    path.write_bytes(orjson.dumps(summary.to_json()))
    return path


def _plan(summary: Path) -> dict:
    """The tune rule's plan for the audited workload, its size left unweighed (30 samples stand for a
    large run: ``regen.sglang.run_size`` would keep SGLang's defaults for so few)."""
    workload = workload_from_audit_histogram(read_json(summary), 2048)
    assert workload.completions == 30
    planned = plan_for_workload(ServerConfig.from_mapping(SERVER), replace(workload, completions=None))
    return planned.plan.recommended | {"launch_args": list(planned.plan.launch_args)}


def test_a_shared_system_prompt_keeps_the_radix_cache(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    summary = _summary(tmp_path, demo_tokenizer_dir, system=True)
    assert read_json(summary)[SYSTEM_PROMPTS] == {
        "samples": 30, "with_system_prompt": 30, "most_common": 30, "most_common_chars": len(SYSTEM),
    }  # fmt: skip
    plan = _plan(summary)
    assert (
        "--disable-radix-cache" not in plan["launch_args"] and "--enable-cache-report" in plan["launch_args"]
    )
    kept = [r for r in plan["reasons"] if r.startswith("radix (prefix) cache kept on")]
    assert len(kept) == 1 and f"a {len(SYSTEM):,}-character system prompt starts 30 of 30 samples" in kept[0]


def test_without_one_the_prompts_are_unique(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    summary = _summary(tmp_path, demo_tokenizer_dir, system=False)
    assert read_json(summary)[SYSTEM_PROMPTS]["with_system_prompt"] == 0
    assert "--disable-radix-cache" in _plan(summary)["launch_args"]


def test_a_small_run_on_sglangs_defaults_still_says_why_the_cache_matters(
    tmp_path: Path, demo_tokenizer_dir: Path
) -> None:
    summary, out = _summary(tmp_path, demo_tokenizer_dir, system=True), tmp_path / "plan.json"
    write_plan_for_workflow(server_cfg=ServerConfig.from_mapping(SERVER), max_tokens=2048,
                            audit_summary=str(summary), out_path=str(out))  # fmt: skip
    plan = read_json(out)
    reasons = plan["recommended"]["reasons"]
    assert reasons[0].startswith("regen: SGLang's defaults for this run: 30 completions")
    assert "--disable-radix-cache" not in plan["launch_args"]
    assert any("system prompt starts 30 of 30 samples" in r for r in reasons[1:])


def test_regenerate_all_is_read_from_the_audits_own_key() -> None:
    """The summary writes its turns under ``empty_old_answers``."""
    summary = {"total": 100, "empty_old_answers": {"regenerate": "all", "old_answers": 250}}
    assert (
        "regenerate: all over 250 assistant turns"
        in shared_prefixes(summary, (VariantShare("d", 1, 1.0),))[0]
    )
