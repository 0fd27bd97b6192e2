"""The GPUs of this machine, asked of ``nvidia-smi``: the caller's side of the memory plan, which
:mod:`regen.sglang.plan` takes as a number (the SGLang-rules package starts no process), and how many a
process may use (``regen check``)."""

from __future__ import annotations

import os
import shutil
import subprocess

#: what to pass instead, said when there is no GPU to ask
NO_NVIDIA_SMI = "nvidia-smi not found: pass --gpu-memory-mib N (e.g. 143771 for an H200)"


class GpuQueryError(ValueError):
    """No GPU to ask (no ``nvidia-smi``)."""


def gpu_memory_from_nvidia_smi() -> int:
    """The first GPU's total memory in MiB (``nvidia-smi --query-gpu=memory.total``)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise GpuQueryError(NO_NVIDIA_SMI)
    out = subprocess.run(
        [exe, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    first = out.stdout.strip().splitlines()[0]
    return int(float(first))


def count_gpus() -> int | None:
    """NVIDIA GPUs this process may use (CUDA_VISIBLE_DEVICES respected); None without nvidia-smi."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
