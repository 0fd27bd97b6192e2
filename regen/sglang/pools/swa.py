"""Hybrid sliding-window attention (gpt-oss, MiMo-V2, Step-3.5, Gemma 4, ...): a full-attention pool and
a sliding-window pool, 0.5.17 and 0.5.23 (``srt/model_executor/pool_configurator.py``).

- with ``--max-running-requests`` given, the radix cache off and chunked prefill on, the SWA pool is
  sized from the request cap and the rest goes to the full pool: 0.5.17
  ``SWAChunkCapPoolConfigurator``, 0.5.23 ``SWARequestCapPoolConfigurator``
  (``compute_swa_request_cap``): per request window + eviction interval x draft tokens + page + the
  decode allocation, plus one (overlap off) or two prefill chunks and a page;
- otherwise ``HybridSWAPoolConfigurator``: cell = full x n_full + ratio x swa x n_swa, the full pool
  holds budget // cell tokens and the SWA pool ``swa_full_tokens_ratio`` (default 0.8) of them.

Which architectures SGLang treats as hybrid SWA is ``configs/model_config.py::is_hybrid_swa_model``; the
rest (Gemma 2/3, Mistral's sliding window, ...) get full KV on every layer (:mod:`.mha`). The window is
the model's ``get_attention_sliding_window_size`` (``sliding_window - 1`` for gpt-oss).
"""

from __future__ import annotations

import math

from regen.sglang.models import ModelShape
from regen.sglang.pools.base import (
    PoolFlags,
    PoolSizes,
    PoolTooSmall,
    Unmodelled,
    kv_element_bytes,
    pages,
    text_config,
)

#: is_hybrid_swa_model's architectures whose layer split regen reads from ``layer_types``
#: ("sliding_attention" / "full_attention"); the others are refused as unmodelled
HYBRID_SWA_ARCHS: dict[str, frozenset[str]] = {
    "0.5.17": frozenset({"GptOssForCausalLM"}),
    "0.5.23": frozenset({"GptOssForCausalLM"}),
}
#: is_hybrid_swa_model's other architectures (0.5.17 and 0.5.23): SGLang runs a sliding-window pool
#: regen does not model (chunked attention, compressed attention, per-layer windows)
UNMODELLED_SWA_ARCHS = frozenset(
    {
        "Llama4ForConditionalGeneration",
        "DeepseekV4ForCausalLM",
        "DeepseekV4ForCausalLMNextN",
        "MiMoV2FlashForCausalLM",
        "MiMoV2MTP",
        "Step3p5ForCausalLM",
        "Step3p7ForConditionalGeneration",
        "Gemma4ForCausalLM",
        "Gemma4ForConditionalGeneration",
        "LagunaForCausalLM",
        "MellumForCausalLM",
        "InklingForConditionalGeneration",
        "BeamForCausalLM",
        "GraniteSWAForCausalLM",
        "GraniteMoeSWAForCausalLM",
    }
)
#: SGLANG_SWA_EVICTION_INTERVAL default (environ.py, 0.5.17 and 0.5.23)
SWA_EVICTION_INTERVAL = 128
#: the architectures whose get_attention_sliding_window_size is ``config.sliding_window - 1``
WINDOW_MINUS_ONE = frozenset({"GptOssForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"})


def is_hybrid_swa(model: ModelShape, version: str) -> bool:
    return model.architecture in HYBRID_SWA_ARCHS[version]


def sliding_window(model: ModelShape) -> int:
    window = int(text_config(model)["sliding_window"])
    return window - 1 if model.architecture in WINDOW_MINUS_ONE else window


def layer_split(model: ModelShape) -> tuple[int, int]:
    """(full, sliding) attention layers from ``layer_types`` (``ModelConfig.swa_attention_layer_ids``)."""
    types = text_config(model).get("layer_types")
    if not isinstance(types, list) or len(types) != model.num_layers:
        raise Unmodelled(f"{model.architecture}: no layer_types to tell sliding from full layers")
    swa = sum(1 for t in types if t == "sliding_attention")
    return len(types) - swa, swa


def request_cap_applies(model: ModelShape, flags: PoolFlags) -> bool:
    """SGLang's own check: ``SWAChunkCapPoolConfigurator.is_applicable`` (0.5.17),
    ``SWARequestCapPoolConfigurator.is_applicable`` (0.5.23)."""
    return (
        flags.max_running_requests is not None
        and flags.disable_radix_cache
        and flags.chunked_prefill_size > 0
        and layer_split(model)[0] > 0
    )


