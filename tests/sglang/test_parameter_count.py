"""``regen.sglang.weights.parameter_count`` against what each model's makers published (the features stage's
projection rates a target's prefill over its active parameters). Vendors count active parameters their own
way, so each is compared under its maker's convention: OpenAI counts the unembedding and not the embedding
(gpt-oss model card: 20.91B total, 3.61B active), Qwen (Qwen3-30B-A3B: 30.5B, 3.3B activated), Mistral
(Mixtral 8x7B: 46.7B, 12.9B) and NVIDIA (Nemotron 3 Nano: 31.6B, 3.5B active, NeMo Megatron-Bridge's model
page) count both. Nemotron-H is the case a plain stack gets wrong: its layers are each a Mamba2 mixer, a MoE
or an attention layer, not attention plus MoE (``ModelShape.estimated_parameters`` gives it 103B)."""

from __future__ import annotations

from pathlib import Path

import pytest

from regen.sglang.models import ModelShape
from regen.sglang.weights import parameter_count

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
