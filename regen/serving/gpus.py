"""The GPUs of this machine, asked of ``nvidia-smi``: the caller's side of the memory plan, which
:mod:`regen.sglang.plan` takes as a number (the SGLang-rules package starts no process)."""

from __future__ import annotations

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
