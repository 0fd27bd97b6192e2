"""What SGLang 0.5.17 holds on the device after loading an MXFP4 gpt-oss model on Hopper, beyond the live
tensors: the allocation sequence of its load replayed through PyTorch's caching allocator
(``regen.sglang.allocator``).

The sequence, from source:
- ``DummyModelLoader.load_model`` (``model_loader/loader.py``) builds ``GptOssForCausalLM`` on the device in
  construction order (``models/gpt_oss.py``): the embedding; per layer qkv (+bias), sinks, o_proj (+bias),
  the YaRN cos/sin cache on the first layer (``rotary_embedding/yarn.py::_compute_cos_sin_cache``, shared
  by the rest through ``get_rope``'s cache), the experts as ``Mxfp4MoEMethod.create_weights`` makes them
  (w13, its scale, its bf16 bias, w2, its scale, its bias), the router (+bias), two norms; the final norm
  and ``lm_head``. ``initialize_dummy_weights`` fills them in place.
- Then, per MoE layer in module order, ``Mxfp4MoEMethod.process_weights_after_loading``'s triton_kernels
  branch (``layers/quantization/mxfp4.py``): the biases to fp32 (the bf16 ones freed as the parameters are
  replaced); ``_swizzle_mxfp4`` of w13 then w2 -- values through ``HopperMXValueLayout.swizzle_data``
  (a pad to 64 x 64, a zero pad that clones, a permuted copy, then ``_pack_bits``' int32 temporaries),
  scales through ``HopperMXScaleLayout.swizzle_data`` (two copies, a pad to 256 rows, a permuted copy);
  ``del`` of the original w13/w2 values (their scales are kept); ``torch.cuda.empty_cache()``.
- ``ModelRunner.load_model`` reads free memory through ``get_available_gpu_memory``, which empties the
  cache once more: what it counts as weights is what the allocator still reserves.

Frees follow CPython 3.12's reference counting: a temporary dies when the operation that consumed it
returns, a call's argument when the callee rebinds it, a function's locals when it returns (in order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from regen.sglang.allocator import CachingAllocator
from regen.sglang.models import ModelShape

BF16, FP32, U8 = 2, 4, 1
VALUE_ALIGN = 64  # HopperMXValueLayout.swizzle_data: SWIZZLE_ALIGN_M/K
SCALE_ROW_ALIGN = 2 * 8 * 2 * 8  # HopperMXScaleLayout: 2 x num_warps(8) x 2 x 8
MXFP4_BLOCK = 32


def _up(n: int, to: int) -> int:
    return -(-n // to) * to


class _Program:
    """Named tensors on a simulated allocator."""

    def __init__(self, log: list[tuple[str, int]] | None = None) -> None:
        self.alloc = CachingAllocator()
        self.live: dict[str, tuple[int, int]] = {}
        self.log = log

    def new(self, name: str, nbytes: int) -> str:
        assert name not in self.live, name
        self.live[name] = (self.alloc.malloc(nbytes), nbytes)
        if self.log is not None:
            self.log.append(("alloc", nbytes))
        return name

    def drop(self, *names: str) -> None:
        for name in names:
            handle, nbytes = self.live.pop(name)
            self.alloc.free(handle)
            if self.log is not None:
                self.log.append(("free", nbytes))

    @property
    def live_bytes(self) -> int:
        return sum(n for _, n in self.live.values())


def _compress(p: _Program, tag: str, n: int, arg: str | None, fourth: bool) -> str:
    """``_compress_fp4`` / ``_compress_fourth`` (hopper_value.py): ``x = x.to(torch.int32)`` then the
    masked shifts, n bytes each; ``arg`` is a temporary argument the rebinding frees (None: a view)."""
    i = p.new(f"{tag}.i", n)
    if arg is not None:
        p.drop(arg)
    p.new(f"{tag}.t1", n)  # x & 0x8
    p.new(f"{tag}.t2", n)  # << 12 (11)
    p.drop(f"{tag}.t1")
    p.new(f"{tag}.t3", n)  # x & 0x7 (0x6)
    p.new(f"{tag}.t4", n)  # << 6 (9)
    p.drop(f"{tag}.t3")
    p.new(f"{tag}.t5", n)  # |
    p.drop(f"{tag}.t2", f"{tag}.t4")
    out = f"{tag}.t5"
    if fourth:
        p.new(f"{tag}.t6", n)  # x & 0x1
        p.new(f"{tag}.t7", n)  # << 13
        p.drop(f"{tag}.t6")
        p.new(f"{tag}.t8", n)  # |
        p.drop(f"{tag}.t5", f"{tag}.t7")
        out = f"{tag}.t8"
    p.drop(i)
    return out


def _pack_part(p: _Program, tag: str, n: int, fourth: bool) -> str:
    """``_compress(x[..., k]) | (_compress(x[..., k] >> 4) << 16)``."""
    a = _compress(p, f"{tag}.lo", n, None, fourth)
    b0 = p.new(f"{tag}.b0", n // 4)  # x[..., k] >> 4, uint8
    b = _compress(p, f"{tag}.hi", n, b0, fourth)
    d = p.new(f"{tag}.d", n)  # << 16
    p.drop(b)
    p.new(tag, n)  # |
    p.drop(a, d)
    return tag


def _pack_bits(p: _Program, tag: str, n: int) -> str:
    """``_pack_bits`` on n uint8 bytes: four int32 parts of n bytes, combined; returns the output."""
    parts = [_pack_part(p, f"{tag}.p{k}", n, k == 3) for k in range(4)]

    def rsu(src: str, name: str) -> str:  # right_shift_unsigned: (x >> s) & mask
        p.new(f"{name}.a", n)
        p.new(name, n)
        p.drop(f"{name}.a")
        return name

    r2 = rsu(parts[1], f"{tag}.r2")
    u1 = p.new(f"{tag}.u1", n)
    p.drop(r2)
    r3 = rsu(parts[2], f"{tag}.r3")
    u2 = p.new(f"{tag}.u2", n)
    p.drop(u1, r3)
    p.new(f"{tag}.u3", n)
    p.drop(u2)
    p.drop(*parts)  # the function's locals first..fourth, at return
    return f"{tag}.u3"


def _swizzle_values(p: _Program, tag: str, experts: int, rows: int, row_bytes: int) -> str:
    """HopperMXValueLayout.swizzle_data on the transposed [E, row_bytes, rows] uint8 view."""
    m, k = _up(row_bytes, VALUE_ALIGN), _up(rows, VALUE_ALIGN)
    n = experts * m * k
    p.new(f"{tag}.v1", n)  # torch.nn.functional.pad to 64 x 64 (a clone where nothing is padded)
    p.new(f"{tag}.v2", n)  # the mma-tile pad after .mT: multiples of 64 need none, so a clone
    p.drop(f"{tag}.v1")
    p.new(f"{tag}.v3", n)  # permute(...).contiguous()
    p.drop(f"{tag}.v2")
    out = _pack_bits(p, tag, n)
    p.drop(f"{tag}.v3")
    return out


def _swizzle_scales(p: _Program, tag: str, experts: int, rows: int, cols: int) -> str:
    """HopperMXScaleLayout.swizzle_data on the transposed [E, cols, rows] uint8 view."""
    s = experts * rows * cols
    p.new(f"{tag}.s1", s)  # _maybe_mT: data.contiguous()
    p.new(f"{tag}.s2", s)  # .mT.contiguous()
    p.drop(f"{tag}.s1")
    padded = experts * _up(rows, SCALE_ROW_ALIGN) * _up(cols, 2)
    p.new(f"{tag}.s3", padded)  # pad to 256 rows, an even column count
    p.drop(f"{tag}.s2")
    p.new(f"{tag}.s4", padded)  # permute + flatten(-5, -1): a copy
    p.drop(f"{tag}.s3")
    return f"{tag}.s4"


@dataclass(frozen=True, slots=True)
class LoadReplay:
    """The allocator after the replayed load, at ``get_available_gpu_memory``'s ``empty_cache``."""

    reserved: int
    live: int  # bytes of the tensors the load leaves (exact sizes)
    inactive_split: int  # free blocks inside segments that hold a live block
    allocated: int  # live blocks as the allocator counts them (rounded, unsplit tails included)
    peak_allocated: int
    segments: int

    @property
    def beyond_live(self) -> int:
        return self.reserved - self.live


