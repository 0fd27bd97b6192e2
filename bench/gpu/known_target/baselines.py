"""The known-target campaign's baselines (issue 27 item 4): the same prompts, sampling and target as
``known_target/run.py``'s regen run, generated the way the original run was done, timed end to end.

  --which default  SGLang with its defaults: only the model path, port, ``--reasoning-parser qwen3`` and
                   ``--tool-call-parser qwen25`` (what the answers need to be parsed as regen's are; the
                   start through ``regen.serving.lifecycle.acquire_server`` also adds ``--enable-metrics``,
                   but none of regen's launch defaults: ``as_given``),
                   a plain async client at concurrency 48
  --which seed     the original run's hand-tuned flags: MTP from the target's own MTP layer (``--speculative-
                   algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1
                   --speculative-num-draft-tokens 4``), ``--max-mamba-cache-size 200 --mem-fraction-static
                   0.93 --mamba-full-memory-ratio 0.6 --max-running-requests 64``; concurrency 64 (its cap)
  --which warmup   SGLang's defaults as ``default``, at concurrency 8 with a handful of prompts (``--n 8``):
                   the campaign's first server, so the first measured run does not pay the fresh machine's
                   cold page cache and JIT caches; its start split is recorded, its time counted nowhere
  --which plan     regen's plan as the 2026-12-01 workflow launched it (cap 265, decode graphs to 265), the
                   same client at 265; ``plan-noprefill`` adds ``--disable-prefill-cuda-graph``: the two
                   measure what SGLang's prefill CUDA graphs cost at start and buy at these prompt lengths

The client is aiohttp (what regen's own client uses, so client overhead is alike), one POST per prompt to
``/v1/chat/completions`` with the fields regen sends minus regen's extras (no ``seed``, no
``return_token_ids``, no ``separate_reasoning`` which SGLang defaults to on anyway, no truncation retry):
``model, messages, temperature 0.6, top_p 0.95, top_k 20, max_tokens, chat_template_kwargs.enable_thinking,
tools`` (rows with tools). Timed as regen's wall is: ``wall_s`` from launching the server to the last answer,
split into ``server_start_s`` (launch to ready, the supervisor's readiness includes a sampled one-token
request) and ``generation_s`` (first request to last answer); stopping the server is not counted.
Measured: output tokens, finish reasons, tool calls, the server's decode plateau and (MTP) the accept
length (``/server_info``'s ``avg_spec_accept_length`` after the run, and the decode lines' ``accept len``)
against ``designed.json``, and regen's memory plan for the same flags (``regen.sglang.plan.plan``) against
what the server realized (cap, mamba slots, KV tokens).

``--dry-cpu``: the same sequence against regen's simulated SGLang in chain mode (the model's chain.json,
cap = the plan's prediction for the flags), to rehearse on CPU.

Usage: python -m bench.gpu.known_target baselines --model DIR --work DIR --which default|seed
       [--n 1000] [--max-tokens 2048] [--concurrency 48|64] [--dry-cpu] [--stop-first RUN_DIR]
Writes WORK/baseline-WHICH.json and prints ``baseline: which=... wall_s=...``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp

from bench.gpu.harness import SGLANG_VERSION, bench_server_cfg, gpu_memory_used_mib, wait_gpu_free
from bench.gpu.known_target import model as kt
from bench.gpu.known_target.run import write_dataset
from bench.gpu.serverlog import (
    accept_lengths,
    decode_lines,
    last_start,
    startup_facts,
    startup_phases,
    steady_state,
    supervisor_times,
)
from bench.harness import log

REPO = Path(__file__).resolve().parents[3]
PARSERS = ["--tool-call-parser", "qwen25"]
SEED_FLAGS = shlex.split(
    "--speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1 "
    "--speculative-num-draft-tokens 4 --max-mamba-cache-size 200 --mem-fraction-static 0.93 "
    "--mamba-full-memory-ratio 0.6 --max-running-requests 64"
)
#: regen's plan for this target and workload as the 2026-12-01 workflow launched it (known-target-2026-12-01
#: logs: gpu0.log), served by a plain client: issue 37 item 2's question, do prefill CUDA graphs pay here
PLAN_FLAGS = shlex.split(
    "--mem-fraction-static 0.92 --max-running-requests 265 --disable-radix-cache "
    "--cuda-graph-max-bs-decode 265"
)
FLAGS = {
    "warmup": PARSERS,  # SGLang's defaults, a handful of prompts: the machine's caches warm, counted nowhere
    "default": PARSERS,
    "seed": [*SEED_FLAGS, *PARSERS],
    "plan": [*PLAN_FLAGS, *PARSERS],
    "plan-noprefill": [*PLAN_FLAGS, "--disable-prefill-cuda-graph", *PARSERS],
}
CONCURRENCY = {"warmup": 8, "default": 48, "seed": 64, "plan": 265, "plan-noprefill": 265}


def request_body(row: dict[str, Any], model: str, max_tokens: int) -> dict[str, Any]:
    """What regen's client sends (regen/generate/client.py ``_body``) minus its extras."""
    return {
        "model": model,
        "messages": row["messages"],
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
        "max_tokens": max_tokens,
        "chat_template_kwargs": {"enable_thinking": True},
        **({"tools": row["tools"]} if row.get("tools") else {}),
    }


