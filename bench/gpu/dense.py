"""The dense bench of issue 33 item 4: regen's recommended server against SGLang's defaults, side by side.

Per model (Llama-3.1-8B and Qwen3-30B-A3B, real configs, dummy weights, ``--skip-tokenizer-init``), one
server per arm (``--arms``):

- ``default``: SGLang's defaults, one closed-loop client at 256 requests in flight, then (same server, the
  loop widened) at 512;
- ``regen``: regen's recommended flags (``regen tune --json`` on the host for this workload), the same
  client at the plan's ``client_concurrency``;
- ``regen-fp8kv`` (opt-in): the same with regen's ``--allow-fp8-kv`` (``--kv-cache-dtype fp8_e4m3``: a
  numerics trade-off), reported on its own (``fp8kv_tps``), never in ``vs_default``.
- ``regen-page1`` / ``regen-page16`` (opt-in controls): regen's plan under a given ``--page-size 1`` / ``16``
  (``regen tune -- --page-size N``: the plan keeps it), beside the plan's own 64-token pages
  (``regen.sglang.search.planned_page_size``); reported apart (``page1_tps``, ``page16_tps``).

``vs_default`` is regen against the best of the default arm's windows (:func:`vs_best_default`), and
``steady_windows`` counts the windows ``serverlog.steady_window`` calls steady.

``--models`` takes each model's own arms as ``model:arm+arm`` (e.g. the page controls on one model only).

The tuner gets the workload as the workflow gives it: an audit summary (``summary.json``) with the prompt
percentiles and the answers' ``supervised_tokens`` histogram (mean and std of the first
:data:`SPREAD_SAMPLES` answer budgets this bench sends), so it plans the running set's length-biased
context, prompt + E[L](1+cv^2)/2 (``regen.sglang.workload``).

Workload: prompts of 300 random token ids (< vocab) through ``/generate`` with ``input_ids``; answers
with a per-request ``max_new_tokens`` drawn log-normal (median 1,200, mean ~1,450, cap 8,192, fixed
seed: the i-th request sent has the same length in every run), ``ignore_eos``, greedy. Closed loop: a
finished request is replaced at once. Each window has its own warm-up at its own in-flight count, at
least one request lifetime (the mean answer / the per-request decode rate, read live from the server's
``Decode batch`` lines: ``gen throughput / #running-req``), then measures a fixed window: output tokens
of the requests completed in it / its length, and the median ``gen throughput`` of the server's lines
logged in it. KV: what the server logged ("KV Cache is allocated.") against regen's ``kv_cache_tokens``.

Device budget (:func:`budget`): server starts as the 2026-12-01 run measured them plus, per window, an
estimated lifetime and the window; ``--budget-s`` (default 480) sets the window length (30-50 s) and
the estimate is printed before the first server starts.

``--dry-cpu`` runs the same sequence against regen's simulated server (chat completions of 300 words,
lengths scaled down, a batch-throughput model): it checks the plumbing, not SGLang.
Last line per model: ``dense: model=… regen_tps=… default256_tps=… default512_tps=… vs_default=…
best_default_in_flight=… steady_windows=k/n predicted_kv=… realized_kv=… regen_log_tps=…
default256_log_tps=… fp8kv_tps=… fp8kv_log_tps=…``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import random
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from bench.gpu import serverlog
from bench.gpu.planner_truth import (
    GPU_MEMORY_MIB,
    MODELS,
    RegenPlan,
    Server,
    free_port,
    host_name,
    read_startup,
    regen_tune,
    sglang_argv,
    simulated_argv,
    trimmed_log,
    wait_gpu_free,
    write_json,
)
from bench.harness import add_campaign_args, fmt, publish
from regen.ingest.audit_summary import Log2Histogram

PROMPT_TOKENS = 300
ANSWER_MEDIAN = 1200
ANSWER_MEAN = 1450
ANSWER_CAP = 8192
SEED = 20261201
#: the plan's field with the client's in-flight count
IN_FLIGHT_KEY = "client_concurrency"
DEFAULT_IN_FLIGHT = (256, 512)
MODEL_NAMES = ("llama-3.1-8b", "qwen3-30b-a3b")
READY = "The server is fired up"
#: the arms a server is started for; ``regen-fp8kv`` and the page arms only when asked (``--arms``)
ARMS = ("default", "regen", "regen-fp8kv", "regen-page1", "regen-page16")
DEFAULT_ARMS = ("default", "regen")
#: arms planned by regen under a given flag (``regen tune -- FLAGS``: the plan keeps it): the KV page
#: regen chooses (``regen.sglang.search.PLANNED_PAGE_SIZE``) against SGLang's 1 and a smaller page
GIVEN_FLAGS_ARMS: dict[str, tuple[str, ...]] = {
    "regen-page1": ("--page-size", "1"),
    "regen-page16": ("--page-size", "16"),
}
#: answer budgets the spread given to the tuner is measured over (the first ones this bench sends)
SPREAD_SAMPLES = 20_000
#: server start to ready on the H200 (measurements/dense-2026-12-01.json, Llama-3.1-8B): the first start
#: on a fresh machine, and a later one (graphs to 528); Qwen3-30B-A3B took 170 / 89 s
FIRST_START_S = 126.0
NEXT_START_S = 70.0
#: Llama-3.1-8B's decode step on the H200 (the 2026-12-01 default points: 3.8 ms + 0.063 ms per request at
#: ~1,360 tokens of mean context; an fp8 KV halves the per-request term): the lifetime estimate's model
STEP_FIXED_S = 3.8e-3
STEP_PER_REQUEST_S = 0.063e-3
WINDOW_RANGE_S = (30.0, 50.0)
#: the warm-up's floor before a lifetime is read, and its ceiling (the lifetime estimate's safety net)
WARMUP_MAX_S = 180.0


def regen_tune_args(summary: Path, fp8_kv: bool) -> tuple[str, ...]:
    """``regen tune`` for this workload as the workflow plans it: from the audit summary, max_tokens."""
    return (
        "--audit-summary",
        str(summary),
        "--max-tokens",
        str(ANSWER_CAP),
        *(("--allow-fp8-kv",) if fp8_kv else ()),
    )


# ------------------------------------------------------------------------------------ workload


def lognormal_sigma(median: float, mean: float) -> float:
    """σ of the log-normal with this median and mean: mean = median · exp(σ²/2)."""
    return math.sqrt(2 * math.log(mean / median))


@dataclass(frozen=True, slots=True)
class Workload:
    """The i-th request's prompt ids and answer budget, the same in every run (seeded per index)."""

    vocab: int
    prompt_tokens: int = PROMPT_TOKENS
    median: float = ANSWER_MEDIAN
    mean: float = ANSWER_MEAN
    cap: int = ANSWER_CAP
    seed: int = SEED

    def max_new_tokens(self, i: int) -> int:
        rng = random.Random(self.seed * 1_000_003 + i)
        draw = rng.lognormvariate(math.log(self.median), lognormal_sigma(self.median, self.mean))
        return max(1, min(self.cap, round(draw)))

    def prompt_ids(self, i: int) -> list[int]:
        rng = random.Random((self.seed + 1) * 1_000_003 + i)
        return [rng.randrange(self.vocab) for _ in range(self.prompt_tokens)]


