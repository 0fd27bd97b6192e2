"""SGLang's ``KVCacheConfigurator`` steps after the weights are loaded: the linear-attention state pool
(``_handle_max_mamba_cache``, its slots per request ``_calculate_mamba_ratio``), the KV pool out of the
budget (``config_from_budget``: the pool configurator, then ``_apply_token_constraints``) and the running
cap (``resolve_max_num_reqs``).

Mirrors ``srt/mem_cache/kv_cache_configurator.py`` (0.5.17 and 0.5.23) with
``srt/mem_cache/allocation_sizing.py::get_mamba_tracking_slots``; the pools per attention family are
:mod:`regen.sglang.pools` (``srt/model_executor/pool_configurator.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from regen.sglang.errors import PlanError, UnmodelledError
from regen.sglang.flags import ServerFlags
from regen.sglang.models import ModelShape
from regen.sglang.pools import (
    PoolFlags,
    PoolTooSmall,
    Unmodelled,
    has_state,
    is_mamba2_hybrid,
    kv_pool,
    state_bytes_per_request,
)
from regen.sglang.server_args import GpuMemorySettings, SpeculativeDecoding

GIB = 1 << 30

MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO = 3  # kv_cache_configurator.py


DEFAULT_MAMBA_FULL_MEMORY_RATIO = 0.9  # ServerArgs.mamba_full_memory_ratio


# Architectures whose "auto" mamba radix strategy resolves to extra_buffer
# (srt/arg_groups/overrides.py::_MAMBA_EXTRA_BUFFER_ARCHS, Qwen families only listed here).
_EXTRA_BUFFER_ARCHS: dict[str, frozenset[str]] = {
    "0.5.17": frozenset(
        {
            "Qwen3_5ForConditionalGeneration",
            "Qwen3_5MoeForConditionalGeneration",
            "Qwen3NextForCausalLM",
            "KimiLinearForCausalLM",
            "NemotronHForCausalLM",
            "FalconH1ForCausalLM",
        }
    ),
    "0.5.23": frozenset(
        {
            "Qwen3_5ForConditionalGeneration",
            "Qwen3_5MoeForConditionalGeneration",
            "Qwen3_5MoeForCausalLM",
            "Qwen3_5ForCausalLM",
            "Qwen3NextForCausalLM",
            "KimiLinearForCausalLM",
            "NemotronHForCausalLM",
            "FalconH1ForCausalLM",
        }
    ),
}


@dataclass(frozen=True, slots=True)
class MambaCache:
    """``_handle_max_mamba_cache``: the state pool (K slots of ``per_request_bytes``), its slots per
    request and radix strategy, the speculative verify scratch (reserved, allocated), the ReplaySSM decode
    ring, and the pool budget left for the KV cache (``rest_gib``). Attention-only models: all empty."""

    per_request_bytes: int
    max_mamba_cache_size: int | None
    slots_per_request: int | None
    radix_cache_strategy: str | None
    state_gib: float
    reserved_scratch_gib: float
    scratch_gib: float
    replay_ring_gib: float
    rest_gib: float
    notes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class KVPool:
    """``config_from_budget``: the KV cell, ``max_total_num_tokens`` after the token constraints, the
    sliding-window pool's tokens, the rule followed, and the bytes they take (with the draft KV pool
    allocated outside the budget where the cell leaves the draft layers out)."""

    cell_bytes: float
    max_total_num_tokens: int
    swa_tokens: int | None
    rule: str
    kv_gib: float
    draft_kv_gib: float


@dataclass(frozen=True, slots=True)
class RunningCap:
    """``resolve_max_num_reqs``: the running cap asked for (or SGLang's estimate), the cap in effect and the
    term that binds it."""

    requested: int
    effective: int
    binding: str


def handle_max_mamba_cache(
    model: ModelShape,
    flags: ServerFlags,
    args: list[str],
    tp: int,
    version: str,
    speculative: SpeculativeDecoding,
    rest_gib: float,
) -> MambaCache:
    """The state pool out of ``rest_gib`` (the budget after weights and slack), and what it leaves."""
    if not has_state(model):
        notes = tuple(
            f"{flag} has no effect: {model.architecture} has no linear-attention layers"
            for flag in ("--max-mamba-cache-size", "--mamba-full-memory-ratio", "--mamba-ssm-dtype")
            if any(a.split("=")[0] == flag for a in args)
        )
        return MambaCache(0, None, None, None, 0.0, 0.0, 0.0, 0.0, rest_gib, notes)
    ssm_dtype = flags.mamba_ssm_dtype
    per_req = state_bytes_per_request(model, tp, ssm_dtype)
    draft_tokens = speculative.draft_tokens
    if draft_tokens and is_mamba2_hybrid(model):
        raise UnmodelledError(
            f"{model.architecture}: Mamba2 verify buffers under speculative decoding are not modelled"
        )
    slots, strategy = mamba_slots_per_request(model, flags, version)
    k, scratch_bytes = _mamba_pool(
        flags, per_req, rest_gib, slots, speculative.max_running_requests, draft_tokens
    )
    if k <= 0:
        raise PlanError(
            f"not enough GPU memory for the linear-attention state cache (max_mamba_cache_size={k}); "
            "raise --mem-fraction-static or lower --max-running-requests"
        )
    state_gib = (k + 1) * per_req / GIB
    reserved_scratch_gib = scratch_bytes / GIB
    rest_gib -= state_gib + reserved_scratch_gib
    scratch_gib = (
        spec_scratch_allocated_bytes(model, tp, ssm_dtype, scratch_bytes, per_req, draft_tokens) / GIB
    )
    ring_gib = 0.0
    if flags.enable_linear_replayssm:
        ring_gib = (k + 1) * model.replay_ring_bytes_per_slot(tp, ssm_dtype, flags.linear_replayssm_cache_len)
        ring_gib /= GIB
    return MambaCache(
        per_req, k, slots, strategy, state_gib, reserved_scratch_gib, scratch_gib, ring_gib, rest_gib, ()
    )


def config_from_budget(
    model: ModelShape,
    flags: ServerFlags,
    tp: int,
    version: str,
    memory: GpuMemorySettings,
    speculative: SpeculativeDecoding,
    rest_gib: float,
) -> KVPool:
    """The KV (and sliding-window) pool out of ``rest_gib``, capped by ``--max-total-tokens``."""
    draft_tokens, draft_layers = speculative.draft_tokens, speculative.draft_layers
    in_cell = draft_layers if draft_kv_in_cell(flags, model) else 0
    pool_flags = PoolFlags(
        tp=tp,
        kv_cache_dtype=flags.kv_cache_dtype,
        page_size=flags.page_size,
        draft_layers_in_cell=in_cell,
        max_running_requests=speculative.max_running_requests,
        disable_radix_cache=flags.disable_radix_cache,
        chunked_prefill_size=memory.chunked_prefill_size,
        overlap_schedule=not flags.disable_overlap_schedule,
        speculative=bool(draft_tokens),
        speculative_draft_tokens=draft_tokens,
        swa_full_tokens_ratio=flags.swa_full_tokens_ratio,
        sglang_version=version,
    )
    try:
        pool = kv_pool(model, version)
        sizes = pool.size(model, int(rest_gib * GIB), pool_flags)
        draft_cell = pool.cell_bytes(model, pool_flags, draft_layers) - pool.cell_bytes(model, pool_flags)
    except Unmodelled as exc:
        raise UnmodelledError(str(exc)) from exc
    except PoolTooSmall as exc:
        raise PlanError(str(exc)) from exc
    cell, tokens = sizes.cell_bytes, sizes.kv_cache_tokens
    other_pools_bytes = sizes.kv_bytes - tokens * cell  # the sliding-window pool, where there is one
    if flags.max_total_tokens is not None:  # _apply_token_constraints
        tokens = min(tokens, flags.max_total_tokens)
    draft_kv_gib = 0.0 if in_cell else tokens * draft_cell / GIB
    kv_gib = (tokens * cell + other_pools_bytes) / GIB
    return KVPool(cell, tokens, sizes.swa_tokens, sizes.rule, kv_gib, draft_kv_gib)


def resolve_max_num_reqs(
    model: ModelShape, flags: ServerFlags, speculative: SpeculativeDecoding, tokens: int, mamba: MambaCache
) -> RunningCap:
    """The running cap: the one asked for (else SGLang's estimate from the context length), bounded by half
    the KV tokens and by the state pool's slots."""
    context_len = flags.context_length or model.context_length or 4096
    if speculative.max_running_requests is not None:
        requested = max(1, speculative.max_running_requests)
    else:
        requested = max(min(int(tokens / context_len * 512), 4096), 2048)  # SGLang's estimate
    terms = {"max_running_requests": requested, "kv_tokens": tokens // 2}
    k, slots = mamba.max_mamba_cache_size, mamba.slots_per_request
    if k is not None and slots is not None:
        terms["mamba_pool"] = k // slots
    binding = min(terms, key=lambda key: terms[key])
    return RunningCap(requested, terms[binding], binding)


def mamba_slots_per_request(model: ModelShape, flags: ServerFlags, version: str) -> tuple[int, str | None]:
    """(S, strategy): KVCacheConfigurator._calculate_mamba_ratio after _mamba_radix_cache_resolution."""
    if flags.disable_radix_cache:
        return 1, None
    strategy = flags.mamba_radix_cache_strategy
    if strategy == "auto":
        wants_overlap = not flags.disable_overlap_schedule
        supports = model.architecture in _EXTRA_BUFFER_ARCHS[version]
        strategy = "extra_buffer" if (wants_overlap or flags.page_size > 1) and supports else "no_buffer"
    overlap = not flags.disable_overlap_schedule and strategy != "no_buffer"  # no_buffer forces no overlap
    if strategy == "extra_buffer":
        tracking = 2 if overlap else 1  # allocation_sizing.get_mamba_tracking_slots
    elif strategy == "extra_buffer_lazy":
        tracking = 1
    else:
        tracking = 0
    return MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO + tracking, strategy


#: architectures whose MTP draft SGLang loads from the model path itself (speculative_hook
#: ``_handle_eagle_family`` sets ``speculative_draft_model_path``, so the target's KV cell counts the draft
#: layers), 0.5.17 and 0.5.23 (which adds the last two); for every other MTP model (Qwen3.5/3.6: its
#: config has ``mtp_num_hidden_layers``, not ``num_nextn_predict_layers``) the cell is the target's alone
_DRAFT_PATH_ARCHS = frozenset({
    "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV4ForCausalLM", "Glm4MoeForCausalLM",
    "Glm4MoeLiteForCausalLM", "GlmMoeDsaForCausalLM", "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM",
    "BailingMoeV2_5ForCausalLM", "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration",
    "HYV3ForCausalLM", "HYV4ForCausalLM", "Qwen4ExpForConditionalGeneration",
})  # fmt: skip


def draft_kv_in_cell(flags: ServerFlags, model: ModelShape) -> bool:
    """Whether SGLang sizes the target's KV pool with the draft layers in the cell
    (``DefaultPoolConfigurator``: only when ``eagle_draft_num_layers`` is known, i.e. a draft model path
    is set); otherwise the draft KV pool is allocated after the budget, out of the slack."""
    return flags.speculative_draft_model_path is not None or model.architecture in _DRAFT_PATH_ARCHS


def spec_scratch_allocated_bytes(
    model: ModelShape, tp: int, ssm_dtype: str | None, reserved: int, per_req: int, draft: int
) -> int:
    """What ``MambaPool`` allocates for the verify buffers whose budget SGLang reserved as
    ``per_req x (running + 1) x D`` (``_handle_max_mamba_cache``): per slot, one SSM state per draft token
    (``intermediate_ssm_state_cache``) and a conv window of ``D + K_conv - 2`` columns instead of the
    state's ``K_conv - 1`` (``intermediate_conv_window_cache``). Measured (0.5.17, seed flags, 65 slots,
    fp32): 36.56 + 0.36 GB."""
    if not reserved or not draft or not per_req or model.linear is None:
        return 0
    slots = reserved // (per_req * draft)
    layers = model.linear_attention_layers
    ssm = model.ssm_state_bytes_per_layer(tp, ssm_dtype) * layers * draft
    kernel = model.linear.conv_kernel_dim
    conv = model.conv_state_bytes_per_layer(tp) * layers * (draft + kernel - 2) // max(1, kernel - 1)
    return slots * (ssm + conv)


def _mamba_pool(
    flags: ServerFlags, per_req: int, rest_gib: float, slots: int, mrr: int | None, draft: int
) -> tuple[int, int]:
    """(K, speculative scratch bytes): the three branches of KVCacheConfigurator._handle_max_mamba_cache."""
    if flags.max_mamba_cache_size is not None:
        k = flags.max_mamba_cache_size
        scratch = per_req * (min(max(1, mrr or 1), k // slots) + 1) * draft if draft else 0
        return k, scratch
    if flags.disable_radix_cache and mrr is not None:
        k = max(1, mrr)
        return k, per_req * (k + 1) * draft if draft else 0
    ratio = flags.mamba_full_memory_ratio or DEFAULT_MAMBA_FULL_MEMORY_RATIO
    budget = rest_gib * ratio / (1 + ratio) * GIB
    if draft:
        k = int((budget - per_req * (1 + draft)) // (per_req * (1 + draft / slots)))
        capped = min(max(1, mrr or 1), k // slots)
        return k, per_req * (capped + 1) * draft
    return int((budget - per_req) // per_req), 0
