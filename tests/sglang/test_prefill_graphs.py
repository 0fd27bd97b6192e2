"""The tuner's prefill CUDA graphs (issue 37 item 2): SGLang captures one per size of
``_generate_prefill_cuda_graph_batch_sizes`` up to the chunked prefill size (58 on the H200, 34.5 s of a
warm start); the recommendation captures them only up to the refill passes its plan runs between decode
steps, where they pay (64 ms a pass with them against 141 ms without at 265 running)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from regen.sglang.alternatives import (
    refill_batch,
    refill_prefill_graph_tokens,
    with_refill_prefill_graphs,
)
from regen.sglang.flags import strip_flags
from regen.sglang.graphs import prefill_graph_batch_sizes
from regen.sglang.models import ModelShape
from regen.sglang.plan import Workload, plan
from regen.sglang.recommend import recommend
from regen.sglang.search import Choice, Target, expected_length_running

MODELS = Path(__file__).parents[2] / "resources" / "models"
H200_MIB = 143771
NO_TRADEOFFS = {"allow_fp8_kv": False, "allow_bf16_state": False}
FLAG = "--cuda-graph-max-bs-prefill"
#: short prompts, answers of a known mean: the dense planner fills the KV at the expected context
WL = Workload(prompt_p50=200, prompt_p99=300, max_tokens=2048, expected_output_tokens=600)


@pytest.fixture(scope="module")
def dense() -> ModelShape:
    return ModelShape.from_config(MODELS / "qwen3-8b")


def _values(args: Sequence[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_the_dense_recommendation_captures_prefill_graphs_up_to_its_refills(
    dense: ModelShape, version: str
) -> None:
    rec = recommend(dense, H200_MIB, 1, [], WL, version, **NO_TRADEOFFS)
    assert _values(rec.args, "--min-free-slots-delay") == ["4"]
    # 4 freed slots a refill x prompt p99 300 = 1,200 tokens: 1,280 is the next size SGLang captures
    sizes = prefill_graph_batch_sizes(rec.recommended.chunked_prefill_size)
    assert rec.recommended.chunked_prefill_size == 8192 and len(sizes) == 58
    assert _values(rec.args, FLAG) == ["1280"] and [s for s in sizes if 1200 <= s <= 1280] == [1280]
    assert rec.candidates[0].args == rec.args
    why = next(r for r in rec.reasons if r.startswith(f"{FLAG} 1280:"))
    assert "4 x prompt p99 300 = 1,200 tokens" in why and "_generate_prefill_cuda_graph_batch_sizes" in why
    assert f"{len(prefill_graph_batch_sizes(1280))} graphs instead of the 58" in why
    # the recommended plan is the one planned under the flags as launched: the graph reserve shrinks by
    # 8 MiB for each size not captured (reserve_for_graph_mb), and no KV number is the old plan's
    launched = plan(dense, H200_MIB, 1, list(rec.args), WL, version)
    r = rec.recommended
    assert r.args == rec.args
    assert (r.kv_cache_tokens, r.mem_fraction_static, r.reserve_gib, r.free_gib) == (
        launched.kv_cache_tokens, launched.mem_fraction_static, launched.reserve_gib, launched.free_gib
    )  # fmt: skip
    unsized = plan(dense, H200_MIB, 1, strip_flags(list(rec.args), {FLAG}), WL, version)
    assert (unsized.reserve_gib - r.reserve_gib) * 1024 == pytest.approx((58 - 39) * 8)
    assert r.kv_cache_tokens >= unsized.kv_cache_tokens


def test_the_refill_batch_follows_sglangs_resolution_of_the_delay(dense: ModelShape) -> None:
    """``min_free_slots_delayer.resolve_min_free_slots``: 0.5.17 caps a given delay at
    min(4, max(2, (cap + 5) // 6)) and turns it off below a cap of 8; 0.5.23 caps it at the cap."""
    delay = ["--min-free-slots-delay", "8"]
    assert refill_batch([], 600, "0.5.17") == refill_batch([], 600, "0.5.23") == 1
    assert (refill_batch(delay, 600, "0.5.17"), refill_batch(delay, 600, "0.5.23")) == (4, 8)
    assert (refill_batch(delay, 8, "0.5.17"), refill_batch(delay, 6, "0.5.17")) == (2, 1)
    assert refill_batch(delay, 6, "0.5.23") == 6 and refill_batch(["--min-free-slots-delay=1"], 600, "") == 1
    # the user's delay of 8: 0.5.17 prefills 4 a pass (1,280 tokens), 0.5.23 all 8 (8 x 300 -> 2,560)
    old = recommend(dense, H200_MIB, 1, delay, WL, "0.5.17", **NO_TRADEOFFS)
    new = recommend(dense, H200_MIB, 1, delay, WL, "0.5.23", **NO_TRADEOFFS)
    assert (_values(old.args, FLAG), _values(new.args, FLAG)) == (["1280"], ["2560"])
    assert _values(new.args, "--min-free-slots-delay") == ["8"]  # the user's, as given


def test_one_refill_a_pass_and_never_below_512(dense: ModelShape) -> None:
    few = recommend(dense, H200_MIB, 1, [], replace(WL, target_concurrency=4), "0.5.17", **NO_TRADEOFFS)
    assert few.recommended.effective_max_running_requests < 8  # SGLang's delay is off: one prompt a pass
    assert "--min-free-slots-delay" not in few.args
    assert _values(few.args, FLAG) == ["512"]  # prompt p99 300, raised to the floor
    assert any(r.startswith(f"{FLAG} 512:") and "one freed slot" in r for r in few.reasons)
    longer = recommend(dense, H200_MIB, 1, [], replace(WL, prompt_p99=1500), "0.5.17", **NO_TRADEOFFS)
    assert _values(longer.args, FLAG) == ["6144"]  # 4 x 1,500 = 6,000 tokens


@pytest.mark.parametrize(
    "given",
    [
        ["--disable-prefill-cuda-graph"],
        ["--disable-cuda-graph"],
        ["--cuda-graph-backend-prefill", "disabled"],
        ["--cuda-graph-max-bs-prefill", "2048"],
        ["--cuda-graph-bs-prefill", "512", "1024"],
        ["--chunked-prefill-size", "1024"],  # the refills reach SGLang's own default: nothing to trim
    ],
)
def test_no_flag_where_prefill_graphs_are_off_or_the_user_sizes_them(
    dense: ModelShape, given: list[str]
) -> None:
    rec = recommend(dense, H200_MIB, 1, given, WL, "0.5.23", **NO_TRADEOFFS)
    assert rec.args[: len(given)] == tuple(given) and "--min-free-slots-delay" in rec.args
    assert rec.args.count(FLAG) == given.count(FLAG)
    assert not any(r.startswith(FLAG) for r in rec.reasons)
    assert rec.recommended.kv_cache_tokens == plan(dense, H200_MIB, 1, list(rec.args), WL).kv_cache_tokens


def test_long_prompts_and_mla_keep_sglangs_default(dense: ModelShape) -> None:
    long = recommend(dense, H200_MIB, 1, [], replace(WL, prompt_p99=2100), "0.5.23", **NO_TRADEOFFS)
    assert FLAG not in long.args  # 4 x 2,100 = 8,400 tokens: every size SGLang captures by default
    mla = ModelShape.from_config(MODELS / "deepseek-v3")
    rec = recommend(mla, H200_MIB, 8, [], WL, "0.5.23", **NO_TRADEOFFS)
    assert "--min-free-slots-delay" in rec.args and FLAG not in rec.args


def test_the_flag_re_plans_sglangs_default_memory_fraction(dense: ModelShape) -> None:
    """With SGLang's own memory fraction the smaller graph reserve raises it: the candidate's KV numbers
    are those of the new plan; its in-flight count and score stand (the KV only grew)."""
    target = Target(dense, H200_MIB, 1, ("--min-free-slots-delay", "4"), WL, "0.5.23")
    before = expected_length_running(target, Choice(True, None, "auto", None))
    assert before is not None and "--mem-fraction-static" not in before.args
    after = with_refill_prefill_graphs(target, before)
    assert after.args == (*before.args, FLAG, "1280")
    assert refill_prefill_graph_tokens(dense, before, WL.prompt_p99, "0.5.23") == 1280
    launched = plan(dense, H200_MIB, 1, list(after.args), WL, "0.5.23")
    assert after.plan == replace(launched, client_concurrency=before.plan.client_concurrency)
    old_mfs, new_mfs = before.plan.mem_fraction_static, after.plan.mem_fraction_static
    assert new_mfs > old_mfs and after.plan.kv_cache_tokens > before.plan.kv_cache_tokens
    assert after.score == before.score and after.reasons[:-1] == before.reasons
    assert f"--mem-fraction-static from {old_mfs:g} to {new_mfs:g}" in after.reasons[-1]
    kv = f"KV cache {after.plan.kv_cache_tokens:,} tokens (was {before.plan.kv_cache_tokens:,})"
    assert kv in after.reasons[-1]


def test_sglang_0_5_17s_piecewise_aliases_are_read_as_the_flags_they_stand_for(dense: ModelShape) -> None:
    """``--disable-piecewise-cuda-graph`` stores ``cuda_graph_backend_prefill = disabled`` and
    ``--piecewise-cuda-graph-max-tokens`` is ``--cuda-graph-max-bs-prefill`` (0.5.17 server_args'
    deprecated aliases): the graph reserve is planned as for the flags they stand for, and the tuner
    adds no limit of its own beside them."""
    for alias, meant in (
        (["--disable-piecewise-cuda-graph"], ["--cuda-graph-backend-prefill", "disabled"]),
        (["--piecewise-cuda-graph-max-tokens", "1024"], [FLAG, "1024"]),
    ):
        assert plan(dense, H200_MIB, 1, alias, WL, "0.5.17").reserve_gib == pytest.approx(
            plan(dense, H200_MIB, 1, meant, WL, "0.5.17").reserve_gib
        )
        rec = recommend(dense, H200_MIB, 1, alias, WL, "0.5.17", **NO_TRADEOFFS)
        assert FLAG not in rec.args
    assert (
        plan(dense, H200_MIB, 1, ["--disable-piecewise-cuda-graph"], WL, "0.5.17").reserve_gib
        < plan(dense, H200_MIB, 1, [], WL, "0.5.17").reserve_gib
    )
