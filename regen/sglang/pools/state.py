"""Per-request recurrent state of linear-attention hybrids, as ``KVCacheConfigurator`` charges it
(``BaseLinearStateParams.mamba_cache_per_req``: layers x (conv + temporal)), 0.5.17 and 0.5.23.

- gated delta net (Qwen3-Next, Qwen3.5/3.6): :class:`regen.sglang.models.ModelShape`'s
  ``state_bytes_per_request`` (``configs/mamba_utils.py::Mamba2StateShape.create`` with GDN's heads);
- Mamba2 (Nemotron-H): ``configs/nemotron_h.py::NemotronHConfig.mamba2_cache_params`` -> the same
  ``Mamba2StateShape.create``: conv (conv_dim / tp, conv_kernel - 1) in bf16 with conv_dim =
  mamba_num_heads x mamba_head_dim + 2 x n_groups x ssm_state_size (n_groups padded to a multiple of
  tp), temporal (mamba_num_heads / tp, mamba_head_dim, ssm_state_size) in the SSM dtype
  (``mamba2_state_dtype``: ``mamba_ssm_dtype`` of the config, default float32), over the 'M' layers of
  ``hybrid_override_pattern``.
"""

from __future__ import annotations

from regen.sglang.models import CONV_STATE_BYTES, DTYPE_BYTES, ModelShape
from regen.sglang.pools.base import Unmodelled, text_config

#: configs/model_config.py::is_nemotron_h
NEMOTRON_H_ARCHS = frozenset({"NemotronHForCausalLM", "NemotronHPuzzleForCausalLM"})


def is_mamba2_hybrid(model: ModelShape) -> bool:
    return model.architecture in NEMOTRON_H_ARCHS and "M" in str(
        text_config(model).get("hybrid_override_pattern", "")
    )


def has_state(model: ModelShape) -> bool:
    """Whether SGLang keeps a recurrent-state pool (``mambaish_config``) next to the KV cache."""
    return model.is_hybrid or is_mamba2_hybrid(model)


def state_layers(model: ModelShape) -> int:
    if is_mamba2_hybrid(model):
        return str(text_config(model)["hybrid_override_pattern"]).count("M")
    return model.linear_attention_layers


def mamba2_bytes_per_layer(model: ModelShape, tp: int, ssm_dtype: str | None) -> tuple[int, int]:
    """(conv, temporal) bytes per layer per request (``Mamba2StateShape.create``)."""
    text = text_config(model)
    heads, head_dim = int(text["mamba_num_heads"]), int(text["mamba_head_dim"])
    groups, state = int(text["n_groups"]), int(text["ssm_state_size"])
    kernel = int(text.get("conv_kernel", 4))
    if heads % tp:
        raise Unmodelled(f"{model.architecture}: mamba_num_heads {heads} not divisible by tp {tp}")
    if groups % tp:
        groups += tp - groups % tp  # extra_groups_for_head_shards: every head's groups on its rank
    conv_dim = heads * head_dim + 2 * groups * state
    dtype = str(ssm_dtype or text.get("mamba_ssm_dtype") or "float32").replace("torch.", "").lower()
    return conv_dim // tp * (kernel - 1) * CONV_STATE_BYTES, heads // tp * head_dim * state * DTYPE_BYTES[
        dtype
    ]


def state_bytes_per_request(model: ModelShape, tp: int, ssm_dtype: str | None = None) -> int:
    """P of ``_handle_max_mamba_cache``: every state layer's conv + temporal state; 0 without state."""
    if is_mamba2_hybrid(model):
        conv, temporal = mamba2_bytes_per_layer(model, tp, ssm_dtype)
        return state_layers(model) * (conv + temporal)
    return model.state_bytes_per_request(tp, ssm_dtype)
