"""The memory plan: what SGLang will allocate for a model, a GPU and a set of launch flags.

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
- KV (and sliding-window) tokens and the recurrent state per request: one module per attention family in
  :mod:`regen.sglang.pools` (``srt/model_executor/pool_configurator.py``); weights per rank and the tp
  SGLang accepts: :mod:`regen.sglang.weights`, :mod:`regen.sglang.fit`;
- speculative defaults: ``srt/arg_groups/speculative_hook.py``
  (max_running_requests 48; steps/topk/draft 3/1/4).

The running-cap search is :mod:`regen.sglang.search`, the sweep's alternatives
:mod:`regen.sglang.alternatives`, the recommendation and the plan file :mod:`regen.sglang.recommend`; the
``regen tune`` command and the ``tune`` rule entry live in :mod:`regen.tune.tune`; what a launched server
really allocated, and its drift from this plan, in :mod:`regen.sglang.realized`.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from regen.sglang.fit import smallest_fitting_tp, tp_refusals
from regen.sglang.flags import ServerFlags, parse_flags
from regen.sglang.graphs import prefill_graph_reserve_mib, prefill_graph_tokens
from regen.sglang.headroom import Headroom, headroom
from regen.sglang.models import ModelShape
from regen.sglang.pools import (
    PoolFlags,
    PoolTooSmall,
    Unmodelled,
    has_state,
    is_mamba2_hybrid,
    is_mla,
    kv_pool,
    state_bytes_per_request,
)
from regen.sglang.weights import weights_per_rank
from regen.sglang.workload import CLIENT_RULE_WORST_CASE, Workload, client_rule_for

GIB = 1 << 30


DEFAULT_VERSION = "0.5.23"


SUPPORTED_VERSIONS = ("0.5.17", "0.5.23")


# Memory in use before SGLang loads weights (CUDA context, NCCL, torch allocator). Not an SGLang constant:
# calibrated so the measured H200 startup (0.5.17, 64-layer Qwen3.6-27B text shape, 143,771 MiB) reproduces
# K=248 and 651,426 KV tokens; see tests/sglang/test_plan.py::test_reproduces_measured_h200_default.
CUDA_CONTEXT_GIB = 1.35


VLM_CACHE_GIB = 0.1  # SGLANG_VLM_CACHE_SIZE_MB=100 (kv_cache_configurator.mm_runtime_reservation_gb, 0.5.23)


MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO = 3  # kv_cache_configurator.py


DEFAULT_MAMBA_FULL_MEMORY_RATIO = 0.9  # ServerArgs.mamba_full_memory_ratio


DEFAULT_DECODE_GRAPH_LIMIT_NOTE = 256


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
    #: how ``client_concurrency`` was found (the rules map): which running-context rule planned it
    client_rule: str = CLIENT_RULE_WORST_CASE
    #: the runtime memory after CUDA graphs against a decode step at the running cap (issue 49)
    decode_headroom: Headroom | None = None
    #: sliding-window models: the SWA tokens the client's requests hold at steady decode, just before an
    #: eviction step (regen.sglang.search.swa_need), and why (issue 49: a pool below it retracts)
    swa_steady_tokens: int | None = None
    swa_rule: str = ""

    @property
    def decode_step_fits(self) -> bool:
        """Whether a decode step at the running cap fits in what CUDA-graph capture leaves."""
        return self.decode_headroom is None or self.decode_headroom.fits

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
            **({"swa_tokens": self.swa_tokens} if self.swa_tokens is not None else {}),
            **({"swa_steady_tokens": self.swa_steady_tokens} if self.swa_steady_tokens is not None else {}),
            **({"decode_headroom": self.decode_headroom.to_json()} if self.decode_headroom else {}),
            "rules": self.rules(),
        }

    def rules(self) -> dict[str, str]:
        """Per number, the SGLang rule it follows (issue 33 item 6)."""
        given = {
            "mem_fraction_static": "--mem-fraction-static as given",
            "cuda_graph_max_bs": "--cuda-graph-max-bs(-decode) as given",
        }
        flags = parse_flags(list(self.args))
        out = {
            "weights_gib": self.weights_rule,
            "kv_cache_tokens": self.kv_pool_rule
            + (", capped by --max-total-tokens" if flags.max_total_tokens else ""),
            "mem_fraction_static": given["mem_fraction_static"]
            if flags.mem_fraction_static is not None
            else "memory_hook.handle_gpu_memory_settings (0.5.17: ServerArgs._handle_gpu_memory_settings)",
            "cuda_graph_max_bs": given["cuda_graph_max_bs"]
            if flags.cuda_graph_max_bs is not None
            else "handle_gpu_memory_settings tier, capped by --max-running-requests",
            "effective_max_running_requests": "KVCacheConfigurator.resolve_max_num_reqs",
            "client_concurrency": self.client_rule,
            "workload_concurrency": "regen: the KV at prompt p99 + max_tokens, at most the cap",
        }
        if self.swa_tokens is not None:
            out["swa_tokens"] = self.kv_pool_rule
        if self.swa_steady_tokens is not None:
            out["swa_steady_tokens"] = self.swa_rule
        if self.decode_headroom is not None:
            out["decode_headroom"] = self.decode_headroom.rule
        if self.max_mamba_cache_size is not None:
            out["max_mamba_cache_size"] = "KVCacheConfigurator._handle_max_mamba_cache"
            out["mamba_slots_per_request"] = "KVCacheConfigurator._calculate_mamba_ratio"
        return out

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["decode_headroom"] = self.decode_headroom.to_json() if self.decode_headroom else None
        out["args"] = list(self.args)
        out["notes"] = list(self.notes)
        out["mamba_pool_gib"] = self.mamba_pool_gib
        out["rules"] = self.rules()
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


def reserved_memory_mib(
    gpu_mib: int, tp: int, chunk: int, decode_max_bs: int, flags: ServerFlags, mla: bool = False
) -> float:
    """handle_gpu_memory_settings: 512 + 1.5*max(chunk, 2048) + tp/8*1024 + reserve_for_graph_mb."""
    activation_tokens = max(chunk, 2048) if chunk > 0 else 2048
    graph = 0.0 if flags.disable_cuda_graph else decode_max_bs * 2.0
    graph += prefill_graph_reserve_mib(chunk, flags, mla)
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


#: the draft steps ``--speculative-adaptive`` chooses among by batch size without a config file: the union
#: of ``speculative/adaptive_spec_params.py::DEFAULT_ADAPTIVE_CONFIG``'s candidate steps (0 from batch 64 up)
ADAPTIVE_CANDIDATE_STEPS: dict[str, tuple[int, ...]] = {"0.5.17": (0, 1, 3, 7), "0.5.23": (0, 1, 3, 5, 7)}


def adaptive_candidate_steps(flags: ServerFlags, version: str) -> tuple[int, ...]:
    """``resolve_candidate_steps_from_config``: every batch-size slot's candidate steps of the
    ``--speculative-adaptive-config`` JSON (its integer keys), else SGLang's defaults for ``version``."""
    path = flags.speculative_adaptive_config
    if path is None:
        return ADAPTIVE_CANDIDATE_STEPS[version]
    try:
        cfg = json.loads(Path(path).read_text())
        steps = {int(s) for key, entry in cfg.items() if key.isdigit() for s in entry["candidate_steps"]}
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise PlanError(
            f"--speculative-adaptive-config {path}: not SGLang's adaptive config ({exc})"
        ) from exc
    if not steps:
        raise PlanError(
            f"--speculative-adaptive-config {path}: no integer batch-size key with candidate_steps"
        )
    return tuple(sorted(steps))


