"""MTP on or off, at which batch: the grid of issue 25 (items 1-4, 6) on one GPU, SGLang 0.5.17.

One server per configuration, each measured at several concurrency levels up to its running cap
(the running x MTP-steps grid); the same plateau method everywhere: the median ``gen throughput`` of
the server's ``Decode batch`` lines while ``#running-req`` sits at the level (``serverlog.steady_state``),
which SGLang counts in accepted tokens (each verify step adds a request's accepted drafts and its bonus
token), next to the lines' ``accept len``. Workload per level: ``c`` requests at once, each a distinct
prompt of exactly ``--prompt-tokens`` words (one token each), a fixed answer of ``--answer-tokens``
(``ignore_eos``, greedy), all finished before the next level.

Configurations, in priority order (a run cut short keeps what it measured; results are written after
every level):
1. ``off``: regen's recommendation for this workload (``regen.sglang.plan.recommend``, fp32 state, no
   MTP), shared by every acceptance (acceptance does not exist without MTP);
2. ``seed`` at acceptance 2.9: the original run's flags (``known_target.baselines.SEED_FLAGS``: NEXTN 3
   steps topk 1, 200 state slots, memory fraction 0.93, mamba ratio 0.6, max running 64);
3. ``mtp3``, ``mtp2``, ``mtp1`` at 2.9: regen's MTP candidates (``regen.sglang.plan.mtp_candidates``: the
   running cap and pools re-solved for the verify buffers, draft weights and draft KV);
4. ``mtp3`` at 3.5, ``mtp1`` at 1.5 (the likely best MTP of each), ``mtp1`` at 3.5, ``mtp3`` at 1.5, then
   ``mtp2`` at 3.5 and 1.5, then ``off-bf16`` (regen's recommendation with ``--allow-bf16-state``,
   reported beside the fp32 decision, not part of it), as the budget allows (``--deadline-s``: a server
   starts only if its start and its cap level fit in what is left).
regen's MTP candidates run without the radix cache (unique prompts, 1 state slot per request, as its
recommendation); should SGLang refuse that (never ready), the planner's same candidate with the radix cache
(3 slots per request) is measured in its place and for every later MTP server, the failure kept in the JSON.
Every server also gets ``--disable-prefill-cuda-graph`` (SGLang 0.5.17 captures 58 prefill graphs, ~33 s
of every start; prefill graphs do not touch decode) and ``--decode-log-interval`` (more plateau lines).

Acceptance: SGLang's benchmarking knob, per server: ``SGLANG_SIMULATE_ACC_LEN`` with
``SGLANG_SIMULATE_ACC_METHOD=match-expected`` (each verify step accepts floor or ceil of the value,
weighted to match it, clamped to ``[1, steps + 1]``) and ``SGLANG_SIMULATE_ACC_TOKEN_MODE=real-draft-token``
(topk 1). The acceptance a of the grid is the accept length at 3 steps; with ``--acc-per-steps chain``
(default) fewer steps get what a drafter of the same per-draft acceptance p would give
(``1 + p + ... + p^s``, p solved from ``1 + p + p^2 + p^3 = a``), as a real MTP head does; ``flat`` sets
``min(a, s + 1)`` for every s (SGLang's knob taken as is, which flatters fewer steps).

Decision: per acceptance, regen's own ranking (``regen.tune.sweep.choose``, what ``regen tune --sweep`` keeps)
over the candidates it would measure (``off`` and each ``mtp<s>``) at their caps; the grid best is the best
point of any configuration at any level at that acceptance (``seed`` included). Planner predictions (cap,
KV tokens, state, verify buffers, draft weights and KV) against what each server's startup log and
``/server_info`` realized (``regen.sglang.realized``).

Writes ``OUT/mtp-<date>.json`` (after every level), ``.md`` and ``.svg`` (decode tok/s against running
requests, a panel per acceptance); the last lines are one
``mtp: acceptance=... best_off_tps=... best_on_tps=... choice_tps=... choice_vs_best=... seed_tps=...
vs_seed=... predicted_cap=... realized_cap=...`` per acceptance (``na`` where nothing ran), then
``mtp-grid: done``. ``--dry-cpu`` runs the same sequence against regen's simulated server (speculative
steps, acceptance and memory map through ``REGEN_SIM_OPTIONS`` / ``SGLANG_SIMULATE_ACC_LEN``).
Driver and device call sequence: ``mtp.sh``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.gpu.harness import (
    SGLANG_VERSION,
    TEMPLATE_TOKENS,
    bench_server_cfg,
    gpu_memory_mib,
    run_module,
    wait_gpu_free,
    word_prompts,
)
from bench.gpu.known_target.baselines import SEED_FLAGS
from bench.gpu.serverlog import decode_lines, startup_facts, steady_state
from bench.harness import fmt, log, write_json

BASE_ARGS = ["--load-format", "dummy"]
LEVELS = (16, 32, 64, 128, 256)
SPEC_ENV = {
    "SGLANG_SIMULATE_ACC_METHOD": "match-expected",
    "SGLANG_SIMULATE_ACC_TOKEN_MODE": "real-draft-token",
}
DONE = "mtp-grid: done"


# --------------------------------------------------------------------------------------------------
# configurations


@dataclass
class Config:
    """One server of the grid."""

    name: str  # off | seed | mtp1..3
    acceptance: float | None  # the grid's acceptance (accept length at 3 steps); None: no MTP
    steps: int  # 0: no MTP
    args: list[str]
    plan: Any  # regen's MemoryPlan for args
    source: str  # recommend | mtp_candidates | seed
    sim_accept_len: float | None = None  # SGLANG_SIMULATE_ACC_LEN for this server
    results: dict[str, Any] = field(default_factory=dict)
    fallback: Config | None = None  # started instead when this one never gets ready

    @property
    def cap(self) -> int:
        return int(self.plan.effective_max_running_requests)

    @property
    def key(self) -> str:
        return self.name if self.acceptance is None else f"{self.name}@{self.acceptance:g}"


def per_draft_acceptance(a: float, steps: int = 3) -> float:
    """p with ``1 + p + ... + p^steps = a`` (bisection; 0 <= p <= 1)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid**k for k in range(steps + 1)) < a:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def sim_accept_len(a: float, steps: int, mode: str) -> float:
    """The ``SGLANG_SIMULATE_ACC_LEN`` for ``steps`` at grid acceptance ``a`` (module doc)."""
    if mode == "flat":
        return min(a, steps + 1.0)
    p = per_draft_acceptance(min(a, 4.0))
    return round(sum(p**k for k in range(steps + 1)), 3)


