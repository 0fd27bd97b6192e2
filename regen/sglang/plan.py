"""Plan SGLang's GPU memory and launch flags from SGLang's own allocation rules.

Mirrors (function names are SGLang's; 0.5.23 paths, 0.5.17 equivalents live in srt/server_args.py):
- default chunked prefill / decode graph max_bs / mem_fraction_static:
  ``srt/arg_groups/memory_hook.py::handle_gpu_memory_settings``
  (0.5.17: ``ServerArgs._handle_gpu_memory_settings``),
  ``reserve_for_graph_mb``, ``adjust_mem_fraction_for_vlm``;
- KV budget: ``srt/mem_cache/kv_cache_configurator.py::KVCacheConfigurator._profile_available_bytes``;
- mamba pool K: ``KVCacheConfigurator._handle_max_mamba_cache``;
  slots per request S: ``_calculate_mamba_ratio``
  with ``srt/mem_cache/allocation_sizing.py::get_mamba_tracking_slots``;
- running cap: ``KVCacheConfigurator.resolve_max_num_reqs``;
- KV tokens: ``srt/model_executor/pool_configurator.py::DefaultPoolConfigurator.calculate_pool_sizes``;
- speculative defaults: ``srt/arg_groups/speculative_hook.py``
  (max_running_requests 48; steps/topk/draft 3/1/4).

The ``regen tune`` command and the ``tune`` rule entry live in :mod:`regen.tune.tune`; what a launched
server really allocated, and its drift from this plan, in :mod:`regen.sglang.realized`.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from regen.io import write_json
from regen.sglang.fit import smallest_fitting_tp, tp_refusals
from regen.sglang.flags import cuda_graph_max_bs_flag, renamed_flag_warnings
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
from regen.sglang.weights import weights_per_rank

log = logging.getLogger("regen.tune.tune")
T = TypeVar("T")

GIB = 1 << 30
DEFAULT_VERSION = "0.5.23"
SUPPORTED_VERSIONS = ("0.5.17", "0.5.23")
# Memory in use before SGLang loads weights (CUDA context, NCCL, torch allocator). Not an SGLang constant:
# calibrated so the measured H200 startup (0.5.17, 64-layer Qwen3.6-27B text shape, 143,771 MiB) reproduces
# K=248 and 651,426 KV tokens; see tests/test_plan.py::test_reproduces_measured_h200_default.
CUDA_CONTEXT_GIB = 1.35
VLM_CACHE_GIB = 0.1  # SGLANG_VLM_CACHE_SIZE_MB=100 (kv_cache_configurator.mm_runtime_reservation_gb, 0.5.23)
MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO = 3  # kv_cache_configurator.py
DEFAULT_MAMBA_FULL_MEMORY_RATIO = 0.9  # ServerArgs.mamba_full_memory_ratio
DEFAULT_DECODE_GRAPH_LIMIT_NOTE = 256
#: ServerArgs.linear_replayssm_cache_len default: decode steps between the ReplaySSM ring's state flushes
REPLAY_RING_LEN = 16
#: the memory fraction the tuner tries besides SGLang's default (measured on the H200: 5.5 GB still free
#: after CUDA graphs at a 608 cap, 2026-11-30); its slack is the least runtime headroom regen plans for
TUNER_MEM_FRACTION = 0.92

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


class PlanError(ValueError):
    """Flags or inputs the planner cannot turn into a memory plan."""


class UnmodelledError(PlanError):
    """A model whose pools the planner does not model: SGLang's own planning applies (no memory flags)."""


@dataclass(frozen=True, slots=True)
class Workload:
    prompt_p50: int
    prompt_p99: int
    max_tokens: int
    target_concurrency: int | None = None
    unique_prompts: bool = True
    #: mean completion tokens expected (source answers, a pilot); adds scheduler candidates (see
    #: ``scheduler_candidates``) that size the running cap for it instead of for max_tokens
    expected_output_tokens: int | None = None

    @property
    def tokens_per_request(self) -> int:
        """The worst case: prompt p99 + max_tokens."""
        return self.prompt_p99 + self.max_tokens

    @property
    def expected_output(self) -> int:
        """The expected answer length: ``expected_output_tokens`` when given below ``max_tokens``, else
        ``max_tokens`` (all the workload knows; :attr:`expected_output_known` says which)."""
        return int(self.expected_output_tokens) if self.expected_output_known else self.max_tokens

    @property
    def expected_output_known(self) -> bool:
        return bool(self.expected_output_tokens) and int(self.expected_output_tokens or 0) < self.max_tokens

    @property
    def expected_tokens_per_request(self) -> int:
        """The expected context of a running request: prompt p50 + the expected answer. The mean context
        of a running set (length-biased: long answers run longer) is prompt + E[L]·(1 + cv²)/2, so this
        holds while the answers' squared coefficient of variation is at most 1."""
        return self.prompt_p50 + self.expected_output


@dataclass(frozen=True, slots=True)
class ServerFlags:
    """The subset of SGLang launch flags the planner understands, with SGLang's defaults (None = auto)."""

    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    max_mamba_cache_size: int | None = None
    mamba_full_memory_ratio: float | None = None
    mamba_radix_cache_strategy: str = "auto"
    mamba_ssm_dtype: str | None = None
    disable_radix_cache: bool = False
    disable_overlap_schedule: bool = False
    kv_cache_dtype: str = "auto"
    max_total_tokens: int | None = None
    chunked_prefill_size: int | None = None
    context_length: int | None = None
    cuda_graph_max_bs: int | None = None
    disable_cuda_graph: bool = False
    speculative_algorithm: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    speculative_draft_model_path: str | None = None
    page_size: int = 1
    tp: int | None = None
    num_continuous_decode_steps: int | None = None
    enable_linear_replayssm: bool = False
    linear_replayssm_cache_len: int = REPLAY_RING_LEN
    linear_attn_backend: str = "triton"
    linear_attn_decode_backend: str | None = None
    swa_full_tokens_ratio: float = 0.8  # ServerArgs.swa_full_tokens_ratio (0.5.17 and 0.5.23)

    @property
    def decode_backend(self) -> str:
        """``--linear-attn-decode-backend``, else ``--linear-attn-backend`` (server_args, 0.5.17/0.5.23)."""
        return self.linear_attn_decode_backend or self.linear_attn_backend


_VALUE_FLAGS: dict[str, tuple[str, type]] = {
    "--mem-fraction-static": ("mem_fraction_static", float),
    "--max-running-requests": ("max_running_requests", int),
    "--max-mamba-cache-size": ("max_mamba_cache_size", int),
    "--mamba-full-memory-ratio": ("mamba_full_memory_ratio", float),
    "--mamba-radix-cache-strategy": ("mamba_radix_cache_strategy", str),
    "--mamba-scheduler-strategy": ("mamba_radix_cache_strategy", str),
    "--mamba-ssm-dtype": ("mamba_ssm_dtype", str),
    "--kv-cache-dtype": ("kv_cache_dtype", str),
    "--max-total-tokens": ("max_total_tokens", int),
    "--chunked-prefill-size": ("chunked_prefill_size", int),
    "--context-length": ("context_length", int),
    "--cuda-graph-max-bs": ("cuda_graph_max_bs", int),
    "--cuda-graph-max-bs-decode": ("cuda_graph_max_bs", int),
    "--speculative-algorithm": ("speculative_algorithm", str),
    "--speculative-num-steps": ("speculative_num_steps", int),
    "--speculative-eagle-topk": ("speculative_eagle_topk", int),
    "--speculative-num-draft-tokens": ("speculative_num_draft_tokens", int),
    "--speculative-draft-model-path": ("speculative_draft_model_path", str),
    "--page-size": ("page_size", int),
    "--tp-size": ("tp", int),
    "--tp": ("tp", int),
    "--tensor-parallel-size": ("tp", int),
    "--num-continuous-decode-steps": ("num_continuous_decode_steps", int),
    "--linear-replayssm-cache-len": ("linear_replayssm_cache_len", int),
    "--linear-attn-backend": ("linear_attn_backend", str),
    "--linear-attn-decode-backend": ("linear_attn_decode_backend", str),
    "--swa-full-tokens-ratio": ("swa_full_tokens_ratio", float),
}
_BOOL_FLAGS: dict[str, str] = {
    "--disable-radix-cache": "disable_radix_cache",
    "--disable-overlap-schedule": "disable_overlap_schedule",
    "--disable-cuda-graph": "disable_cuda_graph",
    "--disable-decode-cuda-graph": "disable_cuda_graph",
    "--enable-linear-replayssm": "enable_linear_replayssm",
}


