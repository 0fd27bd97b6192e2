"""Where each run of the known-target campaign spent its wall time (issue 27 item 4), read from what
the runs left: the three server logs in ``PREFIX.logs.tgz``, regen's phases in
``PREFIX.known_target_measured.json`` and the baselines' ``PREFIX.baseline-{default,seed}.json``.

For each run: the server start split into its phases (``serverlog.startup_phases``) and the generation
split into ramp, full batch and drain (``serverlog.generation_phases``). Then a projection, labelled as
one, of how wall time grows with the number of prompts: each run's time is a fixed part (before the
server, its start, ramp, drain, after) plus prompts x tokens a prompt / its full-batch decode rate;
from that, the prompt count at which regen reaches the issue's targets (1.5x the defaults, 1.2x the
original run's flags end to end), with regen's server start as measured (cold, first on the machine)
and as the later servers' (warm).

Usage: python -m bench.gpu.where_time_went [--prefix measurements/known-target-2026-12-01] [--out FILE.md]
       python -m bench.gpu.where_time_went --work KT_WORK [--out FILE.md]  (a campaign's work dir as it ran:
       every run there, the warm-up included; the projection only with regen, default and seed)
The last line printed is ``where: ...``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.gpu.serverlog import (
    GenerationPhases,
    PrefillCost,
    generation_phases,
    last_start,
    prefill_cost_at_full,
    startup_phases,
)

REPO = Path(__file__).resolve().parents[2]
LOGS = {
    "regen": "run-logs/servers/gpu0.log",
    "default": "baseline-default-logs/gpu0.log",
    "seed": "baseline-seed-logs/gpu0.log",
}
TARGETS = {"default": 1.5, "seed": 1.2}


@dataclass(frozen=True, slots=True)
class RunTime:
    """One run's wall time as a fixed part plus a part that grows with the prompts."""

    name: str
    wall_s: float
    fixed_s: float  # before the server, server start, ramp, drain, after
    s_per_prompt: float  # at the full batch
    startup: dict[str, Any]
    generation: GenerationPhases
    prefill: PrefillCost | None = None  # one prefill batch's cost to the decode at the full batch

    def wall_at(self, prompts: float) -> float:
        return self.fixed_s + self.s_per_prompt * prompts


def read_logs(prefix: Path) -> dict[str, str]:
    with tarfile.open(f"{prefix}.logs.tgz") as tar:
        return {name: tar.extractfile(member).read().decode() for name, member in LOGS.items()}  # type: ignore[union-attr]


def run_time(name: str, text: str, wall: float, outside: float, tokens: int, prompts: int, start: float):
    """One run's :class:`RunTime` from its server log; None when the log has no generation window."""
    startup, gen = startup_phases(text), generation_phases(text)
    if gen is None or not gen.full_decode_tps or not prompts:
        return None
    fixed = outside + start + gen.ramp_s + gen.drain_s
    per_prompt = tokens / prompts / gen.full_decode_tps
    return RunTime(name, wall, fixed, per_prompt, startup, gen, prefill_cost_at_full(text))


def regen_run_time(text: str, measured: dict[str, Any]) -> RunTime | None:
    """regen's run: outside the server is what its phases put before the server's start and after the last
    answer, plus the workflow's preparation (``prepare_s``: ``--until shard`` ahead of a sweep)."""
    ph = measured.get("phases") or {}
    parts = [ph.get("before_server_s"), ph.get("after_s"), ph.get("server_start_s")]
    if any(x is None for x in parts):
        return None
    outside = parts[0] + parts[1] + (ph.get("prepare_s") or 0.0)
    wall, tokens, prompts = measured["wall_s"], measured["output_tokens"], measured["requests"]
    return run_time("regen", text, wall, outside, tokens, prompts, parts[2])  # start to ready


def baseline_run_time(name: str, text: str, b: dict[str, Any]) -> RunTime | None:
    if "error" in b:
        return None
    return run_time(name, text, b["wall_s"], 0.0, b["answers"]["output_tokens"], b["n"], b["server_start_s"])


def run_times(prefix: Path) -> dict[str, RunTime]:
    """The runs of a committed result (``PREFIX.logs.tgz`` and the runs' JSON beside it)."""
    logs = read_logs(prefix)
    measured = json.loads(Path(f"{prefix}.known_target_measured.json").read_text())
    out = {"regen": regen_run_time(logs["regen"], measured)}
    for name in ("default", "seed"):
        b = json.loads(Path(f"{prefix}.baseline-{name}.json").read_text())
        out[name] = baseline_run_time(name, logs[name], b)
    assert all(out.values()), f"no generation window in {[k for k, v in out.items() if v is None]}"
    return out  # type: ignore[return-value]


