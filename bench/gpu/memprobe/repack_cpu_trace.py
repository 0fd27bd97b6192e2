"""The allocation order of SGLang 0.5.17's MXFP4 repack for one MoE layer, from its own code, on CPU
(issue 49 item 4): the check behind ``regen/sglang/mxfp4_load.py``'s hand-written program.

Runs ``Mxfp4MoEMethod.process_weights_after_loading``'s triton_kernels branch (the function body as in
``layers/quantization/mxfp4.py``, calling the real ``triton_kernels`` Hopper layouts) under a
``TorchDispatchMode`` that records every new tensor storage ("alloc", bytes) and every storage that died
since the last operation ("free", bytes), through ``StorageWeakRef``. Frees between two operations are
one group, in no known order (the test compares them as a multiset). Writes JSON [[kind, bytes], ...].

Needs torch (CPU is enough) and triton_kernels (``.gpu/site``, where ``bench/gpu/pack.sh`` puts it).
Usage: PYTHONPATH=.:.gpu/site python -m bench.gpu.memprobe.repack_cpu_trace EXPERTS HIDDEN INTER OUT.json
(tests/data/sglang/mxfp4-repack-trace-e2.json: 2 2880 2880, gpt-oss's widths with two experts)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton_kernels.tensor_details.layout as layout_mod
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from bench.gpu.memprobe.repack_trace import swizzle_mxfp4

# Hopper (sm90) without a GPU: make_default_matmul_mxfp4_w(_scale)_layout pick HopperMX*Layout
layout_mod.cuda_capability_geq = lambda major, minor=0: (major, minor) <= (9, 0)
layout_mod.is_hip_cdna4 = lambda: False

EVENTS: list[tuple[str, int]] = []
TRACKED: dict[int, tuple[StorageWeakRef, int]] = {}


def _check() -> None:
    for key, (ref, nbytes) in list(TRACKED.items()):
        if ref.expired():
            EVENTS.append(("free", nbytes))
            del TRACKED[key]


def _track(t: torch.Tensor, record: bool) -> None:
    s = t.untyped_storage()
    if s._cdata not in TRACKED:
        TRACKED[s._cdata] = (StorageWeakRef(s), s.nbytes())
        if record:
            EVENTS.append(("alloc", s.nbytes()))


class _Recorder(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        _check()
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                _track(t, record=True)
        return out


class _Method:
    def process_weights_after_loading(self, layer):  # type: ignore[no-untyped-def]
        """Mxfp4MoEMethod.process_weights_after_loading, use_triton_kernels branch (0.5.17)."""
        Parameter = torch.nn.Parameter
        w13_weight_bias = layer.w13_weight_bias.to(torch.float32)
        w2_weight_bias = layer.w2_weight_bias.to(torch.float32)
        layer.w13_weight_bias = Parameter(w13_weight_bias, requires_grad=False)
        layer.w2_weight_bias = Parameter(w2_weight_bias, requires_grad=False)
        num_warps = 8
        w13_weight, w13_flex, w13_scale = swizzle_mxfp4(layer.w13_weight, layer.w13_weight_scale, num_warps)
        w2_weight, w2_flex, w2_scale = swizzle_mxfp4(layer.w2_weight, layer.w2_weight_scale, num_warps)
        self.w13_precision_config = (w13_scale, w13_flex)
        self.w2_precision_config = (w2_scale, w2_flex)
        self.w13_weight_triton_tensor = w13_weight
        self.w2_weight_triton_tensor = w2_weight
        del layer.w13_weight
        del layer.w2_weight


def trace(experts: int, hidden: int, inter: int) -> list[tuple[str, int]]:
    """Mxfp4MoEMethod.create_weights' parameters, then the repack, recorded."""
    p = torch.nn.Parameter
    layer = torch.nn.Module()
    layer.w13_weight = p(torch.zeros(experts, 2 * inter, hidden // 2, dtype=torch.uint8), requires_grad=False)
    layer.w13_weight_scale = p(
        torch.full((experts, 2 * inter, hidden // 32), 127, dtype=torch.uint8), requires_grad=False
    )
    layer.w13_weight_bias = p(torch.zeros(experts, 2 * inter, dtype=torch.bfloat16), requires_grad=False)
    layer.w2_weight = p(torch.zeros(experts, hidden, inter // 2, dtype=torch.uint8), requires_grad=False)
    layer.w2_weight_scale = p(
        torch.full((experts, hidden, inter // 32), 127, dtype=torch.uint8), requires_grad=False
    )
    layer.w2_weight_bias = p(torch.zeros(experts, hidden, dtype=torch.bfloat16), requires_grad=False)
    for param in layer.parameters():
        _track(param, record=False)
    del param  # the loop variable would keep the last parameter (w2's bias) alive
    method = _Method()
    with _Recorder():
        method.process_weights_after_loading(layer)
        torch.empty(1)  # one more operation: the frees at the end are seen
    return [e for e in EVENTS if e[1] != 4]  # the marker's 4 bytes


def main(argv: list[str]) -> int:
    experts, hidden, inter = (int(a) for a in argv[:3])
    Path(argv[3]).write_text(json.dumps(trace(experts, hidden, inter)) + "\n")
    print(f"repack_cpu_trace: events={len(EVENTS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
