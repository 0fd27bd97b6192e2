"""SGLang's prefill CUDA graphs: which token counts it captures and what their capture reserves (0.5.17
``ServerArgs``, 0.5.23 ``cuda_graph_hook`` and ``arg_groups/memory_hook``), for the memory plan
(``regen.sglang.plan``), the decode headroom and the tuner's refill limit (``regen.sglang.alternatives``)."""

from __future__ import annotations

from regen.sglang.flags import ServerFlags


def sglang_prefill_graph_limit(chunk: int, flags: ServerFlags) -> int:
    """The token count SGLang captures prefill graphs up to by default (not MLA): the chunked prefill size,
    capped at ``--max-total-tokens`` (``handle_gpu_memory_settings``, 0.5.17 and 0.5.23)."""
    limit = max(chunk, 0)
    return min(limit, flags.max_total_tokens) if flags.max_total_tokens is not None else limit


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


def prefill_graph_reserve_mib(chunk: int, flags: ServerFlags, mla: bool) -> float:
    """reserve_for_graph_mb's prefill part (0.5.17 ``ServerArgs``, 0.5.23 ``arg_groups/memory_hook``): 0 with
    the prefill backend disabled, 1.5 GiB for an MLA backend, else 8 MiB per captured token count
    (``--cuda-graph-max-bs-prefill``, else the chunk, capped at ``--max-total-tokens``)."""
    if flags.prefill_graphs_off:
        return 0.0
    if mla:
        return 1.5 * 1024
    return len(prefill_graph_batch_sizes(prefill_graph_tokens(chunk, flags))) * 8.0


def prefill_graph_tokens(chunk: int, flags: ServerFlags) -> int:
    """The largest token count SGLang captures a prefill graph for (0: prefill graphs off):
    ``--cuda-graph-max-bs-prefill``, else the chunk, capped at ``--max-total-tokens``."""
    if flags.prefill_graphs_off:
        return 0
    if flags.cuda_graph_max_bs_prefill is not None:
        return flags.cuda_graph_max_bs_prefill
    return sglang_prefill_graph_limit(chunk, flags)


def decode_graph_batch_sizes(max_bs: int, speculative: bool = False) -> list[int]:
    """The decode batch sizes SGLang captures a CUDA graph for up to ``max_bs`` (0.5.23
    ``cuda_graph_hook.generate_decode_cuda_graph_batch_sizes``, without ``--disable-cuda-graph-padding``):
    36 up to SGLang's default 256 on one H200, 68 up to 1,024."""
    if max_bs < 1:
        return []
    if speculative:
        sizes = (
            list(range(1, 9))
            + list(range(10, 33, 2))
            + list(range(40, 65, 4))
            + list(range(72, 257, 8))
            + list(range(272, max_bs + 1, 16))
        )
    else:
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    out = [s for s in sizes if s <= max_bs]
    return out if max_bs in out else [*out, max_bs]
