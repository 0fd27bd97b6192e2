"""Which tps SGLang accepts, and the smallest that fits: real public configs (resources/models/*/SOURCE)
against what SGLang 0.5.17 did with them (issue 33) and against its layer checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from regen.sglang.fit import smallest_fitting_tp, tp_refusals
from regen.sglang.models import ModelShape

MODELS = Path(__file__).parents[2] / "resources" / "models"
H200_MIB = 143771


def real(name: str) -> ModelShape:
    return ModelShape.from_config(MODELS / name)


@pytest.mark.parametrize(
    ("name", "tp", "width"), [("qwen3-235b-a22b-fp8", 8, 192), ("qwen3-30b-a3b-fp8", 4, 192)]
)
def test_fp8_block_expert_width_refusals_sglang_gave(name, tp, width):
    refusals = tp_refusals(real(name), tp)
    assert len(refusals) == 1
    assert f"expert width per rank {width}" in refusals[0] and "block_n 128" in refusals[0]


@pytest.mark.parametrize(
    ("name", "tp"),
    [("qwen3-235b-a22b-fp8", 4), ("qwen3-30b-a3b-fp8", 2), ("qwen3-32b-fp8", 8), ("deepseek-v3", 8)],
)
def test_tps_sglang_accepts(name, tp):
    assert tp_refusals(real(name), tp) == []


def test_expert_parallel_lifts_the_fp8_expert_width_refusal():
    # with ep 8 each rank holds 16 whole experts: width 1536 per rank, a multiple of 128
    assert tp_refusals(real("qwen3-235b-a22b-fp8"), 8, ep=8) == []


def test_head_and_group_divisibility():
    assert any("num_attention_heads 40" in r for r in tp_refusals(real("llama-4-scout"), 16))
    assert any(
        "num_attention_heads 32 is not divisible by tp 3" in r for r in tp_refusals(real("llama-3.1-8b"), 3)
    )
    assert any("n_groups 8" in r for r in tp_refusals(real("nemotron-3-nano-30b-a3b"), 16))
    assert tp_refusals(real("nemotron-3-nano-30b-a3b"), 8) == []
    # 8 kv heads at tp 16: each kv head replicated on 2 ranks, accepted by QKVParallelLinear
    assert tp_refusals(real("llama-3.1-8b"), 16) == []


def test_fp8_block_dense_widths_are_checked():
    cfg = json.loads((MODELS / "qwen3-32b-fp8" / "config.json").read_text())
    odd = ModelShape.from_dict({**cfg, "intermediate_size": 25600 + 64 * 8})  # 26112 / 8 = 3264, not /128
    assert any("gate_up_proj output width per rank 3264" in r for r in tp_refusals(odd, 8))


def test_deepseek_v3_cannot_load_on_one_h200_and_says_why():
    fit = smallest_fitting_tp(real("deepseek-v3"), H200_MIB)
    assert fit.tp == 8
    assert "at tp 1 exceed 140.4 GiB" in fit.reason and "per rank at tp 4" in fit.reason


@pytest.mark.parametrize(("name", "tp"), [("llama-4-scout", 2), ("mixtral-8x7b", 1), ("gpt-oss-20b", 1)])
def test_smallest_fitting_tp_on_an_h200(name, tp):
    assert smallest_fitting_tp(real(name), H200_MIB).tp == tp


def test_a_refused_tp_is_skipped_and_named():
    fit = smallest_fitting_tp(real("qwen3-235b-a22b-fp8"), 40 * 1024, tps=(4, 8))
    assert fit.tp is None
    assert "tp 8 refused by SGLang: expert width per rank 192" in fit.reason
    assert "no tp in [4, 8] fits" in fit.reason


def test_reserve_counts_against_the_fit():
    model = real("mixtral-8x7b")  # 87.0 GiB
    assert smallest_fitting_tp(model, H200_MIB, reserve_mib=60 * 1024).tp == 2


def test_mamba_groups_tp_does_not_divide_are_refused_only_when_quantized():
    cfg = json.loads((MODELS / "nemotron-3-nano-30b-a3b" / "config.json").read_text())
    three = {
        **cfg,
        "n_groups": 4,
        "mamba_num_heads": 48,
        "num_attention_heads": 48,
        "num_key_value_heads": 48,
    }
    assert not any("n_groups" in r for r in tp_refusals(ModelShape.from_dict({**three, "n_groups": 1}), 3))
    fp8 = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    assert any("n_groups 4" in r for r in tp_refusals(ModelShape.from_dict(three), 3))
    one_group_fp8 = ModelShape.from_dict({**three, "n_groups": 1, "quantization_config": fp8})
    assert any("when quantized" in r for r in tp_refusals(one_group_fp8, 3))


def test_a_vocab_tp_does_not_divide_once_padded_is_refused():
    # 32000 padded to 64 is 32000: tp 3 cannot split it (VocabParallelEmbedding divide())
    assert any("vocab padded to 64 32000" in r for r in tp_refusals(real("mixtral-8x7b"), 3))


def test_a_dense_70b_fits_one_h200_only_without_room_to_spare():
    model = real("llama-3.3-70b")  # 70.6B parameters in bf16: 131.4 GiB of the H200's 140.4
    assert smallest_fitting_tp(model, H200_MIB).tp == 1
    fit = smallest_fitting_tp(model, H200_MIB, reserve_mib=20 * 1024)
    assert fit.tp == 2 and "131.4 GiB per rank at tp 1 + 20.0 GiB reserved exceed 140.4 GiB" in fit.reason


def test_an_ep_that_does_not_divide_a_tp_is_that_tps_cause():
    fit = smallest_fitting_tp(real("qwen3-235b-a22b-fp8"), H200_MIB, ep=4, tps=(2, 4))
    assert fit.tp == 4 and "tp 2 refused by SGLang: ep 4 must divide tp 2" in fit.reason
