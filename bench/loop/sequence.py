"""The drafter loop's whole device sequence (issue 36), each step its own process, in this order:

  target    python -m bench.gpu.known_target model ROOT/model --dense            (DRY: --tiny --dense)
  workflow  python -m bench.gpu.known_target run --mode sglang --dense ... (DRY: --mode simulated, chain)
            regen's whole workflow, thinking on; then any server it left is stopped and the GPU waited for
  prepare   python -m bench.loop.prepare   regen's exports + the original answers -> DATA/*.jsonl
  capture   python -m bench.loop.capture   x3: regen-train, regen-eval, original-train -> FEAT/*
  train     python -m bench.loop.train     x2: original, regen (same args but --train), SpecForge's reference
            loss always (its Triton kernel refuses Qwen3's 151,936-id full vocabulary; bench.loop.train)
  ceiling   python -m bench.loop.accept --ceiling     the perfect drafter, from the chain
  accept    python -m bench.loop.accept    x2: regen, original (DRY: --dry, train.json's prediction)
and after every step ``bench.loop.report`` rewrites ``RESULTS/loop-<date>.{json,md}`` from what exists,
so a budget cut still leaves the earlier steps' results; the last line is the report's ``loop:`` line.

Each step's command, rc and wall time go to the log and ``ROOT/steps.json`` as it ends; a step that ended
with rc 0 leaves ``ROOT/done/<step>`` and is skipped when the sequence runs again (a second call resumes).
A failed step does not stop the steps that do not need it (the ceiling needs only the target).

Pythons: ``--regen-python`` runs the target build and the workflow (regen + Snakemake: on the H200 the
image's python3 with /tmp/site and /tmp/snk on PYTHONPATH), ``--trainer-python`` the loop's own steps
(SpecForge, torch, transformers: here /work/main/.venv-trainers/bin/python). ``DRY=1`` (or ``--dry``):
the CPU rehearsal (contract 5 in the loop's plan).

Usage: python -m bench.loop.sequence --root /tmp/loop --results measurements [--n 500] [--max-tokens 2048]
       [--train-steps 400] [--seed 0] [--regen-python PY] [--trainer-python PY] [--dry]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KT = "bench.gpu.known_target"  # the known-answer target campaign (its model and run steps)
CAPTURES = ("regen-train", "regen-eval", "original-train")
DRAFTERS = ("original", "regen")  # trained in this order; served regen first (the headline)


@dataclass(frozen=True)
class Step:
    name: str
    cmd: list[str]
    needs: tuple[str, ...] = ()  # steps whose success this one needs


@dataclass(frozen=True)
class Paths:
    root: Path

    @property
    def model(self) -> Path:
        return self.root / "model"

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def run(self) -> Path:
        return self.work / "run"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def feat(self) -> Path:
        return self.root / "feat"

    @property
    def train(self) -> Path:
        return self.root / "train"

    @property
    def acc(self) -> Path:
        return self.root / "acc"

    @property
    def done(self) -> Path:
        return self.root / "done"

    @property
    def steps_json(self) -> Path:
        return self.root / "steps.json"


def plan(a: argparse.Namespace, p: Paths) -> list[Step]:
    """The sequence's steps, with their commands (module doc)."""
    rp, tp = a.regen_python, a.trainer_python
    device = "cpu" if a.dry else "cuda"
    steps = [Step("target", [rp, "-m", KT, "model", str(p.model), "--dense", *(["--tiny"] * a.dry)])]
    workflow = [rp, "-m", KT, "run", "--model", str(p.model), "--work", str(p.work)]
    workflow += ["--mode", "simulated" if a.dry else "sglang", "--dense", "--n", str(a.n)]
    workflow += [
        "--max-tokens",
        str(a.max_tokens),
        "--eval-fraction",
        str(a.eval_fraction),
        "--no-projection",
    ]
    steps.append(Step("workflow", workflow, ("target",)))
    prepare = [
        tp,
        "-m",
        "bench.loop.prepare",
        "--run",
        str(p.run),
        "--dataset",
        str(p.work / "dataset.jsonl"),
    ]
    steps.append(Step("prepare", [*prepare, "--model", str(p.model), "--out", str(p.data)], ("workflow",)))
    for name in CAPTURES:
        cmd = [
            tp,
            "-m",
            "bench.loop.capture",
            "--model",
            str(p.model),
            "--data",
            str(p.data / f"{name}.jsonl"),
        ]
        steps.append(
            Step(f"capture-{name}", [*cmd, "--out", str(p.feat / name), "--device", device], ("prepare",))
        )
    for name in DRAFTERS:
        cmd = [
            tp,
            "-m",
            "bench.loop.train",
            "--target",
            str(p.model),
            "--train",
            str(p.feat / f"{name}-train"),
        ]
        cmd += ["--eval", str(p.feat / "regen-eval"), "--out", str(p.train / name)]
        cmd += ["--steps", str(a.train_steps), "--seed", str(a.seed), "--reference-loss", "--device", device]
        cmd += shlex.split(a.train_args)
        steps.append(Step(f"train-{name}", cmd, (f"capture-{name}-train", "capture-regen-eval")))
    ceiling = [tp, "-m", "bench.loop.accept", "--target", str(p.model), "--ceiling"]
    steps.append(
        Step(
            "ceiling",
            [*ceiling, "--out", str(p.acc / "ceiling.json"), "--max-new-tokens", str(a.max_tokens)],
            ("target",),
        )
    )
    for name in reversed(DRAFTERS):
        cmd = [
            tp,
            "-m",
            "bench.loop.accept",
            "--target",
            str(p.model),
            "--drafter",
            str(p.train / name / "sglang"),
        ]
        cmd += ["--prompts", str(p.data / "eval-prompts.jsonl"), "--out", str(p.acc / f"{name}.json")]
        cmd += ["--max-new-tokens", str(a.max_tokens), *(["--dry"] * a.dry)]
        steps.append(Step(f"accept-{name}", cmd, (f"train-{name}",)))
    return steps


