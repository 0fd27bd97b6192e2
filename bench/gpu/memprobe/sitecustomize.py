"""Weight-load memory probe for the truth bench (issue 49 item 4), imported by every Python process that
has this folder on PYTHONPATH; it acts only with ``REGEN_MEMPROBE=1`` and only in the process that loads
the model (SGLang's scheduler). After ``ModelRunner.load_model`` it logs one line ``REGEN_MEMPROBE {json}``:
what the load's "mem usage" is made of -- the bytes of live tensors by kind (parameters; MXFP4 experts
as the triton_kernels repack holds them: swizzled values, swizzled scales), PyTorch's caching allocator
(allocated, reserved, free space stranded inside segments that hold a live block), and what the device
lost that PyTorch does not own (CUDA context, other processes). Nothing here changes what SGLang does."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

_TARGET = "sglang.srt.model_executor.model_runner"


def _nbytes(t: object) -> int:
    try:
        return int(t.untyped_storage().nbytes())  # type: ignore[attr-defined]
    except Exception:
        return 0


def _triton_bytes(x: object) -> int:
    """A triton_kernels Tensor (``.storage.data``) or a torch tensor."""
    data = getattr(getattr(x, "storage", None), "data", None)
    return _nbytes(data if data is not None else x)


def _probe(runner: object) -> dict[str, object]:
    import torch

    torch.cuda.synchronize()
    model = getattr(runner, "model", None)
    out: dict[str, object] = {}
    seen: set[int] = set()
    kinds: dict[str, int] = {}
    if model is not None:
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            ptr = p.untyped_storage().data_ptr()
            if ptr in seen:
                continue
            seen.add(ptr)
            leaf = name.rsplit(".", 1)[-1]
            kind = leaf if "experts" in name else ("other_" + str(p.dtype).replace("torch.", ""))
            kinds[kind] = kinds.get(kind, 0) + _nbytes(p)
        for mod in model.modules():
            qm = getattr(mod, "quant_method", None)
            for attr in ("w13_weight_triton_tensor", "w2_weight_triton_tensor"):
                t = getattr(qm, attr, None)
                if t is not None:
                    kinds["swizzled_values"] = kinds.get("swizzled_values", 0) + _triton_bytes(t)
            for attr in ("w13_precision_config", "w2_precision_config"):
                pc = getattr(qm, attr, None)
                s = getattr(pc, "weight_scale", None)
                if s is not None:
                    kinds["swizzled_scales"] = kinds.get("swizzled_scales", 0) + _triton_bytes(s)
    st = torch.cuda.memory_stats()
    free, total = torch.cuda.mem_get_info()
    out["tensors_by_kind"] = kinds
    out["tensors_total"] = sum(kinds.values())
    for key in (
        "allocated_bytes.all.current",
        "reserved_bytes.all.current",
        "inactive_split_bytes.all.current",
        "segment.all.current",
        "allocated_bytes.all.peak",
        "reserved_bytes.all.peak",
    ):
        out[key] = st.get(key)
    out["device_used"] = int(total - free)
    out["device_used_not_reserved"] = int(total - free - (st.get("reserved_bytes.all.current") or 0))
    return out


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module):  # type: ignore[no-untyped-def]
            original_exec(module)
            runner = getattr(module, "ModelRunner", None)
            load = getattr(runner, "load_model", None)
            if load is None:
                return

            def load_model(self, *args, **kwargs):  # type: ignore[no-untyped-def]
                result = load(self, *args, **kwargs)
                try:
                    import json

                    print("REGEN_MEMPROBE " + json.dumps(_probe(self)), flush=True)
                except Exception as exc:  # the probe must never break the server
                    print(f"REGEN_MEMPROBE failed: {exc!r}", flush=True)
                return result

            runner.load_model = load_model

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if os.environ.get("REGEN_MEMPROBE") == "1":
    sys.meta_path.insert(0, _Finder())
