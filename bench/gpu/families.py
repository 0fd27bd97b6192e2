"""Held-out families against SGLang's defaults at steady state (issue 49 item 3).

Per model (real configs from ``resources/models``, dummy weights): ``bench.gpu.dense``'s two arms, one
server each, the same closed-loop workload (300-token prompts, log-normal answers of median 1,200 and
mean ~1,450, cap 8,192, ``ignore_eos``): SGLang's defaults at each of ``dense.DEFAULT_IN_FLIGHT`` in
flight (regen is compared with the best of them, ``dense.best_default``), and regen's recommended flags
at the plan's ``client_concurrency``. Each window starts after one request lifetime at its own in-flight
count (``dense.warm_up``), and counts as steady by the benches' one rule (``serverlog.steady_window``:
the KV in use moved less than 5% of itself, the running count flat).

The bar (issue 49): regen >= the defaults on each model, and >= 1.15x where the KV bound allows it. The
KV bound is the running count the pool holds at the workload's mean context (prompt + the running set's
length-biased mean answer so far, E[L](1+cv^2)/2 as ``regen.sglang.workload`` plans it): where it is
below 1.15 x the defaults' running count, no plan can reach 1.15x by running more, and the line names the
bound (``bar=bound``) instead.

Last line per model: ``families: model=... regen_tps=... default_tps=... ratio=... regen_running=...
default_running=... kv_bound_running=... bar=1.15|bound kv_flat=... steady_windows=k/n retracted=...``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.gpu import dense, serverlog
from bench.gpu.harness import BOTH_ARMS_FLAGS, TARGET_RATIO, bar_of
from bench.gpu.hold import retractions
from bench.gpu.planner_truth import host_name
from bench.harness import add_campaign_args, fmt, publish, write_json

MODELS = ("gpt-oss-20b", "qwen3-32b-fp8", "mixtral-8x7b", "nemotron-3-nano-30b-a3b")
#: the answers' coefficient of variation (dense's log-normal, median 1,200 and mean ~1,450)
ANSWER_CV = 0.65


@dataclass(frozen=True, slots=True)
class Verdict:
    model: str
    regen_tps: float | None
    default_tps: float | None
    regen_running: float | None
    default_running: float | None
    kv_bound_running: int | None
    #: the throughput ratio the KV bound allows: running at the bound against the defaults' running count,
    #: each at its step time on the line through the two measured (running, step time) points
    bound_ratio: float | None
    #: the compared windows (regen's, the best default's) are both steady (``serverlog.steady_window``)
    kv_flat: bool
    retracted: int
    #: ``k/n``: the windows of both arms that qualified as steady
    steady_windows: str = "0/0"

    @property
    def ratio(self) -> float | None:
        both = self.regen_tps and self.default_tps
        return self.regen_tps / self.default_tps if both else None

    @property
    def bar(self) -> str:
        """``1.15`` where the KV bound allows 1.15x the defaults' running count, else ``bound``."""
        return "na" if self.bound_ratio is None else bar_of(self.bound_ratio)

    @property
    def passed(self) -> bool:
        """>= the defaults, and >= 1.15x where the bound allows it, in steady windows."""
        r = self.ratio
        if r is None or not self.kv_flat or r < 1.0:
            return False
        return self.bar == "bound" or r >= TARGET_RATIO

    def line(self) -> str:
        return (
            f"families: model={self.model} regen_tps={fmt(self.regen_tps, 0, 'na')} "
            f"default_tps={fmt(self.default_tps, 0, 'na')} "
            f"ratio={fmt(self.ratio, 3, 'na')} regen_running={fmt(self.regen_running, 0, 'na')} "
            f"default_running={fmt(self.default_running, 0, 'na')} "
            f"kv_bound_running={fmt(self.kv_bound_running, 0, 'na')} "
            f"bound_ratio={fmt(self.bound_ratio, 3, 'na')} "
            f"bar={self.bar} kv_flat={int(self.kv_flat)} steady_windows={self.steady_windows} "
            f"retracted={self.retracted} pass={int(self.passed)}"
        )


def window_of(arm: dict[str, Any]) -> dict[str, Any]:
    windows = arm.get("windows") or []
    return windows[0] if windows else {}


def kv_bound_running(
    kv_tokens: int | None, prompt: int, mean_answer: float, server_cap: int | None = None
) -> int | None:
    """The running count the pool holds at the running set's mean context, and no more than the server's
    running cap as it started (``max_running_requests``: a Mamba hybrid's state slots bind before its KV)."""
    if not kv_tokens:
        return None
    context = prompt + mean_answer * (1 + ANSWER_CV**2) / 2
    by_kv = int(kv_tokens / context)
    return min(by_kv, server_cap) if server_cap else by_kv


