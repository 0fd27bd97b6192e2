"""Weight bytes per GPU as SGLang 0.5.17/0.5.23 allocates them, under tensor (and expert) parallelism.

What is followed when:
- The parameter layout SGLang builds (``--load-format dummy`` allocates exactly this; a real load allocates
  the same tensors and copies the checkpoint into them): fused ``QKVParallelLinear`` /
  ``MergedColumnParallelLinear`` / ``RowParallelLinear`` (``srt/layers/linear.py``), the embedding and
  ``lm_head`` padded to 64 rows and sharded by vocab (``srt/layers/vocab_parallel_embedding.py``), norms and
  MoE routers replicated (``ReplicatedLinear``), experts ``num_experts / ep`` per rank with their width
  split over ``tp / ep`` (``srt/layers/moe/fused_moe_triton/layer.py``), Mamba2 mixers as
  ``srt/layers/attention/mamba/mamba.py::MambaMixer2`` builds them.
- Quantized tensors as each method's ``create_weights`` makes them: FP8 (``layers/quantization/fp8.py``:
  1 byte a weight, a float32 ``weight_scale_inv`` per 128x128 block), MXFP4 experts
  (``layers/quantization/mxfp4.py``), NVFP4 (``modelopt_quant.py``), AWQ/GPTQ int4 and compressed-tensors.
- A checkpoint's own byte count (``model.safetensors.index.json`` ``metadata.total_size``, or the sum of the
  local safetensors headers) where one is present: it replaces the layout's total and the layout only says
  which share of it each rank holds; with dummy weights (no checkpoint beside the config) the layout is all.
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass, replace
from typing import Any

from regen.sglang.models import ModelConfigError, ModelShape, _dtype_bytes, _layer_types
from regen.sglang.mxfp4_load import replay_gpt_oss_load

VOCAB_PADDING = 64  # vocab_parallel_embedding.DEFAULT_VOCAB_PADDING_SIZE
FP32 = 4
# how far a checkpoint's byte count may stray from the layout before the estimate's rule says so
CHECKPOINT_LAYOUT_TOLERANCE = 0.05
# MXFP4 experts as SGLang 0.5.17/0.5.23 leaves them on Hopper with the triton_kernels MoE backend (the one
# gpt-oss gets on an H200: arg_groups/overrides.py::_gpt_oss_overrides): Mxfp4MoEMethod.create_weights
# allocates w13/w2 as uint8 pairs of e2m1 [E, out, in/2] with a uint8 e8m0 scale per 32 [E, out, in/32]
# and bf16 biases; process_weights_after_loading (use_triton_kernels) then
# - swizzles the values (``_swizzle_mxfp4``: triton_kernels ``HopperMXValueLayout.swizzle_data`` pads the
#   [in/2, out] byte matrix to multiples of 64 both ways) and deletes the originals,
# - swizzles the scales (``HopperMXScaleLayout``: [out, in/32] padded to 2 x num_warps(8) x 2 x 8 = 256
#   rows and an even column count) but keeps ``w13_weight_scale`` / ``w2_weight_scale`` (not deleted),
# - makes the biases fp32.
MXFP4_VALUE_ALIGN = 64
MXFP4_SCALE_ROW_ALIGN = 256
MXFP4_BLOCK = 32
# What the load holds beyond that layout is not a constant: regen/sglang/mxfp4_load.py replays gpt-oss's
# load through PyTorch's caching allocator (the YaRN cos/sin cache, and the free split blocks the repack's
# transients leave in segments that hold a live tensor). It replaced a 1.40 GiB calibration fitted on the
# 20b, which put the 120b's KV 6.3% high (issue 49 item 4).


def _up(n: int, to: int) -> int:
    return -(-n // to) * to


def mxfp4_expert_bytes(experts: int, out: int, inp: int) -> int:
    """One FusedMoE weight (w13 or w2: ``experts`` stacked ``out x inp`` matrices) in MXFP4 as it is held
    after ``process_weights_after_loading`` on Hopper with triton_kernels (see the constants above)."""
    values = _up(inp // 2, MXFP4_VALUE_ALIGN) * _up(out, MXFP4_VALUE_ALIGN)
    scale_cols = math.ceil(inp / MXFP4_BLOCK)
    scales = out * scale_cols  # the checkpoint-layout scales, kept
    swizzled = _up(out, MXFP4_SCALE_ROW_ALIGN) * _up(scale_cols, 2)
    return experts * (values + scales + swizzled)


@dataclass(frozen=True, slots=True)
class WeightsEstimate:
    """One GPU's weights under a given tp/ep, and where the number comes from."""

    bytes_per_rank: int
    source: str  # "checkpoint index" | "safetensors headers" | "config"
    quantization: str | None
    rule: str
    tp: int
    ep: int
    #: of bytes_per_rank, what every rank holds whole (norms, routers, replicated projections)
    replicated_bytes: int
    #: the model's bytes once, as at tp 1 (the checkpoint's size where it was read)
    total_bytes: int
    #: what SGLang's own layout puts on one rank (== bytes_per_rank when source is "config"): with
    #: ``--load-format dummy`` this is what is allocated, whatever checkpoint lies beside the config
    layout_bytes_per_rank: int

    @property
    def gib_per_rank(self) -> float:
        return self.bytes_per_rank / 2**30


