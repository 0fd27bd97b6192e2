"""What one decode step allocates outside the memory pools and the CUDA graphs, and what is left for it.

The pools take ``mem_fraction_static`` of the memory; the rest (the runtime slack) holds the CUDA graphs
SGLang captures at start, then every step's transient tensors. A plan is right only if its largest batch
fits in what capture leaves (issue 49: gpt-oss-20b planned at 2,921 in flight with decode graphs to
1,024 died at its first eager decode step allocating 2.19 GiB of fp32 logits, 712 MiB free).

What a decode step of ``B`` rows allocates beyond the pools, as SGLang 0.5.17 and 0.5.23 do it
(``V`` = vocab, rows = ``B`` times the tokens verified per request):

- ``layers/logits_processor.py::LogitsProcessor._get_logits``: the lm_head matmul gives bf16
  ``[rows, V_padded]`` (gathered to the full vocab under tp); ``_copy_logits_to_buffer`` copies it into the
  decode graphs' shared fp32 buffer (``model_executor/graph_shared_output.py``: ``max_bs x V x 4``,
  allocated at capture) when the batch ran a graph, else ``logits.float()``: a new fp32 ``[rows, V]``
  beside the bf16 one;
- ``layers/sampler.py::Sampler.forward``: ``logits[:] = torch.softmax(logits)`` (0.5.23:
  ``sampler_softmax``): the softmax is a new fp32 ``[rows, V]`` beside the logits until it is copied back;
- ``managers/scheduler.py::event_loop_overlap`` (the default overlap schedule): step ``k``'s result, with
  its ``next_token_logits`` (the fp32 probabilities), stays in ``result_queue`` until step ``k+1`` has
  been launched, so an eager step runs beside the previous step's fp32 ``[rows, V]``;
- torch's caching allocator keeps a freed block for the next request that fits it; eager batch sizes
  change from step to step, so a step's fp32 block can be stranded beside the next step's: one more fp32
  ``[rows, V]`` is counted for it (measured: at the crash, 5.57 GiB were in use before the fp32 copy of
  2,913 rows, where the tensors above account for 3.5);
- the eager forward's activations (a layer's intermediates at a time; graphs hold their own).

So an eager step holds ``rows x V x 16`` bytes (8 without the overlap schedule) plus its activations, a
graph step ``rows x V x 8`` (its logits sit in the graph buffer), and a prefill chunk after a decode step
the previous step's fp32 logits (and the stranded block) beside the chunk's activations.
"""

from __future__ import annotations

from dataclasses import dataclass

from regen.sglang.flags import ServerFlags
from regen.sglang.models import ModelShape, _dtype_bytes

GIB = 1 << 30
FP32 = 4

#: fp32 [rows, V] buffers an eager decode step holds at once at its peak: the previous step's
#: probabilities (overlap schedule), the allocator's stranded block, and the sampler's logits with
#: their softmax (module doc)
EAGER_FP32_COPIES_OVERLAP = 4
EAGER_FP32_COPIES = 3
#: a graph step: its logits live in the graphs' buffer; the softmax copy and the stranded block remain
GRAPH_FP32_COPIES = 2

#: decode-graph memory per captured batch size beyond the logits buffer, SGLang's own estimate
#: (``reserve_for_graph_mb``: 2 MiB a decode batch size)
DECODE_GRAPH_MIB_PER_BS = 2.0
#: prefill-graph capture (the breakable backend), by the largest token count captured: a line through
#: the largest measured on the H200 (SGLang 0.5.17, "Capture target prefill CUDA graph end. mem usage="
#: in measurements' server logs: Qwen3.6-27B 3.06 GiB to 8,192 tokens and 1.27 GiB to 1,280; Qwen3-8B
#: 1.87, Qwen3-30B-A3B 1.67-1.78 and Llama-3.1-8B 1.47-1.60 to 8,192 lie under it); SGLang's own
#: estimate (8 MiB a captured size, ~0.45 GiB to 8,192) is 3-6 times under what capture takes
PREFILL_GRAPH_GIB_BASE = 0.95
PREFILL_GRAPH_GIB_PER_1K_TOKENS = 0.27
#: the largest batch :func:`largest_fitting_batch` looks for when the plan's own cap is lower
MOST_BATCH = 1 << 16


@dataclass(frozen=True, slots=True)
class Headroom:
    """The runtime memory against a plan's largest decode step."""

    #: the runtime slack and the pools' unassigned rest, less the CUDA graphs' estimate
    free_after_capture_gib: float
    graphs_gib: float
    #: the largest batch the plan allows (its effective running cap) and what a step at it holds
    batch: int
    transient_gib: float
    #: the largest batch (up to :data:`MOST_BATCH`) whose step fits in ``free_after_capture_gib``, at
    #: the plan's decode graphs
    fitting_batch: int
    rule: str

    @property
    def fits(self) -> bool:
        return self.transient_gib <= self.free_after_capture_gib

    def to_json(self) -> dict[str, object]:
        return {
            "free_after_capture_gib": round(self.free_after_capture_gib, 3),
            "graphs_gib": round(self.graphs_gib, 3),
            "batch": self.batch,
            "transient_gib": round(self.transient_gib, 3),
            "fitting_batch": self.fitting_batch,
            "fits": self.fits,
        }


def logits_row_bytes(model: ModelShape) -> int:
    """One row of fp32 logits over the vocab (what ``logits.float()`` allocates per row)."""
    return model.vocab_size * FP32


