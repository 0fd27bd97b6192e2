"""Replay a race's sweep projection with today's length and step models against what the run measured.

The sweep's projection (``results/plan/pilot.json``, ``projection_closed_loop``) is made before the run
from the pilot's lengths and a decode-step line; a race bundle (``measurements/known-target-*.logs.tgz``)
keeps the pilot's lengths, the run's config and the run's own server log, and the measured file keeps the
generation phase's GPU seconds. This plays the closed loop (``regen.tune.closedloop``) again, side by side:

- ``recorded``: what the sweep wrote then;
- ``capped``: the pilot's lengths with the unfinished ones modelled and cut at ``max_tokens`` (the model
  before truncation retries were counted), on the replay's step line;
- ``now``: the same lengths as their slots decode them under the run's truncation policy
  (``regen.tune.closedloop.Truncation``), on the replay's step line.

The replay's step line is the run's own server log fitted over its plateau and falling batch (``--step
run``), or the one the sweep recorded (``--step pilot``): a pilot that drained its batch
(``regen.tune.pilot.DEFAULT_DRAIN_FRACTION``) fits the first itself; older pilots did not drain.

Usage: python -m bench.projection_replay BUNDLE MEASURED_JSON [--draws 20] [--step run|pilot]
  (BUNDLE: a race's logs.tgz, or the dir it unpacks to; MEASURED_JSON: its known_target_measured.json)
       python -m bench.projection_replay --smoke   # CI: the 2026-12-03 race's bundle, 2 draws
Last line: ``projection_replay: measured_gpu_s=… recorded_gpu_s=… capped_gpu_s=… now_gpu_s=… step=…
error_recorded=… error_capped=… error_now=… ratio=…`` (ratio: now / measured).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

import yaml

from bench.harness import REPO, add_smoke, parse_args
from regen.pilot_file import PilotFile
from regen.runconfig import GenerateConfig
from regen.serving.metrics import decode_samples, steady_state
from regen.tune.closedloop import StepModel, Truncation, closed_loop_wall_s
from regen.tune.sweep import CensoredLengths, run_truncation

#: the race --smoke replays: its bundle and measured file in measurements/
SMOKE_BUNDLE = REPO / "measurements" / "known-target-2026-12-03-n800.logs.tgz"
SMOKE_MEASURED = REPO / "measurements" / "known-target-2026-12-03-n800.known_target_measured.json"


def run_step_line(server_log: Path) -> StepModel | None:
    """The decode-step line of a run's server log: its plateau and its falling batch (None: no plateau)."""
    steady = steady_state(decode_samples(server_log.read_text(errors="replace")))
    return None if steady is None else StepModel.fit(steady.step_points())


def mean_closed_loop_gpu_s(
    pool: Sequence[int], n: int, concurrency: int, step: StepModel, ramp_s: float, draws: int
) -> float:
    """The closed loop's wall over ``draws`` seeded draws of ``n`` lengths from ``pool`` (one server)."""
    walls = []
    for seed in range(draws):
        rng = random.Random(seed)
        walls.append(
            closed_loop_wall_s([rng.choice(pool) for _ in range(n)], concurrency, step, ramp_s).wall_s
        )
    return statistics.fmean(walls)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bundle", type=Path, nargs="?", help="a race's logs.tgz or its unpacked dir")
    p.add_argument("measured", type=Path, nargs="?", help="its known_target_measured.json")
    p.add_argument("--draws", type=int, default=20)
    p.add_argument("--step", choices=("run", "pilot"), default="run")
    add_smoke(p, bundle=SMOKE_BUNDLE, measured=SMOKE_MEASURED, draws=2)
    a = parse_args(p, argv)
    if a.bundle is None or a.measured is None:
        p.error("name a race's bundle and its measured file (or --smoke)")
    if a.bundle.is_file():
        with tempfile.TemporaryDirectory(prefix="projection-replay-") as tmp:
            with tarfile.open(a.bundle) as tar:
                tar.extractall(tmp, filter="data")
            return replay(_with_bundle(a, Path(tmp)))
    return replay(a)


def _with_bundle(a: argparse.Namespace, bundle: Path) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(a), "bundle": bundle})


def replay(a: argparse.Namespace) -> int:
    pilot = PilotFile.read(a.bundle / "pilot.json")
    if (
        pilot is None
        or pilot.best is None
        or pilot.projection_closed_loop is None
        or pilot.step_model is None
    ):
        raise SystemExit(f"{a.bundle / 'pilot.json'}: no pilot file with a best candidate and a step line")
    measured = json.loads(a.measured.read_text())["sweep_projection"]
    generate = yaml.safe_load((a.bundle / "config.yaml").read_text())["generate"]
    best = pilot.best
    recorded = pilot.projection_closed_loop
    if a.step == "run":
        log = a.bundle / "run-logs" / "servers" / "gpu0.log"
        step = run_step_line(log)
        if step is None:
            raise SystemExit(f"{log}: no decode plateau in the log")
    else:
        step = StepModel(pilot.step_model["fixed_s"], pilot.step_model["per_request_s"])

    lengths = pilot.censored_lengths
    truncation = run_truncation(GenerateConfig.from_dict(generate), pilot.best_args)
    keep = dataclasses.replace(truncation, policy="keep")  # cut at max_tokens: the model before retries

    def replayed(policy: Truncation) -> tuple[float, CensoredLengths]:
        censored = CensoredLengths.of(
            lengths["finished_lengths"], lengths["unfinished"], lengths["first_attempts"], policy
        )
        n, concurrency = int(recorded["requests"]), int(recorded["concurrency"])
        ramp = best.ramp_s or 0.0
        return mean_closed_loop_gpu_s(censored.lengths, n, concurrency, step, ramp, a.draws), censored

    capped_s, _ = replayed(keep)
    now_s, now = replayed(truncation)
    gpu_s = {
        "measured": float(measured["measured_gpu_s"]),
        "recorded": float(recorded["gpu_hours"]) * 3600,
        "capped": capped_s,
        "now": now_s,
    }
    errors = {k: (v - gpu_s["measured"]) / gpu_s["measured"] for k, v in gpu_s.items() if k != "measured"}
    print(
        f"step line ({a.step}): {step.describe()}; "
        f"{now.retried} of {len(now.lengths)} pilot lengths past max_tokens {truncation.limit}"
    )
    print(
        "projection_replay: "
        + " ".join(f"{k}_gpu_s={v:.1f}" for k, v in gpu_s.items())
        + f" step={a.step} "
        + " ".join(f"error_{k}={v:+.4f}" for k, v in errors.items())
        + f" ratio={gpu_s['now'] / gpu_s['measured']:.4f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