# ---------------------------------------------------------------- quantization schemes
@dataclass(frozen=True, slots=True)
class Quantization:
    """How one quantization method stores a linear layer's (out x in) weight, per SGLang's create_weights."""

    method: str | None  # None: unquantized, in the model dtype
    weight_bits: float = 16.0
    block: tuple[int, int] | None = None  # FP8 block (block_n, block_k)
    group_size: int = 0  # int4/fp4 group size along the input dim
    scale_bytes: int = 0  # bytes of one group scale
    zero_points: bool = False
    experts_only: bool = False  # MXFP4 gpt-oss: only the experts are quantized
    ignored: tuple[str, ...] = ()

    def skips(self, module: str) -> bool:
        """Whether the config leaves ``module`` (``model.layers.<i>.<name>``) unquantized: its
        ``modules_to_not_convert`` / ``ignore`` / ``exclude_modules`` entries, as globs, ``re:`` regexes
        (compressed-tensors) or dotted prefixes and components (fp8.py / utils ``is_layer_skipped``)."""
        for pattern in self.ignored:
            if pattern.startswith("re:"):
                if re.match(pattern[3:], module):
                    return True
            elif any(ch in pattern for ch in "*?["):
                if fnmatch.fnmatchcase(module, pattern) or fnmatch.fnmatchcase(module, pattern + ".*"):
                    return True
            elif module == pattern or module.startswith(pattern + ".") or f".{pattern}." in f".{module}.":
                return True
        return False

    def linear_bytes(self, out: int, inp: int, dtype_bytes: int) -> int:
        if self.method is None or self.experts_only:
            return out * inp * dtype_bytes
        weight = math.ceil(out * inp * self.weight_bits / 8)
        if self.block is not None:  # fp8.py create_fp8_weight_: weight_scale_inv[ceil(out/bn), ceil(in/bk)]
            bn, bk = self.block
            return weight + math.ceil(out / bn) * math.ceil(inp / bk) * FP32
        if self.group_size:
            groups = math.ceil(inp / self.group_size) * out
            zeros = math.ceil(groups * self.weight_bits / 8) if self.zero_points else 0
            return weight + groups * self.scale_bytes + zeros
        return weight + FP32 * 2  # per-tensor weight and input scales

    def experts_bytes(self, experts: int, out: int, inp: int, dtype_bytes: int) -> int:
        """``experts`` stacked (out x in) expert matrices (w13 or w2 of ``FusedMoE``)."""
        if self.method == "mxfp4":
            return mxfp4_expert_bytes(experts, out, inp)
        if self.method is None:
            return experts * out * inp * dtype_bytes
        return experts * self.linear_bytes(out, inp, dtype_bytes)


