"""Step 2 of the drafter loop: the target's hidden states over prepared rows, in SpecForge's offline format.

    python -m bench.loop.capture --model MODEL --data DATA/x.jsonl --out FEAT/x [--device cuda|cpu]

One transformers forward pass per row (``{"id", "input_ids", "loss_mask"}``, from ``bench.loop.prepare``)
writes ``FEAT/x/data_{i:08d}.ckpt`` (``torch.save``) with the four tensors SpecForge's offline EAGLE3
reader (``specforge.runtime.data_plane.offline_reader``) and normalizer
(``specforge.algorithms.eagle3.data.normalize_offline_sample``) take, shaped as SpecForge's own capture
stored them: ``input_ids`` (T,), ``loss_mask`` (T,), ``hidden_state`` (1, T, H) and
``aux_hidden_state`` (1, T, 3H), bf16; plus ``FEAT/x/capture.json`` (layers, rows, ids in file order).

Which states:

- ``aux_hidden_state``: the residual stream after decoder layers ``ids`` (0-based), concatenated in that
  order, where ``ids`` is SpecForge's default for EAGLE3 (``resolve_eagle_capture_layers``:
  ``[1, L//2 - 1, L - 4]`` for L layers; [1, 17, 32] at Qwen3-8B's 36). It is what SGLang captures for
  the same ids (``set_eagle3_layers_to_capture`` adds 1 and takes ``hidden_states + residual`` before
  that layer), so the drafter is trained on the states it is served with. The exported draft config
  names the ids (``eagle_config.eagle_aux_hidden_state_layer_ids``). Below 4 layers SpecForge's rule
  gives a negative id; each id is then clamped into [0, L-1] (the tiny CPU target: [1, 0, 0]) and this
  says so: SGLang captures each layer once, so such a drafter is for the CPU rehearsal only.
- ``hidden_state``: the last layer's output AFTER the final norm (the base model's
  ``last_hidden_state``): SpecForge's ``TargetHead`` is the lm_head alone (no norm) and turns it into the
  target's logits, as SGLang's ``last_hidden_states`` (CaptureHiddenMode.FULL) are.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from regen.io import write_json


def default_layers(num_layers: int) -> tuple[list[int], str]:
    """SpecForge's default EAGLE3 aux layers for ``num_layers`` and why (clamped below 4 layers)."""
    rule = [1, num_layers // 2 - 1, num_layers - 4]
    if all(0 <= i < num_layers for i in rule):
        return rule, f"SpecForge's EAGLE3 default [1, L//2-1, L-4] for L={num_layers}"
    clamped = [min(max(i, 0), num_layers - 1) for i in rule]
    return clamped, (
        f"SpecForge's EAGLE3 default [1, L//2-1, L-4] for L={num_layers} is {rule}; clamped into "
        f"[0, {num_layers - 1}]: {clamped} (CPU rehearsal only: SGLang captures each layer once)"
    )


def feature_record(ids: list[int], mask: list[int], aux: Any, last: Any) -> dict[str, Any]:
    import torch

    return {
        "input_ids": torch.tensor(ids, dtype=torch.long),
        "loss_mask": torch.tensor(mask, dtype=torch.long),
        "hidden_state": last.to(torch.bfloat16).cpu().contiguous(),
        "aux_hidden_state": aux.to(torch.bfloat16).cpu().contiguous(),
    }


def capture(model_dir: Path, data: Path, out: Path, device: str) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(device).eval()
    base = model.model
    num_layers = len(base.layers)
    layers, why = default_layers(num_layers)
    print(f"capture: aux layers {layers} ({why}); hidden_state = final-norm output of layer {num_layers - 1}")
    captured: dict[int, Any] = {}

    def hook(index: int):
        def keep(_module, _inputs, output):
            captured[index] = output[0] if isinstance(output, tuple) else output

        return keep

    handles = [base.layers[i].register_forward_hook(hook(i)) for i in sorted(set(layers))]
    out.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
    ids_in_order = []
    try:
        with torch.no_grad():
            for i, row in enumerate(rows):
                captured.clear()
                ids = torch.tensor([row["input_ids"]], device=device)
                last = base(input_ids=ids).last_hidden_state
                aux = torch.cat([captured[k] for k in layers], dim=-1)
                record = feature_record(row["input_ids"], row["loss_mask"], aux, last)
                path = out / f"data_{i:08d}.ckpt"
                torch.save(record, path.with_suffix(".tmp"))
                path.with_suffix(".tmp").replace(path)
                ids_in_order.append(row["id"])
    finally:
        for h in handles:
            h.remove()
    summary = {
        "model": str(model_dir),
        "data": str(data),
        "device": device,
        "num_hidden_layers": num_layers,
        "aux_hidden_state_layer_ids": layers,
        "why": why,
        "hidden_state": "last layer's output after the final norm (SpecForge's TargetHead is lm_head only)",
        "hidden_size": int(model.config.hidden_size),
        "rows": len(rows),
        "tokens": sum(len(r["input_ids"]) for r in rows),
        "ids": ids_in_order,
    }
    write_json(out / "capture.json", summary)
    return summary


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.loop.capture", description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--data", type=Path, required=True, help="prepared rows: id, input_ids, loss_mask")
    p.add_argument("--out", type=Path, required=True, help="feature directory (data_*.ckpt, capture.json)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    a = p.parse_args(argv)
    s = capture(a.model, a.data, a.out, a.device)
    print(f"capture: {s['rows']} rows, {s['tokens']} tokens -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
