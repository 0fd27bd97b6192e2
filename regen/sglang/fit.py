"""Which tensor-parallel sizes SGLang accepts for a model, and the smallest one at which its weights fit.

A tp is refused where SGLang's layers refuse it at build time (0.5.17 and 0.5.23 agree):
- ``srt/layers/linear.py::QKVParallelLinear``: ``divide(num_heads, tp)``; kv heads divided by tp, or tp a
  multiple of them (each kv head replicated on ``tp / kv_heads`` ranks); ``MergedColumnParallelLinear`` /
  ``RowParallelLinear``: every sharded width divides by tp;
- ``srt/layers/moe/fused_moe_triton/layer.py::FusedMoE``: experts divide by ep, the expert width by tp / ep;
- ``srt/layers/attention/mamba/mamba.py::MambaMixer2``: mamba heads divide by tp, n_groups divides by tp or
  is 1; GDN (``qwen3_next.py``): key and value heads divide by tp;
- FP8 block quantization (``srt/layers/quantization/fp8.py``): ``Fp8LinearMethod.validate_block_quant_shapes``
  (a row-parallel input width per rank, a column-parallel or merged output width per rank, divisible by the
  block) and ``Fp8MoEMethod.create_weights`` (the expert width per rank divisible by block_n always, by
  block_k at tp > 1): "... is not divisible by weight quantization block_n = 128".
"""

from __future__ import annotations

from typing import Any, NamedTuple

from regen.sglang.models import ModelShape
from regen.sglang.weights import VOCAB_PADDING, _text, layer_kinds, quantization_of, weights_per_rank

MIB = 2**20
GIB = 2**30
# tp sizes regen considers for one server: one host's GPUs (SGLang itself takes any tp the model divides)
CANDIDATE_TPS = (1, 2, 4, 8)


class TpFit(NamedTuple):
    """The smallest tp whose weights fit (None: none of the candidates), and why."""

    tp: int | None
    reason: str


def _divides(name: str, value: int, by: int, who: str) -> list[str]:
    if value % by:
        return [f"{name} {value} is not divisible by {who} {by}"]
    return []