def quantization_of(model: ModelShape) -> Quantization:
    """The config's ``quantization_config`` (top level or in ``text_config``) as SGLang reads it."""
    raw = model.raw
    qc = raw.get("quantization_config") or _text(model).get("quantization_config")
    if not isinstance(qc, dict):
        return Quantization(None)
    method = str(qc.get("quant_method") or qc.get("quant_algo") or "").lower()
    ignored = tuple(
        str(p)
        for key in ("modules_to_not_convert", "ignore", "ignored_layers", "exclude_modules")
        for p in qc.get(key) or ()
    )
    if method == "fp8":
        block = qc.get("weight_block_size")
        return Quantization("fp8", 8.0, block=tuple(block) if block else None, ignored=ignored)
    if method == "mxfp4":
        return Quantization("mxfp4", 4.0, experts_only=True, ignored=ignored)
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin", "moe_wna16"):
        bits = int(qc.get("bits") or qc.get("w_bit") or 4)
        group = int(qc.get("group_size") or qc.get("q_group_size") or 128)
        # awq.py / gptq.py create_weights: qweight int32 [in, out/8], scales [in/g, out] in fp16, and qzeros
        # int32 [in/g, out/8] whether the checkpoint is symmetric or not
        return Quantization(
            method,
            float(bits),
            group_size=group if group > 0 else 10**9,
            scale_bytes=2,
            zero_points=True,
            ignored=ignored,
        )
    if method in ("modelopt", "modelopt_fp4", "nvfp4", "modelopt_fp8"):
        algo = str(qc.get("quant_algo") or (qc.get("quantization") or {}).get("quant_algo") or method).upper()
        if "FP8" in algo:
            return Quantization("modelopt_fp8", 8.0, ignored=ignored)
        return Quantization(
            "nvfp4", 4.0, group_size=int(qc.get("group_size") or 16), scale_bytes=1, ignored=ignored
        )
    if method == "compressed-tensors":
        return _compressed_tensors(qc, ignored)
    raise ModelConfigError(
        f"{model.source}: quantization_config.quant_method {method!r} is not modelled; "
        "SGLang's own load decides the weight bytes (run it and read 'Load weight end')"
    )


def _compressed_tensors(qc: dict[str, Any], ignored: tuple[str, ...]) -> Quantization:
    """compressed_tensors: the first config group's weights (num_bits, type, strategy, group_size)."""
    groups = qc.get("config_groups") or {}
    first = next(iter(groups.values()), {}) if isinstance(groups, dict) else {}
    w = first.get("weights") or {}
    bits = int(w.get("num_bits") or 8)
    kind = str(w.get("type") or "int")
    strategy = str(w.get("strategy") or "channel")
    if bits == 8 and kind == "float":
        block = w.get("block_structure")
        if strategy == "block" and block:
            return Quantization("compressed-tensors fp8 block", 8.0, block=tuple(block), ignored=ignored)
        return Quantization("compressed-tensors fp8", 8.0, ignored=ignored)
    group = int(w.get("group_size") or (16 if kind == "float" else 128))
    scale = 1 if kind == "float" else 2
    return Quantization(
        f"compressed-tensors w{bits}{kind[0]}",
        float(bits),
        group_size=group,
        scale_bytes=scale,
        zero_points=not w.get("symmetric", True),
        ignored=ignored,
    )


# ---------------------------------------------------------------- layer plan
def _text(model: ModelShape) -> dict[str, Any]:
    text = model.raw.get("text_config")
    return text if isinstance(text, dict) else model.raw


@dataclass(frozen=True, slots=True)
class LayerKinds:
    """Per decoder layer: its mixer and its feed-forward kind."""

    mixers: tuple[str, ...]  # "attention" | "mla" | "linear_attention" | "mamba2"
    ffns: tuple[str, ...]  # "dense" | "moe" | "none"


