"""SGLang's ``ServerArgs`` handlers the memory plan starts from: the GPU memory settings (chunked prefill,
decode-graph batch, reserved memory, ``mem_fraction_static``) and the speculative-decoding settings (draft
tokens the pools are sized for, the running cap it resets).

Mirrors ``srt/arg_groups/memory_hook.py::handle_gpu_memory_settings`` (0.5.17:
``ServerArgs._handle_gpu_memory_settings``), ``reserve_for_graph_mb``, ``adjust_mem_fraction_for_vlm``, and
``srt/arg_groups/speculative_hook.py`` (0.5.17: ``ServerArgs._handle_speculative_decoding``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from regen.sglang.errors import PlanError
from regen.sglang.flags import ServerFlags
from regen.sglang.graphs import prefill_graph_reserve_mib
from regen.sglang.models import ModelShape
from regen.sglang.pools import is_mla

#: speculative_hook: "Max running requests is reset to 48"
SPECULATIVE_MAX_RUNNING_REQUESTS = 48


@dataclass(frozen=True, slots=True)
class SpeculativeDecoding:
    """``_handle_speculative_decoding``: the draft tokens D the pools are sized for (0: off), the draft KV
    layers, and the running cap as SGLang resets it (None: none given, SGLang resolves it)."""

    draft_tokens: int
    draft_layers: int
    max_running_requests: int | None


@dataclass(frozen=True, slots=True)
class GpuMemorySettings:
    """``handle_gpu_memory_settings``: the chunk, the decode CUDA-graph batch, the memory it reserves for
    graphs and activations, and ``mem_fraction_static`` (unrounded)."""

    chunked_prefill_size: int
    cuda_graph_max_bs: int
    reserved_mib: float
    mem_fraction_static: float


def handle_speculative_decoding(flags: ServerFlags, model: ModelShape, version: str) -> SpeculativeDecoding:
    draft_tokens, draft_layers = _speculative(flags, model, version)
    running = flags.max_running_requests
    if running is None and draft_tokens:
        running = SPECULATIVE_MAX_RUNNING_REQUESTS
    return SpeculativeDecoding(draft_tokens, draft_layers, running)


def handle_gpu_memory_settings(
    model: ModelShape, gpu_mib: int, tp: int, flags: ServerFlags
) -> GpuMemorySettings:
    default_chunk, default_decode_bs = _capacity_defaults(gpu_mib, tp)
    chunk = flags.chunked_prefill_size if flags.chunked_prefill_size is not None else default_chunk
    decode_bs = flags.cuda_graph_max_bs
    if decode_bs is None:
        decode_bs = default_decode_bs
        if flags.max_running_requests is not None and decode_bs > flags.max_running_requests:
            decode_bs = flags.max_running_requests
    reserve_mib = reserved_memory_mib(gpu_mib, tp, chunk, decode_bs, flags, mla=is_mla(model))
    if flags.mem_fraction_static is not None:
        mfs = flags.mem_fraction_static
    else:
        mfs = round((gpu_mib - reserve_mib) / gpu_mib, 3) * vlm_mem_fraction_factor(model)
    return GpuMemorySettings(chunk, decode_bs, reserve_mib, mfs)


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