async def post_all(
    url: str, rows: list[dict[str, Any]], model: str, max_tokens: int, concurrency: int
) -> list[dict[str, Any]]:
    """Every row once, at most ``concurrency`` in flight; one result per row (errors kept, not retried)."""
    sem = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=3600)
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as session:

        async def one(row: dict[str, Any]) -> dict[str, Any]:
            async with sem:
                t0 = time.time()
                try:
                    async with session.post(
                        f"{url}/v1/chat/completions", json=request_body(row, model, max_tokens)
                    ) as resp:
                        data = await resp.json(content_type=None)
                        status = resp.status
                except (aiohttp.ClientError, TimeoutError) as exc:
                    return {
                        "id": row["id"],
                        "error": f"{type(exc).__name__}: {exc}",
                        "t0": t0,
                        "t1": time.time(),
                    }
                out: dict[str, Any] = {"id": row["id"], "t0": t0, "t1": time.time(), "status": status}
                if status != 200 or not data.get("choices"):
                    out["error"] = f"HTTP {status}: {str(data)[:200]}"
                    return out
                choice = data["choices"][0]
                msg = choice.get("message") or {}
                usage = data.get("usage") or {}
                out.update(
                    finish_reason=choice.get("finish_reason"),
                    completion_tokens=int(usage.get("completion_tokens") or 0),
                    reasoning_tokens=usage.get("reasoning_tokens"),
                    has_reasoning=bool(msg.get("reasoning_content")),
                    tool_calls=len(msg.get("tool_calls") or []),
                    tools=bool(row.get("tools")),
                )
                return out

        return await asyncio.gather(*(one(r) for r in rows))


def summarize_answers(res: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in res if "error" not in r]
    reasons: dict[str, int] = {}
    for r in ok:
        reasons[str(r["finish_reason"])] = reasons.get(str(r["finish_reason"]), 0) + 1
    tokens = [r["completion_tokens"] for r in ok]
    lat = [r["t1"] - r["t0"] for r in ok]
    return {
        "requests": len(res),
        "answered": len(ok),
        "errors": len(res) - len(ok),
        "error_examples": [r["error"] for r in res if "error" in r][:3],
        "output_tokens": sum(tokens),
        "mean_output_tokens": statistics.fmean(tokens) if tokens else None,
        "finish_reasons": reasons,
        "stop_fraction": sum(r["finish_reason"] in ("stop", "tool_calls") for r in ok) / max(1, len(res)),
        "tool_rows": sum(r["tools"] for r in ok),
        "tool_calls_parsed_rows": sum(r["tool_calls"] > 0 for r in ok),
        "rows_with_reasoning": sum(r["has_reasoning"] for r in ok),
        "latency_s": {
            "mean": statistics.fmean(lat) if lat else None,
            "p50": statistics.median(lat) if lat else None,
            "max": max(lat) if lat else None,
        },
    }