def plan_configs(model_dir: Path, gpu_mib: int, a: argparse.Namespace) -> tuple[list[Config], Any]:
    """The grid's servers in priority order, planned by regen for this workload."""
    from regen.sglang.alternatives import mtp_candidates
    from regen.sglang.models import ModelShape
    from regen.sglang.plan import Workload, plan
    from regen.sglang.recommend import recommend

    model = ModelShape.from_config(model_dir)
    prompt = a.prompt_tokens + TEMPLATE_TOKENS
    wl = Workload(prompt_p50=prompt, prompt_p99=prompt, max_tokens=a.answer_tokens)
    rec = recommend(
        model, gpu_mib, 1, BASE_ARGS, wl, SGLANG_VERSION, allow_fp8_kv=False, allow_bf16_state=False
    )
    best = rec.candidates[0]

    def by_steps_of(cands: list[Any]) -> dict[int, Any]:
        return {int(c.args[c.args.index("--speculative-num-steps") + 1]): c for c in cands}

    by_steps = by_steps_of(mtp_candidates(model, gpu_mib, 1, BASE_ARGS, wl, SGLANG_VERSION, best))
    # the fallback should SGLang refuse MTP without the radix cache: the same with it (3 slots per request)
    radix = dataclasses.replace(best, args=tuple(a for a in best.args if a != "--disable-radix-cache"))
    with_radix = by_steps_of(mtp_candidates(model, gpu_mib, 1, BASE_ARGS, wl, SGLANG_VERSION, radix))
    seed_args = [*BASE_ARGS, *SEED_FLAGS]
    seed_plan = plan(model, gpu_mib, 1, seed_args, wl, SGLANG_VERSION)
    out = [Config("off", None, 0, list(best.args), best.plan, "recommend")]
    order: list[tuple[float, str]] = [(2.9, "seed"), (2.9, "mtp3"), (2.9, "mtp2"), (2.9, "mtp1")]
    # then the likely best MTP candidate of each other acceptance first (3 steps at 3.5, 1 step at 1.5)
    order += [(3.5, "mtp3"), (1.5, "mtp1"), (3.5, "mtp1"), (1.5, "mtp3"), (3.5, "mtp2"), (1.5, "mtp2")]
    wanted = {float(x) for x in a.acceptances.split(",")}
    for acc, name in order:
        if acc not in wanted:
            continue
        if name == "seed":
            out.append(Config("seed", acc, 3, seed_args, seed_plan, "seed", sim_accept_len(acc, 3, "flat")))
            continue
        steps = int(name[3:])
        cand = by_steps.get(steps)
        if cand is None:
            log(f"no feasible MTP candidate at {steps} steps: {name}@{acc:g} skipped")
            continue
        accept = sim_accept_len(acc, steps, a.acc_per_steps)
        cfg = Config(name, acc, steps, list(cand.args), cand.plan, "mtp_candidates", accept)
        alt = with_radix.get(steps)
        if alt is not None and "--disable-radix-cache" in cand.args:
            source = "mtp_candidates (radix cache)"
            cfg.fallback = Config(name, acc, steps, list(alt.args), alt.plan, source, accept)
        out.append(cfg)
    # last, if time is left: regen's choice with --allow-bf16-state (issue 25 item 4: beside the fp32 one)
    bf16 = recommend(
        model, gpu_mib, 1, BASE_ARGS, wl, SGLANG_VERSION, allow_fp8_kv=False, allow_bf16_state=True
    ).candidates[0]
    if "bfloat16" in bf16.args:
        out.append(Config("off-bf16", None, 0, list(bf16.args), bf16.plan, "recommend --allow-bf16-state"))
    return out, wl