def layer_kinds(model: ModelShape) -> LayerKinds:
    """Nemotron-H ``hybrid_override_pattern`` (M mamba2, * attention, - MLP, E MoE); otherwise GDN/full
    attention by ``_layer_types``, MLA when ``kv_lora_rank`` is set, and the MoE layers by every spelling
    (``_is_moe_layer``)."""
    text = _text(model)
    pattern = text.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        mix = {"M": "mamba2", "*": "attention", "-": "none", "E": "none"}
        ffn = {"M": "none", "*": "none", "-": "dense", "E": "moe"}
        return LayerKinds(tuple(mix[c] for c in pattern), tuple(ffn[c] for c in pattern))
    n = model.num_layers
    lin = model.linear_attention_layers
    if lin:
        mixers = tuple(
            "linear_attention" if t == "linear_attention" else "attention" for t in _layer_types(text, n)
        )
    else:
        mixers = ("mla" if text.get("kv_lora_rank") else "attention",) * n
    return LayerKinds(mixers, tuple("moe" if _is_moe_layer(model, text, i) else "dense" for i in range(n)))


def _is_moe_layer(model: ModelShape, text: dict[str, Any], i: int) -> bool:
    """As SGLang's model files decide it (not transformers'): ``deepseek_v2.py`` (DeepSeek, Kimi, GLM-4 MoE
    share it) ``layer_id >= first_k_dense_replace and layer_id % moe_layer_freq == 0``; ``llama4.py``
    ``_is_moe_layer`` ``(layer_id + 1) % interleave_moe_layer_step == 0`` (0: every layer); ``qwen2_moe.py``
    and ``qwen3_moe.py`` make every layer sparse ("all layers are sparse"), ``mlp_only_layers`` and
    ``decoder_sparse_step`` notwithstanding."""
    if not model.is_moe:
        return False
    if "first_k_dense_replace" in text or "moe_layer_freq" in text:
        k = int(text.get("first_k_dense_replace") or 0)
        return i >= k and i % int(text.get("moe_layer_freq") or 1) == 0
    if "interleave_moe_layer_step" in text:
        step = int(text.get("interleave_moe_layer_step") or 0)
        return step == 0 or (i + 1) % step == 0
    return True


def gated_mlp(model: ModelShape) -> bool:
    """Whether the MLPs and experts are gated (gate and up projections), as every family here but
    Nemotron-H's relu2 MLP (up only)."""
    return model.model_type != "nemotron_h"


# ---------------------------------------------------------------- the count
@dataclass
class _Tally:
    sharded: int = 0
    replicated: int = 0

    def add(self, n: int, *, replicated: bool = False) -> None:
        if replicated:
            self.replicated += n
        else:
            self.sharded += n


