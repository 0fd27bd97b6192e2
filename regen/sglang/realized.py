"""What a launched server really allocated, and how far that is from the plan (drift).

Parses SGLang's startup log and ``/server_info`` into :class:`RealizedMemory` and compares it with
the planner's prediction for the flags that were launched (``regen.sglang.config.PlanFile.launched_section``).
The server module writes the result per GPU slot (``gpu{k}.realized.json``); the report reads it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the prediction's type only; the planner never imports this module
    from regen.sglang.plan import MemoryPlan


@dataclass(frozen=True, slots=True)
class RealizedMemory:
    max_total_num_tokens: int | None = None
    max_running_requests: int | None = None
    max_mamba_cache_size: int | None = None
    chunked_prefill_size: int | None = None
    context_len: int | None = None
    available_gpu_mem_gib: float | None = None
    weights_gib: float | None = None
    kv_cache_gib: float | None = None
    conv_state_gib: float | None = None
    ssm_state_gib: float | None = None
    mamba_slots_per_request: int | None = None
    mem_fraction_static: float | None = None
    replay_ring_gib: float | None = None
    #: speculative decoding: the verify buffers (``intermediate_ssm_state_cache`` + ``intermediate_conv_
    #: window_cache``), the draft model's weights (its own ``Load weight end`` line, type ``...MTP``) and
    #: its KV pool (the second ``KV Cache is allocated`` line of a start)
    spec_scratch_gib: float | None = None
    draft_weights_gib: float | None = None
    draft_kv_cache_gib: float | None = None
    #: a sliding-window model's SWA pool (``SWAKVPool mem usage: ... swa size: N, full size: M``)
    swa_tokens: int | None = None


_NUM = r"([0-9][0-9.]*)"


def parse_startup_log(text: str) -> RealizedMemory:
    """Pull the allocation facts out of an SGLang server log (0.5.17 and 0.5.23 phrasing)."""
    found: dict[str, Any] = {}

    def grab(pattern: str, key: str, kind: type = int) -> None:
        matches = re.findall(pattern, text)
        if matches:
            found[key] = kind(matches[-1])

    grab(r"max_total_num_tokens=(\d+)", "max_total_num_tokens")
    grab(r"chunked_prefill_size=(-?\d+)", "chunked_prefill_size")
    grab(r"max_running_requests=(\d+)", "max_running_requests")
    grab(r"context_len=(\d+)", "context_len")
    grab(rf"available_gpu_mem={_NUM}", "available_gpu_mem_gib", float)
    grab(r"max_mamba_cache_size:\s*(\d+)", "max_mamba_cache_size")
    grab(r"SWAKVPool mem usage:[^\n]*?swa size:\s*(\d+)", "swa_tokens")
    grab(rf"conv_state size:\s*{_NUM}\s*GB", "conv_state_gib", float)
    grab(rf"ssm_state size:\s*{_NUM}\s*GB", "ssm_state_gib", float)
    found.update(_kv_and_draft(text))
    cap = re.findall(
        r"max_running_requests is capped to (\d+) by the mamba state cache.*?(\d+) state slots", text
    )
    if cap:
        found["max_running_requests"] = int(cap[-1][0])
        found["mamba_slots_per_request"] = int(cap[-1][1])
    grab(rf"mem_fraction_static[=:]\s*{_NUM}", "mem_fraction_static", float)
    ring = re.findall(rf"ReplaySSM ring buffers allocated.*?d={_NUM}GB, k={_NUM}GB, g={_NUM}GB", text)
    if ring:
        found["replay_ring_gib"] = sum(float(part) for part in ring[-1])
    scratch = re.findall(
        rf"intermediate_ssm_state_cache size:\s*{_NUM}\s*GB\s*"
        rf"intermediate_conv_window_cache size:\s*{_NUM}\s*GB",
        text,
    )
    if scratch:
        found["spec_scratch_gib"] = float(scratch[-1][0]) + float(scratch[-1][1])
    return RealizedMemory(**found)


_WEIGHTS = re.compile(rf"Load weight end\.(?P<rest>[^\n]*?)mem usage={_NUM}\s*GB")
_KV = re.compile(
    rf"KV Cache is allocated\.[^\n]*?#tokens:\s*(\d+)[^\n]*?K size:\s*{_NUM}\s*GB,\s*V size:\s*{_NUM}\s*GB"
)


def _kv_and_draft(text: str) -> dict[str, Any]:
    """The target's weights and KV pool, and a speculative server's draft weights and draft KV pool, of
    the last start in ``text``: the last target ``Load weight end`` line (a type not ending in ``MTP``),
    the draft's after it, and the ``KV Cache is allocated`` lines after it (the target's first)."""
    found: dict[str, Any] = {}
    loads = list(_WEIGHTS.finditer(text))
    targets = [m for m in loads if "MTP," not in m["rest"]]
    start = targets[-1].start() if targets else 0
    if targets:
        found["weights_gib"] = float(targets[-1][2])
    drafts = [m for m in loads if "MTP," in m["rest"] and m.start() >= start]
    if drafts:
        found["draft_weights_gib"] = float(drafts[-1][2])
    kv = [m for m in _KV.finditer(text) if m.start() >= start] or list(_KV.finditer(text))[-1:]
    if kv:
        found["max_total_num_tokens"] = int(kv[0][1])
        found["kv_cache_gib"] = float(kv[0][2]) + float(kv[0][3])
    if len(kv) > 1:
        found["draft_kv_cache_gib"] = float(kv[1][2]) + float(kv[1][3])
    return found


def realized_from_server_info(info: dict[str, Any], startup: RealizedMemory | None = None) -> RealizedMemory:
    """From GET /server_info (or /get_server_info): top level + internal_states[0]; fields the server
    does not report are filled from the startup log lines (``startup``) when given."""
    realized = _realized_from_info(info)
    if startup is None:
        return realized
    return RealizedMemory(
        **{
            f: getattr(realized, f) if getattr(realized, f) is not None else getattr(startup, f)
            for f in RealizedMemory.__dataclass_fields__
        }
    )


def _realized_from_info(info: dict[str, Any]) -> RealizedMemory:
    states = info.get("internal_states") or [{}]
    state = states[0] if isinstance(states, list) and states else {}
    usage = state.get("memory_usage") or {}
    return RealizedMemory(
        max_total_num_tokens=info.get("max_total_num_tokens"),
        max_running_requests=state.get("effective_max_running_requests_per_dp"),
        max_mamba_cache_size=state.get("max_mamba_cache_size", info.get("max_mamba_cache_size")),
        chunked_prefill_size=info.get("chunked_prefill_size"),
        context_len=info.get("context_length"),
        weights_gib=usage.get("weight"),
        kv_cache_gib=usage.get("kvcache"),
        mem_fraction_static=info.get("mem_fraction_static"),
    )


#: (prediction field of a plan section / ``MemoryPlan``, :class:`RealizedMemory` field) pairs naming the
#: same quantity: the join of predicted and realized values (drift here, the report's table)
PREDICTED_VS_REALIZED: tuple[tuple[str, str], ...] = (
    ("kv_cache_tokens", "max_total_num_tokens"),
    ("swa_tokens", "swa_tokens"),
    ("effective_max_running_requests", "max_running_requests"),
    ("max_mamba_cache_size", "max_mamba_cache_size"),
    ("mamba_slots_per_request", "mamba_slots_per_request"),
    ("weights_gib", "weights_gib"),
    ("kv_cache_gib", "kv_cache_gib"),
    ("mem_fraction_static", "mem_fraction_static"),
    ("replay_ring_gib", "replay_ring_gib"),
    ("spec_scratch_gib", "spec_scratch_gib"),
    ("draft_weights_gib", "draft_weights_gib"),
    ("draft_kv_gib", "draft_kv_cache_gib"),
)


@dataclass(frozen=True, slots=True)
class Drift:
    field: str
    predicted: float
    realized: float
    relative: float

    def __str__(self) -> str:
        return (
            f"{self.field}: predicted {self.predicted:g}, realized {self.realized:g} ({self.relative:+.1%})"
        )


def compare(
    plan_: MemoryPlan | Mapping[str, Any], realized: RealizedMemory, tolerance: float = 0.05
) -> list[Drift]:
    """Fields whose realized value differs from the prediction by more than `tolerance` (relative).

    ``plan_`` is a MemoryPlan or its JSON form (a plan file's ``given``/``recommended`` section)."""

    def predicted(name: str) -> Any:
        return plan_.get(name) if isinstance(plan_, Mapping) else getattr(plan_, name)

    pairs = [(name, predicted(name), getattr(realized, got)) for name, got in PREDICTED_VS_REALIZED]
    drifts = []
    for name, predicted, actual in pairs:
        if predicted is None or actual is None:
            continue
        rel = (actual - predicted) / predicted if predicted else (math.inf if actual else 0.0)
        if abs(rel) > tolerance:
            drifts.append(Drift(name, float(predicted), float(actual), rel))
    return drifts
