"""Measure the GPU's copy bandwidth and bf16 matmul rate; print one JSON object.

Run as its own process (``python3 -m bench.gpu.hw``) so its CUDA context is gone before a
server starts and takes its share of the GPU's memory.
"""

from __future__ import annotations

import json
import sys


def measure(copy_gib: float = 4.0, n: int = 8192, reps: int = 10) -> dict[str, float | str]:
    import torch

    dev = torch.device("cuda")
    elems = int(copy_gib * 2**30) // 2
    src = torch.empty(elems, dtype=torch.bfloat16, device=dev).normal_()
    dst = torch.empty_like(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps * 2):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    copy_s = start.elapsed_time(end) / 1e3 / (reps * 2)
    bytes_moved = 2 * src.numel() * src.element_size()  # read + write
    del src, dst
    a = torch.randn(n, n, dtype=torch.bfloat16, device=dev)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=dev)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        a @ b
    end.record()
    torch.cuda.synchronize()
    mm_s = start.elapsed_time(end) / 1e3 / reps
    _free, total = torch.cuda.mem_get_info()
    return {
        "gpu": torch.cuda.get_device_name(0),
        "gpu_memory_mib": total // 2**20,
        "hbm_bytes_per_s": bytes_moved / copy_s,
        "bf16_flops_per_s": 2 * n**3 / mm_s,
        "copy_gib": copy_gib,
        "matmul_n": n,
        "torch": torch.__version__,
    }


def decode_gemms(gemms: list[tuple[str, int, int, int]], batch: int, reps: int = 20) -> dict[str, object]:
    """Each decode GEMM (``roofline.HybridShape.decode_gemms``) at ``batch`` rows, timed as SGLang runs an
    unquantized bf16 linear layer (``F.linear``); the step's GEMM time is the sum over layers."""
    import torch
    import torch.nn.functional as F

    dev = torch.device("cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    rows, step_s, flops = [], 0.0, 0.0
    for name, k, n, times in gemms:
        x = torch.randn(batch, k, dtype=torch.bfloat16, device=dev)
        w = torch.randn(n, k, dtype=torch.bfloat16, device=dev)
        for _ in range(3):
            F.linear(x, w)
        torch.cuda.synchronize()
        start.record()
        for _ in range(reps):
            F.linear(x, w)
        end.record()
        torch.cuda.synchronize()
        s = start.elapsed_time(end) / 1e3 / reps
        f = 2.0 * batch * k * n
        rows.append(
            {
                "gemm": name,
                "k": k,
                "n": n,
                "per_step": times,
                "us": round(s * 1e6, 1),
                "tflop_s": round(f / s / 1e12, 1),
            }
        )
        step_s += s * times
        flops += f * times
        del x, w
    return {"batch": batch, "gemms": rows, "step_gemm_s": step_s, "step_gemm_tflop_s": flops / step_s / 1e12}


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--decode-gemms":  # --decode-gemms CONFIG_JSON BATCH
        from bench.gpu.roofline import HybridShape

        with open(sys.argv[2]) as fh:
            shape = HybridShape.from_config(json.load(fh))
        json.dump(decode_gemms(shape.decode_gemms(), int(sys.argv[3])), sys.stdout)
    else:
        json.dump(measure(), sys.stdout)
    print()