def swa_request_cap(model: ModelShape, flags: PoolFlags) -> int:
    """``compute_swa_request_cap`` (0.5.23; the same sum in 0.5.17's ``SWAChunkCapPoolConfigurator``)."""
    if flags.speculative:
        raise Unmodelled(f"{model.architecture}: the SWA pool under speculative decoding is not modelled")
    draft = flags.speculative_draft_tokens or 1
    per_request = sliding_window(model) + SWA_EVICTION_INTERVAL * draft + flags.page_size + flags.page_size
    chunks = 2 if flags.overlap_schedule else 1
    assert flags.max_running_requests is not None
    return (
        per_request * max(1, flags.max_running_requests)
        + chunks * flags.chunked_prefill_size
        + flags.page_size
    )


class SWAPool:
    name = "swa"

    def _per_token(self, model: ModelShape, flags: PoolFlags) -> tuple[float, float]:
        """(full, swa) bytes per token per layer (``HybridSWAPoolConfigurator.__init__``)."""
        text = text_config(model)
        element = kv_element_bytes(model, flags.kv_cache_dtype)
        full = max(1, model.num_kv_heads // flags.tp) * (model.head_dim + model.v_head_dim) * element
        swa_heads = int(text.get("swa_num_key_value_heads") or model.num_kv_heads)
        swa_head = int(text.get("swa_head_dim") or model.head_dim)
        swa_v = int(text.get("swa_v_head_dim") or text.get("swa_head_dim") or model.v_head_dim)
        return full, max(1, swa_heads // flags.tp) * (swa_head + swa_v) * element

    def cell_bytes(self, model: ModelShape, flags: PoolFlags, draft_layers: int = 0) -> float:
        full, _ = self._per_token(model, flags)
        return full * (layer_split(model)[0] + draft_layers)

    def size(self, model: ModelShape, available: int, flags: PoolFlags) -> PoolSizes:
        n_full, n_swa = layer_split(model)
        full, swa = self._per_token(model, flags)
        full_cell = full * (n_full + flags.draft_layers_in_cell)
        if request_cap_applies(model, flags):
            swa_tokens = math.ceil(swa_request_cap(model, flags) / flags.page_size) * flags.page_size
            fixed = swa_tokens * swa * n_swa
            tokens = pages(int((available - fixed) // full_cell), flags.page_size)
            if tokens <= 0:
                raise PoolTooSmall(
                    f"SWA pool cap ({swa_tokens:,} tokens) leaves no room for the full KV pool (SGLang "
                    "refuses): lower --max-running-requests or raise --mem-fraction-static"
                )
            rule = (
                "pool_configurator.SWAChunkCapPoolConfigurator"
                if flags.sglang_version == "0.5.17"
                else "pool_configurator.SWARequestCapPoolConfigurator (compute_swa_request_cap)"
            )
        else:
            ratio = flags.swa_full_tokens_ratio
            cell = full_cell + ratio * swa * n_swa
            tokens = pages(int(available // cell), flags.page_size)
            swa_tokens = pages(int(tokens * ratio), flags.page_size)
            rule = "pool_configurator.HybridSWAPoolConfigurator (swa_full_tokens_ratio)"
            if swa_tokens <= sliding_window(model) + flags.page_size:
                raise PoolTooSmall(
                    f"SWA pool ({swa_tokens:,} tokens) cannot hold one request (SGLang refuses): raise "
                    "--swa-full-tokens-ratio or the KV budget"
                )
        kv_bytes = int(tokens * full_cell + swa_tokens * swa * n_swa)
        return PoolSizes(tokens, kv_bytes, full_cell, rule, swa_tokens=swa_tokens)


def swa_cap_per_request(model: ModelShape, page_size: int) -> int:
    """SGLang's own per-request SWA sum when it sizes the pool from the cap (``compute_swa_request_cap``,
    no speculative decoding): window + interval + page + the next step's page."""
    return sliding_window(model) + SWA_EVICTION_INTERVAL + page_size + page_size


#: consecutive evictions 0.5.17 is planned to skip (:func:`swa_eviction_span`); SGLang bounds it by nothing
SWA_SKIPPED_EVICTIONS_0517 = 2


def swa_eviction_span(version: str) -> int:
    """Decode steps a running request can go between two SWA evictions, worst case planned.

    0.5.17 (``ScheduleBatch.maybe_evict_swa``): the decode eviction runs only when the running batch's
    ``forward_iter % SGLANG_SWA_EVICTION_INTERVAL == 0``, and ``forward_iter`` is ``Scheduler.forward_ct``,
    counted by ``run_batch`` for *every* forward, extend (prefill) batches included; the check in
    ``alloc_for_decode`` reads the ct of the running batch's previous decode run. When the multiple of 128
    falls on an extend batch (a refill of finished requests, a re-prefill of retracted ones) every decode
    request skips that eviction and waits for the next multiple; each further multiple taken by an extend
    adds 128 more. The source bounds the run of skips by nothing (more in a row when prefills come more
    often); planned: two in a row, 3 x 128 steps, as measured on the H200 (issue 49):

    - at a lighter prefill load (client 2,982, cap 3,162) the saw's top held 282 per request = window 127
      + 155 steps: one skip;
    - under a refill-heavy load (client 2,130, cap 3,446, 300-token prompts, answers ~1,450; retractions
      re-prefilled, measurements/families-2026-12-04.md) the pool filled at ``#running-req: 1761 ...
      #swa token: 900982, swa token usage: 1.00``: ~511 per request (a lower bound of the need, the pool
      being full) = window 127 + 3 x 128 + 1, two skips in a row; 941 requests were retracted.

    0.5.23 gates per request on tokens slid out (``_swa_eviction_trigger``: ``seqlen - 1 - window >=
    evicted + interval``), which cannot starve: one interval."""
    if version == "0.5.17":
        return SWA_EVICTION_INTERVAL * (1 + SWA_SKIPPED_EVICTIONS_0517)
    return SWA_EVICTION_INTERVAL


def swa_eviction_why(version: str) -> str:
    """Why :func:`swa_eviction_span` is what it is, for the plan's rules."""
    if version == "0.5.17":
        return (
            "0.5.17 evicts only when the running batch's forward_iter % 128 == 0, and forward_iter counts "
            "every forward, prefill batches included, so a refill or re-prefill batch on a multiple of 128 "
            "makes every decode request skip that eviction; the source bounds the skips in a row by nothing. "
            "Measured on the H200: one skip at a lighter prefill load (282 held per request at the saw's "
            "top), two in a row under a refill-heavy one (~511 per request at 1,761 running, swa token usage "
            f"1.00, 941 retracted); planned: {SWA_SKIPPED_EVICTIONS_0517} in a row, "
            "SGLANG_SWA_EVICTION_INTERVAL left at 128 (0.5.23 evicts per request and is unaffected)"
        )
    return "0.5.23 evicts each request once 128 tokens have slid out of its window"


def swa_decode_per_request(model: ModelShape, page_size: int, version: str) -> int:
    """SWA tokens a request past its first eviction holds at most: ``free_swa_out_of_window_slots`` keeps
    the last window + 1 with the radix cache off, and the request grows back by one token a step until
    the next eviction (:func:`swa_eviction_span`), plus the next step's page
    (``new_tokens_required_next_decode``):
    gpt-oss-20b 127 + 384 + 1 + 1 = 513 on 0.5.17, 257 (SGLang's own per-request sum) on 0.5.23."""
    return sliding_window(model) + swa_eviction_span(version) + page_size + page_size


def swa_steady_tokens(
    model: ModelShape,
    *,
    running: int,
    prompt_tokens: int,
    expected_output: int,
    page_size: int,
    chunked_prefill_size: int,
    overlap_schedule: bool,
    version: str,
) -> int:
    """SWA tokens ``running`` requests in a closed loop hold just before an eviction step (the saw's top).

    Every request holds :func:`swa_decode_per_request`, except those admitted since the last eviction:
    a new request holds its whole prompt until its first eviction (``_evict_swa`` runs only on
    ``decode_batch_idx >= 1`` at the interval's step), so it can reach prompt + span + page, ``prompt
    - window`` more than the per-request sum. A closed loop at ``running`` with answers of
    ``expected_output`` tokens on average admits ``running x span / expected_output`` requests per
    eviction span (:func:`swa_eviction_span`); each is counted at the worst ``prompt_tokens - window``
    (the prompt p99; the worst admission time covers the spread of the arrivals). SGLang's admission
    (``PrefillAdder._swa_budget_for_req``) checks only the SWA free *now* (prompt + window), not the
    running requests' growth to the next eviction, and its decode check (``check_decode_mem``) retracts
    when the SWA pool is short: a pool below this sum retracts in a storm (gpt-oss-20b, issue 49: 789
    retractions in 60 s at 2,903 running, ``swa token usage: 1.00`` with the full pool 45% used; 403 in
    60 s at 2,982 planned with one interval, the saw's top at 282 per request; 941 in a run planned with
    one skip, the pool full at 1,761 running, ~511 per request). The prefill chunks in
    flight (one, two with the overlap schedule) and a page, as SGLang's own cap adds them."""
    admitted = min(running, math.ceil(running * swa_eviction_span(version) / max(1, expected_output)))
    prompt = math.ceil(prompt_tokens / page_size) * page_size
    excess = max(0, prompt - sliding_window(model))
    chunks = 2 if overlap_schedule else 1
    return (
        running * swa_decode_per_request(model, page_size, version)
        + admitted * excess
        + chunks * chunked_prefill_size
        + page_size
    )