def levels_for(cap: int, dry: bool) -> list[int]:
    """The cap first (the point the decision is made at), then the grid levels below it."""
    below = [c for c in (LEVELS if not dry else (4, 8, 16)) if c < cap]
    return [cap, *below]


def launch_args(cfg: Config, a: argparse.Namespace) -> list[str]:
    extra = ["--disable-prefill-cuda-graph", "--decode-log-interval", str(a.decode_log_interval)]
    if cfg.steps:
        extra += ["--speculative-draft-load-format", "dummy"]
    return [*cfg.args, *extra]


def server_env(cfg: Config, a: argparse.Namespace) -> dict[str, str]:
    """Environment for this server (SGLang reads the acceptance knobs from it; the simulated server also
    its speculative steps and the plan's memory map)."""
    env: dict[str, str] = {}
    if cfg.steps and cfg.sim_accept_len is not None:
        env |= {"SGLANG_SIMULATE_ACC_LEN": f"{cfg.sim_accept_len:g}", **SPEC_ENV}
    if a.dry_cpu:
        p = cfg.plan
        env["REGEN_SIM_OPTIONS"] = json.dumps(
            {
                "speculative_num_steps": cfg.steps,
                "log_interval_s": 0.25,
                "state_pool_gib": p.state_pool_gib,
                "spec_scratch_gib": p.spec_scratch_gib,
                "draft_weights_gib": p.draft_weights_gib,
                "draft_kv_gib": p.draft_kv_gib,
                "weights_gib": p.weights_gib,
                "kv_cache_gib": p.kv_cache_gib,
                "max_total_num_tokens": p.kv_cache_tokens,
                "max_mamba_cache_size": p.max_mamba_cache_size,
                "mem_fraction_static": p.mem_fraction_static,
            }
        )
    return env


# --------------------------------------------------------------------------------------------------
# one level