def answer_histogram(workload: Workload, n: int = SPREAD_SAMPLES) -> Log2Histogram:
    """The audit's histogram of the first ``n`` answer budgets this bench sends (already capped)."""
    hist = Log2Histogram()
    for i in range(n):
        hist.add(workload.max_new_tokens(i))
    return hist


def audit_summary(workload: Workload) -> dict[str, Any]:
    """What the workflow's audit would say of this workload: prompt percentiles (every prompt has the same
    length) and the old answers' histogram, mean and std (``regen.sglang.workload.workload_from_audit``)."""
    return {
        "prompt_tokens_p50": workload.prompt_tokens,
        "prompt_tokens_p99": workload.prompt_tokens,
        "histograms": {"supervised_tokens": answer_histogram(workload).to_json()},
    }


def generate_body(workload: Workload, i: int) -> dict[str, Any]:
    """SGLang's native ``/generate`` request (``srt/managers/io_struct.py::GenerateReqInput``)."""
    return {
        "input_ids": workload.prompt_ids(i),
        "sampling_params": {
            "max_new_tokens": workload.max_new_tokens(i),
            "ignore_eos": True,
            "temperature": 0.0,
        },
    }


def chat_body(workload: Workload, i: int) -> dict[str, Any]:
    """The simulated server's equivalent (it serves chat completions; a word stands for a token)."""
    words = " ".join(f"t{t}" for t in workload.prompt_ids(i))
    return {
        "model": "dense",
        "messages": [{"role": "user", "content": words}],
        "max_tokens": workload.max_new_tokens(i),
        "ignore_eos": True,
        "temperature": 0.0,
    }


