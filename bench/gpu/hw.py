"""Measure the GPU's copy bandwidth and bf16 matmul rate; print one JSON object.

Run as its own process (``python3 bench/gpu/hw.py``) so its CUDA context is gone before a
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


if __name__ == "__main__":
    json.dump(measure(), sys.stdout)
    print()
