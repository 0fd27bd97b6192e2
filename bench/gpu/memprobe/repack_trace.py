"""Device check for regen/sglang/allocator.py (issue 49 item 4): replay gpt-oss's weight load as SGLang
0.5.17's DummyModelLoader does it -- the parameters in GptOssForCausalLM's construction order, then
Mxfp4MoEMethod.process_weights_after_loading's triton_kernels branch layer by layer (the same calls:
``_swizzle_mxfp4`` through the real ``triton_kernels`` layouts, ``del`` of the originals,
``torch.cuda.empty_cache()``) -- under PyTorch's real caching allocator, and print what it leaves:
``REPACK {json}`` with allocated / reserved / inactive-split bytes after the load and after every layer,
and the allocator's event trace of the first two MoE layers (alloc / free sizes in order).

Needs torch with CUDA and triton_kernels (SGLang's dependency; carry ``.gpu/site/triton_kernels``).
Usage: python -m bench.gpu.memprobe.repack_trace CONFIG_DIR [CONFIG_DIR ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def swizzle_mxfp4(quant_tensor, scale, num_warps):  # type: ignore[no-untyped-def]
    """sglang/srt/layers/quantization/mxfp4.py::_swizzle_mxfp4 (0.5.17), verbatim but for opt_flags."""
    from triton_kernels.numerics import InFlexData
    from triton_kernels.tensor import FP4, convert_layout, wrap_torch_tensor
    from triton_kernels.tensor_details import layout

    value_layout, value_layout_opts = layout.make_default_matmul_mxfp4_w_layout(mx_axis=1)
    scale_layout, scale_layout_opts = layout.make_default_matmul_mxfp4_w_scale_layout(
        mx_axis=1, num_warps=num_warps
    )
    quant_tensor = quant_tensor.transpose(-2, -1)
    scale = scale.transpose(-2, -1)
    quant_tensor = convert_layout(
        wrap_torch_tensor(quant_tensor, dtype=FP4), value_layout, **value_layout_opts
    )
    scale = convert_layout(wrap_torch_tensor(scale), scale_layout, **scale_layout_opts)
    return quant_tensor, InFlexData(), scale


def replay(config_dir: Path, trace_layers: int = 2) -> dict[str, object]:
    import torch

    cfg = json.loads((config_dir / "config.json").read_text())
    h, inter, e = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_local_experts"]
    layers, heads, kv, hd = (
        cfg["num_hidden_layers"],
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["head_dim"],
    )
    vocab = math.ceil(cfg["vocab_size"] / 64) * 64
    ip = -(-inter // 64) * 64
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    dev = torch.device("cuda")
    bf = torch.bfloat16
    P = torch.nn.Parameter
    model = torch.nn.Module()
    with torch.device(dev):
        model.embed = P(torch.empty(vocab, h, dtype=bf), requires_grad=False)
        moes = []
        for i in range(layers):
            m = torch.nn.Module()
            m.qkv = P(torch.empty((heads + 2 * kv) * hd, h, dtype=bf), requires_grad=False)
            m.qkv_b = P(torch.empty((heads + 2 * kv) * hd, dtype=bf), requires_grad=False)
            m.sinks = P(torch.empty(heads, dtype=bf), requires_grad=False)
            m.o = P(torch.empty(h, heads * hd, dtype=bf), requires_grad=False)
            m.o_b = P(torch.empty(h, dtype=bf), requires_grad=False)
            if i == 0:  # yarn.py _compute_cos_sin_cache, once (get_rope caches the module)
                rs = cfg["rope_scaling"]
                t = torch.arange(rs["original_max_position_embeddings"] * rs["factor"], dtype=torch.float32)
                inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float) / hd))
                freqs = torch.einsum("i,j -> ij", t, inv)
                cos = freqs.cos() * 1.0
                sin = freqs.sin() * 1.0
                model.rope = torch.cat((cos, sin), dim=-1)
                del t, inv, freqs, cos, sin
            x = torch.nn.Module()  # Mxfp4MoEMethod.create_weights
            x.w13_weight = P(torch.zeros(e, 2 * ip, h // 2, dtype=torch.uint8), requires_grad=False)
            x.w13_weight_scale = P(
                torch.full((e, 2 * ip, h // 32), 127, dtype=torch.uint8), requires_grad=False
            )
            x.w13_weight_bias = P(torch.zeros(e, 2 * ip, dtype=bf), requires_grad=False)
            x.w2_weight = P(torch.zeros(e, h, ip // 2, dtype=torch.uint8), requires_grad=False)
            x.w2_weight_scale = P(torch.full((e, h, ip // 32), 127, dtype=torch.uint8), requires_grad=False)
            x.w2_weight_bias = P(torch.zeros(e, h, dtype=bf), requires_grad=False)
            m.experts = x
            m.router = P(torch.empty(e, h, dtype=bf), requires_grad=False)
            m.router_b = P(torch.empty(e, dtype=bf), requires_grad=False)
            m.ln1 = P(torch.ones(h, dtype=bf), requires_grad=False)
            m.ln2 = P(torch.ones(h, dtype=bf), requires_grad=False)
            setattr(model, f"l{i}", m)
            moes.append(x)
        model.norm = P(torch.ones(h, dtype=bf), requires_grad=False)
        model.lm_head = P(torch.empty(vocab, h, dtype=bf), requires_grad=False)
    st = torch.cuda.memory_stats()
    built = {
        k: st[k]
        for k in (
            "allocated_bytes.all.current",
            "reserved_bytes.all.current",
            "inactive_split_bytes.all.current",
        )
    }
    per_layer = []
    keep = []
    for i, layer in enumerate(moes):
        if i == 0:
            torch.cuda.memory._record_memory_history(
                enabled="all", context=None, stacks="python", max_entries=200000
            )
        # Mxfp4MoEMethod.process_weights_after_loading, use_triton_kernels branch
        w13_weight_bias = layer.w13_weight_bias.to(torch.float32)
        w2_weight_bias = layer.w2_weight_bias.to(torch.float32)
        layer.w13_weight_bias = P(w13_weight_bias, requires_grad=False)
        layer.w2_weight_bias = P(w2_weight_bias, requires_grad=False)
        del w13_weight_bias, w2_weight_bias
        w13_weight, w13_flex, w13_scale = swizzle_mxfp4(layer.w13_weight, layer.w13_weight_scale, 8)
        w2_weight, w2_flex, w2_scale = swizzle_mxfp4(layer.w2_weight, layer.w2_weight_scale, 8)
        keep.append((w13_weight, w13_scale, w2_weight, w2_scale))
        del w13_weight, w13_scale, w2_weight, w2_scale, w13_flex, w2_flex
        del layer.w13_weight
        del layer.w2_weight
        torch.cuda.empty_cache()
        if i == trace_layers - 1:
            snap = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
        st = torch.cuda.memory_stats()
        per_layer.append(
            [
                st["allocated_bytes.all.current"],
                st["reserved_bytes.all.current"],
                st["inactive_split_bytes.all.current"],
            ]
        )
    events = []
    for tr in snap.get("device_traces", [[]]):
        for ev in tr:
            if ev["action"] in ("alloc", "free_completed", "segment_alloc", "segment_free"):
                events.append([ev["action"], int(ev["size"]), int(ev["addr"])])
    st = torch.cuda.memory_stats()
    out = {
        "model": config_dir.name,
        "built": built,
        "allocated": st["allocated_bytes.all.current"],
        "reserved": st["reserved_bytes.all.current"],
        "inactive_split": st["inactive_split_bytes.all.current"],
        "allocated_peak": st["allocated_bytes.all.peak"],
        "reserved_peak": st["reserved_bytes.all.peak"],
        "segments": st["segment.all.current"],
        "per_layer": per_layer,
        "events": events,
        "torch": torch.__version__,
    }
    del keep, moes, model
    torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("configs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    rows = [replay(c) for c in a.configs]
    for r in rows:
        brief = {k: v for k, v in r.items() if k not in ("events", "per_layer")}
        print("REPACK " + json.dumps(brief), flush=True)
    if a.out:
        a.out.write_text(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