def regen_log(work: Path) -> str:
    """regen's server log in a campaign's work dir (``known_target/device.py``'s layout)."""
    logs = sorted((work / "run" / "logs" / "servers").rglob("gpu*.log"))
    return last_start(logs[0].read_text(errors="replace")) if logs else ""


def work_logs(work: Path) -> dict[str, str]:
    """Each run's server log in a campaign's work dir (regen's, each ``baseline-*.json``'s: the warm-up's
    too), from its last start on."""
    logs = {"regen": regen_log(work)}
    for f in sorted(work.glob("baseline-*.json")):
        log = f.with_suffix("") / "logs" / "gpu0.log"
        logs[f.stem.removeprefix("baseline-")] = (
            last_start(log.read_text(errors="replace")) if log.exists() else ""
        )
    return {k: v for k, v in logs.items() if v}


def work_run_times(work: Path) -> dict[str, RunTime]:
    """Every run a campaign's work dir holds, as they ended; a run whose log has no generation window (or
    whose results are missing) is left out."""
    out: dict[str, RunTime | None] = {}
    for name, text in work_logs(work).items():
        results = work / ("known_target_measured.json" if name == "regen" else f"baseline-{name}.json")
        if not results.exists():
            continue
        data = json.loads(results.read_text())
        out[name] = regen_run_time(text, data) if name == "regen" else baseline_run_time(name, text, data)
    return {k: v for k, v in out.items() if v is not None}


def work_startups(work: Path) -> dict[str, dict[str, Any]]:
    """Each run's server start split (``serverlog.startup_phases``), a run without a generation window too
    (the warm-up's few prompts)."""
    return {name: st for name, text in work_logs(work).items() if (st := startup_phases(text))}


def prompts_to_reach(regen: RunTime, other: RunTime, ratio: float, regen_fixed_s: float) -> float:
    """Prompts at which other's wall / regen's wall reaches ratio; inf when it never does."""
    gain = other.s_per_prompt - ratio * regen.s_per_prompt
    need = ratio * regen_fixed_s - other.fixed_s
    return max(0.0, need / gain) if gain > 0 else math.inf


#: the start phases that ran cold for regen's server, the first on a fresh machine (files and kernel
#: caches not yet warm), and warm for the two later servers
COLD_PHASES = ("interpreter and imports", "weights (target, then draft)", "pools and prefill CUDA graphs")


def warm_start_s(runs: dict[str, RunTime]) -> float:
    """regen's server start had it come after another server on the machine: its cold phases taken
    at the later servers' mean, its other phases (its own larger decode-graph set) as measured."""
    cold = runs["regen"].startup["phases_s"]
    later = [runs[n].startup["phases_s"] for n in TARGETS]
    return sum(statistics.mean(p[k] for p in later) if k in COLD_PHASES else v for k, v in cold.items())


def _prefill_cells(cost: PrefillCost | None) -> str:
    return "na | na" if cost is None else f"{cost.cost_ms:.0f} | {cost.prefills_per_interval:g}"