async def post_level(url: str, model: str, prompts: list[str], max_tokens: int) -> dict[str, Any]:
    """Every prompt at once; completion tokens and wall time."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=1800)
    conn = aiohttp.TCPConnector(limit=len(prompts) + 8)
    t0 = time.monotonic()
    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as session:

        async def one(text: str) -> tuple[int, str | None]:
            body = {
                "model": model,
                "messages": [{"role": "user", "content": text}],
                "max_tokens": max_tokens,
                "temperature": 0.0,
                "ignore_eos": True,
            }
            try:
                async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
                    data = await resp.json(content_type=None)
                    if resp.status != 200:
                        return 0, f"HTTP {resp.status}: {str(data)[:160]}"
                    return int((data.get("usage") or {}).get("completion_tokens") or 0), None
            except (aiohttp.ClientError, TimeoutError) as exc:
                return 0, f"{type(exc).__name__}: {exc}"

        got = await asyncio.gather(*(one(t) for t in prompts))
    wall = time.monotonic() - t0
    errors = [e for _, e in got if e]
    tokens = sum(n for n, _ in got)
    return {
        "wall_s": round(wall, 2),
        "completion_tokens": tokens,
        "errors": len(errors),
        "error_examples": errors[:2],
        "client_tok_s": round(tokens / max(wall, 1e-9), 1),
    }


def read_from(path: Path, offset: int) -> str:
    if not path.exists():
        return ""
    with open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read().decode("utf-8", errors="replace")


def measure_level(url: str, model: str, log_path: Path, c: int, a: argparse.Namespace, seed: int) -> dict:
    samples = word_prompts(c, a.prompt_tokens, f"l{seed}", seed)
    prompts = [s.messages[0].content for s in samples]
    offset = log_path.stat().st_size if log_path.exists() else 0
    client = asyncio.run(post_level(url, model, prompts, a.answer_tokens))
    time.sleep(a.settle_s)  # the last decode line of the level
    lines = decode_lines(read_from(log_path, offset))
    steady = steady_state(lines)
    out: dict[str, Any] = {"concurrency": c, "client": client, "decode_lines": len(lines)}
    if steady is not None:
        out["steady"] = steady.to_json()
        out["decode_tps"] = round(steady.median_tps, 1)
        out["running"] = steady.plateau_running
        out["accept_len"] = steady.median_accept_len
    return out


# --------------------------------------------------------------------------------------------------
# one server


def realized_of(cfg: Config, log_text: str, info: dict[str, Any]) -> dict[str, Any]:
    from regen.sglang.realized import compare, parse_startup_log, realized_from_server_info

    realized = realized_from_server_info(dict(info), parse_startup_log(log_text))
    keep = {k: v for k, v in dataclasses.asdict(realized).items() if v is not None}
    return {
        "realized": keep,
        "drift_over_1pct": [str(d) for d in compare(cfg.plan, realized, tolerance=0.01)],
        "startup_facts": startup_facts(log_text),
    }


def predicted_of(p: Any) -> dict[str, Any]:
    return {
        "cap": p.effective_max_running_requests,
        "binding": p.binding_constraint,
        "kv_tokens": p.kv_cache_tokens,
        "max_mamba_cache_size": p.max_mamba_cache_size,
        "state_gib": round(p.state_pool_gib, 3),
        "spec_scratch_gib": round(p.spec_scratch_gib, 3),
        "draft_weights_gib": round(p.draft_weights_gib, 3),
        "draft_kv_gib": round(p.draft_kv_gib, 3),
        "kv_cache_gib": round(p.kv_cache_gib, 3),
        "weights_gib": round(p.weights_gib, 3),
        "mem_fraction_static": p.mem_fraction_static,
    }


def run_server(cfg: Config, model_dir: Path, a: argparse.Namespace, deadline: float, port: int) -> None:
    from regen.serving.lifecycle import acquire_server, stop_all_servers
    from regen.serving.probes import fetch_server_info
    from regen.serving.procfs import SERVER_START_MARK

    work = a.work / cfg.key.replace("@", "-a")
    servers, logs = work / "servers", work / "logs"
    args = launch_args(cfg, a)
    simulated = {
        "token_rate": a.sim_token_rate,
        "half_speed_running": a.sim_half_speed,
        "max_running_requests": cfg.cap,
        "startup_delay_s": 1.0,
    }
    server_cfg = bench_server_cfg(
        model_dir,
        a.dry_cpu,
        args=args,
        use_tuner=False,
        port_base=port,
        simulated=simulated if a.dry_cpu else None,
    )
    env = server_env(cfg, a)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    r = cfg.results
    r.update(
        name=cfg.name,
        acceptance=cfg.acceptance,
        steps=cfg.steps,
        source=cfg.source,
        launch_args=args,
        env={k: v for k, v in env.items() if "OPTIONS" not in k},
        predicted=predicted_of(cfg.plan),
        levels=[],
    )
    log(f"{cfg.key}: launching ({' '.join(args)}); env {env if not a.dry_cpu else '(dry)'}")
    t0 = time.monotonic()
    log_path = logs / "gpu0.log"
    try:
        with acquire_server(server_cfg, None, servers, logs, owner_pid=os.getpid()) as ep:
            r["start_s"] = round(time.monotonic() - t0, 1)
            info = fetch_server_info(ep.url, None)
            text = log_path.read_text(errors="replace") if log_path.exists() else ""
            this = text[text.rfind(SERVER_START_MARK) :] if SERVER_START_MARK in text else text
            r["plan_vs_realized"] = realized_of(cfg, this, info)
            states = info.get("internal_states") or [{}]
            r["realized_cap"] = (states[0] or {}).get("effective_max_running_requests_per_dp")
            log(f"{cfg.key}: ready in {r['start_s']} s, cap predicted {cfg.cap} realized {r['realized_cap']}")
            for i, c in enumerate(levels_for(int(r["realized_cap"] or cfg.cap), a.dry_cpu)):
                if time.monotonic() > deadline - a.level_reserve_s and i > 0:
                    r["cut"] = f"deadline: levels from {c} down not measured"
                    log(f"{cfg.key}: {r['cut']}")
                    break
                lv = measure_level(ep.url, ep.model or str(model_dir), log_path, c, a, seed=1000 * port + c)
                r["levels"].append(lv)
                log(
                    f"{cfg.key}: c={c}: decode {lv.get('decode_tps')} tok/s at {lv.get('running')} running, "
                    f"accept len {lv.get('accept_len')}, client {lv['client']['client_tok_s']} tok/s "
                    f"({lv['client']['wall_s']} s, {lv['client']['errors']} errors)"
                )
                yield_partial()
            after = fetch_server_info(ep.url, None)
            st = (after.get("internal_states") or [{}])[0] or {}
            r["avg_spec_accept_length"] = st.get("avg_spec_accept_length")
    except Exception as exc:  # a server that fails is a finding: record it, go on with the next one
        import traceback

        traceback.print_exc()
        r["error"] = f"{type(exc).__name__}: {exc}"
        log(f"{cfg.key}: failed: {r['error']}")
    finally:
        stop_all_servers(servers, grace_s=60)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if not a.dry_cpu:
            r["gpu_used_after_stop_mib"] = wait_gpu_free(timeout_s=120)
        r["server_s"] = round(time.monotonic() - t0, 1)


# --------------------------------------------------------------------------------------------------
# summary


def cap_point(r: dict[str, Any]) -> dict[str, Any] | None:
    """The level measured at the server's cap (the first level), if it has a rate."""
    levels = r.get("levels") or []
    return levels[0] if levels and levels[0].get("decode_tps") else None


