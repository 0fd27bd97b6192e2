"""The truth bench's hold phase (issue 49 item 2): a plan counts only once its server ran at its batch.

The startup comparison (``planner_truth.check_target``) stops when SGLang's pools are allocated; the issue's
crash came after, at the first decode step of a batch above the decode graphs. So for each target, after
that comparison: plan the target for the issue's workload (``regen tune --json`` with
:data:`HOLD_WORKLOAD_ARGS`), start SGLang with the recommended launch flags (dummy weights), drive it with a
closed loop of the plan's ``client_concurrency`` requests (``dense.ClosedLoop``: 300-token prompts of random
ids, log-normal answers, median 1,200, mean ~1,450, cap 8,192, ``ignore_eos``; sampled at temperature 1,
the sampler's softmax path, which holds more memory than greedy's argmax), and hold it: the server must
stay up, reach :data:`BATCH_SHARE` of the planned batch in its ``Decode batch`` lines, and decode at it for
``hold_s`` seconds (60 by default), still logging decode lines at the end (:data:`STALL_S`), with no
retraction storm (SGLang's "KV cache pool is full. Retract requests. #retracted_reqs: N" lines,
``managers/scheduler.py``: more than :data:`RETRACT_STORM_SHARE` of the planned batch retracted a minute).
Verdict ``held`` or why not; an out-of-memory line is quoted.

``--dry-cpu``: regen's simulated server with the plan's cap and KV (``regen serve-simulated``), which
checks the plumbing (start, loop, log reading, verdict), not SGLang's memory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shlex
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.gpu import dense, serverlog
from bench.gpu.planner_truth import (
    RegenPlan,
    Server,
    Target,
    free_port,
    model_dir_for,
    regen_tune,
    sglang_argv,
    simulated_argv,
    trimmed_log,
    wait_gpu_free,
)

#: the workload of issue 49's measurement (``regen tune`` options): 300-token prompts, answers of mean
#: 1,437 with cv 0.65 (the log-normal of :class:`bench.gpu.dense.Workload`), max_tokens 8,192
HOLD_WORKLOAD_ARGS = tuple(
    shlex.split(
        "--prompt-p50 300 --prompt-p99 300 --max-tokens 8192 --expected-output-tokens 1437 "
        "--expected-output-cv 0.65"
    )
)
HOLD_S = 60.0
#: the hold counts from the first decode line at this share of the planned batch, and its lines' median
#: running count must be at least this share
BATCH_SHARE = 0.9
#: a retraction storm: more requests retracted a minute of hold than this share of the planned batch
RETRACT_STORM_SHARE = 0.05
#: the longest the batch may take to build up after the server is ready (prefill of the whole batch)
REACH_TIMEOUT_S = 240.0
#: a server that logged no decode line this long before the hold ended has stalled (SGLang logs one every
#: 40 decode steps: a few seconds at a full batch)
STALL_S = 20.0
_RETRACT = re.compile(r"Retract requests\. #retracted_reqs: (\d+)")
_OOM = re.compile(r"^.*(?:CUDA out of memory|OutOfMemoryError|out of memory).*$", re.M | re.I)


@dataclass(frozen=True, slots=True)
class Sample:
    """A decode line as the bench saw it appear (its own clock: lines carry no sub-second stamp)."""

    t: float
    running: int
    queue: int


@dataclass(frozen=True, slots=True)
class Hold:
    """What one hold showed, and its verdict."""

    planned_batch: int
    hold_s: float
    reached_after_s: float | None  # from ready to the first line at BATCH_SHARE of the batch
    held_s: float  # decode seconds at the batch, while the server stayed up
    alive: bool
    decode_lines: int
    median_running: float | None
    min_running: int | None
    max_running: int | None
    retract_events: int
    retracted_reqs: int
    oom: str | None
    verdict: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def held(self) -> bool:
        return self.verdict == "held"


def retractions(text: str) -> tuple[int, int]:
    """(retraction events, requests retracted) in a server log."""
    found = [int(m[1]) for m in _RETRACT.finditer(text)]
    return len(found), sum(found)


def assess(
    samples: list[Sample],
    log_after_ready: str,
    *,
    planned: int,
    hold_s: float,
    alive: bool,
    ready_at: float,
    ended_at: float,
) -> Hold:
    """The verdict of a hold from the decode lines seen (with when they were seen), the log written after
    the server was ready, and whether the server was still up at the end."""
    target = BATCH_SHARE * planned
    reached = next((s.t for s in samples if s.running >= target), None)
    window = [s for s in samples if reached is not None and s.t >= reached]
    held_s = (ended_at - reached) if reached is not None else 0.0
    events, retracted = retractions(log_after_ready)
    oom = _OOM.search(log_after_ready)
    running = [s.running for s in window]
    median = statistics.median(running) if running else None
    minutes = max(held_s, 1.0) / 60
    if not alive:
        verdict = "crashed" + (f": {oom[0].strip()[:300]}" if oom else "")
    elif samples and ended_at - samples[-1].t > STALL_S:
        verdict = f"stalled: no decode line in the last {ended_at - samples[-1].t:.0f} s"
    elif reached is None:
        top = max((s.running for s in samples), default=0)
        verdict = f"did not reach the planned batch: at most {top:,} running of {planned:,}"
    elif median is not None and median < target:
        verdict = f"did not hold the planned batch: median {median:,.0f} running of {planned:,}"
    elif retracted / minutes > RETRACT_STORM_SHARE * planned:
        verdict = f"retraction storm: {retracted:,} requests retracted in {held_s:.0f} s ({events} events)"
    elif held_s < hold_s:
        verdict = f"held {held_s:.0f} s of the {hold_s:.0f} s asked"
    else:
        verdict = "held"
    return Hold(
        planned_batch=planned,
        hold_s=hold_s,
        reached_after_s=None if reached is None else round(reached - ready_at, 1),
        held_s=round(held_s, 1),
        alive=alive,
        decode_lines=len(window),
        median_running=median,
        min_running=min(running) if running else None,
        max_running=max(running) if running else None,
        retract_events=events,
        retracted_reqs=retracted,
        oom=oom[0].strip()[:500] if oom else None,
        verdict=verdict,
    )


@dataclass(slots=True)
class HoldSettings:
    dry: bool
    work: Path
    hold_s: float = HOLD_S
    ready_timeout_s: float = 600.0
    reach_timeout_s: float = REACH_TIMEOUT_S
    #: dry run: the simulated server's decode rate per request and its faults (a crash to test with)
    dry_token_rate: float = 20.0
    dry_faults: dict[str, Any] = field(default_factory=dict)


def sampled_body(workload: dense.Workload, i: int) -> dict[str, Any]:
    """``/generate`` at temperature 1 (the sampler's softmax; top_p/top_k left at SGLang's 1/-1)."""
    body = dense.generate_body(workload, i)
    body["sampling_params"]["temperature"] = 1.0
    return body


def sampled_chat_body(workload: dense.Workload, i: int) -> dict[str, Any]:
    return {**dense.chat_body(workload, i), "temperature": 1.0}


def recommended(plan: RegenPlan) -> tuple[list[str], int, dict[str, Any]]:
    """(launch flags, client in flight, the recommended plan) of ``regen tune --json``."""
    rec = (plan.plan or {}).get("recommended") or {}
    args = [str(a) for a in rec.get("args") or []]
    client = int(rec.get("client_concurrency") or rec.get("effective_max_running_requests") or 0)
    return args, client, rec


def hold_server_argv(
    model_dir: Path, port: int, log: Path, args: list[str], rec: dict[str, Any], s: HoldSettings
) -> list[str]:
    if not s.dry:
        return sglang_argv(model_dir, port, tuple(args))
    cap = int(
        dense.flag_value(args, "--max-running-requests") or rec.get("effective_max_running_requests") or 1
    )
    options = {"max_total_num_tokens": int(rec.get("kv_cache_tokens") or 1_000_000), "log_interval_s": 0.5}
    argv = simulated_argv(port, log, options, max_running=cap, token_rate=s.dry_token_rate)
    return [*argv, "--faults", json.dumps(s.dry_faults)] if s.dry_faults else argv


async def hold(target: Target, s: HoldSettings) -> dict[str, Any]:
    """Plan ``target`` for the issue's workload, start the recommended server, hold it at its batch."""
    model_dir = model_dir_for(target, s.work)
    plan = regen_tune(model_dir, (), *HOLD_WORKLOAD_ARGS)
    args, client, rec = recommended(plan)
    out: dict[str, Any] = {
        "args": args,
        "client_concurrency": client,
        "regen_rc": plan.rc,
        "decode_headroom": rec.get("decode_headroom"),
    }
    if plan.refused or client < 1:
        out["verdict"] = f"not planned: {plan.message[-300:]}"
        return out
    port = free_port()
    log = s.work / "logs" / f"{target.name}-hold.log"
    log.unlink(missing_ok=True)
    server = Server(hold_server_argv(model_dir, port, log, args, rec, s), log, port).start()
    vocab = int(model_vocab(model_dir))
    workload = dense.Workload(vocab=vocab)
    path, body = ("/v1/chat/completions", sampled_chat_body) if s.dry else ("/generate", sampled_body)
    loop = dense.ClosedLoop(f"http://127.0.0.1:{port}", path, body, workload)
    samples: list[Sample] = []
    t0 = time.time()
    try:
        await dense.wait_ready(server, s.ready_timeout_s)
        ready = time.time()
        out["ready_s"] = round(ready - t0, 1)
        offset = len(server.text())
        await loop.open()
        loop.in_flight(client)
        seen = 0
        reached: float | None = None
        while server.alive():
            lines = serverlog.decode_lines(server.text()[offset:])
            now = time.time()
            samples += [Sample(now, x.running, x.queue) for x in lines[seen:]]
            seen = len(lines)
            if reached is None and any(x.running >= BATCH_SHARE * client for x in lines):
                reached = now
            if reached is not None and now - reached >= s.hold_s:
                break
            if reached is None and now - ready > s.reach_timeout_s:
                break
            await asyncio.sleep(1.0)
        ended = time.time()
        alive = server.alive()
        result = assess(
            samples,
            server.text()[offset:],
            planned=client,
            hold_s=s.hold_s,
            alive=alive,
            ready_at=ready,
            ended_at=ended,
        )
    except RuntimeError as exc:  # never ready
        text = server.text()
        oom = _OOM.search(text)
        out["verdict"] = "did not start: " + (oom[0].strip()[:300] if oom else str(exc)[-300:])
        return out
    finally:
        await loop.close()
        server.stop()
        wait_gpu_free(s.dry)
        (s.work / "logs" / f"{target.name}-hold.trimmed.log").write_text(trimmed_log(server.text(), tail=60))
    out.update(result.to_json())
    out["client_errors"] = loop.errors[:5]
    out["completed"] = len(loop.done)
    return out


def model_vocab(model_dir: Path) -> int:
    """The served config's vocabulary (its text model's for a multimodal checkpoint)."""
    config = json.loads((model_dir / "config.json").read_text())
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    return int(text.get("vocab_size") or config.get("vocab_size") or 32000)


def hold_target(target: Target, s: HoldSettings) -> dict[str, Any]:
    return asyncio.run(hold(target, s))


def with_hold(row: dict[str, Any], target: Target, a: argparse.Namespace) -> None:
    """The truth bench's hold phase (``planner_truth.main``'s ``hold_phase``): hold regen's recommended
    server for ``target`` at its planned batch; the row counts only if it held, its verdict says why not."""
    result = hold_target(target, HoldSettings(dry=a.dry_cpu, work=a.work, hold_s=a.hold_s))
    row["hold"] = {**result, "workload_args": list(HOLD_WORKLOAD_ARGS)}
    print(
        f"    hold: {result.get('verdict')} (planned {result.get('client_concurrency')}, median running "
        f"{result.get('median_running')}, held {result.get('held_s')} s, retracted "
        f"{result.get('retracted_reqs')})",
        flush=True,
    )
    if result.get("verdict") != "held":
        row["verdict"] = f"{row['verdict']}; not held: {result.get('verdict')}"
