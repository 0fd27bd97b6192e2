"""SGLang's pool configurators per attention family, on real public configs (resources/models/*/SOURCE).

Measured truths: SGLang 0.5.17 on the H200 (143,771 MiB), dummy weights, the flags ``regen tune
--sglang-version 0.5.17 --gpu-memory-mib 143771 --prompt-p50 300 --prompt-p99 2000 --max-tokens 8192``
recommended on main (issue 33). The weights SGLang logged are put in the shape here, so these tests
check the pools alone (the weights are regen.sglang.weights' job).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from regen.sglang.models import ModelShape
from regen.sglang.plan import PlanError, UnmodelledError, plan
from regen.sglang.pools import kv_pool, state_bytes_per_request
from regen.sglang.pools.base import PoolFlags
from regen.sglang.pools.mla import MLAPool

MODELS = Path(__file__).parents[2] / "resources" / "models"
H200_MIB = 143771
GIB = 1 << 30


def shape(name: str, weights_gib: float | None = None) -> ModelShape:
    model = ModelShape.from_config(MODELS / name)
    if weights_gib is None:
        return model
    return dataclasses.replace(model, weights_bytes_from_index=int(weights_gib * GIB))


def pool_flags(**kw: object) -> PoolFlags:
    base = dict(
        tp=1, kv_cache_dtype="auto", page_size=1, draft_layers_in_cell=0, max_running_requests=None,
        disable_radix_cache=True, chunked_prefill_size=8192, overlap_schedule=True, speculative=False,
        speculative_draft_tokens=0, swa_full_tokens_ratio=0.8, sglang_version="0.5.17",
    )  # fmt: skip
    return PoolFlags(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "weights_gib", "args", "kv_tokens", "swa_tokens"),
    [
        # gpt-oss-20b (MXFP4, sliding window 128 on half the layers): SWAChunkCapPoolConfigurator
        ("gpt-oss-20b", 15.0, "--max-running-requests 267 --cuda-graph-max-bs-decode 267", 4_852_022, 85_004),
        ("mixtral-8x7b", 87.0, "--max-running-requests 100", 335_724, None),
        # Nemotron-3-Nano (Mamba2 hybrid): 6 attention layers of 52 hold KV, 23 Mamba2 layers state
        ("nemotron-3-nano-30b-a3b", 58.9, "--max-running-requests 243", 10_100_000, None),
    ],
)
def test_measured_h200_pools(
    name: str, weights_gib: float, args: str, kv_tokens: int, swa_tokens: int | None
) -> None:
    flags = ["--mem-fraction-static", "0.92", "--disable-radix-cache", *args.split()]
    p = plan(shape(name, weights_gib), H200_MIB, 1, flags, None, "0.5.17")
    assert p.kv_cache_tokens == pytest.approx(kv_tokens, rel=0.01)
    whole = plan(shape(name), H200_MIB, 1, flags, None, "0.5.17")  # with regen.sglang.weights' estimate
    assert whole.weights_gib == pytest.approx(weights_gib, rel=0.02)
    assert whole.kv_cache_tokens == pytest.approx(kv_tokens, rel=0.01)
    assert p.swa_tokens == swa_tokens  # exact: 257 x 267 + 2 x 8192 + 1 for gpt-oss


@pytest.mark.parametrize(
    ("name", "cap", "kv_tokens"),
    [
        ("llama-3.1-8b", 90, 925_436),
        ("qwen3-8b", 80, 820_732),
        ("qwen3-30b-a3b", 76, 776_358),
        pytest.param(
            "qwen3.5-35b-a3b",
            248,
            2_537_851,  # GDN hybrid (Qwen3.6-35B-A3B's shape)
            marks=pytest.mark.xfail(
                strict=True,
                reason="regen.sglang.weights puts 65.3 GiB on this multimodal config (vision tower as a "
                "ViT), 0.8 GiB over the 64.6 GiB that reproduced SGLang's KV: planner-weights' to settle",
            ),
        ),
    ],
)
def test_the_families_already_exact_stay_exact(name: str, cap: int, kv_tokens: int) -> None:
    flags = ["--mem-fraction-static", "0.92", "--max-running-requests", str(cap), "--disable-radix-cache"]
    p = plan(shape(name), H200_MIB, 1, flags, None, "0.5.17")
    assert p.kv_cache_tokens == pytest.approx(kv_tokens, rel=0.001)


def test_swa_request_cap_follows_compute_swa_request_cap() -> None:
    model = shape("gpt-oss-20b")
    flags = pool_flags(max_running_requests=100, sglang_version="0.5.23")
    sizes = kv_pool(model, "0.5.23").size(model, 40 * GIB, flags)
    per_request = (128 - 1) + 128 + 1 + 1  # window (sliding_window - 1) + eviction interval + page + decode
    assert sizes.swa_tokens == per_request * 100 + 2 * 8192 + 1
    per_layer = 8 * (64 + 64) * 2  # kv heads x (head_dim + v_head_dim) x bf16
    assert sizes.kv_cache_tokens == (40 * GIB - sizes.swa_tokens * per_layer * 12) // (per_layer * 12)
    assert "SWARequestCapPoolConfigurator" in sizes.rule
    overlap_off = kv_pool(model, "0.5.23").size(
        model, 40 * GIB, dataclasses.replace(flags, overlap_schedule=False)
    )
    assert overlap_off.swa_tokens == sizes.swa_tokens - 8192  # one prefill chunk in flight, not two


def test_swa_without_a_cap_splits_by_the_ratio() -> None:
    model = shape("gpt-oss-20b")
    sizes = kv_pool(model, "0.5.17").size(model, 40 * GIB, pool_flags())
    per_layer = 8 * 128 * 2
    assert sizes.kv_cache_tokens == int(40 * GIB // (per_layer * 12 + 0.8 * per_layer * 12))
    assert sizes.swa_tokens == int(sizes.kv_cache_tokens * 0.8)
    assert "HybridSWAPoolConfigurator" in sizes.rule


def test_mla_cell_is_the_latent_replicated_on_every_rank() -> None:
    for name in ("deepseek-v3", "kimi-k2"):
        model = shape(name)
        pool = kv_pool(model, "0.5.23")
        assert isinstance(pool, MLAPool)
        # (kv_lora_rank 512 + qk_rope_head_dim 64) x 61 layers x bf16, the same at tp 1 and tp 8
        assert pool.cell_bytes(model, pool_flags(tp=8)) == pool.cell_bytes(model, pool_flags()) == 70_272
        assert pool.cell_bytes(model, pool_flags(tp=8), draft_layers=1) == 576 * 62 * 2  # + the MTP layer


def test_dsa_indexer_adds_its_keys() -> None:
    v3 = shape("deepseek-v3")
    raw = {**v3.raw, "architectures": ["DeepseekV32ForCausalLM"], "index_topk": 2048, "index_head_dim": 128}
    v32 = ModelShape.from_dict(raw, source="deepseek-v3 as V3.2")
    indexer = (128 + 128 // 128 * 4) * 61  # index_head_dim + fp32 scale per 128, uint8, per layer
    assert MLAPool().cell_bytes(v32, pool_flags(tp=8)) == 70_272 + indexer


def test_mamba2_state_follows_mamba2_state_shape() -> None:
    model = shape("nemotron-3-nano-30b-a3b")
    conv_dim = 64 * 64 + 2 * 8 * 128  # heads x head_dim + 2 x n_groups x state
    per_layer = conv_dim * 3 * 2 + 64 * 64 * 128 * 4  # conv (K-1) in bf16 + temporal in fp32
    assert state_bytes_per_request(model, 1) == 23 * per_layer
    assert state_bytes_per_request(model, 2) == 23 * (conv_dim // 2 * 3 * 2 + 32 * 64 * 128 * 4)
    assert kv_pool(model, "0.5.17").cell_bytes(model, pool_flags()) == 2 * 256 * 6 * 2  # '*' layers only


def test_unmodelled_families_are_said_not_guessed() -> None:
    with pytest.raises(UnmodelledError, match="is_hybrid_swa_model"):
        plan(shape("llama-4-scout"), H200_MIB, 8, [], None, "0.5.17")
    spec = ["--speculative-algorithm", "EAGLE", "--max-running-requests", "64", "--disable-radix-cache"]
    with pytest.raises(UnmodelledError, match="speculative"):
        plan(shape("gpt-oss-20b", 15.0), H200_MIB, 1, spec, None, "0.5.17")


def test_a_swa_pool_that_leaves_no_full_pool_is_refused() -> None:
    huge = ["--max-running-requests", "400000", "--disable-radix-cache"]
    with pytest.raises(PlanError, match="leaves no room"):
        plan(shape("gpt-oss-20b", 15.0), H200_MIB, 1, huge, None, "0.5.17")


def test_the_swa_pool_is_read_from_sglangs_log_and_compared() -> None:
    from regen.sglang.realized import compare, parse_startup_log

    flags = ["--mem-fraction-static", "0.92", "--disable-radix-cache", "--max-running-requests", "267"]
    p = plan(shape("gpt-oss-20b"), H200_MIB, 1, flags, None, "0.5.17")
    log = "SWAKVPool mem usage: 113.00 GB, swa size: 85004, full size: 4852022\nmax_total_num_tokens=4852022"
    realized = parse_startup_log(log)
    assert realized.swa_tokens == 85_004 and realized.max_total_num_tokens == 4_852_022
    assert compare(p, realized, tolerance=0.01) == []
    assert (
        compare(p, parse_startup_log(log.replace("85004", "42502")), tolerance=0.01)[0].field == "swa_tokens"
    )


@pytest.mark.parametrize("name", ["deepseek-v3", "kimi-k2"])
def test_mla_targets_at_tp_8_plan_the_latent_cell(name: str) -> None:
    """At tp 8 (one H200 host) the KV of DeepSeek-V3 / Kimi-K2 is the budget over SGLang's MLA cell,
    70,272 B a token on every rank (issue 33: regen had read it as 128-head attention, 359,168 B)."""
    p = plan(shape(name), H200_MIB, 8, ["--mem-fraction-static", "0.9"], None, "0.5.23")
    assert p.kv_cell_bytes == 70_272
    assert p.kv_cache_tokens == int(p.kv_cache_gib * GIB) // 70_272
    assert "MLA cell" in p.kv_pool_rule
