"""The dense bench of issue 33 item 4: regen's recommended server against SGLang's defaults, side by side.

Per model (Llama-3.1-8B and Qwen3-30B-A3B, real configs, dummy weights, ``--skip-tokenizer-init``):

- (a) one server with SGLang's defaults, driven by one closed-loop client at 256 requests in flight,
  then (same server, the loop widened) at 512;
- (b) one server with regen's recommended flags (``regen tune --json`` on the host for this workload),
  the same client at regen's in-flight count (the plan's ``workload_concurrency``).

Workload: prompts of 300 random token ids (< vocab) through ``/generate`` with ``input_ids``; answers
with a per-request ``max_new_tokens`` drawn log-normal (median 1,200, mean ~1,450, cap 8,192, fixed
seed: the i-th request sent has the same length in every run), ``ignore_eos``, greedy. Closed loop: a
finished request is replaced at once. Each phase warms up, then measures a fixed window: output tokens
of the requests completed in the window / the window, and, as a check, the median ``gen throughput``
of the server's ``Decode batch`` lines logged in it. KV: what the server logged ("KV Cache is
allocated.") against regen's predicted ``kv_cache_tokens``.

``--dry-cpu`` runs the same sequence against regen's simulated server (chat completions of 300 words,
lengths scaled down, a batch-throughput model): it checks the plumbing, not SGLang.
Last line per model: ``dense: model=… regen_tps=… default256_tps=… default512_tps=… vs_default=…
predicted_kv=… realized_kv=…``.
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
from dataclasses import dataclass, field
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


def regen_workload_args(prompt_tokens: int, expected: int) -> tuple[str, ...]:
    return (
        "--prompt-p50", str(prompt_tokens), "--prompt-p99", str(prompt_tokens),
        "--max-tokens", str(ANSWER_CAP), "--expected-output-tokens", str(expected),
    )  # fmt: skip


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
    seconds: float
    completed: int
    output_tokens: int
    client_tps: float
    log_median_tps: float | None
    log_median_running: float | None
    log_lines: int
    errors: int

    def to_json(self) -> dict[str, Any]:
        return {
            "in_flight": self.in_flight,
            "seconds": round(self.seconds, 1),
            "completed": self.completed,
            "output_tokens": self.output_tokens,
            "client_tps": round(self.client_tps, 1),
            "log_median_tps": None if self.log_median_tps is None else round(self.log_median_tps, 1),
            "log_median_running": self.log_median_running,
            "log_lines": self.log_lines,
            "errors": self.errors,
        }


async def measure(loop: ClosedLoop, server: Server, n: int, warmup_s: float, window_s: float) -> Window:
    """Set ``n`` in flight, warm up, then count a fixed window."""
    loop.in_flight(n)
    await asyncio.sleep(warmup_s)
    start_offset = len(server.text())
    errors_before = len(loop.errors)
    t_a = time.time()
    await asyncio.sleep(window_s)
    t_b = time.time()
    in_window = [d for d in loop.done if t_a <= d.ended < t_b]
    tokens = sum(d.tokens for d in in_window)
    lines = serverlog.decode_lines(server.text()[start_offset:])
    return Window(
        in_flight=n,
        seconds=t_b - t_a,
        completed=len(in_window),
        output_tokens=tokens,
        client_tps=tokens / (t_b - t_a),
        log_median_tps=statistics.median(x.gen_tps for x in lines) if lines else None,
        log_median_running=statistics.median(x.running for x in lines) if lines else None,
        log_lines=len(lines),
        errors=len(loop.errors) - errors_before,
    )


# ------------------------------------------------------------------------------------ servers


@dataclass(frozen=True, slots=True)
class Settings:
    dry: bool
    warmup_s: float
    window_s: float
    work: Path
    ready_timeout_s: float
    length_scale: float  # dry run: answers scaled down so a window holds many of them


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
    options = {"max_total_num_tokens": int(p.get("kv_cache_tokens") or 1_000_000), "log_interval_s": 1.0,
               "half_speed_running": 200}  # fmt: skip
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
    loop = ClosedLoop(f"http://127.0.0.1:{server.port}", "/v1/chat/completions" if s.dry else "/generate",
                      chat_body if s.dry else generate_body, workload)  # fmt: skip
    try:
        await wait_ready(server, s.ready_timeout_s)
        out["ready_s"] = round(time.time() - t0, 1)
        await loop.open()
        for n in in_flight:
            window = await measure(loop, server, n, s.warmup_s, s.window_s)
            out["windows"].append(window.to_json())
            print(
                f"    {name} in_flight={n}: {window.client_tps:,.0f} tok/s (log median "
                f"{window.log_median_tps}), {window.completed} done, {window.errors} errors",
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


def tps_of(result: dict[str, Any], in_flight: int | None = None) -> float | None:
    for w in result.get("windows", []):
        if in_flight is None or w["in_flight"] == in_flight:
            return float(w["client_tps"])
    return None


async def bench_model(model: str, s: Settings) -> dict[str, Any]:
    model_dir = MODELS / model
    config = json.loads((model_dir / "config.json").read_text())
    scale = s.length_scale if s.dry else 1.0
    workload = Workload(
        vocab=int(config["vocab_size"]),
        median=ANSWER_MEDIAN * scale,
        mean=ANSWER_MEAN * scale,
        cap=max(1, round(ANSWER_CAP * scale)),
    )
    plan = regen_tune(model_dir, (), *regen_workload_args(PROMPT_TOKENS, ANSWER_MEAN))
    rec = (plan.plan or {}).get("recommended") or {}
    row: dict[str, Any] = {
        "model": model,
        "regen_rc": plan.rc,
        "regen_message": plan.message,
        "regen_args": rec.get("args"),
        "regen_in_flight": rec.get(IN_FLIGHT_KEY),
        "predicted_kv": rec.get("kv_cache_tokens"),
        "default_plan_kv": (plan.plan or {}).get("kv_cache_tokens"),
        "regen_recommended": {k: v for k, v in rec.items() if k not in ("reasons",)},
        "regen_reasons": rec.get("reasons"),
    }
    print(
        f"[{model}] regen: {' '.join(rec.get('args') or [])} in flight {row['regen_in_flight']} "
        f"(rc {plan.rc})",
        flush=True,
    )
    row["default"] = await run_server(f"{model}-default", model_dir, [], DEFAULT_IN_FLIGHT, plan, workload, s)
    if plan.refused or not rec.get("args") or not rec.get(IN_FLIGHT_KEY):
        row["regen"] = {"error": f"no recommendation: {plan.message}"}
    else:
        n = int(rec[IN_FLIGHT_KEY])
        row["regen"] = await run_server(
            f"{model}-regen", model_dir, list(rec["args"]), (n,), plan, workload, s
        )
    row["regen_tps"] = tps_of(row["regen"])
    row["default256_tps"] = tps_of(row["default"], DEFAULT_IN_FLIGHT[0])
    row["default512_tps"] = tps_of(row["default"], DEFAULT_IN_FLIGHT[1])
    row["vs_default"] = (
        row["regen_tps"] / row["default256_tps"] if row["regen_tps"] and row["default256_tps"] else None
    )
    row["realized_kv"] = row["regen"].get("realized_kv")
    return row


def fmt(value: Any, nd: int = 0) -> str:
    if value is None:
        return "na"
    return f"{value:.{nd}f}" if isinstance(value, float) else str(value)


def final_line(row: dict[str, Any]) -> str:
    return (
        f"dense: model={row['model']} regen_tps={fmt(row['regen_tps'])} default256_tps="
        f"{fmt(row['default256_tps'])} default512_tps={fmt(row['default512_tps'])} "
        f"vs_default={fmt(row['vs_default'], 3)} predicted_kv={fmt(row['predicted_kv'])} "
        f"realized_kv={fmt(row['realized_kv'])}"
    )


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        f"# Dense bench: regen's plan against SGLang's defaults ({doc['date']})",
        "",
        "**DRY RUN on CPU against regen's simulated server: not a measurement.**\n" if doc["dry_cpu"] else "",
        f"Host: {doc['host']}; SGLang 0.5.17, dummy weights, `--skip-tokenizer-init`. Workload: prompts of "
        f"{PROMPT_TOKENS} random token ids, answers log-normal (median {ANSWER_MEDIAN}, mean ~{ANSWER_MEAN}, "
        f"cap {ANSWER_CAP}, seed {SEED}), `ignore_eos`, greedy, one closed-loop client; warm-up "
        f"{doc['warmup_s']:.0f} s, window {doc['window_s']:.0f} s (output tokens of the requests completed "
        "in it / its length; the server log's median gen throughput beside it).",
        "",
        "| model | server | flags | in flight | client tok/s | log median tok/s | median running "
        "| KV tokens |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in doc["rows"]:
        for which in ("default", "regen"):
            r = row.get(which) or {}
            for w in r.get("windows", []) or [{}]:
                lines.append(
                    f"| {row['model']} | {which} | `{' '.join(r.get('flags') or []) or '(defaults)'}` | "
                    f"{w.get('in_flight', '—')} | {fmt(w.get('client_tps'))} | "
                    f"{fmt(w.get('log_median_tps'))} | "
                    f"{fmt(w.get('log_median_running'))} | {fmt(r.get('realized_kv'))} |"
                )
            if r.get("error"):
                lines.append(f"| {row['model']} | {which} | error: {r['error'][:200]} | | | | | |")
    lines += ["", "```", *(final_line(r) for r in doc["rows"]), "```", ""]
    return "\n".join(lines)


async def amain(a: argparse.Namespace) -> int:
    s = Settings(
        dry=a.dry_cpu,
        warmup_s=a.warmup_s if a.warmup_s is not None else (2.0 if a.dry_cpu else 20.0),
        window_s=a.window_s if a.window_s is not None else (5.0 if a.dry_cpu else 50.0),
        work=a.work,
        ready_timeout_s=a.ready_timeout_s,
        length_scale=0.02,
    )
    (s.work / "logs").mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    stem = "dense-" + dt.date.today().isoformat() + ("-dry" if s.dry else "")
    doc: dict[str, Any] = {"date": dt.date.today().isoformat(), "dry_cpu": s.dry, "host": host_name(s.dry),
                           "gpu_memory_mib": GPU_MEMORY_MIB, "warmup_s": s.warmup_s, "window_s": s.window_s,
                           "rows": []}  # fmt: skip
    for model in a.models.split(","):
        row = await bench_model(model, s)
        doc["rows"].append(row)
        write_json(a.out / f"{stem}.json", doc)
        print(final_line(row), flush=True)
    (a.out / f"{stem}.md").write_text(markdown(doc))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dry-cpu", action="store_true", help="regen's simulated server instead of SGLang")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--work", type=Path, default=Path("/tmp/truth-work/dense"))
    p.add_argument("--models", default=",".join(MODEL_NAMES), help="model dirs under tests/data/models")
    p.add_argument("--warmup-s", type=float, default=None, help="default 20 (dry: 2)")
    p.add_argument("--window-s", type=float, default=None, help="default 50 (dry: 5)")
    p.add_argument("--ready-timeout-s", type=float, default=420.0)
    return asyncio.run(amain(p.parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
