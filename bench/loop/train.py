"""Step 3 of the drafter loop: the real ``specforge train`` (offline EAGLE3, full vocabulary), then
``specforge export --to sglang``.

    python -m bench.loop.train --target MODEL --train FEAT/regen-train --eval FEAT/regen-eval \\
        --out TRAIN/NAME --steps N --seed S [--reference-loss] [--device cuda|cpu] [--batch-size B]
        [--lr LR] [--keep-checkpoint]

On the H200 (the dense target at Qwen3-8B's shape, ~400 train rows of 300-600 tokens): ``--steps 400
--batch-size 1 --reference-loss`` (one pass over the rows; the full vocabulary needs the reference loss,
below), estimated ~0.15-0.3 s a step; SpecForge logs ``perf/optimizer_step_time_s`` every steps/10.

Writes into TRAIN/NAME: ``run.yaml`` (the SpecForge config it ran, printed too), ``draft_config.json``,
``specforge/`` (SpecForge's checkpoints: removed after the export unless ``--keep-checkpoint``),
``sglang/`` (the exported draft model dir for SGLang's ``--speculative-draft-model-path``),
``train.log`` (both CLIs' output) and ``train.json``: ``{"steps", "seed", "wall_s", "specforge_eval",
"acc_per_position", "predicted_accept_length_3steps", ...}``.

- The draft config: SpecForge's own generated one (``_generate_draft_config``: the target's fields,
  ``LlamaForCausalLMEagle3``, one layer) with ``draft_vocab_size`` = the target's vocabulary (full vocab,
  identity t2d/d2t) and ``eagle_config.eagle_aux_hidden_state_layer_ids`` = the layers the features
  were captured at (FEAT/capture.json), which SGLang reads to capture the same layers when serving.
- Eval: SpecForge's own, once, at the last step (``eval_interval`` = steps) over the eval features.
  SpecForge reports per-TTT-position accuracies (``eval/per_position_acc``: share of supervised tokens
  whose draft argmax at unroll step k is the target's token), not served acceptance; ``acc_per_position``
  is that list and ``predicted_accept_length_3steps`` = 1 + a1 + a1*a2 + a1*a2*a3 from it.
- ``--reference-loss``: ``bench/loop/reference_loss/`` first on the subprocess's PYTHONPATH; its
  ``sitecustomize`` answers the import of ``specforge.core.loss`` with SpecForge's reference formula
  (``specforge_loss.py``) and changes nothing else. Without it SpecForge's Triton loss runs as shipped.
  Needed on CPU (no Triton) AND for a full vocabulary above 131,072 ids (Qwen3's 151,936): SpecForge
  0.2.0's kernel (``specforge.core.loss._calculate_settings``) takes the vocabulary's next power of two
  as one block and refuses blocks over 131,072; this module stops before training with that message
  rather than fail inside the first step. ``--device`` is independent of it (cuda: bf16 on the GPU).
- SpecForge's ``TargetHead`` reads the lm_head only through a ``*.index.json``; a single-file target
  (the tiny CPU target) gets ``TRAIN/NAME/target/``: links to MODEL's files plus that index.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from regen.io import write_json

REFERENCE_LOSS_DIR = Path(__file__).resolve().parent / "reference_loss"
#: the settings both drafters of one comparison share; printed and kept in run.yaml
LEARNING_RATE = 5e-4  # short runs: 57 steps on the tiny target gave accept 2.21 at 5e-4, 1.58 at 1e-4
BATCH_SIZE = 1
MAX_LENGTH = 4096
TTT_LENGTH = 7
#: SpecForge 0.2.0's Triton loss: one block of next_power_of_2(vocab) lanes, at most this many
TRITON_MAX_FUSED_SIZE = 131072
_STEP_LINE = re.compile(r"^step (\d+): (\{.*\})\s*$")


def target_view(model: Path, out: Path) -> tuple[Path, str]:
    """MODEL itself when it has a safetensors index; else ``out/target`` with links and a written index."""
    if list(model.glob("*.index.json")):
        return model, "the target dir as it is"
    from safetensors import safe_open

    view = out / "target"
    view.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for f in sorted(model.iterdir()):
        link = view / f.name
        if not link.exists():
            link.symlink_to(f.resolve())
        if f.suffix == ".safetensors":
            with safe_open(str(f), framework="pt") as st:
                weight_map.update(dict.fromkeys(st.keys(), f.name))  # safe_open has no __iter__
    (view / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return (
        view,
        f"{view}: links to {model} plus model.safetensors.index.json (SpecForge's TargetHead needs one)",
    )


def draft_config(target: Path, layers: list[int]) -> dict[str, Any]:
    """SpecForge's generated EAGLE3 draft config for ``target``, full vocabulary, capture layers named."""
    from specforge.algorithms.eagle3.providers import algorithm_providers
    from specforge.config import Config
    from specforge.training.model_loading import _generate_draft_config

    cfg = Config.model_validate(
        {"model": {"target_model_path": str(target)}, "data": {"hidden_states_path": "-"}}
    )
    generated = _generate_draft_config(cfg, algorithm_providers().model.draft_config).to_dict()
    keep = {k: v for k, v in generated.items() if not k.startswith("_") and k != "transformers_version"}
    keep["draft_vocab_size"] = keep["vocab_size"]
    keep["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(layers)}
    keep["torch_dtype"] = "bfloat16"
    return keep


def run_config(
    target: Path,
    draft: Path,
    train: Path,
    evals: Path,
    out: Path,
    name: str,
    steps: int,
    seed: int,
    batch: int,
    lr: float,
) -> dict[str, Any]:
    return {
        "run_id": name,
        "output_dir": str(out / "specforge"),
        "model": {
            "target_model_path": str(target),
            "draft_model_config": str(draft),
            "torch_dtype": "bfloat16",
        },
        "data": {
            "hidden_states_path": str(train),
            "eval_hidden_states_path": str(evals),
            "max_length": MAX_LENGTH,
            "cache_dir": str(out / "cache"),
            "dataloader_num_workers": 0,
        },
        "training": {
            "strategy": "eagle3",
            "max_steps": steps,
            "num_epochs": 1000,
            "batch_size": batch,
            "learning_rate": lr,
            "ttt_length": TTT_LENGTH,
            "attention_backend": "sdpa",
            "fsdp_sharding": "NO_SHARD",  # one process: DDP (SpecForge's choice for NO_SHARD), CPU or GPU
            "eval_interval": steps,
            "log_interval": max(1, steps // 10),
            "seed": seed,
        },
    }


def eval_metrics(log_text: str) -> dict[str, Any]:
    """The last ``step N: {...}`` line carrying ``eval/`` keys (SpecForge's console logger)."""
    found: dict[str, Any] = {}
    for line in log_text.splitlines():
        m = _STEP_LINE.match(line.strip())
        if m and "'eval/" in m.group(2):
            found = ast.literal_eval(re.sub(r"\bnan\b", "None", m.group(2)))
    return found


def predicted_accept_length(acc: list[float], steps: int = 3) -> float:
    """1 + a1 + a1*a2 + ... over the first ``steps`` positions (SGLang's accept length counts the bonus
    token)."""
    total, run = 1.0, 1.0
    for a in acc[:steps]:
        run *= a
        total += run
    return total


SPECFORGE_MAIN = "import sys; from specforge.cli import main; sys.exit(main())"


def logged_run(cmd: list[str], env: dict[str, str], log) -> float:
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[1]} {cmd[2]} failed (exit {proc.returncode}); see {log.name}")
    return wall


def remove_checkpoints(run_dir: Path) -> None:
    """SpecForge's resumable checkpoints (weights + optimizer state, ~7x the exported drafter: ~12 GB at
    Qwen3-8B's shape) once ``sglang/`` is written; its ``*.best_meta.json`` (the eval it kept) stays."""
    for entry in run_dir.iterdir():
        if entry.is_symlink():
            entry.unlink()
        elif entry.is_dir():
            shutil.rmtree(entry)


def train(a: argparse.Namespace) -> dict[str, Any]:
    out: Path = a.out
    out.mkdir(parents=True, exist_ok=True)
    capture = json.loads((a.train / "capture.json").read_text())
    eval_capture = json.loads((a.eval / "capture.json").read_text())
    layers = capture["aux_hidden_state_layer_ids"]
    if eval_capture["aux_hidden_state_layer_ids"] != layers:
        raise SystemExit(f"{a.train} and {a.eval} were captured at different layers")
    target, target_note = target_view(a.target, out)
    draft = draft_config(target, layers)
    block = 1 << (int(draft["draft_vocab_size"]) - 1).bit_length()
    if not a.reference_loss and block > TRITON_MAX_FUSED_SIZE:
        raise SystemExit(
            f"draft vocabulary {draft['draft_vocab_size']}: SpecForge 0.2.0's Triton loss needs one block of "
            f"{block} > {TRITON_MAX_FUSED_SIZE} (specforge.core.loss._calculate_settings) and would fail "
            "in the first step; pass --reference-loss (its reference formula, on any device)"
        )
    draft_path = out / "draft_config.json"
    draft_path.write_text(json.dumps(draft, indent=1))
    cfg = run_config(target, draft_path, a.train, a.eval, out, out.name, a.steps, a.seed, a.batch_size, a.lr)
    cfg_path = out / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    print(f"train: specforge config ({cfg_path}):\n{yaml.safe_dump(cfg, sort_keys=False)}")
    env = dict(os.environ)
    loss_note = "SpecForge's Triton loss (specforge.core.loss) as shipped"
    if a.reference_loss:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REFERENCE_LOSS_DIR), env.get("PYTHONPATH")) if p)
        loss_note = (
            f"--reference-loss: {REFERENCE_LOSS_DIR}/sitecustomize.py (first on PYTHONPATH) answers the "
            f"import of specforge.core.loss with {REFERENCE_LOSS_DIR}/specforge_loss.py (SpecForge's "
            "reference formula, no Triton); nothing else replaced"
        )
    if a.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    script = Path(sys.executable).parent / "specforge"
    # the console script where pip installed SpecForge; its entry point (specforge.cli:main) where the
    # wheel is only unzipped onto PYTHONPATH (the GPU host)
    specforge = [str(script)] if script.exists() else [sys.executable, "-c", SPECFORGE_MAIN]
    log_path = out / "train.log"
    with open(log_path, "w") as log:
        log.write(f"loss: {loss_note}\ntarget: {target_note}\ncapture layers: {layers} ({capture['why']})\n")
        log.write(f"config:\n{yaml.safe_dump(cfg, sort_keys=False)}\n")
        wall = logged_run([*specforge, "train", "--config", str(cfg_path)], env, log)
        export_wall = logged_run(
            [
                *specforge,
                "export",
                "--to",
                "sglang",
                "--checkpoint",
                str(out / "specforge"),
                "--draft-config",
                str(draft_path),
                "--output-dir",
                str(out / "sglang"),
            ],
            env,
            log,
        )
    if not a.keep_checkpoint:
        remove_checkpoints(out / "specforge")
    metrics = eval_metrics(log_path.read_text())
    if "eval/per_position_acc" not in metrics:
        raise SystemExit(f"{log_path}: no SpecForge eval line (eval/per_position_acc) in the train output")
    acc = [float(x) for x in metrics["eval/per_position_acc"]]
    result = {
        "steps": a.steps,
        "seed": a.seed,
        "wall_s": round(wall, 2),
        "export_wall_s": round(export_wall, 2),
        "batch_size": a.batch_size,
        "learning_rate": a.lr,
        "train_rows": capture["rows"],
        "eval_rows": eval_capture["rows"],
        "aux_hidden_state_layer_ids": layers,
        "loss": "reference" if a.reference_loss else "triton",
        "device": a.device,
        "checkpoint": "kept"
        if a.keep_checkpoint
        else "removed after the export (--keep-checkpoint keeps it)",
        "specforge_eval": metrics,
        "acc_per_position": acc,
        "acc_per_position_meaning": "SpecForge's eval/per_position_acc (per TTT position, not conditional)",
        "predicted_accept_length_3steps": predicted_accept_length(acc, 3),
    }
    write_json(out / "train.json", result)
    return result


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.loop.train", description=__doc__.split("\n")[0])
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("--train", type=Path, required=True, help="train features (bench.loop.capture)")
    p.add_argument("--eval", type=Path, required=True, help="eval features (bench.loop.capture)")
    p.add_argument("--out", type=Path, required=True, help="TRAIN/NAME; NAME is SpecForge's run_id")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument(
        "--reference-loss",
        action="store_true",
        help="SpecForge's reference loss instead of its Triton kernel (CPU; any vocabulary over 131072)",
    )
    p.add_argument(
        "--device", choices=("cuda", "cpu"), default=None, help="default: cuda where torch sees one"
    )
    p.add_argument("--keep-checkpoint", action="store_true", help="keep SpecForge's checkpoints (GBs)")
    p.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    p.add_argument("--lr", type=float, default=LEARNING_RATE)
    a = p.parse_args(argv)
    if a.device is None:
        import torch

        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    r = train(a)
    print(
        f"train: {a.out.name} steps={r['steps']} seed={r['seed']} wall_s={r['wall_s']} "
        f"acc_per_position={[round(x, 3) for x in r['acc_per_position']]} "
        f"predicted_accept_length_3steps={r['predicted_accept_length_3steps']:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