def _speculative(flags: ServerFlags, model: ModelShape, version: str) -> tuple[int, int]:
    """(draft tokens D the pools are sized for, draft KV layers): NEXTN == EAGLE; auto 3/1/4; topk 1 forces
    D = steps + 1. ``--speculative-adaptive`` (EAGLE/NEXTN/EAGLE3 at topk 1, else SGLang falls back to the
    static steps: ``adaptive_unsupported_reason``) sizes them for its largest candidate step
    (``ServerArgs.max_speculative_num_draft_tokens``), whatever step it starts at."""
    algo = (flags.speculative_algorithm or "").upper()
    if not algo:
        return 0, 0
    steps = flags.speculative_num_steps or 3
    topk = flags.speculative_eagle_topk or 1
    draft = flags.speculative_num_draft_tokens or 4
    if topk == 1:
        draft = steps + 1
    eagle = algo in ("EAGLE", "NEXTN", "EAGLE3")
    if flags.speculative_adaptive and eagle and topk == 1:
        candidates = adaptive_candidate_steps(flags, version)
        if flags.speculative_num_steps is not None and flags.speculative_num_steps not in candidates:
            raise PlanError(
                f"--speculative-num-steps {flags.speculative_num_steps} is not among "
                f"--speculative-adaptive's candidate steps {list(candidates)}: SGLang refuses it "
                "(_init_adaptive_speculative_params)"
            )
        draft = max(candidates) + 1
    draft_layers = max(1, model.mtp_layers) if eagle else 0
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
    draft_tokens, draft_layers = _speculative(flags, model, sglang_version)
    mrr_requested = flags.max_running_requests
    if mrr_requested is None and draft_tokens:
        mrr_requested = 48  # speculative_hook: "Max running requests is reset to 48"
    if decode_bs is None:
        decode_bs = default_decode_bs
        if flags.max_running_requests is not None and decode_bs > flags.max_running_requests:
            decode_bs = flags.max_running_requests
    reserve_mib = reserved_memory_mib(gpu_memory_mib, tp, chunk, decode_bs, flags, mla=is_mla(model))
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
        pools_gib = state_gib + reserved_scratch_gib
        if (
            pools_gib > 0 and rest_gib + pools_gib > 0
        ):  # the weights alone leave room: the state pools took it
            raise PlanError(
                f"the linear-attention state pool ({state_gib:.1f} GiB) and the speculative scratch "
                f"({reserved_scratch_gib:.1f} GiB for {draft_tokens} draft tokens a request) leave no KV "
                f"cache memory beside the weights ({weights_gib:.1f} GiB per rank{draft}) at "
                f"mem_fraction_static={mfs:.3f}: lower --max-running-requests or the speculative steps"
            )
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
    client_rule = CLIENT_RULE_WORST_CASE
    if workload is not None:
        client_rule = CLIENT_RULE_WORST_CASE if stateful else client_rule_for(workload)
        workload_running = min(running, tokens // max(1, workload.tokens_per_request))
        client = (
            workload_running
            if stateful
            else expected_fill(tokens, workload, decode_bs, running, flags.page_size)
        )
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
    room = headroom(
        model,
        runtime_gib=slack_gib + free_gib - ring_gib,
        batch=running,
        graph_max_bs=decode_bs,
        flags=flags,
        chunk=chunk,
        prefill_graph_tokens=prefill_graph_tokens(chunk, flags),
        draft_tokens=draft_tokens,
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
        client_rule=client_rule,
        decode_headroom=room,
    )


def expected_fill(tokens: int, workload: Workload, decode_graph_bs: int, running: int, page_size: int) -> int:
    """Requests in flight that fill ``tokens`` of KV at the workload's expected context on pages of
    ``page_size`` tokens, never fewer than the decode graphs SGLang captures by default, never more than the
    running cap."""
    per_request = max(1, workload.paged_tokens_per_request(page_size))
    return min(running, max(tokens // per_request, decode_graph_bs))


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