def completion_tokens(answer: dict[str, Any]) -> int:
    """Output tokens of a ``/generate`` answer (``meta_info``) or a chat completion (``usage``)."""
    if "meta_info" in answer:
        return int(answer["meta_info"]["completion_tokens"])
    return int(answer["usage"]["completion_tokens"])


# ------------------------------------------------------------------------------------ closed loop


@dataclass(slots=True)
class Done:
    index: int
    started: float
    ended: float
    tokens: int


@dataclass
class ClosedLoop:
    """N requests always in flight: each worker sends the next request as soon as its last one ends."""

    url: str
    path: str
    body: Any  # (Workload, index) -> request body
    workload: Workload
    done: list[Done] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    next_index: int = 0
    workers: list[asyncio.Task[None]] = field(default_factory=list)
    session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_read=3600)
        # limit=0: aiohttp's default pool of 100 connections would cap the loop silently
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout)

    async def _worker(self) -> None:
        assert self.session is not None
        while True:
            i = self.next_index
            self.next_index += 1
            started = time.time()
            try:
                async with self.session.post(self.url + self.path, json=self.body(self.workload, i)) as resp:
                    answer = await resp.json(content_type=None)
                    if resp.status != 200:
                        raise RuntimeError(f"HTTP {resp.status}: {str(answer)[:200]}")
                self.done.append(Done(i, started, time.time(), completion_tokens(answer)))
            except (aiohttp.ClientError, RuntimeError, KeyError, ValueError) as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
                await asyncio.sleep(0.5)

    def in_flight(self, n: int) -> None:
        """Widen the loop to ``n`` workers (it only grows: a narrower loop needs a new server)."""
        while len(self.workers) < n:
            self.workers.append(asyncio.create_task(self._worker()))

    async def close(self) -> None:
        for task in self.workers:
            task.cancel()
        await asyncio.gather(*self.workers, return_exceptions=True)
        if self.session is not None:
            await self.session.close()


@dataclass(frozen=True, slots=True)
class Window:
    in_flight: int
    warmup_s: float
    lifetime_s: float | None  # one request's lifetime when the warm-up ended (mean answer / per-request rate)
    seconds: float
    completed: int
    output_tokens: int
    client_tps: float
    log_median_tps: float | None
    log_median_running: float | None
    log_lines: int
    errors: int
    #: the window's ends (``serverlog.window_ends``: KV in use and running count of its first and last
    #: decode lines), which ``serverlog.steady_window`` judges
    ends: dict[str, float | None] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "in_flight": self.in_flight,
            "warmup_s": round(self.warmup_s, 1),
            "lifetime_s": None if self.lifetime_s is None else round(self.lifetime_s, 1),
            "seconds": round(self.seconds, 1),
            "completed": self.completed,
            "output_tokens": self.output_tokens,
            "client_tps": round(self.client_tps, 1),
            "log_median_tps": None if self.log_median_tps is None else round(self.log_median_tps, 1),
            "log_median_running": self.log_median_running,
            "log_lines": self.log_lines,
            "errors": self.errors,
            **self.ends,
            "steady": serverlog.steady_window(self.ends),
        }


def request_lifetime_s(lines: list[serverlog.DecodeLine], mean_answer: float, last: int = 5) -> float | None:
    """One request's lifetime at the current decode rate: the mean answer / the per-request rate (the
    median ``gen throughput / #running-req`` of the ``last`` decode lines); None before any line."""
    rates = [x.gen_tps / x.running for x in lines[-last:] if x.running and x.gen_tps > 0]
    return mean_answer / statistics.median(rates) if rates else None


