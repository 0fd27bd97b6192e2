"""Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2, GLM-4.7-Flash, ...): the MLA branch of
``DefaultPoolConfigurator._compute_cell_size`` with ``kv_cache_configurator.calculate_mla_kv_cache_dim``,
0.5.17 and 0.5.23.

cell = (kv_lora_rank + qk_rope_head_dim) x layers x element bytes: one latent per token, replicated on
every TP rank (not divided by tp). DSA models (``model_config.is_deepseek_dsa``: DeepSeek-V3.2, GLM-5
with ``index_topk``) add the indexer's keys, ``index_head_dim + index_head_dim // 128 x 4`` bytes
(``DSATokenToKVPool.quant_block_size`` 128, uint8 with fp32 scales) per layer.
"""

from __future__ import annotations

from regen.sglang.models import ModelShape
from regen.sglang.pools.base import PoolFlags, PoolSizes, Unmodelled, kv_element_bytes, pages, text_config

RULE = "pool_configurator.DefaultPoolConfigurator (MLA cell, calculate_mla_kv_cache_dim)"
#: configs/model_config.py::is_deepseek_dsa (0.5.17; 0.5.23 the same list), when ``index_topk`` is set
DSA_ARCHS = frozenset(
    {
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "DeepseekV3ForCausalLMNextN",
        "MistralLarge3ForCausalLM",
        "PixtralForConditionalGeneration",
        "GlmMoeDsaForCausalLM",
        "GlmMoeDsaForCausalLMNextN",
        "LongcatFlashForCausalLM",
        "LongcatFlashForCausalLMNextN",
    }
)
DSA_QUANT_BLOCK = 128  # DSATokenToKVPool.quant_block_size


def is_mla(model: ModelShape) -> bool:
    """``ModelConfig._derive_model_shapes`` sets ``AttentionArch.MLA`` for the configs with a
    ``kv_lora_rank`` (DeepSeek-V2/V3 family, Kimi, GLM-MoE-Lite/DSA, MiniCPM3, ...)."""
    return text_config(model).get("kv_lora_rank") is not None


def is_dsa(model: ModelShape) -> bool:
    return model.architecture in DSA_ARCHS and text_config(model).get("index_topk") is not None


class MLAPool:
    name = "mla"

    def cell_bytes(self, model: ModelShape, flags: PoolFlags, draft_layers: int = 0) -> float:
        text = text_config(model)
        if flags.kv_cache_dtype not in ("auto", "bf16", "bfloat16", "float16"):
            raise Unmodelled(
                f"{model.architecture}: MLA with --kv-cache-dtype {flags.kv_cache_dtype} (SGLang's scaled "
                "latent layout, calculate_mla_kv_cache_dim) is not modelled"
            )
        layers = model.num_layers + draft_layers
        dim = int(text["kv_lora_rank"]) + int(text["qk_rope_head_dim"])
        cell = dim * layers * kv_element_bytes(model, flags.kv_cache_dtype)
        if is_dsa(model):
            index_dim = int(text["index_head_dim"])
            cell += (index_dim + index_dim // DSA_QUANT_BLOCK * 4) * layers
        return cell

    def size(self, model: ModelShape, available: int, flags: PoolFlags) -> PoolSizes:
        cell = self.cell_bytes(model, flags, flags.draft_layers_in_cell)
        tokens = pages(int(available // cell), flags.page_size)
        rule = RULE
        if is_dsa(model) and flags.kv_cache_dtype == "auto":  # overrides._dsa_kv_cache_dtype_default
            rule += (
                "; DSA with the bf16 latent SGLang picks below SM100 (H100/H200); on SM100+ (B200) it picks "
                "fp8_e4m3, whose scaled layout is not modelled"
            )
        return PoolSizes(kv_cache_tokens=tokens, kv_bytes=int(tokens * cell), cell_bytes=cell, rule=rule)