def tp_refusals(model: ModelShape, tp: int, ep: int = 1) -> list[str]:
    """Why SGLang would refuse this tp (and ep) at load; empty when it accepts it."""
    if tp < 1:
        return [f"tp {tp} must be at least 1"]
    if ep < 1 or tp % ep:
        return [f"ep {ep} must divide tp {tp} (SGLang's moe_tp_size = tp / ep)"]
    text = _text(model)
    kinds = layer_kinds(model)
    out: list[str] = []
    padded_vocab = -(-model.vocab_size // VOCAB_PADDING) * VOCAB_PADDING
    out += _divides("vocab padded to 64", padded_vocab, tp, "tp (VocabParallelEmbedding)")
    attn = {"attention", "mla"} & set(kinds.mixers)
    if attn:
        out += _divides("num_attention_heads", model.num_attention_heads, tp, "tp")
    if "attention" in kinds.mixers:
        kv = model.num_kv_heads
        if kv >= tp:
            out += _divides("num_key_value_heads", kv, tp, "tp")
        elif tp % kv:
            out.append(f"tp {tp} is not a multiple of num_key_value_heads {kv} (QKVParallelLinear replicas)")
    if "dense" in kinds.ffns:
        width = int(text.get("intermediate_size_mlp") or model.intermediate_size)
        out += _divides("intermediate_size", width, tp, "tp")
    if "moe" in kinds.ffns:
        out += _divides("num_experts", model.num_experts, ep, "ep")
        out += _divides("moe_intermediate_size", model.moe_intermediate_size, tp // ep, "tp/ep")
        if model.shared_expert_intermediate_size:
            out += _divides("shared expert width", model.shared_expert_intermediate_size, tp, "tp")
    if "mamba2" in kinds.mixers:
        out += _divides("mamba_num_heads", int(text["mamba_num_heads"]), tp, "tp")
        groups = int(text.get("n_groups") or 1)
        if groups % tp and groups != 1:
            out.append(f"n_groups {groups} is neither divisible by tp {tp} nor 1 (MambaMixer2)")
        elif groups % tp and quantization_of(model).method is not None:
            out.append(f"n_groups {groups} is not divisible by tp {tp}, as MambaMixer2 needs when quantized")
    if "linear_attention" in kinds.mixers and model.linear is not None:
        out += _divides("linear_num_key_heads", model.linear.num_key_heads, tp, "tp")
        out += _divides("linear_num_value_heads", model.linear.num_value_heads, tp, "tp")
    if out:
        return out
    return _fp8_block_refusals(model, text, kinds.mixers, kinds.ffns, tp, ep)


def _fp8_block_refusals(
    model: ModelShape, text: dict[str, Any], mixers: tuple[str, ...], ffns: tuple[str, ...], tp: int, ep: int
) -> list[str]:
    """fp8.py's block checks on every quantized layer's per-rank widths."""
    q = quantization_of(model)
    if q.block is None:
        return []
    bn, bk = q.block
    out: list[str] = []

    def column(name: str, widths: list[int], merged: bool) -> None:
        if tp > 1 or merged:
            for w in widths:
                if w % bn:
                    out.append(f"{name} output width per rank {w} is not divisible by block_n {bn} (fp8.py)")

    def row(name: str, width: int) -> None:
        if tp > 1 and width % bk:
            out.append(f"{name} input width per rank {width} is not divisible by block_k {bk} (fp8.py)")

    hd = model.head_dim
    if "attention" in mixers:
        q_out = model.num_attention_heads // tp * hd * (2 if model.attn_output_gate else 1)
        kv_out = max(1, model.num_kv_heads // tp) * hd
        column("qkv_proj", [q_out, kv_out, kv_out], merged=True)
        row("o_proj", model.num_attention_heads // tp * hd)
    if "mla" in mixers:
        heads = model.num_attention_heads // tp
        column("q_b_proj", [heads * (int(text["qk_nope_head_dim"]) + int(text["qk_rope_head_dim"]))], False)
        column("kv_b_proj", [heads * (int(text["qk_nope_head_dim"]) + int(text["v_head_dim"]))], False)
        row("o_proj", heads * int(text["v_head_dim"]))
    if "dense" in ffns:
        width = int(text.get("intermediate_size_mlp") or model.intermediate_size) // tp
        column("gate_up_proj", [width, width], merged=True)
        row("down_proj", width)
    if "moe" in ffns:
        width = model.moe_intermediate_size // (tp // ep)
        if width % bn:
            out.append(
                f"expert width per rank {width} (moe_intermediate_size {model.moe_intermediate_size} / "
                f"{tp // ep}) is not divisible by block_n {bn} (fp8.py Fp8MoEMethod)"
            )
        elif tp > 1 and width % bk:
            out.append(
                f"expert width per rank {width} is not divisible by block_k {bk} (fp8.py Fp8MoEMethod)"
            )
        shared = model.shared_expert_intermediate_size // tp
        if shared:
            column("shared_expert gate_up_proj", [shared, shared], merged=True)
            row("shared_expert down_proj", shared)
    return list(dict.fromkeys(out))


def smallest_fitting_tp(
    model: ModelShape,
    gpu_memory_mib: float,
    *,
    reserve_mib: float = 0.0,
    ep: int = 1,
    tps: tuple[int, ...] = CANDIDATE_TPS,
) -> TpFit:
    """The smallest tp in ``tps`` that SGLang accepts and whose weights per rank, plus ``reserve_mib``
    (what must stay free besides them), fit in ``gpu_memory_mib``; the reason names every smaller tp's
    cause ("weights 1,252.0 GiB per rank at tp 1 exceed 139.0 GiB")."""
    capacity = gpu_memory_mib * MIB
    gpu_gib = capacity / GIB
    causes: list[str] = []
    for tp in sorted(tps):
        refused = tp_refusals(model, tp, ep)
        if refused:
            causes.append(f"tp {tp} refused by SGLang: {refused[0]}")
            continue
        est = weights_per_rank(model, tp, ep)
        if est.bytes_per_rank + reserve_mib * MIB > capacity:
            extra = f" + {reserve_mib / 1024:,.1f} GiB reserved" if reserve_mib else ""
            causes.append(
                f"weights {est.gib_per_rank:,.1f} GiB per rank at tp {tp}{extra} exceed {gpu_gib:,.1f} GiB"
            )
            continue
        fits = f"tp {tp}: weights {est.gib_per_rank:,.1f} GiB per rank ({est.source}) fit {gpu_gib:,.1f} GiB"
        return TpFit(tp, "; ".join([*causes, fits]))
    return TpFit(None, "; ".join([*causes, f"no tp in {list(tps)} fits"]))