def best_point(rs: list[dict[str, Any]]) -> tuple[float, dict[str, Any] | None]:
    best: tuple[float, dict[str, Any] | None] = (0.0, None)
    for r in rs:
        for lv in r.get("levels") or []:
            if (lv.get("decode_tps") or 0) > best[0]:
                best = (
                    lv["decode_tps"],
                    {"config": r["name"], "concurrency": lv["concurrency"], "running": lv.get("running")},
                )
    return best


def summarize(results: list[dict[str, Any]], acceptances: list[float]) -> list[dict[str, Any]]:
    from regen.tune.sweep import choose

    off = [r for r in results if r["name"] == "off"]
    out = []
    for acc in acceptances:
        on = [r for r in results if r.get("acceptance") == acc]
        best_off, where_off = best_point(off)
        best_on, where_on = best_point(on)
        # regen's decision: the sweep's ranking over its own candidates (off + mtp<s>) at their caps
        cands = [r for r in [*off, *on] if r["name"] != "seed" and cap_point(r)]
        choice = cands[choose([cap_point(r)["decode_tps"] for r in cands])] if cands else None
        seed = next((r for r in on if r["name"] == "seed" and cap_point(r)), None)
        choice_tps = cap_point(choice)["decode_tps"] if choice else None
        seed_tps = cap_point(seed)["decode_tps"] if seed else None
        grid_best = max(best_off, best_on) or None
        out.append(
            {
                "acceptance": acc,
                "best_off_tps": best_off or None,
                "best_off_at": where_off,
                "best_on_tps": best_on or None,
                "best_on_at": where_on,
                "choice": None if choice is None else choice["name"],
                "choice_tps": choice_tps,
                "choice_vs_best": round(choice_tps / grid_best, 3) if choice_tps and grid_best else None,
                "seed_tps": seed_tps,
                "vs_seed": round(choice_tps / seed_tps, 3) if choice_tps and seed_tps else None,
                "predicted_cap": None if choice is None else choice["predicted"]["cap"],
                "realized_cap": None if choice is None else choice.get("realized_cap"),
                "crossover": crossover(off, on),
            }
        )
    return out