def layout_bytes(model: ModelShape, tp: int, ep: int = 1) -> tuple[int, int]:
    """(bytes on one rank, of which replicated) of SGLang's parameter layout at this tp/ep."""
    q = quantization_of(model)
    text = _text(model)
    d = _dtype_bytes(model.dtype)
    h = model.hidden_size
    t = _Tally()

    layer = 0  # the decoder layer the loop below is at: lin() names its modules by it

    def lin(out: int, inp: int, name: str, *, replicated: bool = False, quantized: bool = True) -> None:
        quantized = quantized and not q.skips(f"model.layers.{layer}.{name}")
        t.add(q.linear_bytes(out, inp, d) if quantized else out * inp * d, replicated=replicated)

    vocab = math.ceil(model.vocab_size / VOCAB_PADDING) * VOCAB_PADDING
    t.add(vocab // tp * h * d * (1 if model.tie_word_embeddings else 2))
    t.add(h * d, replicated=True)  # final norm
    kinds = layer_kinds(model)
    for layer, (mixer, ffn) in enumerate(zip(kinds.mixers, kinds.ffns, strict=True)):
        t.add(2 * h * d, replicated=True)  # input and post-attention norms
        if mixer == "attention":
            _attention(model, text, tp, lin, t, d)
        elif mixer == "mla":
            _mla(model, text, tp, lin, t, d)
        elif mixer == "linear_attention":
            _gdn(model, tp, lin, t, d)
        elif mixer == "mamba2":
            _mamba2(model, text, tp, lin, t, d)
        if ffn == "dense":
            width = int(text.get("intermediate_size_mlp") or model.intermediate_size)
            lin((2 if gated_mlp(model) else 1) * width // tp, h, "mlp.up_proj")
            lin(h, width // tp, "mlp.down_proj")
        elif ffn == "moe":
            skipped = q.skips(f"model.layers.{layer}.mlp.experts")
            _moe(model, text, tp, ep, Quantization(None) if skipped else q, lin, t, d)
    _vision(model, tp, t, d)
    return t.sharded + t.replicated, t.replicated


def _vision(model: ModelShape, tp: int, t: _Tally, d: int) -> None:
    """A ViT tower (SigLIP and alike, sharded by tp in SGLang's VisionAttention/MLP): per layer qkv + o
    (4 vh^2) and a two-matrix MLP (2 vh vi), plus the projector to the text width; unquantized."""
    vision = model.raw.get("vision_config")
    if not isinstance(vision, dict) or not model.is_multimodal:
        return
    vh = int(vision.get("hidden_size") or model.vision_hidden_size)
    vi = int(vision.get("intermediate_size") or 4 * vh)
    layers = int(vision.get("num_hidden_layers") or vision.get("depth") or model.vision_layers)
    t.add(layers * (4 * vh * vh + 2 * vh * vi) * d // tp)
    t.add(vh * model.hidden_size * d // tp)


def _attention(model: ModelShape, text: dict[str, Any], tp: int, lin, t: _Tally, d: int) -> None:
    """QKVParallelLinear (kv heads replicated when tp > kv heads) + RowParallelLinear o_proj."""
    h, hd = model.hidden_size, model.head_dim
    q_heads = model.num_attention_heads // tp
    kv_heads = max(1, model.num_kv_heads // tp)
    q_out = q_heads * hd * (2 if model.attn_output_gate else 1)
    lin(q_out + 2 * kv_heads * hd, h, "self_attn.q_proj")
    lin(h, q_heads * hd, "self_attn.o_proj")
    if text.get("attention_bias") or model.model_type in ("qwen2", "qwen2_moe", "qwen2_vl"):
        t.add((q_out + 2 * kv_heads * hd) * d)  # qkv bias
    if text.get("attention_bias") and model.model_type not in ("glm4_moe", "mixtral"):
        t.add(h * d)  # o_proj bias=attention_bias in llama.py, qwen3.py, gpt_oss.py (glm4_moe.py: False)
    if model.model_type.startswith(("qwen3", "gemma3")):  # q_norm / k_norm over head_dim
        t.add(2 * hd * d, replicated=True)
    if model.model_type == "gpt_oss":  # attention sinks, one per head
        t.add(q_heads * FP32)


def _mla(model: ModelShape, text: dict[str, Any], tp: int, lin, t: _Tally, d: int) -> None:
    """deepseek_v2.py DeepseekV2AttentionMLA: q_a/kv_a replicated (fused_qkv_a_proj_with_mqa where q_lora_rank
    is set), q_b/kv_b column, o_proj row."""
    h = model.hidden_size
    heads = model.num_attention_heads // tp
    nope, rope = int(text["qk_nope_head_dim"]), int(text["qk_rope_head_dim"])
    v_dim, kv_rank = int(text["v_head_dim"]), int(text["kv_lora_rank"])
    q_rank = text.get("q_lora_rank")
    if q_rank:
        lin(int(q_rank) + kv_rank + rope, h, "self_attn.q_a_proj", replicated=True)  # fused with kv_a
        t.add(int(q_rank) * d, replicated=True)
        lin(heads * (nope + rope), int(q_rank), "self_attn.q_b_proj")
    else:
        lin(heads * (nope + rope), h, "self_attn.q_proj")
        lin(kv_rank + rope, h, "self_attn.kv_a_proj_with_mqa", replicated=True)
    t.add(kv_rank * d, replicated=True)
    lin(heads * (nope + v_dim), kv_rank, "self_attn.kv_b_proj")
    lin(h, heads * v_dim, "self_attn.o_proj")
    # post_load_weights (deepseek_common/deepseek_weight_loader.py) keeps w_kc and w_vc beside kv_b_proj:
    # contiguous copies of it, dequantized to bf16 where the checkpoint is FP8-block
    t.add(heads * (nope + v_dim) * kv_rank * d)


def _gdn(model: ModelShape, tp: int, lin, t: _Tally, d: int) -> None:
    """Gated delta net (qwen3_next.py): in_proj_qkvz + in_proj_ba column, conv1d, out_proj row."""
    lin_cfg = model.linear
    assert lin_cfg is not None
    h = model.hidden_size
    key_dim = lin_cfg.num_key_heads * lin_cfg.key_head_dim
    value_dim = lin_cfg.num_value_heads * lin_cfg.value_head_dim
    lin((2 * key_dim + 2 * value_dim) // tp, h, "linear_attn.in_proj_qkvz")
    lin(2 * lin_cfg.num_value_heads // tp, h, "linear_attn.in_proj_ba", quantized=False)
    t.add(model.conv_dim() // tp * lin_cfg.conv_kernel_dim * d)
    lin(h, value_dim // tp, "linear_attn.out_proj")
    t.add(2 * lin_cfg.num_value_heads // tp * FP32 + lin_cfg.value_head_dim * d)


def _mamba2(model: ModelShape, text: dict[str, Any], tp: int, lin, t: _Tally, d: int) -> None:
    """MambaMixer2: in_proj [z, x, B, C, dt] column, conv1d over x/B/C, A/D/dt_bias per head, gated
    RMSNorm over the inner dim, out_proj row; groups that tp does not divide are replicated."""
    h = model.hidden_size
    heads = int(text["mamba_num_heads"])
    inner = heads * int(text["mamba_head_dim"])
    groups = int(text.get("n_groups") or 1)
    state = int(text["ssm_state_size"])
    kernel = int(text.get("conv_kernel") or 4)
    groups_per_rank = groups // tp if groups % tp == 0 else groups
    conv = inner // tp + 2 * groups_per_rank * state
    lin(inner // tp + conv + heads // tp, h, "mixer.in_proj")
    t.add(conv * kernel * d + (conv * d if text.get("use_conv_bias", True) else 0))
    t.add(3 * heads // tp * FP32 + inner // tp * d)
    lin(h, inner // tp, "mixer.out_proj")


def _moe(
    model: ModelShape,
    text: dict[str, Any],
    tp: int,
    ep: int,
    q: Quantization,
    lin,
    t: _Tally,
    d: int,
) -> None:
    """FusedMoE w13 [E/ep, 2I/(tp/ep), h] and w2 [E/ep, h, I/(tp/ep)], router replicated, shared experts
    column/row parallel over tp (gated except Nemotron-H's relu2)."""
    h = model.hidden_size
    experts = model.num_experts // ep
    width = model.moe_intermediate_size // (tp // ep)
    if q.method == "mxfp4":  # Mxfp4MoEMethod.create_weights pads it to triton_kernels' 64
        width = -(-width // 64) * 64
    gated = gated_mlp(model)
    up = (2 if gated else 1) * width
    t.add(q.experts_bytes(experts, up, h, d) + q.experts_bytes(experts, h, width, d))
    if model.model_type == "gpt_oss":  # w13/w2 biases (bf16; fp32 after mxfp4.py's triton_kernels repack)
        t.add(experts * (up + h) * (FP32 if q.method == "mxfp4" else d))
    t.add(model.num_experts * h * d, replicated=True)  # router gate (quant_config=None)
    if text.get("topk_method") == "noaux_tc" or model.model_type in (
        "deepseek_v3",
        "kimi_k2",
        "nemotron_h",
        "glm4_moe",
    ):
        t.add(model.num_experts * FP32, replicated=True)  # e_score_correction_bias
    shared = model.shared_expert_intermediate_size
    if shared:
        lin((2 if gated else 1) * shared // tp, h, "mlp.shared_experts.up_proj")
        lin(h, shared // tp, "mlp.shared_experts.down_proj")
        if model.model_type.startswith(("qwen2_moe", "qwen3_next", "qwen3_5")):
            t.add(h * d, replicated=True)  # shared_expert_gate


@dataclass(frozen=True, slots=True)
class ParameterCount:
    """The text model's parameters in SGLang's layout (tp 1, every weight counted as one value whatever its
    stored form): all of them, the embedding and lm_head among them, the routed experts among them, and the
    part of those a token passes through (``num_experts_per_tok`` of ``num_experts``)."""

    total: int
    embeddings: int
    routed_experts: int
    active_experts: int

    @property
    def active_per_token(self) -> int:
        """What one token's forward multiplies through, the embedding lookup and lm_head left out."""
        return self.total - self.embeddings - self.routed_experts + self.active_experts


def parameter_count(model: ModelShape) -> ParameterCount:
    """:class:`ParameterCount` from :func:`layout_bytes` over the model as if unquantized bf16 (its
    per-layer mixers and feed-forwards by :func:`layer_kinds`: Nemotron-H's Mamba2, MoE and attention
    layers each counted as what it is)."""
    text = {k: v for k, v in _text(model).items() if k != "quantization_config"}
    raw = {k: v for k, v in model.raw.items() if k != "quantization_config"}
    if "text_config" in raw:
        raw["text_config"] = text
    plain = replace(model, dtype="bfloat16", raw=raw)
    total = layout_bytes(plain, 1)[0] // 2
    h = model.hidden_size
    vocab = math.ceil(model.vocab_size / VOCAB_PADDING) * VOCAB_PADDING
    embeddings = vocab * h * (1 if model.tie_word_embeddings else 2)
    moe_layers = layer_kinds(model).ffns.count("moe")
    per_expert = (3 if gated_mlp(model) else 2) * h * model.moe_intermediate_size
    routed = moe_layers * model.num_experts * per_expert
    active = moe_layers * min(model.num_experts_per_tok, model.num_experts) * per_expert
    return ParameterCount(total, embeddings, routed, active)


def mtp_draft_bytes(model: ModelShape, tp: int) -> int:
    """One rank's bytes of the MTP draft SGLang loads beside the target when no draft path is given
    (``qwen3_5_mtp.py`` ``Qwen3_5ForCausalLMMTP``, ``deepseek_nextn.py`` ``DeepseekModelNextN``,
    ``nemotron_h_mtp.py``): ``mtp_layers`` decoder layers in the target's layout, each a full-attention (MLA
    where the target's is) mixer and the target's feed-forward (``is_nextn`` makes DeepSeek's MoE whatever
    ``first_k_dense_replace`` says; Nemotron-H's follow ``mtp_hybrid_override_pattern``), its own embedding,
    lm_head and final norm (the target's replace them only after the pools are sized), and ``fc`` /
    ``eh_proj`` 2h -> h with its two norms, a replicated ``nn.Linear`` in the model's dtype; no vision tower.
    Quantized as the target's layers are, by their own index (the checkpoint's MTP layer sits after them)."""
    n = model.mtp_layers
    if n <= 0:
        return 0
    text = {**_text(model), "num_hidden_layers": n, "layer_types": ["full_attention"] * n}
    if "first_k_dense_replace" in text:
        text["first_k_dense_replace"] = 0
    mtp_pattern = text.pop("mtp_hybrid_override_pattern", None)
    text.pop("hybrid_override_pattern", None)
    if mtp_pattern:
        text["hybrid_override_pattern"] = mtp_pattern
    raw = {**model.raw, "text_config": text} if "text_config" in model.raw else text
    draft = replace(
        model,
        raw=raw,
        num_layers=n,
        full_attention_layers=n,
        linear_attention_layers=0,
        is_multimodal=False,
    )
    h, d = model.hidden_size, _dtype_bytes(model.dtype)
    return layout_bytes(draft, tp)[0] + (2 * h * h + 2 * h) * d


# ---------------------------------------------------------------- entry point
def weights_per_rank(model: ModelShape, tp: int, ep: int = 1) -> WeightsEstimate:
    """One rank's weight bytes at this tp (and ep: experts split over ep, their width over tp/ep)."""
    if tp < 1 or ep < 1 or tp % ep:
        raise ValueError(f"tp {tp} / ep {ep}: ep must divide tp (SGLang's moe_tp_size = tp / ep)")
    q = quantization_of(model)
    per_rank, replicated = layout_bytes(model, tp, ep)
    one_rank, _ = layout_bytes(model, 1, 1)
    quant = q.method
    rule = "SGLang's parameter layout (linear.py, vocab_parallel_embedding.py, fused_moe_triton)"
    if quant:
        rule += f" with {quant} weights as layers/quantization create_weights allocates them"
    load = _load_beyond_layout(model, tp, ep, per_rank) if quant == "mxfp4" and model.is_moe else None
    if quant == "mxfp4":
        rule += (
            " (MXFP4 experts as mxfp4.py's triton_kernels repack leaves them on Hopper: swizzled values, "
            "the scales kept beside their swizzled copy, fp32 biases)"
        )
    if load is not None:
        rule += f"; {load[1]}"
    if isinstance(model.raw.get("vision_config"), dict) and model.is_multimodal:
        rule += "; the vision tower approximated as a ViT (4 vh^2 + 2 vh vi a layer)"
    checkpoint, source = model.weights_bytes_from_index, "checkpoint index"
    if checkpoint is None:
        checkpoint, source = model.weights_bytes_from_headers, "safetensors headers"
    extra = load[0] if load is not None else 0
    if checkpoint is None:
        total = per_rank + extra
        return WeightsEstimate(total, "config", quant, rule, tp, ep, replicated + extra, one_rank, total)
    share = checkpoint / one_rank
    rule = f"checkpoint bytes ({source}), split per rank as {rule}"
    if abs(share - 1) > CHECKPOINT_LAYOUT_TOLERANCE:  # e.g. MTP layers SGLang skips, a misread quantization
        layout_gib, checkpoint_gib = one_rank / 2**30, checkpoint / 2**30
        rule += (
            f"; the layout alone gives {layout_gib:,.1f} GiB at tp 1, the checkpoint {checkpoint_gib:,.1f}"
        )
    if load is not None:  # the checkpoint's count stands for all the rank holds, as for every model
        rule = rule.replace(
            f"; {load[1]}", "; the replayed load's allocator term not added to a checkpoint's count"
        )
    return WeightsEstimate(
        int(per_rank * share), source, quant, rule, tp, ep, int(replicated * share), int(checkpoint), per_rank
    )


def _load_beyond_layout(model: ModelShape, tp: int, ep: int, layout: int) -> tuple[int, str]:
    """What SGLang's MXFP4 load leaves reserved beyond the parameter layout, and the rule that says so."""
    if model.model_type != "gpt_oss":
        return 0, (
            f"what PyTorch's caching allocator keeps after the MXFP4 repack is not modelled for "
            f"{model.model_type} (only gpt-oss's load is replayed): SGLang may count up to the repack's "
            "transients more as weights"
        )
    replay = replay_gpt_oss_load(model, tp, ep)
    beyond = replay.reserved - layout
    return beyond, (
        f"plus {beyond / 2**30:.2f} GiB the load holds beyond that layout, replayed through PyTorch's "
        f"caching allocator (regen/sglang/mxfp4_load.py): the YaRN cos/sin cache and "
        f"{replay.inactive_split / 2**30:.2f} GiB of free split blocks the repack's transients leave in "
        "segments that hold a live tensor"
    )
