"""The memory plan: what SGLang will allocate for a model, a GPU and a set of launch flags.

:func:`plan` runs SGLang's own steps in SGLang's order, each a function returning a frozen record named
as SGLang names it (function names are SGLang's; 0.5.23 paths, 0.5.17 equivalents in parentheses):

1. :func:`regen.sglang.server_args.handle_speculative_decoding` (``srt/arg_groups/speculative_hook.py``;
   0.5.17: ``ServerArgs._handle_speculative_decoding``): draft tokens, the running cap reset to 48;
2. :func:`regen.sglang.server_args.handle_gpu_memory_settings`
   (``srt/arg_groups/memory_hook.py::handle_gpu_memory_settings``, ``reserve_for_graph_mb``,
   ``adjust_mem_fraction_for_vlm``; 0.5.17: ``ServerArgs._handle_gpu_memory_settings``): chunk, decode-graph
   batch, ``mem_fraction_static``;
3. :func:`load_model` (``ModelRunner.load_model``): the tp SGLang accepts (:mod:`regen.sglang.fit`), the
   weights per rank (:mod:`regen.sglang.weights`) and the MTP draft's;
4. :func:`profile_available_bytes` (``KVCacheConfigurator._profile_available_bytes``): the pool budget
   after weights, the (1 - mfs) slack and the VLM cache;
5. :func:`regen.sglang.kv_cache_configurator.handle_max_mamba_cache` (``_handle_max_mamba_cache``, slots
   per request ``_calculate_mamba_ratio`` with ``allocation_sizing.get_mamba_tracking_slots``);
6. :func:`regen.sglang.kv_cache_configurator.config_from_budget` (the pool configurator of
   ``srt/model_executor/pool_configurator.py``, one module per attention family in
   :mod:`regen.sglang.pools`, then ``_apply_token_constraints``);
7. :func:`regen.sglang.kv_cache_configurator.resolve_max_num_reqs`: the running cap;
8. regen's own: :func:`client_concurrency` (the requests the client keeps in flight) and
   :func:`runtime_memory` (what is left free, and the decode headroom after CUDA graphs).

The running-cap search is :mod:`regen.sglang.search`, the sweep's alternatives
:mod:`regen.sglang.alternatives`, the recommendation and the plan file :mod:`regen.sglang.recommend`; the
``regen tune`` command and the ``tune`` rule entry live in :mod:`regen.tune.tune`; what a launched server
really allocated, and its drift from this plan, in :mod:`regen.sglang.realized`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from regen.sglang.errors import PlanError, UnmodelledError
from regen.sglang.fit import smallest_fitting_tp, tp_refusals
from regen.sglang.flags import ServerFlags, parse_flags
from regen.sglang.graphs import prefill_graph_tokens
from regen.sglang.headroom import Headroom, headroom
from regen.sglang.kv_cache_configurator import (
    KVPool,
    MambaCache,
    RunningCap,
    config_from_budget,
    handle_max_mamba_cache,
    resolve_max_num_reqs,
)
from regen.sglang.models import ModelShape
from regen.sglang.pools import has_state
from regen.sglang.server_args import (
    GpuMemorySettings,
    SpeculativeDecoding,
    handle_gpu_memory_settings,
    handle_speculative_decoding,
)
from regen.sglang.weights import mtp_draft_bytes, weights_per_rank
from regen.sglang.workload import CLIENT_RULE_WORST_CASE, Workload, client_rule_for

__all__ = ["PlanError", "UnmodelledError", "Workload", "parse_flags"]  # what callers take from here too

GIB = 1 << 30

DEFAULT_VERSION = "0.5.23"


SUPPORTED_VERSIONS = ("0.5.17", "0.5.23")


# Memory in use before SGLang loads weights (CUDA context, NCCL, torch allocator). Not an SGLang constant:
# calibrated so the measured H200 startup (0.5.17, 64-layer Qwen3.6-27B text shape, 143,771 MiB) reproduces
# K=248 and 651,426 KV tokens; see tests/sglang/test_plan.py::test_reproduces_measured_h200_default.
CUDA_CONTEXT_GIB = 1.35


VLM_CACHE_GIB = 0.1  # SGLANG_VLM_CACHE_SIZE_MB=100 (kv_cache_configurator.mm_runtime_reservation_gb, 0.5.23)


DEFAULT_DECODE_GRAPH_LIMIT_NOTE = 256


#: the memory fraction the tuner tries besides SGLang's default (measured on the H200: 5.5 GB still free
#: after CUDA graphs at a 608 cap, 2026-11-30); its slack is the least runtime headroom regen plans for
TUNER_MEM_FRACTION = 0.92


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
    speculative = handle_speculative_decoding(flags, model, sglang_version)
    memory = handle_gpu_memory_settings(model, gpu_memory_mib, tp, flags)
    weights = load_model(model, gpu_memory_mib, tp, speculative)
    available = profile_available_bytes(
        model, gpu_memory_mib, cuda_context_gib, sglang_version, memory, weights
    )
    mamba = handle_max_mamba_cache(model, flags, args, tp, sglang_version, speculative, available.rest_gib)
    if mamba.rest_gib <= 0:
        raise _no_kv_memory(model, gpu_memory_mib, tp, memory, weights, mamba, speculative)
    kv = config_from_budget(model, flags, tp, sglang_version, memory, speculative, mamba.rest_gib)
    cap = resolve_max_num_reqs(model, flags, speculative, kv.max_total_num_tokens, mamba)
    client = client_concurrency(model, workload, flags, memory, kv, cap)
    runtime = runtime_memory(model, flags, memory, speculative, weights, available, mamba, kv, cap)
    notes = _notes(model, flags, memory, available, mamba)
    phases = PlanPhases(memory, weights, available, mamba, kv, cap, client, runtime, notes)
    return _memory_plan(phases, sglang_version, gpu_memory_mib, tp, args, cuda_context_gib)


def _notes(
    model: ModelShape,
    flags: ServerFlags,
    memory: GpuMemorySettings,
    available: AvailableMemory,
    mamba: MambaCache,
) -> tuple[str, ...]:
    """The plan's notes: flags with no effect, and what a ReplaySSM decode ring leaves of the slack."""
    notes = list(mamba.notes)
    if has_state(model) and flags.enable_linear_replayssm:
        notes += replay_ring_notes(
            mamba.replay_ring_gib,
            available.slack_gib,
            memory.reserved_mib / 1024,
            memory.mem_fraction_static,
            available.pre_load_gib,
        )
    return tuple(notes)