def crossover(off: list[dict[str, Any]], on: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Per concurrency measured both ways: MTP (best over steps) / off; the first level where MTP loses."""

    def by_c(rs: list[dict[str, Any]]) -> dict[int, float]:
        got: dict[int, float] = {}
        for r in rs:
            if r["name"] == "seed":
                continue
            for lv in r.get("levels") or []:
                if lv.get("decode_tps"):
                    got[lv["concurrency"]] = max(got.get(lv["concurrency"], 0.0), lv["decode_tps"])
        return got

    a, b = by_c(off), by_c(on)
    common = sorted(set(a) & set(b))
    if not common:
        return None
    ratios = {str(c): round(b[c] / a[c], 3) for c in common}
    loses = next((c for c in common if ratios[str(c)] < 1.0), None)
    return {"mtp_over_off_by_concurrency": ratios, "mtp_loses_from": loses}


def final_lines(summary: list[dict[str, Any]]) -> list[str]:
    keys = (
        "best_off_tps",
        "best_on_tps",
        "choice_tps",
        "choice_vs_best",
        "seed_tps",
        "vs_seed",
        "predicted_cap",
        "realized_cap",
    )
    return [
        f"mtp: acceptance={s['acceptance']:g} " + " ".join(f"{k}={fmt(s[k], 'g', 'na')}" for k in keys)
        for s in summary
    ]


def markdown(doc: dict[str, Any]) -> str:
    lines = [f"# MTP grid ({doc['date']}, SGLang {SGLANG_VERSION}, {doc['mode']})", ""]
    w = doc["workload"]
    lines += [
        f"Workload per level: c requests of {w['prompt_tokens']} prompt tokens, {w['answer_tokens']} answer "
        "tokens (ignore_eos, greedy). Decode tok/s: median gen throughput at the running plateau "
        "(accepted tokens/s).",
        "",
    ]
    lines += [
        "| config | accept | steps | SIMULATE_ACC_LEN | cap pred / real | c | running | decode tok/s | "
        "accept len | client tok/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["servers"]:
        head = (
            f"| {r['name']} | {fmt(r.get('acceptance'), 'g', 'na')} | {r['steps']} | "
            f"{fmt(r.get('sim_accept_len'), 'g', 'na')} | "
            f"{r['predicted']['cap']} / {fmt(r.get('realized_cap'), 'g', 'na')} |"
        )
        if r.get("error") or not r.get("levels"):
            lines.append(f"{head} - | - | {r.get('error', 'not measured')} | | |")
        for lv in r.get("levels") or []:
            lines.append(
                f"{head} {lv['concurrency']} | {fmt(lv.get('running'), 'g', 'na')} | "
                f"{fmt(lv.get('decode_tps'), 'g', 'na')} | "
                f"{fmt(lv.get('accept_len'), 'g', 'na')} | {lv['client']['client_tok_s']} |"
            )
    lines += ["", "## Decision per acceptance", ""]
    for s in doc["summary"]:
        lines.append(
            f"- acceptance {s['acceptance']:g}: choice {s['choice']} {fmt(s['choice_tps'], 'g', 'na')} "
            "tok/s, "
            f"grid best off {fmt(s['best_off_tps'], 'g', 'na')} ({s['best_off_at']}), on "
            f"{fmt(s['best_on_tps'], 'g', 'na')} "
            f"({s['best_on_at']}); vs best {fmt(s['choice_vs_best'], 'g', 'na')}, vs seed "
            f"{fmt(s['vs_seed'], 'g', 'na')}; "
            f"crossover {s['crossover']}"
        )
    lines += ["", "## Planner vs realized", ""]
    for r in doc["servers"]:
        pvr = r.get("plan_vs_realized") or {}
        lines.append(
            f"- {r['name']}@{fmt(r.get('acceptance'), 'g', 'na')}: predicted {r['predicted']}; realized "
            f"{pvr.get('realized')}; drift > 1%: {pvr.get('drift_over_1pct')}"
        )
    lines += ["", *final_lines(doc["summary"]), ""]
    return "\n".join(lines)


def svg_plot(doc: dict[str, Any]) -> str:
    """Decode tok/s against running requests, one panel per acceptance: ``off`` (shared), ``seed`` and
    each ``mtp<s>`` as lines (issue 25 item 3: where MTP stops paying)."""
    accs = [s["acceptance"] for s in doc["summary"]]
    servers = [r for r in doc["servers"] if r.get("levels")]
    pts = [
        (lv.get("running") or lv["concurrency"], lv["decode_tps"])
        for r in servers
        for lv in r["levels"]
        if lv.get("decode_tps")
    ]
    if not pts or not accs:
        return '<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>'
    xmax = max(x for x, _ in pts) * 1.05
    ymax = max(y for _, y in pts) * 1.1
    w, h, pad = 420, 300, 50
    colors = {"off": "#000", "seed": "#999", "mtp1": "#1f77b4", "mtp2": "#2ca02c", "mtp3": "#d62728"}
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w * len(accs)}" height="{h + 40}" '
        'font-family="sans-serif" font-size="11">'
    ]
    for k, acc in enumerate(accs):
        x0 = k * w

        def sx(x: float, x0: int = x0) -> float:
            return x0 + pad + (w - 1.5 * pad) * x / xmax

        def sy(y: float) -> float:
            return h - pad + 20 - (h - 1.5 * pad) * y / ymax

        out.append(f'<text x="{x0 + w / 2}" y="14" text-anchor="middle">acceptance {acc:g}</text>')
        out.append(f'<line x1="{sx(0)}" y1="{sy(0)}" x2="{sx(xmax)}" y2="{sy(0)}" stroke="#000"/>')
        out.append(f'<line x1="{sx(0)}" y1="{sy(0)}" x2="{sx(0)}" y2="{sy(ymax)}" stroke="#000"/>')
        for t in range(0, int(xmax) + 1, max(1, int(xmax // 5) // 50 * 50 or 50)):
            out.append(f'<text x="{sx(t)}" y="{sy(0) + 14}" text-anchor="middle">{t}</text>')
        for t in range(0, int(ymax) + 1, max(1, int(ymax // 5) // 500 * 500 or 500)):
            out.append(f'<text x="{sx(0) - 4}" y="{sy(t) + 4}" text-anchor="end">{t}</text>')
        out.append(f'<text x="{x0 + w / 2}" y="{h + 32}" text-anchor="middle">running requests</text>')
        row = 0
        for r in servers:
            if r["name"] != "off" and r.get("acceptance") != acc:
                continue
            line = sorted(
                (lv.get("running") or lv["concurrency"], lv["decode_tps"])
                for lv in r["levels"]
                if lv.get("decode_tps")
            )
            color = colors.get(r["name"], "#555")
            coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in line)
            out.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="1.5"/>')
            out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{color}"/>' for x, y in line]
            out.append(f'<text x="{sx(xmax) - 60}" y="{32 + 13 * row}" fill="{color}">{r["name"]}</text>')
            row += 1
    out.append("</svg>")
    return "\n".join(out)


# --------------------------------------------------------------------------------------------------

_PARTIAL: list[Any] = []


def yield_partial() -> None:
    """Write the results so far (a run cut short still reports)."""
    if _PARTIAL:
        _PARTIAL[0]()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--model", type=Path, default=None, help="make_model.py dir (default: built in WORK)")
    p.add_argument(
        "--deadline-s", type=float, default=900.0, help="wall budget from start, server starts included"
    )
    p.add_argument("--acceptances", default="2.9,1.5,3.5")
    p.add_argument("--acc-per-steps", choices=("chain", "flat"), default="chain")
    p.add_argument("--only", default=None, help="comma-separated config keys to run (e.g. off-bf16,mtp2@1.5)")
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--answer-tokens", type=int, default=192)
    p.add_argument("--decode-log-interval", type=int, default=8)
    p.add_argument("--settle-s", type=float, default=1.0)
    p.add_argument(
        "--start-estimate-s",
        type=float,
        default=100.0,
        help="skip a server that cannot start and measure its cap in what is left",
    )
    p.add_argument("--level-reserve-s", type=float, default=25.0)
    p.add_argument("--port-base", type=int, default=30300)
    p.add_argument("--dry-cpu", action="store_true")
    p.add_argument("--sim-token-rate", type=float, default=60.0, help="--dry-cpu: per request at batch 0")
    p.add_argument("--sim-half-speed", type=int, default=64, help="--dry-cpu: batch of half that rate")
    a = p.parse_args(argv)
    t_start = time.monotonic()
    deadline = t_start + a.deadline_s
    a.out.mkdir(parents=True, exist_ok=True)
    a.work.mkdir(parents=True, exist_ok=True)
    if a.dry_cpu:
        a.answer_tokens = min(a.answer_tokens, 48)
        a.settle_s = min(a.settle_s, 0.6)
    model_dir = a.model or a.work / "model"
    if not (model_dir / "config.json").exists():
        run_module("make_model", str(model_dir.resolve()), "64", check=True)
    gpu_mib = gpu_memory_mib(a.dry_cpu)
    configs, wl = plan_configs(model_dir, gpu_mib, a)
    if a.only:
        only = a.only.split(",")
        configs = sorted((c for c in configs if c.key in only), key=lambda c: only.index(c.key))
    acceptances = [float(x) for x in a.acceptances.split(",")]
    date = dt.date.today().isoformat()
    doc: dict[str, Any] = {
        "date": date,
        "mode": "simulated" if a.dry_cpu else "sglang",
        "sglang_version": SGLANG_VERSION,
        "gpu_memory_mib": gpu_mib,
        "acc_per_steps": a.acc_per_steps,
        "workload": {
            "prompt_tokens": a.prompt_tokens,
            "answer_tokens": a.answer_tokens,
            "planner_workload": dataclasses.asdict(wl),
        },
        "plan": [
            {
                "key": c.key,
                "args": c.args,
                "sim_accept_len": c.sim_accept_len,
                "predicted": predicted_of(c.plan),
            }
            for c in configs
        ],
        "servers": [],
        "summary": [],
    }
    out_json = a.out / f"mtp-{date}.json"

    def write() -> None:
        doc["servers"] = [c.results | {"sim_accept_len": c.sim_accept_len} for c in configs if c.results]
        doc["summary"] = summarize(doc["servers"], acceptances)
        doc["elapsed_s"] = round(time.monotonic() - t_start, 1)
        write_json(out_json, doc)
        (a.out / f"mtp-{date}.md").write_text(markdown(doc))
        (a.out / f"mtp-{date}.svg").write_text(svg_plot(doc))

    _PARTIAL.append(write)
    for c in configs:
        log(f"plan: {c.key}: cap {c.cap}, SIMULATE_ACC_LEN {c.sim_accept_len}, {' '.join(c.args)}")
    first = True
    refused = False  # an MTP candidate without the radix cache never got ready
    for i, cfg in enumerate(configs):
        left = deadline - time.monotonic()
        need = a.start_estimate_s * (1.5 if first and not a.dry_cpu else 1.0) + a.level_reserve_s
        if a.dry_cpu:
            need = 5.0
        if left < need:
            cfg.results.update(
                name=cfg.name,
                acceptance=cfg.acceptance,
                steps=cfg.steps,
                source=cfg.source,
                predicted=predicted_of(cfg.plan),
                levels=[],
                error=f"not started: {left:.0f} s left, needs ~{need:.0f} s",
            )
            log(f"{cfg.key}: {cfg.results['error']}")
            continue
        if refused and cfg.fallback is not None:  # an earlier one was refused: the rest would be too
            alt = cfg.fallback
            cfg.args, cfg.plan, cfg.source, cfg.fallback = alt.args, alt.plan, alt.source, None
        run_server(cfg, model_dir, a, deadline, a.port_base + i)
        first = False
        alt = cfg.fallback
        if "start_s" not in cfg.results and alt is not None and deadline - time.monotonic() > need:
            refused = True
            # the server never got ready (e.g. SGLang refused MTP without the radix cache): measure the
            # planner's same candidate with the radix cache in its place, the failure kept beside it
            log(f"{cfg.key}: never ready ({cfg.results.get('error')}); trying {alt.source}")
            failed = dict(cfg.results)
            run_server(alt, model_dir, a, deadline, a.port_base + 50 + i)
            cfg.args, cfg.plan, cfg.source = alt.args, alt.plan, alt.source
            cfg.results = {**alt.results, "first_attempt": failed}
        write()
    write()
    for line in final_lines(doc["summary"]):
        print(line, flush=True)
    print(DONE, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