def plan_vs_realized(shape_src: Path, gpu_mib: int, args: list[str], log_text: str, info: dict[str, Any]):
    """regen's memory plan for ``args`` against what the server realized (startup log + /server_info)."""
    from regen.sglang.models import ModelShape
    from regen.sglang.plan import plan
    from regen.sglang.realized import compare, parse_startup_log, realized_from_server_info

    planner_args = [a for a in args if a not in PARSERS]
    out: dict[str, Any] = {"sglang_version": SGLANG_VERSION, "gpu_memory_mib": gpu_mib, "args": planner_args}
    try:
        mp = plan(ModelShape.from_config(shape_src), gpu_mib, 1, planner_args, sglang_version=SGLANG_VERSION)
    except Exception as exc:  # the planner's failure on this config is a finding, not a crash
        out["error"] = f"{type(exc).__name__}: {exc}"
        return out, None
    out["predicted"] = mp.summary()
    out["spec_scratch_gib"] = round(mp.spec_scratch_gib, 3)
    out["notes"] = list(mp.notes)
    if log_text or info:
        try:
            realized = realized_from_server_info(dict(info), parse_startup_log(log_text))
            out["realized"] = {k: v for k, v in asdict(realized).items() if v is not None}
            out["drift_over_5pct"] = [str(d) for d in compare(mp, realized)]
        except Exception as exc:
            out["realized_error"] = f"{type(exc).__name__}: {exc}"
    return out, mp


def gpu_used_mib(dry: bool) -> int | None:
    if dry:
        return None
    return gpu_memory_used_mib()


def stop_leftovers(run_dir: Path, dry: bool) -> dict[str, Any]:
    """Stop any supervisor the regen run left (its owner, Snakemake, is gone) and wait for the GPU."""
    from regen.serving.lifecycle import stop_all_servers

    stopped = stop_all_servers(run_dir / "work" / "servers", grace_s=60)
    used = None
    if not dry:
        used = wait_gpu_free(timeout_s=180)
    return {"stopped_supervisors": stopped, "gpu_used_mib": used}


def server_cfg(a: argparse.Namespace, args: list[str], sim_cap: int | None) -> Any:
    simulated = {
        "token_rate": a.sim_token_rate,
        "startup_delay_s": 1.0,
        "tokenizer_path": str(a.model.resolve()),
        "max_running_requests": sim_cap or 64,
    }
    return bench_server_cfg(
        a.model.resolve(),
        a.dry_cpu,
        args=args,
        use_tuner=False,
        port_base=a.port_base,
        simulated=simulated if a.dry_cpu else None,
    )


def as_given(cfg: Any, plan: Any, port: int, model_path: str) -> list[str]:
    """SGLang's launch command with the baseline's flags only: none of regen's launch defaults
    (``regen.serving.launch_args.LAUNCH_DEFAULT_FLAGS``), as the original run launched SGLang."""
    from regen.serving.local_sglang import build_sglang_command

    return build_sglang_command(cfg, plan, port, model_path, launch_defaults=False)