@dataclass(frozen=True, slots=True)
class PlanPhases:
    """What each of SGLang's start-up phases decided (``plan``), in the order they run."""

    memory: GpuMemorySettings
    weights: LoadedWeights
    available: AvailableMemory
    mamba: MambaCache
    kv: KVPool
    cap: RunningCap
    client: ClientConcurrency
    runtime: RuntimeMemory
    notes: tuple[str, ...]


def _memory_plan(
    phases: PlanPhases,
    sglang_version: str,
    gpu_memory_mib: int,
    tp: int,
    args: list[str],
    cuda_context_gib: float,
) -> MemoryPlan:
    """The phases' records as one plan."""
    memory, weights, available, mamba = phases.memory, phases.weights, phases.available, phases.mamba
    kv, cap, client, runtime = phases.kv, phases.cap, phases.client, phases.runtime
    return MemoryPlan(
        sglang_version=sglang_version,
        gpu_memory_mib=gpu_memory_mib,
        tp=tp,
        args=tuple(args),
        mem_fraction_static=round(memory.mem_fraction_static, 4),
        chunked_prefill_size=memory.chunked_prefill_size,
        cuda_graph_max_bs=memory.cuda_graph_max_bs,
        weights_gib=weights.gib,
        weights_rule=weights.rule,
        state_pool_gib=mamba.state_gib,
        spec_scratch_gib=mamba.scratch_gib,
        kv_cache_gib=kv.kv_gib,
        reserve_gib=memory.reserved_mib / 1024,
        slack_gib=available.slack_gib,
        context_gib=cuda_context_gib,
        vlm_cache_gib=available.vlm_gib,
        free_gib=runtime.free_gib,
        state_bytes_per_request=mamba.per_request_bytes,
        kv_cell_bytes=kv.cell_bytes,
        swa_tokens=kv.swa_tokens,
        kv_pool_rule=kv.rule,
        max_mamba_cache_size=mamba.max_mamba_cache_size,
        mamba_slots_per_request=mamba.slots_per_request,
        mamba_radix_cache_strategy=mamba.radix_cache_strategy,
        kv_cache_tokens=kv.max_total_num_tokens,
        requested_max_running_requests=cap.requested,
        effective_max_running_requests=cap.effective,
        binding_constraint=cap.binding,
        workload_concurrency=client.workload_running,
        client_concurrency=client.client,
        notes=phases.notes,
        replay_ring_gib=mamba.replay_ring_gib,
        draft_weights_gib=weights.draft_gib,
        draft_kv_gib=kv.draft_kv_gib,
        client_rule=client.rule,
        decode_headroom=runtime.decode_headroom,
    )