def env(a: argparse.Namespace) -> dict[str, str]:
    repo = str(Path(__file__).resolve().parents[2])
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(":") if p]
    return {
        **os.environ,
        "PYTHONPATH": ":".join(paths if repo in paths else [*paths, repo]),
        "PYTHONUNBUFFERED": "1",
    }


def free_gpu(p: Paths, dry: bool) -> dict[str, Any]:
    """Stop any supervisor the workflow left (Snakemake, its owner, is gone) and wait for the GPU's memory:
    the next step loads the target on it."""
    from regen.serving.lifecycle import stop_all_servers

    out: dict[str, Any] = {"stopped_supervisors": stop_all_servers(p.run / "work" / "servers", grace_s=60)}
    if not dry:
        from bench.gpu.harness import wait_gpu_free

        out["gpu_used_mib"] = wait_gpu_free(timeout_s=180)
    return out


def run_step(step: Step, e: dict[str, str]) -> tuple[int, float]:
    print(f"=== step {step.name} ({time.strftime('%H:%M:%S')}): {shlex.join(step.cmd)}", flush=True)
    t = time.time()
    rc = subprocess.run(step.cmd, env=e, stdin=subprocess.DEVNULL).returncode
    wall = time.time() - t
    print(f"=== step {step.name}: rc={rc} in {wall:.0f} s", flush=True)
    return rc, wall


def sequence(a: argparse.Namespace) -> int:
    from bench.loop import report

    p = Paths(a.root)
    p.done.mkdir(parents=True, exist_ok=True)
    e = env(a)
    record: dict[str, Any] = json.loads(p.steps_json.read_text()) if p.steps_json.exists() else {}
    record.setdefault("steps", {})
    record["config"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}
    ok = {f.name for f in p.done.iterdir()}
    for step in plan(a, p):
        if step.name in ok:
            print(f"=== step {step.name}: done before, skipped", flush=True)
            continue
        missing = [n for n in step.needs if n not in ok]
        if missing:
            print(f"=== step {step.name}: skipped, needs {', '.join(missing)}", flush=True)
            record["steps"][step.name] = {"rc": None, "skipped_for": missing}
            continue
        rc, wall = run_step(step, e)
        entry: dict[str, Any] = {"rc": rc, "wall_s": round(wall, 1), "cmd": shlex.join(step.cmd)}
        if step.name == "workflow":
            entry["after"] = free_gpu(p, a.dry)
        if rc == 0:
            (p.done / step.name).touch()
            ok.add(step.name)
        record["steps"][step.name] = entry
        p.steps_json.write_text(json.dumps(record, indent=1))
        report.write(p.root, a.results, a.date, dry=a.dry)
    line = report.write(p.root, a.results, a.date, dry=a.dry)
    total = sum(s.get("wall_s") or 0 for s in record["steps"].values())
    print(f"loop sequence: steps ok {len(ok)} of {len(plan(a, p))}, {total:.0f} s in steps", flush=True)
    print(line, flush=True)
    return 0 if len(ok) == len(plan(a, p)) else 1


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", type=Path, required=True, help="the sequence's work dir (model, run, data, ...)")
    p.add_argument("--results", type=Path, required=True, help="where loop-<date>.{json,md} go")
    p.add_argument("--date", default=time.strftime("%Y-%m-%d"))
    p.add_argument("--n", type=int, default=500, help="prompts through regen's workflow")
    p.add_argument(
        "--max-tokens", type=int, default=2048, help="the workflow's max_tokens, and the served one"
    )
    p.add_argument("--eval-fraction", type=float, default=0.1)
    p.add_argument("--train-steps", type=int, default=400, help="one pass over ~400 rows (bench.loop.train)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-args", default="", help="more arguments for both train runs, as one string")
    p.add_argument("--regen-python", default=os.environ.get("REGEN_PY", sys.executable))
    p.add_argument("--trainer-python", default=os.environ.get("LOOP_PY", sys.executable))
    p.add_argument("--dry", action="store_true", default=os.environ.get("DRY") == "1", help="CPU rehearsal")
    a = p.parse_args(argv)
    a.root = a.root.resolve()
    a.results = a.results.resolve()
    return sequence(a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
