"""SGLang's token and state pools, one module per attention family behind one interface
(:class:`regen.sglang.pools.base.KVPool`): :mod:`.mha` (the default, dense / GQA / MoE and the
attention layers of hybrids), :mod:`.mla` (latent cells, DSA indexer), :mod:`.swa` (sliding-window
pools), :mod:`.state` (GDN and Mamba2 recurrent state). :func:`kv_pool` picks a model's family as
``pool_configurator.create_memory_pool_configurator`` does; :func:`unmodelled_reason` says when none fits.
"""

from __future__ import annotations

from regen.sglang.models import ModelShape
from regen.sglang.pools.base import KVPool, PoolFlags, PoolSizes, PoolTooSmall, Unmodelled
from regen.sglang.pools.mha import MHAPool
from regen.sglang.pools.mla import MLAPool, is_mla
from regen.sglang.pools.state import has_state, is_mamba2_hybrid, state_bytes_per_request
from regen.sglang.pools.swa import UNMODELLED_SWA_ARCHS, SWAPool, is_hybrid_swa

__all__ = [
    "KVPool",
    "PoolFlags",
    "PoolSizes",
    "PoolTooSmall",
    "Unmodelled",
    "has_state",
    "is_mamba2_hybrid",
    "kv_pool",
    "state_bytes_per_request",
    "unmodelled_reason",
]

#: configs/model_config.py::is_minimax_sparse and is_deepseek_v4 (their own configurators, not modelled)
_OWN_CONFIGURATOR_ARCHS = frozenset(
    {
        "MiniMaxM3SparseForCausalLM",
        "DeepseekV4ForCausalLM",
        "DeepseekV4ForCausalLMNextN",
        "DeepseekV4ForCausalLMDSpark",
    }
)


def unmodelled_reason(model: ModelShape) -> str | None:
    """Why the planner cannot size this model's pools (SGLang's own planning then applies), else None."""
    if model.architecture in _OWN_CONFIGURATOR_ARCHS:
        return f"{model.architecture}: SGLang sizes its pools with a configurator of its own (not modelled)"
    if model.architecture in UNMODELLED_SWA_ARCHS:
        return (
            f"{model.architecture}: SGLang runs a sliding-window / chunked-attention pool for it "
            "(configs/model_config.py::is_hybrid_swa_model) that regen does not model"
        )
    return None


def kv_pool(model: ModelShape, version: str) -> KVPool:
    """The family of ``create_memory_pool_configurator`` (0.5.17 and 0.5.23) for ``model``."""
    reason = unmodelled_reason(model)
    if reason is not None:
        raise Unmodelled(reason)
    if is_hybrid_swa(model, version):
        return SWAPool()
    if is_mla(model):
        return MLAPool()
    return MHAPool()