@dataclass(frozen=True, slots=True)
class LoadedWeights:
    """``ModelRunner.load_model``: what the weights leave resident per rank before the pools are sized
    (the target's, and the MTP draft's, which shares embedding and lm_head only after the pools)."""

    gib: float
    rule: str
    draft_gib: float


def load_model(
    model: ModelShape, gpu_memory_mib: int, tp: int, speculative: SpeculativeDecoding
) -> LoadedWeights:
    """The weights per rank at ``tp``; a tp SGLang refuses is a PlanError naming the smallest that works."""
    refused = tp_refusals(model, tp)
    if refused:
        fit = smallest_fitting_tp(model, gpu_memory_mib)
        raise PlanError(
            f"tp {tp} refused by SGLang: {'; '.join(refused)} (smallest tp that works: {fit.reason})"
        )
    weights = weights_per_rank(model, tp)
    draft_gib = mtp_draft_bytes(model, tp) / GIB if speculative.draft_layers else 0.0
    return LoadedWeights(weights.gib_per_rank, f"{weights.rule} [{weights.source}]", draft_gib)


@dataclass(frozen=True, slots=True)
class AvailableMemory:
    """``_profile_available_bytes`` before the state pool: the GPU, what is there before the weights load,
    the (1 - mfs) runtime slack, the VLM cache, and the pool budget left (``rest_gib``)."""

    total_gib: float
    pre_load_gib: float
    slack_gib: float
    vlm_gib: float
    rest_gib: float


def profile_available_bytes(
    model: ModelShape,
    gpu_memory_mib: int,
    cuda_context_gib: float,
    version: str,
    memory: GpuMemorySettings,
    weights: LoadedWeights,
) -> AvailableMemory:
    total_gib = gpu_memory_mib / 1024
    pre_load_gib = total_gib - cuda_context_gib
    slack_gib = pre_load_gib * (1 - memory.mem_fraction_static)
    vlm_gib = VLM_CACHE_GIB if model.is_multimodal and version != "0.5.17" else 0.0
    rest_gib = pre_load_gib - weights.gib - weights.draft_gib - slack_gib - vlm_gib
    return AvailableMemory(total_gib, pre_load_gib, slack_gib, vlm_gib, rest_gib)


