"""Shared prefixes keep SGLang's radix cache (issue 57 item 4): several completions per prompt,
``regenerate: all`` over multi-turn samples and a shared system prompt turn the planner's
``--disable-radix-cache`` off, with the reason and the cache report in the plan."""

from __future__ import annotations

from pathlib import Path

from regen.ingest.audit_summary import SYSTEM_PROMPTS, SystemPrompts
from regen.io import read_json, write_json
from regen.runconfig import GenerateConfig, ServerConfig
from regen.sglang.models import ModelShape
from regen.sglang.recommend import recommend
from regen.sglang.search import CACHE_REPORT_FLAG
from regen.sglang.workload import VariantShare, Workload, shared_prefixes
from regen.tune.tune import write_plan_for_workflow
from regen.tune.workload_plan import variant_shares, workload_from_audit_histogram

MODELS = Path(__file__).parents[2] / "resources" / "models"
H200_MIB = 143771
NO_TRADEOFFS = {"allow_fp8_kv": False, "allow_bf16_state": False}
ONE = (VariantShare("default", 1, 1.0),)


def _turns(regenerate: str, old_answers: int, total: int = 100) -> dict:
    return {"total": total, "empty_answers": {"regenerate": regenerate, "old_answers": old_answers}}


def test_unique_prompts_without_a_shared_prefix() -> None:
    assert shared_prefixes({}, ONE) == ()
    assert shared_prefixes(_turns("all", 100), ONE) == ()  # one assistant turn a sample: nothing extends
    assert shared_prefixes(_turns("last", 300), ONE) == ()  # only the last turn is sent
    short = {SYSTEM_PROMPTS: {"samples": 100, "most_common": 90, "most_common_chars": 40}}
    rare = {SYSTEM_PROMPTS: {"samples": 1000, "most_common": 20, "most_common_chars": 4000}}
    assert shared_prefixes(short, ONE) == shared_prefixes(rare, ONE) == ()


def test_each_cause_of_a_shared_prefix_is_named() -> None:
    four = variant_shares(GenerateConfig.from_dict({"sampling": {"n": 4}}))
    assert "4 completions per prompt" in shared_prefixes({}, four)[0]
    two_variants = (VariantShare("a", 1, 1.0), VariantShare("b", 1, 0.0))
    assert "2 completions per prompt" in shared_prefixes({}, two_variants)[0]
    assert "regenerate: all over 250 assistant turns in 100" in shared_prefixes(_turns("all", 250), ONE)[0]
    system = {SYSTEM_PROMPTS: {"samples": 100, "most_common": 30, "most_common_chars": 2000}}
    assert "2,000-character system prompt starts 30 of 100" in shared_prefixes(system, ONE)[0]
    assert len(shared_prefixes({**system, **_turns("all", 250)}, four)) == 3


def test_system_prompts_find_the_most_common_in_bounded_memory() -> None:
    counter = SystemPrompts(slots=4)
    common = [{"role": "system", "content": "x" * 600}, {"role": "user", "content": "q"}]
    for i in range(400):
        if i % 3 == 0:
            counter.add(common)
        elif i % 3 == 1:
            counter.add([{"role": "system", "content": f"unique {i}"}, {"role": "user", "content": "q"}])
        else:
            counter.add([{"role": "user", "content": f"no system {i}"}])
    out = counter.to_json()
    assert len(counter.counts) <= 4
    assert out["samples"] == 400 and out["with_system_prompt"] == 267
    # Misra-Gries: a lower bound, low by at most samples / slots
    assert 134 - 400 // 4 <= out["most_common"] <= 134 and out["most_common_chars"] == 600
    assert SystemPrompts().to_json()["most_common"] == 0


def test_shared_prompts_keep_the_radix_cache_and_plan_the_same_kv() -> None:
    dense = ModelShape.from_config(MODELS / "qwen3-8b")
    unique = Workload(prompt_p50=1000, prompt_p99=3000, max_tokens=4096, expected_output_tokens=900)
    shared = Workload(
        prompt_p50=1000, prompt_p99=3000, max_tokens=4096, expected_output_tokens=900,
        shared_prefixes=("4 completions per prompt",),
    )  # fmt: skip
    off = recommend(dense, H200_MIB, 1, [], unique, "0.5.23", **NO_TRADEOFFS)
    on = recommend(dense, H200_MIB, 1, [], shared, "0.5.23", **NO_TRADEOFFS)
    assert "--disable-radix-cache" in off.args and CACHE_REPORT_FLAG not in off.args
    assert "--disable-radix-cache" not in on.args and CACHE_REPORT_FLAG in on.args
    kept = [r for r in on.reasons if r.startswith("radix (prefix) cache kept on")]
    assert len(kept) == 1 and "4 completions per prompt" in kept[0] and "rem_total_tokens" in kept[0]
    # the tree's KV is evictable and SGLang's admission counts it free: the same pool, the same client
    assert on.recommended.kv_cache_tokens == off.recommended.kv_cache_tokens
    assert on.recommended.client_concurrency == off.recommended.client_concurrency


def test_a_hybrid_with_shared_prompts_plans_its_state_slots() -> None:
    hybrid = ModelShape.from_config(MODELS / "gpu-qwen3.6-27b-text")
    wl = Workload(prompt_p50=261, prompt_p99=261, max_tokens=2048, expected_output_tokens=636)
    off = recommend(hybrid, H200_MIB, 1, [], wl, "0.5.23", **NO_TRADEOFFS)
    on = recommend(hybrid, H200_MIB, 1, [], Workload(**{**_fields(wl), "shared_prefixes": ("n",)}), "0.5.23",
                   **NO_TRADEOFFS)  # fmt: skip
    assert "--disable-radix-cache" in off.args and "--disable-radix-cache" not in on.args
    assert "--max-mamba-cache-size" in on.args
    assert any("state pool holds the slots per running request" in r for r in on.reasons)
    # the tree keeps a state per cached prefix: more slots per request, fewer requests than radix off
    assert on.recommended.effective_max_running_requests <= off.recommended.effective_max_running_requests


def _fields(wl: Workload) -> dict:
    return {f: getattr(wl, f) for f in wl.__dataclass_fields__}


def test_the_tune_rule_keeps_the_cache_for_n_above_one(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    write_json(summary, {"prompt_tokens_p50": 300, "prompt_tokens_p99": 900, "total": 10})
    cfg = {
        "mode": "sglang", "model_path": "unused", "model_config": str(MODELS / "qwen3-8b"),
        "gpu_memory_mib": 81920, "tp": 1, "args": [], "use_tuner": True, "sglang_version": "0.5.23",
    }  # fmt: skip
    for n, out in ((1, tmp_path / "one.json"), (4, tmp_path / "four.json")):
        variants = variant_shares(GenerateConfig.from_dict({"sampling": {"n": n}}))
        write_plan_for_workflow(server_cfg=ServerConfig.from_mapping(cfg), max_tokens=2048,
                                audit_summary=str(summary), out_path=str(out), variants=variants)  # fmt: skip
    one, four = read_json(tmp_path / "one.json"), read_json(tmp_path / "four.json")
    assert "--disable-radix-cache" in one["launch_args"]
    assert "--disable-radix-cache" not in four["launch_args"] and CACHE_REPORT_FLAG in four["launch_args"]
    assert any("4 completions per prompt" in r for r in four["recommended"]["reasons"])
    # the provisional plan (prestart) reads the same summary and variants: the same workload
    prestart = workload_from_audit_histogram(read_json(summary), 2048, variants)
    assert prestart.shared_prefixes and not prestart.unique_prompts
