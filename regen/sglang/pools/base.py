"""The one interface every attention family's pool module implements, and the numbers it returns.

SGLang sizes its token pools in ``srt/model_executor/pool_configurator.py`` (0.5.17 and 0.5.23): one
configurator per attention family (``create_memory_pool_configurator``), each turning the bytes left
after weights, slack and state (``KVCacheConfigurator._profile_available_bytes``) into token counts.
A family module here mirrors one of them and names it in :attr:`PoolSizes.rule`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from regen.sglang.models import DTYPE_BYTES, KV_DTYPE_BYTES, ModelShape


class Unmodelled(ValueError):
    """An attention family or pool the planner does not model: SGLang's own planning applies."""


class PoolTooSmall(ValueError):
    """Pools SGLang would refuse to start with (a pool that holds no request)."""


@dataclass(frozen=True, slots=True)
class PoolFlags:
    """What the launch flags say that pool sizing reads (SGLang's defaults already resolved)."""

    tp: int
    kv_cache_dtype: str
    page_size: int
    #: EAGLE/NEXTN draft layers SGLang counts in the target's cell (0: none, or allocated after the budget)
    draft_layers_in_cell: int
    max_running_requests: int | None  # as given on the command line (None: not given)
    disable_radix_cache: bool
    chunked_prefill_size: int
    overlap_schedule: bool
    speculative: bool
    speculative_draft_tokens: int
    swa_full_tokens_ratio: float
    sglang_version: str


@dataclass(frozen=True, slots=True)
class PoolSizes:
    """The token pools one configurator allocates out of ``available`` bytes."""

    kv_cache_tokens: int  # max_total_num_tokens (the full-attention pool for sliding-window models)
    kv_bytes: int
    cell_bytes: float  # bytes per token of kv_cache_tokens (what SGLang divides the budget by)
    rule: str  # the SGLang function this follows
    swa_tokens: int | None = None  # the sliding-window pool, where there is one


class KVPool(Protocol):
    """One attention family: how many tokens its pools hold in ``available`` bytes."""

    name: str

    def size(self, model: ModelShape, available: int, flags: PoolFlags) -> PoolSizes: ...

    def cell_bytes(self, model: ModelShape, flags: PoolFlags, draft_layers: int = 0) -> float: ...


def kv_element_bytes(model: ModelShape, kv_cache_dtype: str) -> float:
    """Bytes per KV element: the model dtype for ``auto``, else the ``--kv-cache-dtype`` choice."""
    if kv_cache_dtype != "auto":
        return KV_DTYPE_BYTES[kv_cache_dtype]
    return DTYPE_BYTES[model.dtype.replace("torch.", "").lower()]


def text_config(model: ModelShape) -> dict:
    """The text model's config (``text_config`` of a multimodal config, else the config itself)."""
    raw = model.raw
    return raw["text_config"] if isinstance(raw.get("text_config"), dict) else raw


def pages(tokens: int, page_size: int) -> int:
    return tokens // page_size * page_size