def activation_bytes_per_token(model: ModelShape) -> int:
    """An eager forward's live intermediates per token, one layer at a time: the residual stream and its
    norms (4 x hidden), q/k/v and the attention output, the feed-forward's gate/up and activation (the
    ``top_k`` routed experts' plus a shared expert for MoE) and the router's fp32 scores."""
    d = _dtype_bytes(model.dtype)
    h = model.hidden_size
    attn = model.num_attention_heads * model.head_dim * (2 if model.attn_output_gate else 1)
    attn += 2 * model.num_kv_heads * model.head_dim + model.num_attention_heads * model.head_dim
    if model.is_moe:
        ffn = 3 * model.num_experts_per_tok * model.moe_intermediate_size
        ffn += 3 * model.shared_expert_intermediate_size
        router = model.num_experts * FP32
    else:
        ffn, router = 3 * model.intermediate_size, 0
    return d * (4 * h + attn + ffn) + router


def decode_rows(batch: int, draft_tokens: int) -> int:
    """Rows of logits a decode step computes: one a request, the verified draft tokens under EAGLE."""
    return batch * max(1, draft_tokens)


def decode_step_bytes(
    model: ModelShape, batch: int, graph_max_bs: int, flags: ServerFlags, draft_tokens: int = 0
) -> int:
    """Peak bytes one decode step of ``batch`` requests allocates outside the pools and the graphs."""
    rows = decode_rows(batch, draft_tokens)
    row = logits_row_bytes(model)
    if batch <= graph_max_bs and not flags.disable_cuda_graph:
        return rows * row * GRAPH_FP32_COPIES
    copies = EAGER_FP32_COPIES if flags.disable_overlap_schedule else EAGER_FP32_COPIES_OVERLAP
    return rows * (row * copies + activation_bytes_per_token(model))


def prefill_after_decode_bytes(model: ModelShape, batch: int, chunk: int, draft_tokens: int = 0) -> int:
    """A prefill chunk launched after a decode step of ``batch``: that step's fp32 logits and the stranded
    block beside the chunk's activations."""
    rows = decode_rows(batch, draft_tokens)
    return rows * logits_row_bytes(model) * 2 + max(chunk, 0) * activation_bytes_per_token(model)


def step_peak_bytes(
    model: ModelShape, batch: int, graph_max_bs: int, flags: ServerFlags, chunk: int, draft_tokens: int = 0
) -> int:
    """The larger of a decode step at ``batch`` and a prefill chunk after it."""
    return max(
        decode_step_bytes(model, batch, graph_max_bs, flags, draft_tokens),
        prefill_after_decode_bytes(model, batch, chunk, draft_tokens),
    )


def graphs_bytes(model: ModelShape, graph_max_bs: int, flags: ServerFlags, prefill_tokens: int) -> int:
    """The CUDA graphs' memory: the decode graphs' shared fp32 logits buffer (``graph_max_bs x V x 4``)
    and SGLang's per-size estimate, and prefill graphs to ``prefill_tokens`` (0: none) as measured
    (:data:`PREFILL_GRAPH_GIB_BASE`, :data:`PREFILL_GRAPH_GIB_PER_1K_TOKENS`)."""
    out = 0.0
    if not flags.disable_cuda_graph and graph_max_bs > 0:
        out += graph_max_bs * logits_row_bytes(model) + graph_max_bs * DECODE_GRAPH_MIB_PER_BS * (1 << 20)
    if prefill_tokens > 0:
        out += (PREFILL_GRAPH_GIB_BASE + PREFILL_GRAPH_GIB_PER_1K_TOKENS * prefill_tokens / 1024) * GIB
    return int(out)


def headroom(
    model: ModelShape,
    *,
    runtime_gib: float,
    batch: int,
    graph_max_bs: int,
    flags: ServerFlags,
    chunk: int,
    prefill_graph_tokens: int,
    draft_tokens: int = 0,
) -> Headroom:
    """``runtime_gib`` (the slack and the pools' rest) against a step at ``batch``, the plan's cap, with
    decode graphs to ``graph_max_bs`` and prefill graphs to ``prefill_graph_tokens`` (0: none)."""
    graphs = graphs_bytes(model, graph_max_bs, flags, prefill_graph_tokens) / GIB
    free = runtime_gib - graphs
    transient = step_peak_bytes(model, batch, graph_max_bs, flags, chunk, draft_tokens) / GIB
    fitting = largest_fitting_batch(
        model, free, graph_max_bs, flags, chunk, draft_tokens, most=max(batch, MOST_BATCH)
    )
    kind = "a graph" if batch <= graph_max_bs and not flags.disable_cuda_graph else "an eager"
    rule = (
        f"regen.sglang.headroom: {kind} decode step at {batch:,} running holds {transient:.2f} GiB "
        f"outside the pools and graphs (fp32 logits x vocab {model.vocab_size:,}: logits_processor "
        "logits.float(), sampler softmax, the previous step's under the overlap schedule, one stranded "
        f"block; eager activations); {free:.2f} GiB left after CUDA graphs ({graphs:.2f} GiB)"
    )
    return Headroom(free, graphs, batch, transient, fitting, rule)


def largest_fitting_batch(
    model: ModelShape,
    free_gib: float,
    graph_max_bs: int,
    flags: ServerFlags,
    chunk: int,
    draft_tokens: int = 0,
    *,
    most: int,
) -> int:
    """The largest batch up to ``most`` whose step fits in ``free_gib`` (0 when none does)."""
    budget = free_gib * GIB

    def fits(n: int) -> bool:
        return step_peak_bytes(model, n, graph_max_bs, flags, chunk, draft_tokens) <= budget

    lo, hi, best = 1, most, 0
    while lo <= hi:  # the step grows with the batch (a graph step below an eager one)
        mid = (lo + hi) // 2
        if fits(mid):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best
