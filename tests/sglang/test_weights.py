"""Weights per GPU as SGLang allocates them: real public configs (resources/models/*/SOURCE) against what
SGLang 0.5.17 logged on an H200 with dummy weights (issue 33), and SGLang's layout rules on made-up ones."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from regen.sglang.models import ModelConfigError, ModelShape
from regen.sglang.weights import layer_kinds, quantization_of, weights_per_rank

MODELS = Path(__file__).parents[2] / "resources" / "models"
GIB = 2**30


def real(name: str) -> ModelShape:
    return ModelShape.from_config(MODELS / name)


# 'Load weight end ... mem usage=' of SGLang 0.5.17 on the H200, --load-format dummy (issue 33's table)
@pytest.mark.parametrize(
    ("name", "measured_gib", "quantization"),
    [
        ("mixtral-8x7b", 87.0, None),
        ("qwen3-32b-fp8", 32.1, "fp8"),
        ("qwen3-30b-a3b-fp8", 29.2, "fp8"),
        ("gpt-oss-20b", 15.0, "mxfp4"),
        ("nemotron-3-nano-30b-a3b", 58.9, None),
    ],
)
def test_weights_at_tp1_are_within_2_percent_of_what_sglang_loaded(name, measured_gib, quantization):
    est = weights_per_rank(real(name), 1)
    assert est.source == "config"
    assert est.quantization == quantization
    assert est.gib_per_rank == pytest.approx(measured_gib, rel=0.02)


def test_mixtral_experts_are_intermediate_size_wide_when_moe_intermediate_size_is_absent():
    model = real("mixtral-8x7b")
    assert "moe_intermediate_size" not in model.raw
    assert (model.num_experts, model.moe_intermediate_size) == (8, 14336)


def test_every_moe_spelling_is_read():
    deepseek, kimi, qwen, gpt_oss = (
        real("deepseek-v3"),
        real("kimi-k2"),
        real("qwen3-30b-a3b"),
        real("gpt-oss-20b"),
    )
    assert (deepseek.num_experts, deepseek.shared_expert_intermediate_size) == (256, 1 * 2048)
    assert kimi.num_experts == 384
    assert (qwen.num_experts, qwen.moe_intermediate_size) == (128, 768)
    assert (gpt_oss.num_experts, gpt_oss.moe_intermediate_size) == (32, 2880)
    nemotron = real("nemotron-3-nano-30b-a3b")
    assert (nemotron.num_experts, nemotron.shared_expert_intermediate_size) == (128, 3712)
    scout = real(
        "llama-4-scout"
    )  # one shared expert of intermediate_size, dense layers intermediate_size_mlp
    assert (scout.num_experts, scout.shared_expert_intermediate_size) == (16, 8192)


def test_dense_first_layers_and_hybrid_patterns():
    ds = layer_kinds(real("deepseek-v3"))  # first_k_dense_replace 3
    assert ds.ffns[:3] == ("dense",) * 3 and set(ds.ffns[3:]) == {"moe"}
    assert set(ds.mixers) == {"mla"}
    nemo = layer_kinds(real("nemotron-3-nano-30b-a3b"))  # hybrid_override_pattern
    assert (nemo.mixers.count("mamba2"), nemo.mixers.count("attention"), nemo.ffns.count("moe")) == (
        23,
        6,
        23,
    )
    base = json.loads((MODELS / "qwen3-30b-a3b" / "config.json").read_text())
    # qwen3_moe.py builds every layer sparse ("all layers are sparse"), whatever these fields say
    qwen = ModelShape.from_dict({**base, "mlp_only_layers": [0], "decoder_sparse_step": 2})
    assert set(layer_kinds(qwen).ffns) == {"moe"}
    llama4 = dict(json.loads((MODELS / "llama-4-scout" / "config.json").read_text()))
    llama4["text_config"] = {**llama4["text_config"], "interleave_moe_layer_step": 2}
    assert layer_kinds(ModelShape.from_dict(llama4)).ffns[:2] == ("dense", "moe")


def test_moe_models_weigh_far_more_than_their_dense_reading_did():
    # 671B parameters in FP8: more than an H200 at tp 1, about 80 GiB a rank at tp 8
    ds = real("deepseek-v3")
    assert 600 < weights_per_rank(ds, 1).gib_per_rank < 700
    assert 70 < weights_per_rank(ds, 8).gib_per_rank < 90


def _tiny(**over) -> dict:
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "vocab_size": 1000,
        "torch_dtype": "bfloat16",
    }
    cfg.update(over)
    return cfg


def test_layout_by_hand_bf16_and_vocab_padding_and_tp_sharding():
    model = ModelShape.from_dict(_tiny())
    h, v = 256, 1024  # 1000 padded to a multiple of 64 (pad_vocab_size)
    qkv, o, mlp = (4 + 2 * 2) * 64 * h, h * 4 * 64, 3 * 512 * h
    norms = 2 * h * 2 + h
    expected = 2 * (2 * v * h + 2 * (qkv + o + mlp)) + 2 * norms
    one = weights_per_rank(model, 1)
    assert one.bytes_per_rank == expected
    two = weights_per_rank(model, 2)
    assert two.replicated_bytes == 2 * norms  # norms on every rank whole, the rest halved
    assert two.bytes_per_rank == (expected - 2 * norms) // 2 + 2 * norms
    assert two.total_bytes == expected
    # tp 4 > 2 kv heads: each kv head replicated on 2 ranks (QKVParallelLinear), so more than a quarter
    four = weights_per_rank(model, 4)
    assert four.bytes_per_rank > (expected - 2 * norms) // 4 + 2 * norms


def _bf16_over_fp8_block(linear: list[tuple[int, int]], layers: int) -> int:
    """What these (out, in) layers save in FP8 with a float32 scale per 128x128 block, over bf16."""
    bf16 = sum(o * i * 2 for o, i in linear)
    fp8 = sum(o * i + -(-o // 128) * -(-i // 128) * 4 for o, i in linear)
    return (bf16 - fp8) * layers


def test_fp8_block_adds_a_float32_scale_per_128_block():
    fp8 = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
    plain = weights_per_rank(ModelShape.from_dict(_tiny()), 1).bytes_per_rank
    quant = weights_per_rank(ModelShape.from_dict(_tiny(quantization_config=fp8)), 1).bytes_per_rank
    h = 256
    linear = [(8 * 64, h), (h, 4 * 64), (2 * 512, h), (h, 512)]  # (out, in) per layer
    assert plain - quant == _bf16_over_fp8_block(linear, layers=2)


def test_int4_awq_and_compressed_tensors_and_nvfp4_are_read():
    awq = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}
    assert quantization_of(ModelShape.from_dict(_tiny(quantization_config=awq))).weight_bits == 4
    ct = {
        "quant_method": "compressed-tensors",
        "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int", "group_size": 128}}},
    }
    assert (
        quantization_of(ModelShape.from_dict(_tiny(quantization_config=ct))).method
        == "compressed-tensors w4i"
    )
    nvfp4 = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}
    q = quantization_of(ModelShape.from_dict(_tiny(quantization_config=nvfp4)))
    assert (q.method, q.group_size) == ("nvfp4", 16)
    # 4 bits + a 1-byte scale per 16 and a 2-byte one per 128 respectively: both well under bf16's 16
    full = ModelShape.from_dict(_tiny())
    for cfg in (awq, nvfp4):
        assert weights_per_rank(ModelShape.from_dict(_tiny(quantization_config=cfg)), 1).bytes_per_rank < (
            weights_per_rank(full, 1).bytes_per_rank
        )


def test_an_unknown_quantization_is_refused_by_name():
    with pytest.raises(ModelConfigError, match="'bitnet' is not modelled"):
        weights_per_rank(ModelShape.from_dict(_tiny(quantization_config={"quant_method": "bitnet"})), 1)


def test_expert_parallel_splits_experts_and_ep_must_divide_tp():
    model = real("qwen3-30b-a3b")
    assert weights_per_rank(model, 4, 4).bytes_per_rank == weights_per_rank(model, 4, 1).bytes_per_rank
    with pytest.raises(ValueError, match="ep must divide tp"):
        weights_per_rank(model, 4, 3)


def test_checkpoint_index_total_is_used_and_split_by_the_layout():
    model = real("qwen3-8b")
    total = json.loads((MODELS / "qwen3-8b" / "model.safetensors.index.json").read_text())["metadata"]
    one, two = weights_per_rank(model, 1), weights_per_rank(model, 2)
    assert (one.source, one.bytes_per_rank) == ("checkpoint index", total["total_size"])
    assert two.bytes_per_rank == pytest.approx(total["total_size"] / 2, rel=0.01)


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], int]]) -> int:
    """A safetensors file per its format: u64 LE header length, JSON header, then the tensor bytes."""
    header, offset = {}, 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + b"\0" * offset)
    return offset


def test_safetensors_headers_give_the_bytes_when_there_is_no_index(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps(_tiny()))
    a = _write_safetensors(tmp_path / "model-1.safetensors", {"x": ("BF16", [256, 256], 131072)})
    b = _write_safetensors(tmp_path / "model-2.safetensors", {"y": ("F8_E4M3", [512, 256], 131072)})
    est = weights_per_rank(ModelShape.from_config(tmp_path), 1)
    assert (est.source, est.bytes_per_rank) == ("safetensors headers", a + b)
    (tmp_path / "model-2.safetensors").write_bytes(b"\x01")
    with pytest.raises(ModelConfigError, match=r"model-2\.safetensors: not a readable safetensors header"):
        ModelShape.from_config(tmp_path)


# Gemma-3-27B-it's config.json omits vocab_size (its text_config as TensorRT-LLM's
# tests/unittest/_torch/modeling/test_modeling_gemma3.py copies it, layers back to the real 62)
GEMMA3_27B = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "text_config": {
        "head_dim": 128,
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "model_type": "gemma3_text",
        "num_attention_heads": 32,
        "num_hidden_layers": 62,
        "num_key_value_heads": 16,
        "query_pre_attn_scalar": 168,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
    },
    "torch_dtype": "bfloat16",
    "vision_config": {
        "hidden_size": 1152,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_hidden_layers": 27,
    },
}


def test_gemma3_takes_transformers_defaults_for_what_its_config_omits():
    model = ModelShape.from_dict(GEMMA3_27B)
    assert (model.vocab_size, model.tie_word_embeddings) == (262208, True)  # Gemma3TextConfig defaults
    assert 50 < weights_per_rank(model, 1).gib_per_rank < 52  # 27.4B parameters in bf16, SigLIP included


def test_mla_and_moe_layout_by_hand():
    """A DeepSeek-V3-shaped toy: layer 0 dense, layer 1 MoE (first_k_dense_replace 1) with 4 routed experts
    and 1 shared, MLA with q_lora_rank; bf16, tp 2."""
    cfg = _tiny(
        architectures=["DeepseekV3ForCausalLM"],
        model_type="deepseek_v3",
        q_lora_rank=128,
        kv_lora_rank=64,
        qk_nope_head_dim=32,
        qk_rope_head_dim=16,
        v_head_dim=32,
        n_routed_experts=4,
        n_shared_experts=1,
        moe_intermediate_size=128,
        first_k_dense_replace=1,
        vocab_size=1024,
    )
    h, heads = 256, 4 // 2
    mla_replicated = (128 + 64 + 16) * h + 128 + 64  # fused_qkv_a_proj_with_mqa, q_a/kv_a layernorms
    mla_sharded = heads * 48 * 128 + heads * 64 * 64 + h * heads * 32 + heads * 64 * 64  # + w_kc/w_vc
    dense = 3 * 512 // 2 * h
    experts = 4 * 3 * h * 128 // 2
    shared = 3 * h * 128 // 2
    router = 4 * h + 4 * 2  # gate (bf16) and e_score_correction_bias (fp32, counted in bf16 elements)
    norms = 2 * (2 * h) + h
    embed = 2 * 1024 // 2 * h
    expected = 2 * (embed + 2 * mla_replicated + 2 * mla_sharded + dense + experts + shared + router + norms)
    est = weights_per_rank(ModelShape.from_dict(cfg), 2)
    assert est.bytes_per_rank == expected
    assert est.replicated_bytes == 2 * (2 * mla_replicated + router + norms)


def test_mxfp4_expert_width_is_padded_to_64_per_rank():
    model = real("gpt-oss-20b")  # 2880 / 2 = 1440 -> 1472 per rank (Mxfp4MoEMethod, triton_kernels)
    one, two = weights_per_rank(model, 1), weights_per_rank(model, 2)
    assert two.bytes_per_rank > (one.bytes_per_rank - one.replicated_bytes) / 2 * 1.01


def test_a_checkpoint_far_from_the_layout_says_both(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps(_tiny()))
    layout = weights_per_rank(ModelShape.from_dict(_tiny()), 1).bytes_per_rank
    index = {"metadata": {"total_size": 2 * layout}, "weight_map": {}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    est = weights_per_rank(ModelShape.from_config(tmp_path), 2)
    assert est.bytes_per_rank == pytest.approx(2 * est.layout_bytes_per_rank, rel=1e-6)
    assert "the layout alone gives" in est.rule


@pytest.mark.parametrize(
    "ignore",
    [
        {"exclude_modules": ["model.layers.*.self_attn*"]},  # modelopt glob
        {"ignore": ["re:.*self_attn.*"]},  # compressed-tensors regex
        {"modules_to_not_convert": ["self_attn"]},  # fp8 / mxfp4 component
    ],
)
def test_modules_left_unquantized_stay_in_the_model_dtype(ignore):
    fp8 = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    everything = weights_per_rank(ModelShape.from_dict(_tiny(quantization_config=fp8)), 1).bytes_per_rank
    kept = weights_per_rank(
        ModelShape.from_dict(_tiny(quantization_config={**fp8, **ignore})), 1
    ).bytes_per_rank
    h = 256
    attention = [(8 * 64, h), (h, 4 * 64)]
    assert kept - everything == _bf16_over_fp8_block(attention, layers=2)


def test_mxfp4_experts_are_held_as_the_triton_kernels_repack_leaves_them():
    """One gpt-oss expert on Hopper (mxfp4.py, use_triton_kernels): w13 [5,760 x 2,880] and w2 [2,880 x
    2,880] as swizzled e2m1 bytes (64-aligned), their e8m0 scales kept beside the swizzled copy (rows
    256-aligned), fp32 biases; every expert the same, no factor on top."""
    from regen.sglang.mxfp4_load import replay_gpt_oss_load
    from regen.sglang.weights import layout_bytes, mxfp4_expert_bytes

    w13 = 1472 * 5760 + 5760 * 90 + 5888 * 90
    w2 = 1472 * 2880 + 2880 * 90 + 3072 * 90
    assert mxfp4_expert_bytes(1, 5760, 2880) == w13 and mxfp4_expert_bytes(1, 2880, 2880) == w2
    big = real("gpt-oss-120b")
    half = ModelShape.from_dict({**big.raw, "num_local_experts": 64}, source="gpt-oss-120b, 64 experts")
    expert = w13 + w2 + (5760 + 2880) * 4  # and its fp32 biases
    router_row = 2880 * 2
    more = layout_bytes(big, 1)[0] - layout_bytes(half, 1)[0]
    assert more == 36 * 64 * (expert + router_row)
    # on top of the layout, what the replayed load leaves reserved (regen/sglang/mxfp4_load.py)
    assert weights_per_rank(big, 1).bytes_per_rank == replay_gpt_oss_load(big, 1, 1).reserved
    assert weights_per_rank(big, 1).gib_per_rank == pytest.approx(70.28, abs=0.01)  # SGLang logged 70.26