def run_baseline(a: argparse.Namespace) -> dict[str, Any]:
    from regen.serving import lifecycle as server_mod
    from regen.serving.lifecycle import stop_all_servers
    from regen.serving.probes import fetch_server_info

    which = a.which
    work = a.work / f"baseline-{which}"
    work.mkdir(parents=True, exist_ok=True)
    dataset = work / "dataset.jsonl"
    write_dataset(dataset, a.n, a.tools_fraction)  # the regen run's prompts, byte for byte
    rows = [json.loads(line) for line in dataset.read_text().splitlines() if line.strip()]
    args = list(FLAGS[which])
    concurrency = a.concurrency or CONCURRENCY[which]
    if a.dry_cpu:  # plan for the full shape, as the regen rehearsal's tuner does
        shape_src = work / "full-shape-config.json"
        shape_src.write_text(json.dumps(kt.config_json(kt.Shape(), 2, 0)))
        gpu_mib = 143771
        os.environ["REGEN_SIM_CHAIN"] = str((a.model / "chain.json").resolve())
        os.environ["REGEN_SIM_SERVER"] = "bench.sim_chain:chain_server"  # the simulated server's hook
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
        os.environ["REGEN_SIM_TOOL_CALL_PARSER"] = "qwen25"
    else:
        from regen.serving.gpus import gpu_memory_from_nvidia_smi

        shape_src = a.model
        gpu_mib = gpu_memory_from_nvidia_smi()
    pre_plan, mp = plan_vs_realized(shape_src, gpu_mib, args, "", {})
    sim_cap = mp.effective_max_running_requests if mp is not None else None
    servers, logs = work / "servers", work / "logs"
    result: dict[str, Any] = {
        "which": which,
        "mode": "simulated" if a.dry_cpu else "sglang",
        "launch_args": args,
        "concurrency": concurrency,
        "n": a.n,
        "max_tokens": a.max_tokens,
        "tools_fraction": a.tools_fraction,
        "client": "aiohttp, plain: one POST per prompt, no retry",
        "request_fields": sorted(request_body(rows[0], "m", a.max_tokens)),
        "gpu_used_before_mib": gpu_used_mib(a.dry_cpu),
    }
    log(f"{which}: launching the server: {' '.join(args)}; concurrency {concurrency}, {len(rows)} prompts")
    info: dict[str, Any] = {}
    t_launch = time.monotonic()
    launch_epoch = time.time()
    try:
        with server_mod.acquire_server(
            server_cfg(a, args, sim_cap),
            None,
            servers,
            logs,
            owner_pid=os.getpid(),
            command_builder=None if a.dry_cpu else as_given,
        ) as ep:
            t_ready = time.monotonic()
            info = fetch_server_info(ep.url, None)
            log(f"{which}: ready in {t_ready - t_launch:.1f} s at {ep.url}, cap {ep.max_running_requests}")
            t_gen = time.monotonic()
            answers = asyncio.run(post_all(ep.url, rows, ep.model or str(a.model), a.max_tokens, concurrency))
            t_end = time.monotonic()
            after = fetch_server_info(ep.url, None)  # SGLang's own average accept length over the run
            result["avg_spec_accept_length"] = ((after.get("internal_states") or [{}])[0] or {}).get(
                "avg_spec_accept_length"
            )
            result["endpoint"] = {
                "url": ep.url,
                "max_running_requests": ep.max_running_requests,
                "version": ep.version,
            }
    finally:
        t_stop = time.monotonic()
        result["stopped_supervisors"] = stop_all_servers(servers, grace_s=60)
        result["stop_s"] = round(time.monotonic() - t_stop, 1)
        if not a.dry_cpu:
            result["gpu_used_after_stop_mib"] = wait_gpu_free(timeout_s=180)
    result.update(
        wall_s=round(t_end - t_launch, 2),
        server_start_s=round(t_ready - t_launch, 2),
        ready_to_first_request_s=round(t_gen - t_ready, 2),
        generation_s=round(t_end - t_gen, 2),
        launch_epoch=launch_epoch,
    )
    result["answers"] = summarize_answers(answers)
    result["output_tok_s"] = result["answers"]["output_tokens"] / max(1e-9, result["generation_s"])
    log_path = logs / "gpu0.log"
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    this = last_start(text)
    steady = steady_state(decode_lines(this))
    result["server_log"] = {
        "decode_lines": len(decode_lines(this)),
        "decode": steady.to_json() if steady else None,
        "startup_facts": startup_facts(this),
        "startup_phases": startup_phases(this),  # the start split (imports, weights, pools, graphs)
        "supervisor": supervisor_times(text),
    }
    designed = json.loads((a.model / "designed.json").read_text())
    result["mtp"] = {
        "server_avg_accept_len": result.pop("avg_spec_accept_length", None),
        "measured_accept_len": accept_lengths(this),
        "designed_accept_len": designed["mtp"]["accept_length"],
        "designed_accept_len_simulated": designed["mtp"].get("accept_length_simulated"),
        "designed_per_draft_acceptance": designed["mtp"]["per_draft_acceptance"],
    }
    keep = (
        "max_running_requests",
        "max_total_num_tokens",
        "mem_fraction_static",
        "max_mamba_cache_size",
        "speculative_algorithm",
        "cuda_graph_max_bs",
        "chunked_prefill_size",
        "disable_radix_cache",
    )
    states = info.get("internal_states") or [{}]
    result["server_info"] = {k: info.get(k) for k in keep} | {
        "effective_max_running_requests_per_dp": (states[0] or {}).get(
            "effective_max_running_requests_per_dp"
        )
    }
    result["plan"] = plan_vs_realized(shape_src, gpu_mib, args, this, info)[0] if mp else pre_plan
    return result