def parse_flags(args: list[str]) -> ServerFlags:
    """Read the flags the planner understands from an SGLang argv; other flags are skipped."""
    values: dict[str, Any] = {}
    i = 0
    while i < len(args):
        token = args[i]
        name, eq, inline = token.partition("=")
        if name in _BOOL_FLAGS:
            values[_BOOL_FLAGS[name]] = True
        elif name in _VALUE_FLAGS:
            attr, kind = _VALUE_FLAGS[name]
            if eq:
                raw = inline
            elif i + 1 < len(args):
                i += 1
                raw = args[i]
            else:
                raise PlanError(f"flag {name} needs a value")
            try:
                values[attr] = kind(raw)
            except ValueError as exc:
                raise PlanError(f"flag {name}: {raw!r} is not a valid {kind.__name__}") from exc
        i += 1
    return ServerFlags(**values)


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    sglang_version: str
    gpu_memory_mib: int
    tp: int
    args: tuple[str, ...]
    mem_fraction_static: float
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    weights_gib: float
    weights_rule: str
    state_pool_gib: float
    spec_scratch_gib: float
    kv_cache_gib: float
    reserve_gib: float  # graphs + activations estimate (memory_hook reserved_mem)
    slack_gib: float  # (1 - mfs) x memory before load
    context_gib: float
    vlm_cache_gib: float
    free_gib: float
    state_bytes_per_request: int
    kv_cell_bytes: float
    max_mamba_cache_size: int | None
    mamba_slots_per_request: int | None
    mamba_radix_cache_strategy: str | None
    kv_cache_tokens: int
    swa_tokens: int | None  # the sliding-window pool's tokens, where there is one
    kv_pool_rule: str  # the SGLang configurator the KV (and SWA) tokens follow
    requested_max_running_requests: int
    effective_max_running_requests: int
    binding_constraint: str
    workload_concurrency: int | None = None  # running requests the KV cache holds at p99 prompt + max_tokens
    #: requests the client keeps in flight: for attention-only models the KV cache filled at the expected
    #: context (prompt p50 + expected answer), never below SGLang's decode-graph default, within the cap;
    #: for linear-attention hybrids the running cap (their state pool sets it)
    client_concurrency: int | None = None
    notes: tuple[str, ...] = ()
    #: --enable-linear-replayssm decode ring: allocated per state slot outside SGLang's pool budget (its
    #: solver charges only the spec-verify ring), so it comes out of the (1 - mfs) runtime slack
    replay_ring_gib: float = 0.0
    #: speculative decoding (EAGLE/NEXTN): the draft model's own weights (its MTP layer, fc, and a copy of
    #: the embedding and lm_head, shared with the target only after the pools are sized), charged against
    #: the pool budget; and the draft KV pool (the draft layers' KV for every token), allocated after the
    #: budget, out of the runtime slack, where SGLang leaves the draft layers out of the cell
    draft_weights_gib: float = 0.0
    draft_kv_gib: float = 0.0

    @property
    def mamba_pool_gib(self) -> float:
        return self.state_pool_gib + self.spec_scratch_gib

    def summary(self) -> dict[str, Any]:
        return {
            "mem_fraction_static": self.mem_fraction_static,
            "max_mamba_cache_size": self.max_mamba_cache_size,
            "mamba_slots_per_request": self.mamba_slots_per_request,
            "mamba_pool_gib": round(self.mamba_pool_gib, 3),
            "kv_cache_tokens": self.kv_cache_tokens,
            "kv_cache_gib": round(self.kv_cache_gib, 3),
            "weights_gib": round(self.weights_gib, 3),
            "effective_max_running_requests": self.effective_max_running_requests,
            "binding_constraint": self.binding_constraint,
            "workload_concurrency": self.workload_concurrency,
            "client_concurrency": self.client_concurrency,
            "cuda_graph_max_bs": self.cuda_graph_max_bs,
            "replay_ring_gib": round(self.replay_ring_gib, 3),
        }

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["args"] = list(self.args)
        out["notes"] = list(self.notes)
        out["mamba_pool_gib"] = self.mamba_pool_gib
        return out


