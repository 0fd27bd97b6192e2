"""``regen.sglang.weights.parameter_count`` against what each model's makers published (the features stage's
projection rates a target's prefill over its active parameters). Vendors count active parameters their own
way, so each is compared under its maker's convention: OpenAI counts the unembedding and not the embedding
(gpt-oss model card: 20.91B total, 3.61B active), Qwen (Qwen3-30B-A3B: 30.5B, 3.3B activated), Mistral
(Mixtral 8x7B: 46.7B, 12.9B) and NVIDIA (Nemotron 3 Nano: 31.6B, 3.5B active, NeMo Megatron-Bridge's model
page) count both. Nemotron-H is the case a plain stack gets wrong: its layers are each a Mamba2 mixer, a MoE
or an attention layer, not attention plus MoE (a plain stack of attention-plus-MoE layers gives it 103B).
The MTP draft SGLang loads beside the target is counted by the same layout (``mtp_draft_bytes``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from regen.sglang.models import ModelShape
from regen.sglang.weights import mtp_draft_bytes, parameter_count

MODELS = Path(__file__).resolve().parents[2] / "resources" / "models"


@pytest.mark.parametrize(
    ("model", "total_b", "active_b", "counted"),
    [
        ("gpt-oss-20b", 20.91, 3.61, "lm_head"),
        ("qwen3-30b-a3b", 30.5, 3.3, "both"),
        ("mixtral-8x7b", 46.7, 12.9, "both"),
        ("nemotron-3-nano-30b-a3b", 31.6, 3.5, "both"),
    ],
)
def test_the_count_is_what_the_makers_published(
    model: str, total_b: float, active_b: float, counted: str
) -> None:
    shape = ModelShape.from_config(MODELS / model)
    count = parameter_count(shape)
    lm_head = count.embeddings // (1 if shape.tie_word_embeddings else 2)
    active = count.active_per_token + (lm_head if counted == "lm_head" else count.embeddings)
    assert count.total / 1e9 == pytest.approx(total_b, rel=0.01)
    assert active / 1e9 == pytest.approx(active_b, rel=0.03)


def test_a_dense_model_is_active_whole_but_its_embeddings() -> None:
    count = parameter_count(ModelShape.from_config(MODELS / "llama-3.1-8b"))
    assert count.total / 1e9 == pytest.approx(8.03, rel=0.01)  # Meta: 8.03B
    assert count.routed_experts == count.active_experts == 0
    assert count.active_per_token == count.total - count.embeddings


def test_deepseek_v3_mtp_draft_is_its_published_moe_layer_in_fp8() -> None:
    """DeepSeek publishes its MTP module as 11.5B unique parameters beside the shared 0.9B embedding and 0.9B
    head (README_WEIGHTS.md: 14B of the 685B). SGLang's ``DeepseekModelNextN`` builds its layer with
    ``is_nextn`` (MoE, though ``first_k_dense_replace`` makes layer 0 of the main stack dense) and loads its
    experts in the checkpoint's FP8 (1 byte a weight, a float32 scale per 128x128 block)."""
    shape = ModelShape.from_config(MODELS / "deepseek-v3")
    h = shape.hidden_size
    head_and_embedding = 2 * shape.vocab_size * h
    plain = ModelShape.from_dict({k: v for k, v in shape.raw.items() if k != "quantization_config"})
    unique = mtp_draft_bytes(plain, 1) / 2 - head_and_embedding
    assert unique / 1e9 == pytest.approx(11.5, rel=0.02)
    experts = 256 * 3 * h * shape.moe_intermediate_size
    expert_saving = experts - experts * 4 // (128 * 128)  # 2 bytes to 1, plus the block scales
    saving = mtp_draft_bytes(plain, 1) - mtp_draft_bytes(shape, 1)
    # the experts, and beside them the attention and shared-expert projections; not the embedding or head
    assert expert_saving < saving < expert_saving * 1.03


def test_the_draft_of_a_dense_gated_delta_target_is_one_attention_layer_without_the_vision_tower() -> None:
    """Qwen3.5-27B (a VLM config: ``text_config`` and a vision tower the draft does not load): one
    full-attention layer with the dense MLP, its own embedding and lm_head, ``fc`` 2h -> h; SGLang 0.5.17
    logged 5.53 GB for it on the H200 (``tests/sglang/test_plan.py`` SEED_LOG_0517)."""
    shape = ModelShape.from_config(MODELS / "qwen3.5-27b")
    assert shape.is_multimodal and shape.mtp_layers == 1
    assert round(mtp_draft_bytes(shape, 1) / 2**30, 2) == 5.53
    # tp 2 shards the layer and the vocab; the fc and the norms stay whole on each rank
    h = shape.hidden_size
    whole = (2 * h * h + 2 * h) * 2
    assert mtp_draft_bytes(shape, 2) == pytest.approx((mtp_draft_bytes(shape, 1) + whole) / 2, rel=1e-3)