@lru_cache(maxsize=32)
def replay_gpt_oss_load(model: ModelShape, tp: int, ep: int) -> LoadReplay:
    """Replay SGLang 0.5.17's dummy-weight load of an MXFP4 gpt-oss model on one Hopper rank."""
    return replay_logged(model, tp, ep, None)


def replay_logged(model: ModelShape, tp: int, ep: int, log: list[tuple[str, int]] | None) -> LoadReplay:
    """The replay; ``log`` (when given) receives every ("alloc" | "free", bytes) in order."""
    raw = model.raw
    h = model.hidden_size
    hd = model.head_dim
    heads = model.num_attention_heads // tp
    kv = max(1, model.num_kv_heads // tp)
    vocab = math.ceil(model.vocab_size / 64) * 64 // tp
    experts = model.num_experts // ep
    width = _up(model.moe_intermediate_size // (tp // ep), 64)  # create_weights: triton_kernels' 64
    p = _Program(log)
    p.new("embed", vocab * h * BF16)
    for i in range(model.num_layers):
        qkv = (heads + 2 * kv) * hd
        p.new(f"{i}.qkv", qkv * h * BF16)
        p.new(f"{i}.qkv_b", qkv * BF16)
        p.new(f"{i}.sinks", heads * BF16)
        p.new(f"{i}.o", h * heads * hd * BF16)
        p.new(f"{i}.o_b", h * BF16)
        if i == 0:
            _rope_cache(p, raw, hd)
        p.new(f"{i}.w13", experts * 2 * width * h // 2)
        p.new(f"{i}.w13_s", experts * 2 * width * (h // MXFP4_BLOCK))
        p.new(f"{i}.w13_b", experts * 2 * width * BF16)
        p.new(f"{i}.w2", experts * h * width // 2)
        p.new(f"{i}.w2_s", experts * h * (width // MXFP4_BLOCK))
        p.new(f"{i}.w2_b", experts * h * BF16)
        p.new(f"{i}.router", model.num_experts * h * BF16)
        p.new(f"{i}.router_b", model.num_experts * BF16)
        p.new(f"{i}.ln1", h * BF16)
        p.new(f"{i}.ln2", h * BF16)
    p.new("norm", h * BF16)
    p.new("lm_head", vocab * h * BF16)
    for i in range(model.num_layers):
        _process_layer(p, str(i), experts, width, h)
    p.alloc.empty_cache()  # get_available_gpu_memory(empty_cache=True)
    a = p.alloc
    return LoadReplay(a.reserved, p.live_bytes, a.inactive_split, a.allocated, a.peak_allocated, a.segments)


def _process_layer(p: _Program, i: str, experts: int, width: int, h: int) -> None:
    """``Mxfp4MoEMethod.process_weights_after_loading``, use_triton_kernels branch, on one FusedMoE."""
    p.new(f"{i}.w13_b32", experts * 2 * width * FP32)  # w13_weight_bias.to(torch.float32)
    p.new(f"{i}.w2_b32", experts * h * FP32)
    p.drop(f"{i}.w13_b", f"{i}.w2_b")  # the Parameters replaced
    _swizzle_values(p, f"{i}.w13v", experts, 2 * width, h // 2)
    _swizzle_scales(p, f"{i}.w13s", experts, 2 * width, h // MXFP4_BLOCK)
    _swizzle_values(p, f"{i}.w2v", experts, h, width // 2)
    _swizzle_scales(p, f"{i}.w2s", experts, h, width // MXFP4_BLOCK)
    p.drop(f"{i}.w13", f"{i}.w2")  # del layer.w13_weight, layer.w2_weight
    p.alloc.empty_cache()


def _rope_cache(p: _Program, raw: dict, hd: int) -> None:
    """yarn.py ``_compute_cos_sin_cache``: t, freqs = t x inv_freq, cos and sin (each times mscale), cat."""
    scaling = raw.get("rope_scaling") or {}
    positions = int(
        (scaling.get("original_max_position_embeddings") or raw.get("max_position_embeddings") or 4096)
        * float(scaling.get("factor") or 1.0)
    )
    half = positions * (hd // 2) * FP32
    p.new("rope.t", positions * FP32)
    p.new("rope.freqs", half)
    p.new("rope.cos0", half)
    p.new("rope.cos", half)
    p.drop("rope.cos0")
    p.new("rope.sin0", half)
    p.new("rope.sin", half)
    p.drop("rope.sin0")
    p.new("rope.cache", 2 * half)
    p.drop("rope.t", "rope.freqs", "rope.cos", "rope.sin")