# ---------------------------------------------------------------- defaults (memory_hook) --
def _capacity_defaults(gpu_mib: int, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, decode graph max_bs) tiers of handle_gpu_memory_settings."""
    if gpu_mib < 20 * 1024:
        return 2048, 8
    if gpu_mib < 35 * 1024:
        return 4096, 48 if tp < 4 else 160
    if gpu_mib < 60 * 1024:
        return 4096, 32 if tp < 4 else 160
    if gpu_mib < 160 * 1024:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def prefill_graph_batch_sizes(max_bs: int) -> list[int]:
    """cuda_graph_hook.generate_prefill_cuda_graph_batch_sizes (0.5.17: ServerArgs._generate_prefill_...)."""
    sizes = (
        list(range(4, 33, 4))
        + list(range(48, 257, 16))
        + list(range(288, 513, 32))
        + list(range(576, 1025, 64))
        + list(range(1280, 4097, 256))
        + list(range(4608, max_bs + 1, 512))
    )
    return [s for s in sizes if s <= max_bs]


def reserved_memory_mib(gpu_mib: int, tp: int, chunk: int, decode_max_bs: int, flags: ServerFlags) -> float:
    """handle_gpu_memory_settings: 512 + 1.5*max(chunk, 2048) + tp/8*1024 + reserve_for_graph_mb."""
    activation_tokens = max(chunk, 2048) if chunk > 0 else 2048
    graph = 0.0 if flags.disable_cuda_graph else decode_max_bs * 2.0
    prefill_max_bs = chunk if chunk > 0 else 0
    if flags.max_total_tokens is not None:
        prefill_max_bs = min(prefill_max_bs, flags.max_total_tokens)
    graph += len(prefill_graph_batch_sizes(prefill_max_bs)) * 8
    reserved = 512 + activation_tokens * 1.5 + tp / 8 * 1024 + graph
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return reserved


def vlm_mem_fraction_factor(model: ModelShape) -> float:
    """adjust_mem_fraction_for_vlm: 0.95 x clamp(1 - 0.1 x (complexity - 1), 0.8, 1.05)."""
    if not model.is_multimodal:
        return 1.0
    ratio = (model.vision_layers * model.vision_hidden_size**2) / (24 * 1024**2)
    return 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))


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


def draft_weights_bytes(model: ModelShape) -> int:
    """The MTP draft model SGLang loads next to the target (``Qwen3_5ForCausalLMMTP``: ``mtp_layers``
    full-attention decoder layers, ``fc`` 2h -> h, two pre-fc norms, its own embedding and lm_head, which
    it replaces by the target's only after the memory pools are sized)."""
    if model.mtp_layers <= 0:
        return 0
    draft = replace(
        model,
        full_attention_layers=model.mtp_layers,
        linear_attention_layers=0,
        weights_bytes_from_index=None,
    )
    params = draft.estimated_parameters()
    h = model.hidden_size
    return int(draft.weights_bytes() * (params + 2 * h * h + 2 * h) / params)


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


def _speculative(flags: ServerFlags, model: ModelShape) -> tuple[int, int]:
    """(draft tokens D, draft KV layers): NEXTN == EAGLE; auto 3/1/4; topk 1 forces D = steps + 1."""
    algo = (flags.speculative_algorithm or "").upper()
    if not algo:
        return 0, 0
    steps = flags.speculative_num_steps or 3
    topk = flags.speculative_eagle_topk or 1
    draft = flags.speculative_num_draft_tokens or 4
    if topk == 1:
        draft = steps + 1
    draft_layers = max(1, model.mtp_layers) if algo in ("EAGLE", "NEXTN", "EAGLE3") else 0
    return draft, draft_layers


# ------------------------------------------------------------------------------- plan --
def plan(
    model: ModelShape,
    gpu_memory_mib: int,
    tp: int,
    args: list[str],
    workload: Workload | None = None,
    sglang_version: str = DEFAULT_VERSION,
    cuda_context_gib: float = CUDA_CONTEXT_GIB,
) -> MemoryPlan:
    """Predict what SGLang will allocate for `args` on one GPU of `gpu_memory_mib` (per-TP-rank view)."""
    if sglang_version not in SUPPORTED_VERSIONS:
        raise PlanError(f"sglang_version {sglang_version!r} not supported; use one of {SUPPORTED_VERSIONS}")
    flags = parse_flags(args)
    tp = flags.tp or tp
    notes: list[str] = []
    default_chunk, default_decode_bs = _capacity_defaults(gpu_memory_mib, tp)
    chunk = flags.chunked_prefill_size if flags.chunked_prefill_size is not None else default_chunk
    decode_bs = flags.cuda_graph_max_bs
    draft_tokens, draft_layers = _speculative(flags, model)
    mrr_requested = flags.max_running_requests
    if mrr_requested is None and draft_tokens:
        mrr_requested = 48  # speculative_hook: "Max running requests is reset to 48"
    if decode_bs is None:
        decode_bs = default_decode_bs
        if flags.max_running_requests is not None and decode_bs > flags.max_running_requests:
            decode_bs = flags.max_running_requests
    reserve_mib = reserved_memory_mib(gpu_memory_mib, tp, chunk, decode_bs, flags)
    if flags.mem_fraction_static is not None:
        mfs = flags.mem_fraction_static
    else:
        mfs = round((gpu_memory_mib - reserve_mib) / gpu_memory_mib, 3) * vlm_mem_fraction_factor(model)
    total_gib = gpu_memory_mib / 1024
    pre_load_gib = total_gib - cuda_context_gib
    refused = tp_refusals(model, tp)
    if refused:
        fit = smallest_fitting_tp(model, gpu_memory_mib)
        raise PlanError(
            f"tp {tp} refused by SGLang: {'; '.join(refused)} (smallest tp that works: {fit.reason})"
        )
    weights = weights_per_rank(model, tp)
    weights_gib = weights.gib_per_rank
    slack_gib = pre_load_gib * (1 - mfs)
    vlm_gib = VLM_CACHE_GIB if model.is_multimodal and sglang_version != "0.5.17" else 0.0
    draft_weights_gib = draft_weights_bytes(model) / tp / GIB if draft_layers else 0.0
    rest_gib = pre_load_gib - weights_gib - draft_weights_gib - slack_gib - vlm_gib

    ssm_dtype = flags.mamba_ssm_dtype
    stateful = has_state(model)
    per_req = state_bytes_per_request(model, tp, ssm_dtype) if stateful else 0
    ring_gib = 0.0
    reserved_scratch_gib = 0.0
    k: int | None = None
    slots: int | None = None
    strategy: str | None = None
    state_gib = scratch_gib = 0.0
    if stateful:
        if draft_tokens and is_mamba2_hybrid(model):
            raise UnmodelledError(
                f"{model.architecture}: Mamba2 verify buffers under speculative decoding are not modelled"
            )
        slots, strategy = mamba_slots_per_request(model, flags, sglang_version)
        k, scratch_bytes = _mamba_pool(flags, per_req, rest_gib, slots, mrr_requested, draft_tokens)
        if k <= 0:
            raise PlanError(
                f"not enough GPU memory for the linear-attention state cache (max_mamba_cache_size={k}); "
                "raise --mem-fraction-static or lower --max-running-requests"
            )
        state_gib = (k + 1) * per_req / GIB
        reserved_scratch_gib = scratch_bytes / GIB
        rest_gib -= state_gib + reserved_scratch_gib
        scratch_gib = spec_scratch_allocated_bytes(model, tp, ssm_dtype, scratch_bytes, per_req, draft_tokens)
        scratch_gib /= GIB
        if flags.enable_linear_replayssm:
            ring_gib = (k + 1) * model.replay_ring_bytes_per_slot(
                tp, ssm_dtype, flags.linear_replayssm_cache_len
            )
            ring_gib /= GIB
            notes += replay_ring_notes(ring_gib, slack_gib, reserve_mib / 1024, mfs, pre_load_gib)
    else:
        for flag in ("--max-mamba-cache-size", "--mamba-full-memory-ratio", "--mamba-ssm-dtype"):
            if any(a.split("=")[0] == flag for a in args):
                notes.append(f"{flag} has no effect: {model.architecture} has no linear-attention layers")
    if rest_gib <= 0:
        draft = f" + MTP draft {draft_weights_gib:.1f} GiB" if draft_weights_gib else ""
        fit = smallest_fitting_tp(model, gpu_memory_mib, reserve_mib=reserve_mib)
        raise PlanError(
            f"weights ({weights_gib:.1f} GiB per rank at tp {tp}{draft}) leave no KV cache memory at "
            f"mem_fraction_static={mfs:.3f}; "
            + (f"the smallest tp that fits: {fit.tp} ({fit.reason})" if fit.tp else fit.reason)
        )
    in_cell = draft_layers if draft_kv_in_cell(flags, model) else 0
    pool_flags = PoolFlags(
        tp=tp,
        kv_cache_dtype=flags.kv_cache_dtype,
        page_size=flags.page_size,
        draft_layers_in_cell=in_cell,
        max_running_requests=mrr_requested,
        disable_radix_cache=flags.disable_radix_cache,
        chunked_prefill_size=chunk,
        overlap_schedule=not flags.disable_overlap_schedule,
        speculative=bool(draft_tokens),
        speculative_draft_tokens=draft_tokens,
        swa_full_tokens_ratio=flags.swa_full_tokens_ratio,
        sglang_version=sglang_version,
    )
    try:
        pool = kv_pool(model, sglang_version)
        sizes = pool.size(model, int(rest_gib * GIB), pool_flags)
        draft_cell = pool.cell_bytes(model, pool_flags, draft_layers) - pool.cell_bytes(model, pool_flags)
    except Unmodelled as exc:
        raise UnmodelledError(str(exc)) from exc
    except PoolTooSmall as exc:
        raise PlanError(str(exc)) from exc
    cell, tokens = sizes.cell_bytes, sizes.kv_cache_tokens
    other_pools_bytes = sizes.kv_bytes - tokens * cell  # the sliding-window pool, where there is one
    if flags.max_total_tokens is not None:
        tokens = min(tokens, flags.max_total_tokens)
    draft_kv_gib = 0.0 if in_cell else tokens * draft_cell / GIB
    context_len = flags.context_length or model.context_length or 4096
    if mrr_requested is not None:
        requested = max(1, mrr_requested)
    else:
        requested = max(min(int(tokens / context_len * 512), 4096), 2048)  # resolve_max_num_reqs estimate
    terms = {"max_running_requests": requested, "kv_tokens": tokens // 2}
    if k is not None and slots is not None:
        terms["mamba_pool"] = k // slots
    binding = min(terms, key=lambda key: terms[key])
    running = terms[binding]
    workload_running = client = None
    if workload is not None:
        workload_running = min(running, tokens // max(1, workload.tokens_per_request))
        client = workload_running if stateful else expected_fill(tokens, workload, decode_bs, running)
    kv_gib = (tokens * cell + other_pools_bytes) / GIB
    free_gib = (
        total_gib
        - cuda_context_gib
        - weights_gib
        - state_gib
        - scratch_gib
        - kv_gib
        - slack_gib
        - vlm_gib
        - draft_weights_gib
        - draft_kv_gib
    )
    return MemoryPlan(
        sglang_version=sglang_version,
        gpu_memory_mib=gpu_memory_mib,
        tp=tp,
        args=tuple(args),
        mem_fraction_static=round(mfs, 4),
        chunked_prefill_size=chunk,
        cuda_graph_max_bs=decode_bs,
        weights_gib=weights_gib,
        weights_rule=f"{weights.rule} [{weights.source}]",
        state_pool_gib=state_gib,
        spec_scratch_gib=scratch_gib,
        kv_cache_gib=kv_gib,
        reserve_gib=reserve_mib / 1024,
        slack_gib=slack_gib,
        context_gib=cuda_context_gib,
        vlm_cache_gib=vlm_gib,
        free_gib=free_gib,
        state_bytes_per_request=per_req,
        kv_cell_bytes=cell,
        swa_tokens=sizes.swa_tokens,
        kv_pool_rule=sizes.rule,
        max_mamba_cache_size=k,
        mamba_slots_per_request=slots,
        mamba_radix_cache_strategy=strategy,
        kv_cache_tokens=tokens,
        requested_max_running_requests=requested,
        effective_max_running_requests=running,
        binding_constraint=binding,
        workload_concurrency=workload_running,
        client_concurrency=client,
        notes=tuple(notes),
        replay_ring_gib=ring_gib,
        draft_weights_gib=draft_weights_gib,
        draft_kv_gib=draft_kv_gib,
    )


def expected_fill(tokens: int, workload: Workload, decode_graph_bs: int, running: int) -> int:
    """Requests in flight that fill ``tokens`` of KV at the workload's expected context, never fewer than
    the decode graphs SGLang captures by default, never more than the running cap."""
    return min(running, max(tokens // max(1, workload.expected_tokens_per_request), decode_graph_bs))


def replay_ring_notes(
    ring_gib: float, slack_gib: float, reserve_gib: float, mfs: float, pre_load_gib: float
) -> list[str]:
    """What the ReplaySSM decode ring does to the runtime headroom (CUDA graphs, activations): a note when
    it leaves less than both SGLang's reserve estimate and the slack of the tuner's own memory fraction."""
    left = slack_gib - ring_gib
    notes = [
        f"--enable-linear-replayssm: its decode ring takes {ring_gib:.2f} GiB outside SGLang's pool budget, "
        f"leaving {left:.2f} GiB of the {slack_gib:.2f} GiB runtime slack"
    ]
    needed = min(reserve_gib, (1 - TUNER_MEM_FRACTION) * pre_load_gib)
    if left < needed:
        fit = math.floor((mfs - (needed - left) / pre_load_gib) * 1000) / 1000
        notes.append(
            f"that is less than the {needed:.2f} GiB kept for CUDA graphs and activations: expect an "
            f"out-of-memory error at graph capture; --mem-fraction-static {fit:g} keeps it"
        )
    return notes


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


# ------------------------------------------------------------------------- recommend --
@dataclass(frozen=True, slots=True)
class Candidate:
    args: tuple[str, ...]
    plan: MemoryPlan
    score: int
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Recommendation:
    given: MemoryPlan
    recommended: MemoryPlan
    args: tuple[str, ...]
    reasons: tuple[str, ...]
    warnings: tuple[str, ...]
    candidates: tuple[Candidate, ...] = field(default=())
    #: what ``regen tune --sweep`` measures against the recommendation for speculative decoding (MTP at 1-3
    #: steps when the model has MTP layers; the same without MTP when the given flags force it on)
    speculative: tuple[Candidate, ...] = field(default=())
    #: why MTP is on or off in this (static, unmeasured) plan
    mtp_note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            **self.given.summary(),
            "recommended": {
                **self.recommended.summary(),
                "args": list(self.args),
                "reasons": list(self.reasons),
            },
            "warnings": list(self.warnings),
            "candidates": [
                {"args": list(c.args), "score": c.score, "reasons": list(c.reasons), **c.plan.summary()}
                for c in self.candidates
            ],
            "speculative_candidates": [
                {"args": list(c.args), "score": c.score, "reasons": list(c.reasons), **c.plan.summary()}
                for c in self.speculative
            ],
            "mtp": self.mtp_note,
        }


_PLANNER_FLAGS = {
    "--mem-fraction-static",
    "--max-running-requests",
    "--max-mamba-cache-size",
    "--mamba-full-memory-ratio",
    "--mamba-radix-cache-strategy",
    "--mamba-scheduler-strategy",
    "--mamba-ssm-dtype",
    "--disable-radix-cache",
    "--kv-cache-dtype",
    "--cuda-graph-max-bs",
    "--cuda-graph-max-bs-decode",
}


def _strip_planner_flags(args: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(args):
        name, eq, _ = args[i].partition("=")
        if name in _PLANNER_FLAGS:
            takes_value = name in _VALUE_FLAGS and not eq
            i += 2 if takes_value else 1
            continue
        out.append(args[i])
        i += 1
    return out


def flag_warnings(args: list[str], model: ModelShape, sglang_version: str = DEFAULT_VERSION) -> list[str]:
    """Flags that do nothing in this configuration, and renamed/removed spellings."""
    flags = parse_flags(args)
    names = {a.split("=")[0] for a in args if a.startswith("--")}
    out = list(renamed_flag_warnings(args, sglang_version))
    if "--mamba-full-memory-ratio" in names:
        if flags.max_mamba_cache_size is not None:
            out.append("--mamba-full-memory-ratio is ignored when --max-mamba-cache-size is given")
        elif flags.disable_radix_cache and flags.max_running_requests is not None:
            out.append(
                "--mamba-full-memory-ratio is ignored with --disable-radix-cache and --max-running-requests "
                "(the mamba pool is sized to max_running_requests)"
            )
    if "--num-continuous-decode-steps" in names and sglang_version == "0.5.23":
        out.append("--num-continuous-decode-steps has no effect: nothing reads it in SGLang 0.5.23")
    if flags.disable_radix_cache and "--mamba-radix-cache-strategy" in names:
        out.append("--mamba-radix-cache-strategy is ignored with --disable-radix-cache")
    if not has_state(model):
        for flag in ("--max-mamba-cache-size", "--mamba-full-memory-ratio", "--mamba-ssm-dtype"):
            if flag in names:
                out.append(f"{flag} has no effect: {model.architecture} has no linear-attention layers")
    out += replay_flag_problems(flags, model, sglang_version)
    if (flags.mamba_radix_cache_strategy == "no_buffer") and not flags.disable_overlap_schedule:
        out.append(
            "--mamba-radix-cache-strategy no_buffer requires --disable-overlap-schedule (SGLang asserts)"
        )
    return out


def replay_flag_problems(flags: ServerFlags, model: ModelShape, version: str) -> list[str]:
    """Why ``--enable-linear-replayssm`` would do nothing or be refused (server_args
    ``_handle_linear_attn_backend``, 0.5.17 and 0.5.23); empty when it applies."""
    if not flags.enable_linear_replayssm:
        return []
    if not model.is_hybrid:
        return [
            f"--enable-linear-replayssm has no effect: {model.architecture} has no linear-attention layers"
        ]
    out = []
    if flags.decode_backend != "triton":
        out.append(
            "--enable-linear-replayssm requires the triton linear-attention decode backend "
            f"(SGLang refuses --linear-attn-decode-backend {flags.decode_backend})"
        )
    _, strategy = mamba_slots_per_request(model, flags, version)
    if strategy in ("extra_buffer", "extra_buffer_lazy"):
        out.append(
            "--enable-linear-replayssm requires the no_buffer mamba cache strategy (SGLang refuses "
            f"{strategy}, which the radix cache resolves to here); add --disable-radix-cache for unique "
            "prompts"
        )
    if flags.linear_replayssm_cache_len < 1:
        out.append("--linear-replayssm-cache-len must be >= 1 (SGLang refuses it)")
    if flags.linear_attn_decode_backend is None and flags.mamba_ssm_dtype == "bfloat16":
        out.append(
            "--enable-linear-replayssm with --mamba-ssm-dtype bfloat16: on SM100+ GPUs (B200) SGLang then "
            "defaults the decode backend to flashinfer and refuses the flag; add "
            "--linear-attn-decode-backend triton there"
        )
    return out


def recommend(
    model: ModelShape,
    gpu_memory_mib: int,
    tp: int,
    args: list[str],
    workload: Workload,
    sglang_version: str = DEFAULT_VERSION,
    *,
    allow_fp8_kv: bool,
    allow_bf16_state: bool,
    top_k: int = 5,
    allow_replay_decode: bool = False,
) -> Recommendation:
    """Search the flag space for the config whose KV cache holds the most concurrent workload requests."""
    given = plan(model, gpu_memory_mib, tp, args, workload, sglang_version)
    base = _strip_planner_flags(args)
    user_flags = parse_flags(args)
    radix_options = [True] if workload.unique_prompts else [False]
    state_dtypes: list[str | None] = [user_flags.mamba_ssm_dtype]
    if allow_bf16_state and has_state(model) and user_flags.mamba_ssm_dtype != "bfloat16":
        state_dtypes.append("bfloat16")
    kv_dtypes = [user_flags.kv_cache_dtype]
    if allow_fp8_kv and user_flags.kv_cache_dtype == "auto":
        kv_dtypes.append("fp8_e4m3")
    mfs_options: list[float | None] = [user_flags.mem_fraction_static]
    if user_flags.mem_fraction_static is None:
        mfs_options += [TUNER_MEM_FRACTION]
    target = workload.target_concurrency or 4096
    candidates: list[Candidate] = []
    for disable_radix in radix_options:
        for state_dtype in state_dtypes:
            for kv_dtype in kv_dtypes:
                for mfs in mfs_options:
                    if has_state(model) or workload.target_concurrency:
                        found = _best_running(
                            model, gpu_memory_mib, tp, base, workload, sglang_version, target,
                            disable_radix, state_dtype, kv_dtype, mfs,
                        )  # fmt: skip
                    else:
                        found = _expected_length_running(
                            model, gpu_memory_mib, tp, base, workload, sglang_version, disable_radix,
                            kv_dtype, mfs,
                        )  # fmt: skip
                    if found is not None:
                        candidates.append(found)
    if not candidates:
        kept = ("no feasible configuration found; kept the flags as given",)
        return Recommendation(
            given, given, tuple(args), kept, tuple(flag_warnings(args, model, sglang_version))
        )
    # Highest workload concurrency; ties: fewer quality trade-offs, then more KV headroom.
    candidates.sort(key=lambda c: (-c.score, _tradeoffs(c.args), -c.plan.kv_cache_tokens))
    best = candidates[0]
    warnings = flag_warnings(args, model, sglang_version)
    if (
        args  # about flags the user gave; with none, the recommendation sets the graph limit itself
        and given.effective_max_running_requests > DEFAULT_DECODE_GRAPH_LIMIT_NOTE
        and user_flags.cuda_graph_max_bs is None
    ):
        warnings.append(
            f"the given flags allow {given.effective_max_running_requests} running requests; decode graphs "
            f"are captured only up to {given.cuda_graph_max_bs}; larger batches decode eagerly (slower)"
        )
    sched = scheduler_candidates(
        model, gpu_memory_mib, tp, base, workload, sglang_version, best, allow_replay_decode
    )
    spec = speculative_alternatives(model, gpu_memory_mib, tp, base, workload, sglang_version, best)
    return Recommendation(
        given=given,
        recommended=best.plan,
        args=best.args,
        reasons=best.reasons,
        warnings=tuple(warnings),
        candidates=(best, *sched, *candidates[1:top_k]),
        speculative=tuple(spec),
        mtp_note=static_mtp_note(model, list(best.args)),
    )


def sweep_workload(workload: Workload) -> Workload:
    """The workload the sweep's extra candidates are sized for: the expected output length when one is
    given below ``max_tokens`` (as :func:`scheduler_candidates`), else ``workload`` itself."""
    expected = workload.expected_output_tokens
    if not expected or expected >= workload.max_tokens:
        return workload
    return Workload(
        prompt_p50=workload.prompt_p50, prompt_p99=workload.prompt_p99, max_tokens=int(expected),
        target_concurrency=None, unique_prompts=workload.unique_prompts,
    )  # fmt: skip


def speculative_alternatives(
    model: ModelShape, gpu_mib: int, tp: int, base: list[str], workload: Workload, version: str,
    best: Candidate,
) -> list[Candidate]:  # fmt: skip
    """What the sweep measures against ``best`` to keep or drop MTP: the MTP candidates (1-3 steps,
    :func:`mtp_candidates`) when the model has MTP layers, less the one ``best`` already is; and when
    ``best`` runs speculative decoding (the given flags ask for it), the same without it, its cap
    re-solved for the memory the verify buffers free."""
    wl = sweep_workload(workload)
    chosen = parse_flags(list(best.args))
    given_steps = (chosen.speculative_num_steps or 3) if chosen.speculative_algorithm else None
    out = [
        c for c in mtp_candidates(model, gpu_mib, tp, base, wl, version, best)
        if parse_flags(list(c.args)).speculative_num_steps != given_steps
    ]  # fmt: skip
    if chosen.speculative_algorithm:
        try:
            found = _best_running(
                model, gpu_mib, tp, strip_speculative_args(base), wl, version, 4096,
                chosen.disable_radix_cache, chosen.mamba_ssm_dtype, chosen.kv_cache_dtype,
                chosen.mem_fraction_static,
            )  # fmt: skip
        except PlanError:
            found = None
        if found is not None:
            n = found.plan.effective_max_running_requests
            why = f"MTP off: the given flags' speculative decoding dropped; {n} running requests without it"
            out.insert(0, replace(found, reasons=(why, *found.reasons)))
    return out


def static_mtp_note(model: ModelShape, args: list[str]) -> str:
    """Why MTP is on or off in a plan nothing has measured (``regen tune`` without ``--sweep``)."""
    flags = parse_flags(args)
    if flags.speculative_algorithm:
        return (
            f"MTP on: the given server.args ask for {flags.speculative_algorithm} (not measured; "
            "`regen tune --sweep` measures it against no MTP)"
        )
    if model.mtp_layers <= 0:
        return "MTP off: the model has no MTP layers"
    return (
        "MTP off: not measured; the static plan keeps it off (`regen tune --sweep` measures 1-3 MTP steps "
        "against it)"
    )


#: SGLang admits new requests one scheduler pass at a time: at a full running cap with outputs of spread
#: lengths, about one request frees per decode step and each is prefilled in a forward pass of its own.
#: ``--min-free-slots-delay N`` (SGLang caps N at 4) waits for N free slots and prefills them together.
MIN_FREE_SLOTS_DELAY = 4


def scheduler_candidates(
    model: ModelShape, gpu_mib: int, tp: int, base: list[str], workload: Workload, version: str,
    best: Candidate, replay_decode: bool = False,
) -> list[Candidate]:  # fmt: skip
    """Candidates that trade the static guarantee for throughput, to be measured by ``regen tune --sweep``.

    With ``workload.expected_output_tokens`` below ``max_tokens``: the running cap sized so the KV cache
    holds every running request at prompt p99 + the *expected* output (the mean context of a running set
    stays under that while the lengths' squared coefficient of variation is below 1), relying on SGLang's
    own admission (free KV) and retraction for the rare overflow; then the same with prefill refills
    batched (``--min-free-slots-delay``). Same state dtype, KV dtype, radix choice and memory fraction as
    ``best``. Empty when no expected length is given. With ``replay_decode``, also the batched one with
    ReplaySSM decode (opt-in: on the H200, 27B hybrid shape, SGLang 0.5.17, it gained nothing at equal
    batch and its ring costs about 9% of the cap; its decode kernel already runs the state at 90% of the
    copy bandwidth without it).
    """
    expected = workload.expected_output_tokens
    if not expected or expected >= workload.max_tokens or not has_state(model):
        return []  # attention-only models: the recommendation itself is sized for the expected length
    chosen = parse_flags(list(best.args))
    wl = Workload(
        prompt_p50=workload.prompt_p50, prompt_p99=workload.prompt_p99, max_tokens=int(expected),
        target_concurrency=None, unique_prompts=workload.unique_prompts,
    )  # fmt: skip
    found = _best_running(
        model, gpu_mib, tp, base, wl, version, 4096, chosen.disable_radix_cache, chosen.mamba_ssm_dtype,
        chosen.kv_cache_dtype, chosen.mem_fraction_static,
    )  # fmt: skip
    if found is None or found.plan.effective_max_running_requests <= best.plan.effective_max_running_requests:
        return []
    n = found.plan.effective_max_running_requests
    sized = Candidate(
        args=found.args,
        plan=found.plan,
        score=found.score,
        reasons=(
            f"--max-running-requests {n}: sized for the expected {expected} output tokens per request "
            f"(not max_tokens {workload.max_tokens}); SGLang admits by free KV and retracts on overflow",
            *found.reasons[1:],
        ),
    )
    delay = ("--min-free-slots-delay", str(MIN_FREE_SLOTS_DELAY))
    batched = Candidate(
        args=(*found.args, *delay),
        plan=found.plan,
        score=found.score,
        reasons=(
            *sized.reasons,
            f"--min-free-slots-delay {MIN_FREE_SLOTS_DELAY}: prefill refills {MIN_FREE_SLOTS_DELAY} at a "
            "time instead of one forward pass per freed slot",
        ),
    )
    if not replay_decode:
        return [sized, batched]
    return [sized, batched, *_replay_candidate(model, gpu_mib, tp, base, wl, version, chosen, found, batched)]


#: speculative steps the MTP candidates try (topk 1, draft tokens = steps + 1)
MTP_STEPS = (1, 2, 3)
_SPEC_FLAGS = (
    "--speculative-algorithm", "--speculative-num-steps", "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
)  # fmt: skip


def speculative_args(steps: int, algorithm: str = "NEXTN") -> tuple[str, ...]:
    """SGLang's flags for MTP with ``steps`` draft steps, topk 1 (draft tokens = steps + 1)."""
    return (
        "--speculative-algorithm", algorithm, "--speculative-num-steps", str(steps),
        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(steps + 1),
    )  # fmt: skip


def strip_speculative_args(args: list[str]) -> list[str]:
    """``args`` without the speculative flags the MTP candidates set themselves."""
    out: list[str] = []
    i = 0
    while i < len(args):
        name, eq, _ = args[i].partition("=")
        if name in _SPEC_FLAGS:
            i += 1 if eq else 2
            continue
        out.append(args[i])
        i += 1
    return out


def mtp_candidates(
    model: ModelShape, gpu_mib: int, tp: int, base: list[str], workload: Workload, version: str,
    best: Candidate, steps: tuple[int, ...] = MTP_STEPS,
) -> list[Candidate]:  # fmt: skip
    """MTP (NEXTN: SGLang's EAGLE on the model's own MTP layers, topk 1) at each of ``steps``, with the
    running cap re-solved for the speculative memory: per running request SGLang then also holds the
    verify buffers (one state per draft token, ``intermediate_ssm_state_cache``) next to its state slots,
    and the draft model's weights and KV. Same state dtype, KV dtype, radix choice and memory fraction as
    ``best``. Empty when the model has no MTP layers. Whether MTP pays off depends on the acceptance
    and the batch: ``regen tune --sweep`` measures them."""
    if model.mtp_layers <= 0:
        return []
    chosen = parse_flags(list(best.args))
    plain = strip_speculative_args(base)
    out = []
    for n_steps in steps:
        spec = list(speculative_args(n_steps))
        try:
            found = _best_running(
                model, gpu_mib, tp, [*plain, *spec], workload, version, 4096, chosen.disable_radix_cache,
                chosen.mamba_ssm_dtype, chosen.kv_cache_dtype, chosen.mem_fraction_static,
            )  # fmt: skip
        except PlanError:  # the draft model's weights and buffers do not fit: no MTP candidate at these steps
            found = None
        if found is None:
            continue
        p = found.plan
        n = p.effective_max_running_requests
        out.append(
            Candidate(
                args=found.args,
                plan=p,
                score=found.score,
                reasons=(
                    f"MTP {n_steps} step{'s' if n_steps > 1 else ''} (NEXTN, topk 1, {n_steps + 1} draft "
                    f"tokens): verify buffers {p.spec_scratch_gib:.1f} GiB and draft weights "
                    f"{p.draft_weights_gib:.1f} GiB leave room for {n} running requests (to be measured)",
                    *found.reasons,
                ),
            )
        )
    return out


def _replay_candidate(
    model: ModelShape, gpu_mib: int, tp: int, base: list[str], wl: Workload, version: str,
    chosen: ServerFlags, sized: Candidate, batched: Candidate,
) -> list[Candidate]:  # fmt: skip
    """``batched`` with SGLang's ReplaySSM decode (``--enable-linear-replayssm``): each decode step reads
    the linear-attention state and appends a small record to a per-slot ring, writing the state back only
    every ``REPLAY_RING_LEN`` steps, instead of reading and writing it every step. The ring lives outside
    SGLang's pool budget, so the memory fraction drops by its share (the runtime slack stays as it was)
    and the cap is re-solved. Empty where SGLang would refuse the flag or it does nothing."""
    # the triton decode backend named: on SM100+ with bf16 state SGLang would default to flashinfer and refuse
    replay = ["--enable-linear-replayssm", "--linear-attn-decode-backend", "triton"]
    flags = replace(chosen, enable_linear_replayssm=True, linear_attn_decode_backend="triton")
    if flags.speculative_algorithm or replay_flag_problems(flags, model, version):
        return []
    pre_load_gib = gpu_mib / 1024 - CUDA_CONTEXT_GIB
    top = round(sized.plan.mem_fraction_static * 1000)

    def at(thousandths: int) -> Candidate | None:
        """The cap solved at this memory fraction, if the ring it implies fits in the fraction given up."""
        got = _best_running(
            model, gpu_mib, tp, [*base, *replay], wl, version, 4096,
            chosen.disable_radix_cache, chosen.mamba_ssm_dtype, chosen.kv_cache_dtype, thousandths / 1000,
        )  # fmt: skip
        given_up = (top - thousandths) / 1000 * pre_load_gib
        return got if got is not None and got.plan.replay_ring_gib <= given_up else None

    highest = _highest(top - 200, top, at)  # the highest fraction whose cap's ring fits: the slack is kept
    if highest is None:
        return []
    found = highest[1]
    mfs, ring_gib = found.plan.mem_fraction_static, found.plan.replay_ring_gib
    n = found.plan.effective_max_running_requests
    delay = batched.args[len(sized.args) :]
    return [
        Candidate(
            args=(*found.args, *delay),
            plan=found.plan,
            score=found.score,
            reasons=(
                f"--max-running-requests {n}: sized for the expected {wl.max_tokens} output tokens per "
                "request, as the refill-batched candidate, in the memory the ring leaves",
                "--enable-linear-replayssm: decode reads the linear-attention state and appends to a "
                f"per-slot ring, writing the state back every {flags.linear_replayssm_cache_len} steps "
                "instead of every step (about half the state traffic)",
                f"--mem-fraction-static {mfs:g}: {sized.plan.mem_fraction_static:g} less the ring's "
                f"{ring_gib:.2f} GiB, which SGLang allocates outside its pool budget",
                *batched.reasons[len(sized.reasons) :],
            ),
        )
    ]


def _highest(lo: int, hi: int, attempt: Callable[[int], T | None]) -> tuple[int, T] | None:
    """The highest n in [lo, hi] that ``attempt`` accepts, with what it returned (bisection: ``attempt``
    must accept every n below one it accepts); None when it accepts none."""
    best = None
    while lo <= hi:
        mid = (lo + hi) // 2
        found = attempt(mid)
        if found is not None:
            best, lo = (mid, found), mid + 1
        else:
            hi = mid - 1
    return best


def _tradeoffs(args: tuple[str, ...]) -> int:
    return sum(1 for a in args if a in ("bfloat16", "fp8_e4m3"))


def _candidate_args(
    base: list[str], running: int, disable_radix: bool, slots: int, state_dtype: str | None,
    kv_dtype: str, mfs: float | None, version: str, hybrid: bool,
) -> list[str]:  # fmt: skip
    out = list(base)
    if mfs is not None:
        out += ["--mem-fraction-static", f"{mfs:g}"]
    out += ["--max-running-requests", str(running)]
    if hybrid:
        if disable_radix:
            out.append("--disable-radix-cache")
        else:
            out += ["--max-mamba-cache-size", str(running * slots)]
        if state_dtype is not None:
            out += ["--mamba-ssm-dtype", state_dtype]
    elif disable_radix:
        out.append("--disable-radix-cache")
    if kv_dtype != "auto":
        out += ["--kv-cache-dtype", kv_dtype]
    if running > DEFAULT_DECODE_GRAPH_LIMIT_NOTE:
        out += [cuda_graph_max_bs_flag(version), str(running)]
    return out


def _best_running(
    model: ModelShape, gpu_mib: int, tp: int, base: list[str], workload: Workload, version: str, target: int,
    disable_radix: bool, state_dtype: str | None, kv_dtype: str, mfs: float | None,
) -> Candidate | None:  # fmt: skip
    probe = plan(
        model, gpu_mib, tp, [*base, *(["--disable-radix-cache"] if disable_radix else [])], None, version
    )
    slots = probe.mamba_slots_per_request or 1

    def attempt(n: int) -> MemoryPlan | None:
        args = _candidate_args(
            base, n, disable_radix, slots, state_dtype, kv_dtype, mfs, version, has_state(model)
        )
        try:
            p = plan(model, gpu_mib, tp, args, workload, version)
        except PlanError:
            return None
        holds = p.kv_cache_tokens >= n * workload.tokens_per_request
        return p if holds and p.effective_max_running_requests >= n else None

    best = _highest(1, max(1, target), attempt)
    if best is None:
        return None
    n, p = best
    args = tuple(p.args)
    reasons = [
        f"--max-running-requests {n}: the KV cache holds {p.kv_cache_tokens:,} tokens = {n} x "
        f"(prompt p99 {workload.prompt_p99} + max_tokens {workload.max_tokens}) with "
        f"{p.kv_cache_tokens - n * workload.tokens_per_request:,} tokens to spare",
    ]
    if has_state(model) and disable_radix:
        reasons.append(
            "--disable-radix-cache: prompts are unique, so prefix caching saves nothing and each request "
            f"needs 1 state slot instead of {probe_slots(model, base, version)}; the state pool is sized to "
            "--max-running-requests, leaving the rest to KV"
        )
    elif has_state(model):
        reasons.append(f"--max-mamba-cache-size {n * slots}: {slots} state slots per running request")
    elif disable_radix:
        reasons.append(RADIX_OFF_DENSE_REASON)
    if state_dtype == "bfloat16":
        reasons.append("--mamba-ssm-dtype bfloat16 (opted in): halves the SSM state; a quality trade-off")
    if kv_dtype != "auto":
        reasons.append(f"--kv-cache-dtype {kv_dtype} (opted in): halves the KV cell; a quality trade-off")
    if mfs is not None:
        reasons.append(f"--mem-fraction-static {mfs:g}: less runtime slack, more pool memory")
    if n > DEFAULT_DECODE_GRAPH_LIMIT_NOTE:
        reasons.append(
            f"{cuda_graph_max_bs_flag(version)} {n}: SGLang captures decode graphs only to 256 by default; "
            "above that it decodes eagerly"
        )
    score = min(n, workload.target_concurrency or n)
    return Candidate(args=args, plan=p, score=score, reasons=tuple(reasons))


#: the largest decode CUDA-graph batch the planner asks SGLang to capture; above it SGLang decodes eagerly.
#: SGLang's own largest default is 512 (B200, or tp >= 4: ``handle_gpu_memory_settings``); each captured
#: size costs capture time and graph memory, and at a thousand rows a step the launch overhead that graphs
#: save is small beside the step (not measured)
MAX_PLANNED_DECODE_GRAPH_BS = 1024


def _expected_length_running(
    model: ModelShape, gpu_mib: int, tp: int, base: list[str], workload: Workload, version: str,
    disable_radix: bool, kv_dtype: str, mfs: float | None,
) -> Candidate | None:  # fmt: skip
    """Attention-only models (dense, MoE, MLA): the batch that fills the KV cache at the *expected* context
    (prompt p50 + expected answer), with decode graphs captured up to it, relying on SGLang's own admission
    and retraction for the requests that run long; never below SGLang's defaults (its running cap,
    ``KVCacheConfigurator.resolve_max_num_reqs``, and its decode-graph range)."""
    own = [*(["--mem-fraction-static", f"{mfs:g}"] if mfs is not None else [])]
    own += ["--disable-radix-cache"] if disable_radix else []
    own += ["--kv-cache-dtype", kv_dtype] if kv_dtype != "auto" else []
    try:
        default = plan(model, gpu_mib, tp, [*base, *own], workload, version)
    except PlanError:
        return None
    default_cap, default_graphs = default.effective_max_running_requests, default.cuda_graph_max_bs
    per_request = workload.expected_tokens_per_request
    # a sliding-window model with the radix cache off: a cap given selects SGLang's request-capped SWA pool
    # (SWAChunkCapPoolConfigurator / SWARequestCapPoolConfigurator) instead of the ratio split
    swa_capped = disable_radix and default.swa_tokens is not None

    def args_for(n: int) -> list[str]:
        out = [*base, *own]
        if n > default_cap or swa_capped:
            out += ["--max-running-requests", str(max(n, default_cap))]
        if n > default_graphs:
            out += [cuda_graph_max_bs_flag(version), str(min(n, MAX_PLANNED_DECODE_GRAPH_BS))]
        return out

    def attempt(n: int) -> MemoryPlan | None:
        try:
            p = plan(model, gpu_mib, tp, args_for(n), workload, version)
        except PlanError:
            return None
        holds = p.kv_cache_tokens >= n * per_request
        return p if holds and p.effective_max_running_requests >= n else None

    most = attempt(1)  # the fewest graphs: the most KV, so no larger batch can fit
    found = _highest(1, most.kv_cache_tokens // per_request, attempt) if most is not None else None
    fill = found[0] if found is not None else 0
    client = min(max(fill, default_graphs), default_cap) if fill <= default_cap else fill
    p = plan(model, gpu_mib, tp, args_for(client), workload, version)
    p = replace(p, client_concurrency=client)
    expected = (
        f"expected answer {workload.expected_output:,}"
        if workload.expected_output_known
        else f"max_tokens {workload.max_tokens:,} (no expected answer length given: pass "
        "--expected-output-tokens, the old answers' or a pilot's mean; max_tokens is the upper bound)"
    )
    reasons = [
        f"client in flight {client:,} (client_concurrency): the KV cache holds {p.kv_cache_tokens:,} tokens "
        f"= {fill:,} x (prompt p50 {workload.prompt_p50:,} + {expected}); the expected context, not the "
        "worst case: SGLang admits by free KV less the running requests' expected growth "
        "(schedule_policy.PrefillAdder, new_token_ratio) and retracts when decode runs out "
        "(Scheduler.update_running_batch -> ScheduleBatch.retract_decode)",
    ]
    if fill < default_graphs:
        reasons.append(
            f"in flight raised from {fill:,} to SGLang's decode-graph default {default_graphs}: never below "
            "what SGLang's defaults run; its admission and retraction hold the rest, as with its defaults"
        )
    if swa_capped:
        reasons.append(
            f"--max-running-requests {max(client, default_cap):,}: SGLang's default cap or more, given so "
            f"that SGLang sizes the sliding-window pool for it ({p.swa_tokens:,} tokens, {p.kv_pool_rule}) "
            "and gives the rest to full attention, instead of swa_full_tokens_ratio of it"
        )
    elif client > default_cap:
        reasons.append(
            f"--max-running-requests {client:,}: above SGLang's default cap {default_cap:,} "
            "(KVCacheConfigurator.resolve_max_num_reqs)"
        )
    else:
        reasons.append(
            f"--max-running-requests left to SGLang (its default cap {default_cap:,}, "
            "KVCacheConfigurator.resolve_max_num_reqs): the client's in-flight count bounds the batch"
        )
    if client > default_graphs:
        graphs = min(client, MAX_PLANNED_DECODE_GRAPH_BS)
        reasons.append(
            f"{cuda_graph_max_bs_flag(version)} {graphs}: decode graphs up to the planned batch; SGLang "
            f"captures only to {default_graphs} by default (handle_gpu_memory_settings) and decodes larger "
            "batches eagerly"
        )
    if disable_radix:
        reasons.append(RADIX_OFF_DENSE_REASON)
    if kv_dtype != "auto":
        reasons.append(f"--kv-cache-dtype {kv_dtype} (opted in): halves the KV cell; a quality trade-off")
    if mfs is not None:
        reasons.append(f"--mem-fraction-static {mfs:g}: less runtime slack, more pool memory")
    return Candidate(args=tuple(p.args), plan=p, score=client, reasons=tuple(reasons))


#: why the tuner turns the radix (prefix) cache off for an attention-only model (issue 34 item 14)
RADIX_OFF_DENSE_REASON = (
    "--disable-radix-cache: the workload's prompts are unique (Workload.unique_prompts), so the prefix tree "
    "would only keep finished requests' KV that no later request reuses; off, SGLang frees it at once and "
    "skips the tree's match, insert and evict work per request (a prefix shared by every prompt, such as "
    "a long system prompt, is then prefilled again for each request)"
)


def probe_slots(model: ModelShape, base: list[str], version: str) -> int:
    slots, _ = mamba_slots_per_request(model, parse_flags(base), version)
    return slots


# --------------------------------------------------------------------- workload, files --
DEFAULT_WORKLOAD = Workload(prompt_p50=1024, prompt_p99=4096, max_tokens=4096)


def workload_from_audit(
    summary_json: str | Path | dict[str, Any],
    max_tokens: int | None = None,
    target_concurrency: int | None = None,
) -> Workload:
    """Workload from the audit summary: prompt_tokens_p50/p99 keys, else a prompt_tokens{p50,p99} block."""
    summary = summary_json if isinstance(summary_json, dict) else json.loads(Path(summary_json).read_text())
    block = summary.get("prompt_tokens") if isinstance(summary.get("prompt_tokens"), dict) else {}
    p50 = summary.get("prompt_tokens_p50", block.get("p50", DEFAULT_WORKLOAD.prompt_p50))
    p99 = summary.get("prompt_tokens_p99", block.get("p99", DEFAULT_WORKLOAD.prompt_p99))
    return Workload(
        prompt_p50=int(p50),
        prompt_p99=int(max(p99, p50)),
        max_tokens=int(max_tokens or summary.get("max_tokens") or DEFAULT_WORKLOAD.max_tokens),
        target_concurrency=target_concurrency,
    )


def write_plan_file(
    path: str | Path,
    recommendation: Recommendation,
    *,
    sglang_version: str,
    model_config: str,
    gpu_memory_mib: int,
    use_recommended: bool = True,
) -> None:
    """The plan file the server rules read: launch_args + both plans."""
    write_json(
        path,
        {
            "launch_args": list(recommendation.args if use_recommended else recommendation.given.args),
            "launched": "recommended" if use_recommended else "given",
            "given": recommendation.given.to_json(),
            "recommended": {
                **recommendation.recommended.to_json(),
                "reasons": list(recommendation.reasons),
            },
            "warnings": list(recommendation.warnings),
            "sglang_version": sglang_version,
            "model_config": model_config,
            "gpu_memory_mib": gpu_memory_mib,
        },
    )


def gpu_memory_from_nvidia_smi() -> int:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise PlanError("nvidia-smi not found: pass --gpu-memory-mib N (e.g. 143771 for an H200)")
    out = subprocess.run(
        [exe, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    first = out.stdout.strip().splitlines()[0]
    return int(float(first))