def _no_kv_memory(
    model: ModelShape,
    gpu_memory_mib: int,
    tp: int,
    memory: GpuMemorySettings,
    weights: LoadedWeights,
    mamba: MambaCache,
    speculative: SpeculativeDecoding,
) -> PlanError:
    """Why no KV cache memory is left: the state pools took it, or the weights (and the tp that fits)."""
    mfs = memory.mem_fraction_static
    draft = f" + MTP draft {weights.draft_gib:.1f} GiB" if weights.draft_gib else ""
    pools_gib = mamba.state_gib + mamba.reserved_scratch_gib
    if (
        pools_gib > 0 and mamba.rest_gib + pools_gib > 0
    ):  # the weights alone leave room: the state pools took it
        return PlanError(
            f"the linear-attention state pool ({mamba.state_gib:.1f} GiB) and the speculative scratch "
            f"({mamba.reserved_scratch_gib:.1f} GiB for {speculative.draft_tokens} draft tokens a request) "
            f"leave no KV cache memory beside the weights ({weights.gib:.1f} GiB per rank{draft}) at "
            f"mem_fraction_static={mfs:.3f}: lower --max-running-requests or the speculative steps"
        )
    fit = smallest_fitting_tp(model, gpu_memory_mib, reserve_mib=memory.reserved_mib)
    return PlanError(
        f"weights ({weights.gib:.1f} GiB per rank at tp {tp}{draft}) leave no KV cache memory at "
        f"mem_fraction_static={mfs:.3f}; "
        + (f"the smallest tp that fits: {fit.tp} ({fit.reason})" if fit.tp else fit.reason)
    )


@dataclass(frozen=True, slots=True)
class ClientConcurrency:
    """regen's own (no SGLang equivalent): the running requests the KV holds at the worst case, the
    requests the client keeps in flight, and the rule that planned them."""

    workload_running: int | None
    client: int | None
    rule: str


def client_concurrency(
    model: ModelShape,
    workload: Workload | None,
    flags: ServerFlags,
    memory: GpuMemorySettings,
    kv: KVPool,
    cap: RunningCap,
) -> ClientConcurrency:
    if workload is None:
        return ClientConcurrency(None, None, CLIENT_RULE_WORST_CASE)
    stateful = has_state(model)
    tokens, running = kv.max_total_num_tokens, cap.effective
    rule = CLIENT_RULE_WORST_CASE if stateful else client_rule_for(workload)
    workload_running = min(running, tokens // max(1, workload.tokens_per_request))
    client = (
        workload_running
        if stateful
        else expected_fill(tokens, workload, memory.cuda_graph_max_bs, running, flags)
    )
    return ClientConcurrency(workload_running, client, rule)


@dataclass(frozen=True, slots=True)
class RuntimeMemory:
    """regen's own: the GPU memory no pool, weight or slack takes, and the runtime memory after CUDA graphs
    against a decode step at the running cap."""

    free_gib: float
    decode_headroom: Headroom


def runtime_memory(
    model: ModelShape,
    flags: ServerFlags,
    memory: GpuMemorySettings,
    speculative: SpeculativeDecoding,
    weights: LoadedWeights,
    available: AvailableMemory,
    mamba: MambaCache,
    kv: KVPool,
    cap: RunningCap,
) -> RuntimeMemory:
    free_gib = (
        available.pre_load_gib  # the GPU less the CUDA context
        - weights.gib
        - mamba.state_gib
        - mamba.scratch_gib
        - kv.kv_gib
        - available.slack_gib
        - available.vlm_gib
        - weights.draft_gib
        - kv.draft_kv_gib
    )
    chunk = memory.chunked_prefill_size
    room = headroom(
        model,
        runtime_gib=available.slack_gib + free_gib - mamba.replay_ring_gib,
        batch=cap.effective,
        graph_max_bs=memory.cuda_graph_max_bs,
        flags=flags,
        chunk=chunk,
        prefill_graph_tokens=prefill_graph_tokens(chunk, flags),
        draft_tokens=speculative.draft_tokens,
    )
    return RuntimeMemory(free_gib, room)


def expected_fill(
    tokens: int, workload: Workload, decode_graph_bs: int, running: int, flags: ServerFlags
) -> int:
    """Requests in flight that fill ``tokens`` of KV at the workload's expected context on the pages of
    ``flags`` (a prompt's completions sharing its pages where its radix cache is on), never fewer than the
    decode graphs SGLang captures by default, never more than the running cap."""
    per_request = max(1, workload.paged_tokens_per_request(flags.page_size, not flags.disable_radix_cache))
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
