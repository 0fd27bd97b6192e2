"""Multi-head / grouped-query attention: ``DefaultPoolConfigurator`` (``_compute_cell_size``, MHA branch;
``calculate_pool_sizes``), 0.5.17 and 0.5.23.

cell = kv_heads_per_tp x (head_dim + v_head_dim) x full-attention layers x element bytes, with
kv_heads_per_tp = max(1, kv_heads // tp) (``ModelConfig.get_num_kv_heads``); tokens = budget // cell,
page-aligned. Linear-attention hybrids count only their full-attention layers
(``mambaish.full_attention_layer_ids``): GDN from ``layer_types`` (:class:`ModelShape`), Nemotron-H from
``hybrid_override_pattern`` (``configs/nemotron_h.py::NemotronHConfig.full_attention_layer_ids``).
"""

from __future__ import annotations

from regen.sglang.models import ModelShape
from regen.sglang.pools.base import PoolFlags, PoolSizes, kv_element_bytes, pages, text_config

RULE = "pool_configurator.DefaultPoolConfigurator (MHA cell)"


def attention_layers(model: ModelShape) -> int:
    """Layers with a KV cache: '*' of a Nemotron-H ``hybrid_override_pattern``, else the full layers."""
    pattern = text_config(model).get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        return pattern.count("*")
    return model.full_attention_layers


class MHAPool:
    name = "mha"

    def cell_bytes(self, model: ModelShape, flags: PoolFlags, draft_layers: int = 0) -> float:
        kv_heads = max(1, model.num_kv_heads // flags.tp)
        layers = attention_layers(model) + draft_layers
        return (
            kv_heads
            * (model.head_dim + model.v_head_dim)
            * layers
            * kv_element_bytes(model, flags.kv_cache_dtype)
        )

    def size(self, model: ModelShape, available: int, flags: PoolFlags) -> PoolSizes:
        cell = self.cell_bytes(model, flags, flags.draft_layers_in_cell)
        tokens = pages(int(available // cell), flags.page_size)
        return PoolSizes(kv_cache_tokens=tokens, kv_bytes=int(tokens * cell), cell_bytes=cell, rule=RULE)