def baseline_line(r: dict[str, Any]) -> str:
    ans = r["answers"]
    acc = r["mtp"]["server_avg_accept_len"] or (r["mtp"]["measured_accept_len"] or {}).get(
        "running_weighted_mean"
    )
    pred = (r["plan"].get("predicted") or {}).get("effective_max_running_requests")
    real = r["server_info"].get("effective_max_running_requests_per_dp") or r["server_info"].get(
        "max_running_requests"
    )
    fields = {
        "which": r["which"],
        "wall_s": r["wall_s"],
        "server_start_s": r["server_start_s"],
        "generation_s": r["generation_s"],
        "requests": ans["requests"],
        "errors": ans["errors"],
        "output_tokens": ans["output_tokens"],
        "output_tok_s": round(r["output_tok_s"], 1),
        "stop_fraction": round(ans["stop_fraction"], 4),
        "finish": ",".join(f"{k}:{v}" for k, v in sorted(ans["finish_reasons"].items())),
        "accept_len": "na" if acc is None else round(acc, 3),
        "designed_accept_len": round(r["mtp"]["designed_accept_len"], 3),
        "cap_planned": pred,
        "cap_realized": real,
    }
    return "baseline: " + " ".join(f"{k}={v}" for k, v in fields.items())


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, required=True, help="the model step's output")
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--which", choices=sorted(FLAGS), required=True)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--tools-fraction", type=float, default=0.3)
    p.add_argument("--concurrency", type=int, default=None, help="default: CONCURRENCY[--which]")
    p.add_argument("--port-base", type=int, default=30100)
    p.add_argument("--dry-cpu", action="store_true", help="regen's simulated SGLang in chain mode")
    p.add_argument("--sim-token-rate", type=float, default=20000.0, help="simulated decode tok/s per request")
    p.add_argument(
        "--stop-first", type=Path, default=None, help="a regen run dir whose servers to stop first"
    )
    a = p.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    pre = stop_leftovers(a.stop_first, a.dry_cpu) if a.stop_first else None
    out = a.work / f"baseline-{a.which}.json"
    try:
        result = run_baseline(a)
    except Exception as exc:  # e.g. the server never got ready: record why, keep the campaign going
        import traceback

        traceback.print_exc()
        line = f"baseline: which={a.which} error={type(exc).__name__}"
        failed = {"which": a.which, "error": f"{type(exc).__name__}: {exc}", "before": pre, "line": line}
        out.write_text(json.dumps(failed, indent=1, default=str))
        print(line, flush=True)
        return 1
    result["before"] = pre
    line = baseline_line(result)
    result["line"] = line
    out.write_text(json.dumps(result, indent=1, default=str))
    print(
        json.dumps(
            {k: result[k] for k in ("server_log", "mtp", "plan", "server_info")}, indent=1, default=str
        )
    )
    print(line, flush=True)
    return 0