async def warm_up(server: Server, mean_answer: float, s: Settings) -> tuple[float, float | None]:
    """Run until at least ``s.warmup_s`` and one request lifetime (as the server's lines have it now) have
    passed, at most ``s.warmup_max_s``: (seconds warmed, the last lifetime read)."""
    t0, offset = time.time(), len(server.text())
    while True:
        elapsed = time.time() - t0
        lifetime = request_lifetime_s(serverlog.decode_lines(server.text()[offset:]), mean_answer)
        if elapsed >= s.warmup_max_s:
            return elapsed, lifetime
        if elapsed >= s.warmup_s and lifetime is not None and elapsed >= lifetime:
            return elapsed, lifetime
        await asyncio.sleep(0.5)


async def measure(loop: ClosedLoop, server: Server, n: int, s: Settings) -> Window:
    """Set ``n`` in flight, warm up at ``n`` (one request lifetime at least), then count a fixed window."""
    loop.in_flight(n)
    warmed, lifetime = await warm_up(server, loop.workload.mean, s)
    start_offset = len(server.text())
    errors_before = len(loop.errors)
    t_a = time.time()
    await asyncio.sleep(s.window_s)
    t_b = time.time()
    in_window = [d for d in loop.done if t_a <= d.ended < t_b]
    tokens = sum(d.tokens for d in in_window)
    lines = serverlog.decode_lines(server.text()[start_offset:])
    return Window(
        in_flight=n,
        warmup_s=warmed,
        lifetime_s=lifetime,
        seconds=t_b - t_a,
        completed=len(in_window),
        output_tokens=tokens,
        client_tps=tokens / (t_b - t_a),
        log_median_tps=statistics.median(x.gen_tps for x in lines) if lines else None,
        log_median_running=statistics.median(x.running for x in lines) if lines else None,
        log_lines=len(lines),
        errors=len(loop.errors) - errors_before,
        ends=serverlog.window_ends(lines),
    )


# ------------------------------------------------------------------------------------ servers


@dataclass(frozen=True, slots=True)
class Settings:
    dry: bool
    warmup_s: float  # the warm-up's floor; it lasts one request lifetime at least
    warmup_max_s: float
    window_s: float
    fixed_window: float | None  # --window-s as given (None: the window that fits the budget)
    work: Path
    ready_timeout_s: float
    length_scale: float  # dry run: answers scaled down so a window holds many of them
    #: flags appended to the regen arm's plan (--regen-extra-args): a probe, named in the output
    regen_extra_args: tuple[str, ...] = ()
    #: flags both arms run with (the defaults arm as its only flags, regen's plan as the user's given
    #: flags): a backend choice the comparison holds equal, named in the output
    both_arms_flags: tuple[str, ...] = ()
    #: the default arm's in-flight counts, one window each (the same loop widened)
    default_in_flight: tuple[int, ...] = DEFAULT_IN_FLIGHT