def tables(runs: dict[str, RunTime], startups: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """Each run's generation split and server start split (``startups``, default the runs'), one row or
    column per run."""
    rows = [
        "| run | wall s | fixed s | server start s | ramp s | full batch s | running at full "
        "| tok/s at full | prefill batches at full | drain s | tokens in drain "
        "| tokens below 90% of full batch | last 1% of answers s | one prefill at full ms "
        "| prefills per 40-pass interval |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    start = {r.name: r.startup["launch_to_ready_s"] for r in runs.values() if r.startup}
    for r in runs.values():
        g = r.generation
        rows.append(
            f"| {r.name} | {r.wall_s:.1f} | {r.fixed_s:.0f} | {start.get(r.name, math.nan):.0f} "
            f"| {g.ramp_s:.0f} | {g.full_s:.0f} "
            f"| {g.full_running} | {g.full_decode_tps:,.0f} | {g.prefill_batches_at_full} | {g.drain_s:.0f} "
            f"| {g.drain_tokens_fraction:.1%} | {g.drain_token_share:.1%} | {g.last_percent_s:.0f} "
            f"| {_prefill_cells(r.prefill)} |"
        )
    started = startups if startups is not None else {n: r.startup for n, r in runs.items() if r.startup}
    if not started:
        return rows
    phases = list(next(iter(started.values()))["phases_s"])
    start_rows = ["| server start phase | " + " | ".join(started) + " |", "|---|" + "---|" * len(started)]
    for p in phases:
        cells = " | ".join(f"{st['phases_s'][p]:.0f}" for st in started.values())
        start_rows.append(f"| {p} | {cells} |")
    start_rows.append(
        "| SGLang's printed prefill-graph capture | "
        + " | ".join(f"{st['printed_elapsed_s']['prefill_graphs_s']:.1f}" for st in started.values())
        + " |"
    )
    return [*rows, "", *start_rows]


def markdown(
    runs: dict[str, RunTime], prefix: Path, startups: dict[str, dict[str, Any]] | None = None
) -> tuple[str, str]:
    """Every run's tables, then (with regen, default and seed) the projection and the ``where:`` line."""
    head = [
        f"## Where each run's time went (`bench/gpu/where_time_went.py`, from `{prefix.name}`)",
        "",
        *tables(runs, startups),
        "",
    ]
    if not {"regen", *TARGETS} <= set(runs):
        line = "where: runs=" + ",".join(runs) + " (the projection needs regen, default and seed)"
        return "\n".join(head), line
    regen = runs["regen"]
    warm = warm_start_s(runs)
    regen_warm_fixed = regen.fixed_s - regen.startup["launch_to_ready_s"] + warm
    reach = {
        (name, label): prompts_to_reach(regen, runs[name], ratio, fixed)
        for name, ratio in TARGETS.items()
        for label, fixed in (("cold", regen.fixed_s), ("warm", regen_warm_fixed))
    }
    limits = {name: runs[name].s_per_prompt / regen.s_per_prompt for name in TARGETS}
    fixed = f"{regen.fixed_s:.0f} (warm start: {regen_warm_fixed:.0f}) | " + " | ".join(
        f"{runs[n].fixed_s:.0f}" for n in TARGETS
    )
    per_prompt = " | ".join(f"{r.s_per_prompt:.3f}" for r in runs.values())
    proj = [
        "| | regen | default | seed |",
        "|---|---|---|---|",
        f"| fixed part s (before, start, ramp, drain, after) | {fixed} |",
        f"| s a prompt at the full batch | {per_prompt} |",
    ]
    reach_lines = [
        f"- {TARGETS[name]}x the {name} run: regen's long-run limit is {limits[name]:.2f}x; reached at "
        f"{reach[(name, 'cold')]:,.0f} prompts with regen's cold start, "
        f"{reach[(name, 'warm')]:,.0f} with a warm one "
        f"(the {name} run then takes {runs[name].wall_at(reach[(name, 'warm')]):,.0f} s)."
        for name in TARGETS
    ]
    text = "\n".join(
        [
            *head,
            "Projection, not a measurement: wall = fixed part + prompts x seconds a prompt at the full "
            "batch.",
            "",
            *proj,
            "",
            *reach_lines,
        ]
    )
    line = (
        "where: regen_start_s={:.0f} regen_warm_start_s={:.0f} regen_full_tps={:.0f} default_full_tps={:.0f} "
        "seed_full_tps={:.0f} regen_drain_s={:.0f} limit_vs_default={:.3f} limit_vs_seed={:.3f} "
        "prompts_for_default_target={:.0f} prompts_for_seed_target={:.0f}"
    ).format(
        regen.startup["launch_to_ready_s"],
        warm,
        regen.generation.full_decode_tps,
        runs["default"].generation.full_decode_tps,
        runs["seed"].generation.full_decode_tps,
        regen.generation.drain_s,
        limits["default"],
        limits["seed"],
        reach[("default", "warm")],
        reach[("seed", "warm")],
    )
    return text, line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefix", type=Path, default=REPO / "measurements/known-target-2026-12-01")
    ap.add_argument("--work", type=Path, help="a campaign's work dir instead (known_target/device.py's)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    if a.work:
        text, line = markdown(work_run_times(a.work), a.work, work_startups(a.work))
    else:
        text, line = markdown(run_times(a.prefix), a.prefix)
    if a.out:
        a.out.write_text(text + "\n")
    print(text)
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