def bound_ratio(
    points: list[tuple[float, float]], bound: int | None, default_running: float | None
) -> float | None:
    """Throughput at ``bound`` running over throughput at ``default_running``, with the step time on the
    line through ``points`` ((running, server decode tok/s) of the two windows): step = running / rate."""
    usable = [(b, b / tps) for b, tps in points if b and tps]
    if bound is None or not default_running or len(usable) < 2 or usable[0][0] == usable[1][0]:
        return None
    (b1, t1), (b2, t2) = usable
    slope = (t2 - t1) / (b2 - b1)

    def step_s(b: float) -> float:
        return t1 + slope * (b - b1)

    if step_s(bound) <= 0 or step_s(default_running) <= 0:
        return None
    return (bound / step_s(bound)) / (default_running / step_s(default_running))


def verdict(row: dict[str, Any], work: Path, mean_answer: float) -> Verdict:
    regen, default = row.get("regen") or {}, row.get("default") or {}
    rw, dw = window_of(regen), dense.best_default(default)
    retracted = 0
    for arm in ("regen", "default"):
        log = work / "logs" / f"dense-{row['model']}-{arm}.log"
        if log.exists():
            retracted += retractions(log.read_text(errors="replace"))[1]
    bound = kv_bound_running(
        regen.get("realized_kv"),
        dense.PROMPT_TOKENS,
        mean_answer,
        (regen.get("startup") or {}).get("max_running_requests"),
    )
    points = [(w.get("log_median_running"), w.get("log_median_tps")) for w in (rw, dw)]
    return Verdict(
        model=row["model"],
        regen_tps=rw.get("client_tps"),
        default_tps=dw.get("client_tps"),
        regen_running=rw.get("log_median_running"),
        default_running=dw.get("log_median_running"),
        kv_bound_running=bound,
        bound_ratio=bound_ratio(points, bound, dw.get("log_median_running")),
        kv_flat=serverlog.steady_window(rw) and serverlog.steady_window(dw),
        retracted=retracted,
        steady_windows=serverlog.steady_count([*default.get("windows", []), *regen.get("windows", [])]),
    )


async def amain(a: argparse.Namespace) -> int:
    s = dense.Settings(
        dry=a.dry_cpu,
        warmup_s=2.0 if a.dry_cpu else 20.0,
        warmup_max_s=10.0 if a.dry_cpu else a.warmup_max_s,
        window_s=5.0 if a.dry_cpu else a.window_s,
        fixed_window=a.window_s,
        work=a.work,
        ready_timeout_s=a.ready_timeout_s,
        length_scale=0.02,
    )
    (s.work / "logs").mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    stem = "families-" + dt.date.today().isoformat() + ("-dry" if s.dry else "")
    doc: dict[str, Any] = {
        "date": dt.date.today().isoformat(),
        "dry_cpu": s.dry,
        "host": host_name(s.dry),
        "warmup_s": s.warmup_s,
        "rows": [],
        "verdicts": [],
    }
    for model in (m for m in a.models.split(",") if m):
        s_model = replace(s, both_arms_flags=() if s.dry else BOTH_ARMS_FLAGS.get(model, ()))
        row = await dense.bench_model(model, s_model, ("default", "regen"), a.budget_s)
        v = verdict(row, s.work, dense.ANSWER_MEAN * (s.length_scale if s.dry else 1.0))
        doc["rows"].append(row)
        doc["verdicts"].append(v.line())
        write_json(a.out / f"{stem}.json", doc)  # what a run cut short by the device keeps
        print(v.line(), flush=True)
    page = dense.markdown(doc) + "\n```\n" + "\n".join(doc["verdicts"]) + "\n```\n"
    return publish(a.out, stem, doc, page)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_campaign_args(p, work=Path("/tmp/families-work"))
    p.set_defaults(out=Path("/tmp/families-out"))  # truth.sh names its own; smoke runs stay out of the tree
    p.add_argument("--smoke", action="store_true", help="one model on the simulated server (CI)")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--window-s", type=float, default=40.0)
    p.add_argument("--warmup-max-s", type=float, default=150.0)
    p.add_argument("--budget-s", type=float, default=420.0)
    p.add_argument("--ready-timeout-s", type=float, default=420.0)
    a = p.parse_args(argv)
    if a.smoke:
        a.dry_cpu, a.models = True, "qwen3-32b-fp8"
    return asyncio.run(amain(a))


if __name__ == "__main__":
    raise SystemExit(main())