def flag_value(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args[:-1] else None


def server_for(name: str, model_dir: Path, flags: list[str], plan: RegenPlan, s: Settings) -> Server:
    port = free_port()
    log = s.work / "logs" / f"dense-{name}.log"
    log.unlink(missing_ok=True)
    if not s.dry:
        return Server(sglang_argv(model_dir, port, tuple(flags)), log, port)
    # the plan the simulated server plays: regen's recommendation under its flags, else the defaults' plan
    p = plan.plan or {}
    p = (p.get("recommended") or p) if flags else p
    cap = int(flag_value(flags, "--max-running-requests") or p.get("effective_max_running_requests") or 1024)
    options = {
        "max_total_num_tokens": int(p.get("kv_cache_tokens") or 1_000_000),
        "log_interval_s": 1.0,
        "half_speed_running": 200,
    }
    return Server(simulated_argv(port, log, options, max_running=cap, token_rate=20.0), log, port)


async def wait_ready(server: Server, timeout_s: float) -> None:
    end = time.time() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.time() < end:
            if not server.alive():
                raise RuntimeError(f"server exited: {server.text()[-1500:]}")
            if READY in server.text():
                try:
                    async with session.get(f"http://127.0.0.1:{server.port}/health") as resp:
                        if resp.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
            await asyncio.sleep(1.0)
    raise RuntimeError(f"server not ready after {timeout_s:.0f} s")


async def run_server(
    name: str,
    model_dir: Path,
    flags: list[str],
    in_flight: tuple[int, ...],
    plan: RegenPlan,
    workload: Workload,
    s: Settings,
) -> dict[str, Any]:
    """Start one server, measure a window per in-flight count (widening the same loop), stop it."""
    server = server_for(name, model_dir, flags, plan, s).start()
    out: dict[str, Any] = {"flags": flags, "windows": []}
    t0 = time.time()
    loop = ClosedLoop(
        f"http://127.0.0.1:{server.port}",
        "/v1/chat/completions" if s.dry else "/generate",
        chat_body if s.dry else generate_body,
        workload,
    )
    try:
        await wait_ready(server, s.ready_timeout_s)
        out["ready_s"] = round(time.time() - t0, 1)
        await loop.open()
        for n in in_flight:
            window = await measure(loop, server, n, s)
            out["windows"].append(window.to_json())
            print(
                f"    {name} in_flight={n}: {window.client_tps:,.0f} tok/s (log median "
                f"{window.log_median_tps}), {window.completed} done, {window.errors} errors; warm-up "
                f"{window.warmup_s:.0f} s (lifetime {fmt(window.lifetime_s, 0, 'na')} s)",
                flush=True,
            )
    except RuntimeError as exc:
        out["error"] = str(exc)[-2000:]
        print(f"    {name}: {str(exc)[:300]}", flush=True)
    finally:
        await loop.close()
        server.stop()
        wait_gpu_free(s.dry)
    text = server.text()
    startup = read_startup(text)
    out["startup"] = startup.to_json()
    out["realized_kv"] = startup.kv_tokens or startup.max_total_num_tokens
    out["client_errors"] = loop.errors[:5]
    (s.work / "logs" / f"dense-{name}.trimmed.log").write_text(trimmed_log(text, tail=40))
    return out


# ------------------------------------------------------------------------------------ one model


def tps_of(result: dict[str, Any], in_flight: int | None = None, key: str = "client_tps") -> float | None:
    for w in result.get("windows", []):
        if (in_flight is None or w["in_flight"] == in_flight) and w.get(key) is not None:
            return float(w[key])
    return None


@dataclass(frozen=True, slots=True)
class Budget:
    """The device time one model's arms are expected to take: server starts, warm-ups, windows."""

    starts_s: float
    warmups_s: float
    windows: int
    window_s: float

    @property
    def total_s(self) -> float:
        return self.starts_s + self.warmups_s + self.windows * self.window_s

    def words(self) -> str:
        return (
            f"~{self.total_s:.0f} s of GPU: server starts {self.starts_s:.0f} s, warm-ups "
            f"{self.warmups_s:.0f} s, {self.windows} windows of {self.window_s:.0f} s"
        )


def lifetime_estimate_s(in_flight: int, mean_answer: float, fp8_kv: bool = False) -> float:
    """One request's lifetime at ``in_flight`` running, by Llama-3.1-8B's measured step model."""
    per_request = STEP_PER_REQUEST_S * (0.5 if fp8_kv else 1.0)
    return mean_answer * (STEP_FIXED_S + per_request * in_flight)


def budget(
    windows: list[tuple[int, bool]],
    servers: int,
    mean_answer: float,
    floor_s: float,
    budget_s: float,
    window_s: float | None = None,
) -> Budget:
    """The estimate for ``windows`` ((in flight, fp8 KV) each) on ``servers`` servers; without a given
    ``window_s`` the window that fits ``budget_s``, within :data:`WINDOW_RANGE_S`."""
    starts = FIRST_START_S + NEXT_START_S * max(0, servers - 1) if servers else 0.0
    warm = sum(max(floor_s, lifetime_estimate_s(n, mean_answer, fp8)) for n, fp8 in windows)
    if window_s is None:
        lo, hi = WINDOW_RANGE_S
        window_s = min(hi, max(lo, (budget_s - starts - warm) / max(1, len(windows))))
    return Budget(starts, warm, len(windows), window_s)


#: the row's key per arm
ROW_KEY = {
    "default": "default",
    "regen": "regen",
    "regen-fp8kv": "fp8kv",
    "regen-page1": "page1",
    "regen-page16": "page16",
}


async def bench_model(model: str, s: Settings, arms: tuple[str, ...], budget_s: float) -> dict[str, Any]:
    model_dir = MODELS / model
    config = json.loads((model_dir / "config.json").read_text())
    scale = s.length_scale if s.dry else 1.0
    workload = Workload(
        vocab=int(config["vocab_size"]),
        median=ANSWER_MEDIAN * scale,
        mean=ANSWER_MEAN * scale,
        cap=max(1, round(ANSWER_CAP * scale)),
    )
    summary, lengths = s.work / f"{model}-audit-summary.json", audit_summary(workload)
    write_json(summary, lengths)
    planned = ("regen", *(a for a in arms if a == "regen-fp8kv" or a in GIVEN_FLAGS_ARMS))
    plans = {
        arm: regen_tune(
            model_dir,
            (*s.both_arms_flags, *GIVEN_FLAGS_ARMS.get(arm, ())),
            *regen_tune_args(summary, arm == "regen-fp8kv"),
        )
        for arm in planned
    }
    plan = plans["regen"]
    rec = (plan.plan or {}).get("recommended") or {}
    row: dict[str, Any] = {
        "model": model,
        "arms": list(arms),
        "answer_lengths": dict(lengths["histograms"]["supervised_tokens"], buckets=None),
        "regen_rc": plan.rc,
        "regen_message": plan.message,
        "regen_args": rec.get("args"),
        "regen_in_flight": rec.get(IN_FLIGHT_KEY),
        "predicted_kv": rec.get("kv_cache_tokens"),
        "default_plan_kv": (plan.plan or {}).get("kv_cache_tokens"),
        "regen_recommended": {k: v for k, v in rec.items() if k not in ("reasons",)},
        "regen_reasons": rec.get("reasons"),
    }
    runs: list[tuple[str, list[str], tuple[int, ...], RegenPlan]] = []
    if "default" in arms:
        runs.append(("default", list(s.both_arms_flags), s.default_in_flight, plan))
    for arm in (a for a in planned if a in arms):
        arm_rec = (plans[arm].plan or {}).get("recommended") or {}
        args = list(arm_rec.get("args") or [])
        if arm == "regen" and s.regen_extra_args:  # a probe of a flag the planner does not choose (yet)
            args += list(s.regen_extra_args)
        print(
            f"[{model}] {arm}: {' '.join(args)} in flight {arm_rec.get(IN_FLIGHT_KEY)} (rc {plans[arm].rc})",
            flush=True,
        )
        if plans[arm].refused or not args or not arm_rec.get(IN_FLIGHT_KEY):
            row[ROW_KEY[arm]] = {"error": f"no recommendation: {plans[arm].message}"}
        elif arm == "regen-fp8kv" and "fp8_e4m3" not in args:
            row[ROW_KEY[arm]] = {
                "error": "regen's plan with --allow-fp8-kv kept the bf16 KV: " + " ".join(args)
            }
        else:
            runs.append((arm, args, (int(arm_rec[IN_FLIGHT_KEY]),), plans[arm]))
    if "regen-fp8kv" in arms:
        fp8 = (plans["regen-fp8kv"].plan or {}).get("recommended") or {}
        row |= {
            "fp8kv_args": fp8.get("args"),
            "fp8kv_in_flight": fp8.get(IN_FLIGHT_KEY),
            "fp8kv_predicted_kv": fp8.get("kv_cache_tokens"),
        }
    windows = [(n, arm == "regen-fp8kv") for arm, _, ns, _ in runs for n in ns]
    given_window = s.window_s if s.dry else s.fixed_window
    b = budget(windows, len(runs), workload.mean, s.warmup_s, budget_s, given_window)
    row["budget"] = {"estimate_s": round(b.total_s), "budget_s": budget_s, "window_s": b.window_s}
    over = f"; over the {budget_s:.0f} s budget: drop an arm (--arms)" if b.total_s > budget_s else ""
    print(f"[{model}] device budget: {b.words()}{over}", flush=True)
    s = replace(s, window_s=b.window_s)
    for arm, args, ns, arm_plan in runs:
        row[ROW_KEY[arm]] = await run_server(f"{model}-{arm}", model_dir, args, ns, arm_plan, workload, s)
    row |= headline(row)
    return row


def headline(row: dict[str, Any]) -> dict[str, Any]:
    """The last line's numbers: regen against the defaults (client tok/s), the server's own rates, and the
    fp8-KV arm beside them (never in ``vs_default``: it changes numerics)."""
    default, regen, fp8 = row.get("default") or {}, row.get("regen") or {}, row.get("fp8kv") or {}
    out = {
        "regen_tps": tps_of(regen),
        "default256_tps": tps_of(default, DEFAULT_IN_FLIGHT[0]),
        "default512_tps": tps_of(default, DEFAULT_IN_FLIGHT[1]),
        "regen_log_tps": tps_of(regen, key="log_median_tps"),
        "default256_log_tps": tps_of(default, DEFAULT_IN_FLIGHT[0], key="log_median_tps"),
        "fp8kv_tps": tps_of(fp8),
        "fp8kv_log_tps": tps_of(fp8, key="log_median_tps"),
        **{
            f"{key}_{metric}": tps_of(row.get(key) or {}, key=field)
            for key in ("page1", "page16")
            for metric, field in (("tps", "client_tps"), ("log_tps", "log_median_tps"))
        },
        "realized_kv": regen.get("realized_kv"),
        "fp8kv_realized_kv": fp8.get("realized_kv"),
    }
    best = best_default(default)
    out["best_default_in_flight"] = best.get("in_flight")
    out["vs_default"] = vs_best_default(out["regen_tps"], default)
    out["steady_windows"] = serverlog.steady_count([*default.get("windows", []), *regen.get("windows", [])])
    return out


def best_default(default: dict[str, Any]) -> dict[str, Any]:
    """The default arm's fastest window (client tok/s), whatever in-flight count it ran at: what regen is
    compared with (issue 57 item 5); {} without one."""
    windows = [w for w in default.get("windows", []) if w.get("client_tps")]
    return max(windows, key=lambda w: w["client_tps"], default={})


def vs_best_default(regen_tps: float | None, default: dict[str, Any]) -> float | None:
    """regen's client tok/s over the best of the default arm's windows (:func:`best_default`)."""
    best = best_default(default).get("client_tps")
    return regen_tps / best if regen_tps and best else None


#: the last line's fields after the issue's seven (the server's own rates; the fp8-KV and page arms apart)
EXTRA_FIELDS = (
    "regen_log_tps",
    "default256_log_tps",
    "fp8kv_tps",
    "fp8kv_log_tps",
    "page1_tps",
    "page1_log_tps",
    "page16_tps",
    "page16_log_tps",
)


def final_line(row: dict[str, Any]) -> str:
    return (
        f"dense: model={row['model']} regen_tps={fmt(row['regen_tps'], 0, 'na')} default256_tps="
        f"{fmt(row['default256_tps'], 0, 'na')} default512_tps={fmt(row['default512_tps'], 0, 'na')} "
        f"vs_default={fmt(row['vs_default'], 3, 'na')} "
        f"best_default_in_flight={fmt(row.get('best_default_in_flight'), 0, 'na')} "
        f"steady_windows={row.get('steady_windows', 'na')} predicted_kv={fmt(row['predicted_kv'], 0, 'na')} "
        f"realized_kv={fmt(row['realized_kv'], 0, 'na')} "
        + " ".join(f"{key}={fmt(row.get(key), 0, 'na')}" for key in EXTRA_FIELDS)
    )


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        f"# Dense bench: regen's plan against SGLang's defaults ({doc['date']})",
        "",
        "**DRY RUN on CPU against regen's simulated server: not a measurement.**\n" if doc["dry_cpu"] else "",
        f"Host: {doc['host']}; SGLang 0.5.17, dummy weights, `--skip-tokenizer-init`. Workload: prompts of "
        f"{PROMPT_TOKENS} random token ids, answers log-normal (median {ANSWER_MEDIAN}, mean ~{ANSWER_MEAN}, "
        f"cap {ANSWER_CAP}, seed {SEED}), `ignore_eos`, greedy, one closed-loop client. Each window has its "
        f"own warm-up at its in-flight count (at least {doc['warmup_s']:.0f} s and one request lifetime), "
        "then counts the output tokens of the requests completed in it / its length; the server log's median "
        "gen throughput beside it. The fp8-KV arm (opt-in) changes numerics: reported apart, never in "
        "vs_default.",
        "",
        "| model | server | flags | in flight | warm-up s | lifetime s | window s | client tok/s "
        "| log median tok/s | median running | KV tokens |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in doc["rows"]:
        for which in ("default", "regen", "fp8kv", "page1", "page16"):
            if which not in row:
                continue
            r = row.get(which) or {}
            for w in r.get("windows", []) or [{}]:
                lines.append(
                    f"| {row['model']} | {which} | `{' '.join(r.get('flags') or []) or '(defaults)'}` | "
                    f"{w.get('in_flight', '—')} | {fmt(w.get('warmup_s'), 0, 'na')} | "
                    f"{fmt(w.get('lifetime_s'), 0, 'na')} | "
                    f"{fmt(w.get('seconds'), 0, 'na')} | {fmt(w.get('client_tps'), 0, 'na')} | "
                    f"{fmt(w.get('log_median_tps'), 0, 'na')} | "
                    f"{fmt(w.get('log_median_running'), 0, 'na')} | {fmt(r.get('realized_kv'), 0, 'na')} |"
                )
            if r.get("error"):
                lines.append(f"| {row['model']} | {which} | error: {r['error'][:200]} | | | | | | | | |")
    lines += ["", "```", *(final_line(r) for r in doc["rows"]), "```", ""]
    return "\n".join(lines)


def model_arms(spec: str, arms: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """``model`` (the ``--arms``) or ``model:arm+arm`` (its own arms)."""
    model, _, own = spec.partition(":")
    return model, arms_of(own.replace("+", ",")) if own else arms


def arms_of(text: str) -> tuple[str, ...]:
    arms = tuple(a for a in (x.strip() for x in text.split(",")) if a)
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise SystemExit(f"--arms: unknown {unknown or text!r}; choose from {', '.join(ARMS)}")
    return arms


async def amain(a: argparse.Namespace) -> int:
    s = Settings(
        dry=a.dry_cpu,
        warmup_s=a.warmup_s if a.warmup_s is not None else (2.0 if a.dry_cpu else 20.0),
        warmup_max_s=a.warmup_max_s if a.warmup_max_s is not None else (10.0 if a.dry_cpu else WARMUP_MAX_S),
        window_s=a.window_s if a.window_s is not None else 5.0,
        fixed_window=a.window_s,
        work=a.work,
        ready_timeout_s=a.ready_timeout_s,
        length_scale=0.02,
        regen_extra_args=tuple(t for t in a.regen_extra_args.split(",") if t),
    )
    arms = arms_of(a.arms)
    (s.work / "logs").mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    stem = "dense-" + dt.date.today().isoformat() + ("-dry" if s.dry else "")
    stem += "-probe" if s.regen_extra_args else ""
    doc: dict[str, Any] = {
        "date": dt.date.today().isoformat(),
        "dry_cpu": s.dry,
        "host": host_name(s.dry),
        "gpu_memory_mib": GPU_MEMORY_MIB,
        "warmup_s": s.warmup_s,
        "warmup_max_s": s.warmup_max_s,
        "arms": list(arms),
        "rows": [],
    }
    for spec in a.models.split(","):
        model, own_arms = model_arms(spec, arms)
        row = await bench_model(model, s, own_arms, a.budget_s)
        doc["rows"].append(row)
        write_json(a.out / f"{stem}.json", doc)
        print(final_line(row), flush=True)
    return publish(a.out, stem, doc, markdown(doc))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_campaign_args(p, work=Path("/tmp/truth-work/dense"))
    p.add_argument(
        "--models",
        default=",".join(MODEL_NAMES),
        help="model dirs under resources/models, each with its own arms as model:arm+arm if wanted",
    )
    p.add_argument(
        "--arms", default=",".join(DEFAULT_ARMS), help=f"of {', '.join(ARMS)} (regen-fp8kv: opt-in)"
    )
    p.add_argument(
        "--warmup-s",
        type=float,
        default=None,
        help="each window's warm-up floor; it also lasts one request lifetime (default 20, dry 2)",
    )
    p.add_argument("--warmup-max-s", type=float, default=None, help=f"default {WARMUP_MAX_S:.0f} (dry: 10)")
    p.add_argument(
        "--window-s",
        type=float,
        default=None,
        help="measured window (default: what fits --budget-s, 30-50 s; dry: 5)",
    )
    p.add_argument("--budget-s", type=float, default=480.0, help="device seconds per model (default 480)")
    p.add_argument(
        "--regen-extra-args",
        default="",
        help="comma-separated flags appended to the regen arm's plan, e.g. --num-continuous-decode-steps=4",
    )
    p.add_argument("--ready-timeout-s", type=float, default=420.0)
    return asyncio.run(amain(p.parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
