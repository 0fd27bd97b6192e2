"""``regen tune --sweep`` live on one GPU, real SGLang: candidates, scheduler knobs, projection, exact ids.

One campaign, in this order (every step through regen's own code):

1. ``hw.py``: copy bandwidth and bf16 matmul rate (the roofline's ceilings).
2. The tuner (``regen.sglang.plan.recommend``, bf16 state allowed, ``expected_output_tokens`` given)
   proposes the static recommendation (its running cap holds every request at prompt + max_tokens) and
   three scheduler candidates (cap sized for the expected length; the same plus ``--min-free-slots-delay``;
   that plus ReplaySSM decode, ``--enable-linear-replayssm``, in the memory its ring leaves);
   this script adds the expected-length cap with ``--enable-mixed-chunk`` (measured 2026-11-30: -37%).
3. ``regen.tune.sweep.run_sweep`` measures each for ``--pilot-s`` seconds on a workload with a thinking-length
   spread: 256-token prompts, per-request ``max_tokens`` drawn from a clipped log-normal, ``ignore_eos``.
   Candidates are ranked by the server's steady decode rate (``regen.serving.metrics``: median gen
   throughput of the log's decode lines at the running plateau).
4. On the winner, restarted: (a) exact ids — direct requests with ``return_token_ids`` compare SGLang's
   ``prompt_token_ids`` with regen's rendering (``regen.chat``), and the completion ids with their own
   re-tokenization; (b) a longer run of the same workload through ``regen.generate.client.generate_shard``,
   sized from the time left, against the sweep's projection of it (``regen.tune.closedloop``, drain included);
   (c) a pure-decode plateau (all requests at once, fixed length), the method of the 2026-11-29 run, for
   the fraction of the compute+bandwidth decode bound (state read and written every step, as the issue
   defines it; for a ReplaySSM winner also against the bound of its own, smaller, state traffic).

``--dry-cpu`` runs every step against regen's simulated server with a small workload.
Last line: ``sweep: recommended_tps=… best_tps=… best_vs_recommended=… bound_fraction=… projected_h=…
measured_h=… projection_error=… prompt_ids_equal=…``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import math
import os
import random
import shlex
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.gpu.harness import (
    BASE_ARGS,
    REPO,
    SGLANG_VERSION,
    bench_server_cfg,
    generate_dict,
    gpu_memory_mib,
    make_model,
    measure_hw,
    wait_gpu_free,
    word_prompts,
)
from bench.gpu.roofline import HybridShape, decode_step_cost
from bench.harness import add_campaign_args, fmt, log, publish, result_line, write_json
from regen.types import Sample

TEMPLATE_TOKENS = 5


# --------------------------------------------------------------------------------------- workload
@dataclasses.dataclass(frozen=True, slots=True)
class Lengths:
    """Per-request output lengths: log-normal (median, sigma) clipped to [lo, hi]."""

    median: float
    sigma: float
    lo: int
    hi: int

    def draw(self, n: int, seed: int) -> list[int]:
        rng = random.Random(seed)
        return [
            int(min(self.hi, max(self.lo, round(self.median * math.exp(rng.gauss(0.0, self.sigma))))))
            for _ in range(n)
        ]

    def mean(self, n: int = 200_000) -> float:
        return statistics.fmean(self.draw(n, 99))


def prompts(n: int, prompt_tokens: int, prefix: str, seed: int) -> list[Sample]:
    return word_prompts(n, prompt_tokens, prefix, seed, lowest_id=10)


def generate_cfg(max_tokens: int, ids: bool = True) -> Any:
    """regen's generate config: every request at ``max_tokens`` (a per-sample spread comes from
    ``bench.length_proxy``, between the client and the server)."""
    from regen.runconfig import GenerateConfig

    return dataclasses.replace(GenerateConfig.from_dict(generate_dict(max_tokens)), return_token_ids=ids)


# --------------------------------------------------------------------------------------- server
def server_cfg(model_dir: Path, dry: bool) -> Any:
    simulated = {
        "token_rate": 40,
        "half_speed_running": 48,
        "startup_delay_s": 1.0,
        "tokenizer_path": str(model_dir),
    }
    return bench_server_cfg(model_dir, dry, args=[], use_tuner=True, port_base=30000, simulated=simulated)


def candidates_for(rec: Any, dry: bool) -> list[Any]:
    """The static recommendation and the tuner's scheduler candidates (dry: caps scaled down 8x)."""
    from regen.tune.sweep import SweepCandidate

    def cap(p: Any) -> int:
        n = int(p.effective_max_running_requests)
        return max(4, n // 8) if dry else n

    out = [SweepCandidate(tuple(rec.args), cap(rec.recommended), "recommended")]
    sized = None
    for c in rec.candidates:
        if "sized for the expected" in (c.reasons[0] if c.reasons else ""):
            label = (
                "expected-length cap"
                + (" + refill batching" if "--min-free-slots-delay" in c.args else "")
                + (" + replay decode" if "--enable-linear-replayssm" in c.args else "")
            )
            out.append(SweepCandidate(tuple(c.args), cap(c.plan), label))
            sized = sized or (c if "--min-free-slots-delay" not in c.args else None)
    if sized is not None:  # SGLang's prefill/decode interleaving knob, on the expected-length cap
        out.append(
            SweepCandidate(
                (*sized.args, "--enable-mixed-chunk"), cap(sized.plan), "expected-length cap + mixed chunk"
            )
        )
    return out


# --------------------------------------------------------------------------------------- exact ids
async def _post_all(url: str, bodies: list[dict[str, Any]], concurrency: int) -> list[dict[str, Any] | str]:
    import aiohttp

    sem = asyncio.Semaphore(concurrency)
    out: list[dict[str, Any] | str] = [""] * len(bodies)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(i: int, body: dict[str, Any]) -> None:
            async with sem:
                try:
                    async with session.post(url + "/v1/chat/completions", json=body) as resp:
                        text = await resp.text()
                        out[i] = (
                            json.loads(text) if resp.status == 200 else f"HTTP {resp.status}: {text[:300]}"
                        )
                except Exception as exc:  # a failed request is a reported mismatch, not a crash
                    out[i] = f"{type(exc).__name__}: {exc}"

        await asyncio.gather(*(one(i, b) for i, b in enumerate(bodies)))
    return out


def rendered_prompt_ids(tpl: Any, sample: Sample) -> list[int]:
    """regen's ids of a sample's prompt: ``regen.chat`` renders the prompt turns (generation prompt,
    thinking off) and the model's tokenizer encodes them, as SGLang should."""
    text = tpl.render_dicts(tpl.prompt_messages(sample.messages), True, False)
    return tpl.tokenizer.encode(text, add_special_tokens=False).ids


def exact_ids_check(
    url: str, model: str, model_dir: Path, samples: list[Sample], max_tokens: int
) -> dict[str, Any]:
    """SGLang's prompt_token_ids vs regen's rendered prompt ids, and completion re-tokenization, per
    request."""
    from regen.chat import ChatTemplate, to_template_dicts
    from regen.output.masks import completion_retokenizes_differently

    tpl = ChatTemplate.from_dir(model_dir)
    bodies = []
    expected = [rendered_prompt_ids(tpl, s) for s in samples]
    for s in samples:
        bodies.append(
            {
                "model": model,
                "messages": to_template_dicts(tpl.prompt_messages(s.messages)),
                "max_tokens": max_tokens,
                "temperature": 0.6,
                "top_p": 0.95,
                "top_k": 20,
                "seed": 0,
                "ignore_eos": True,
                "chat_template_kwargs": {"enable_thinking": False},
                "separate_reasoning": True,
                "return_token_ids": True,
            }
        )
    t0 = time.monotonic()
    answers = asyncio.run(_post_all(url, bodies, 64))
    equal = returned = completion_mismatch = 0
    first_diff: list[dict[str, Any]] = []
    for s, want, ans in zip(samples, expected, answers, strict=True):
        choice = (ans.get("choices") or [{}])[0] if isinstance(ans, dict) else {}
        got = choice.get("prompt_token_ids")
        if got is None:
            if len(first_diff) < 3:
                first_diff.append(
                    {"id": s.id, "error": ans if isinstance(ans, str) else "no prompt_token_ids"}
                )
            continue
        returned += 1
        if list(got) == list(want):
            equal += 1
        elif len(first_diff) < 3:
            k = next(
                (i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
                min(len(got), len(want)),
            )
            first_diff.append(
                {
                    "id": s.id,
                    "at": k,
                    "sglang": got[max(0, k - 3) : k + 3],
                    "regen": want[max(0, k - 3) : k + 3],
                    "len_sglang": len(got),
                    "len_regen": len(want),
                }
            )
        out_ids = choice.get("token_ids", choice.get("response_token_ids"))
        if out_ids is not None:
            completion_mismatch += completion_retokenizes_differently(tpl, out_ids)
    return {
        "requests": len(samples),
        **ids_summary(len(samples), returned, equal, completion_mismatch, first_diff),
        "wall_s": round(time.monotonic() - t0, 1),
        "how": "direct HTTP /v1/chat/completions with return_token_ids, rendered by regen.chat",
    }


def ids_summary(
    n: int, returned: int, equal: int, mismatch: int, first: list[dict[str, Any]]
) -> dict[str, Any]:
    """The prompt-ids comparison's counts over ``n`` requests (``returned`` of them with ids)."""
    return {
        "prompt_ids_returned": returned,
        "prompt_ids_equal": equal,
        "prompt_ids_equal_fraction": round(equal / n, 4) if n else None,
        "completion_retokenize_mismatch": mismatch,
        "completion_retokenize_mismatch_rate": round(mismatch / returned, 4) if returned else None,
        "first_differences": first,
    }


def ids_in_records(records: Path, model_dir: Path, samples: dict[str, Sample]) -> dict[str, Any]:
    """The same comparison on what regen's client journaled (``prompt_token_ids`` / ``completion_token_ids``
    of each record, when the client asks for them), for every request of a run."""
    from regen.chat import ChatTemplate
    from regen.output.masks import completion_retokenizes_differently

    tpl = ChatTemplate.from_dir(model_dir)
    n = returned = equal = mismatch = 0
    first: list[dict[str, Any]] = []
    for line in records.read_text().splitlines():
        rec = json.loads(line)
        n += 1
        got, out_ids = rec.get("prompt_token_ids"), rec.get("completion_token_ids")
        sample = samples.get(rec["id"])
        if got is None or sample is None:
            continue
        returned += 1
        want = rendered_prompt_ids(tpl, sample)
        if list(got) == list(want):
            equal += 1
        elif len(first) < 3:
            first.append({"id": rec["id"], "len_sglang": len(got), "len_regen": len(want)})
        if out_ids is not None:
            mismatch += completion_retokenizes_differently(tpl, out_ids)
    return {
        "records": n,
        **ids_summary(n, returned, equal, mismatch, first),
        "how": "regen.generate.client's journaled ids (return_token_ids) "
        "vs regen.chat's rendering of each record's prompt",
    }


def token_export_check(tokenized: Path, records: Path) -> dict[str, Any]:
    """Each row of the workflow's token export against the ids SGLang returned for that sample: the
    input_ids are the prompt ids then the completion ids, and the loss mask covers the completion only
    (one regenerated turn, truncated: no end-of-turn added)."""
    if not tokenized.exists():
        return {"rows": 0, "error": f"{tokenized.name} not written"}
    served = {}
    for line in records.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("prompt_token_ids") is not None and rec.get("completion_token_ids") is not None:
            served[rec["id"]] = (list(rec["prompt_token_ids"]), list(rec["completion_token_ids"]))
    rows = exact = 0
    first: list[dict[str, Any]] = []
    for line in tokenized.read_text().splitlines():
        row = json.loads(line)
        rows += 1
        prompt, completion = served.get(str(row["id"]), (None, None))
        ok = (
            prompt is not None
            and row["input_ids"] == prompt + completion
            and row["loss_mask"] == ([0] * len(prompt) + [1] * len(completion))
        )
        exact += ok
        if not ok and len(first) < 3:
            first.append(
                {"id": row["id"], "len_input_ids": len(row["input_ids"]), "served": prompt is not None}
            )
    return {
        "rows": rows,
        "equal_to_served_ids": exact,
        "first_differences": first,
        "how": "input_ids == SGLang's prompt_token_ids + token_ids; loss_mask 1 exactly on the completion",
    }


def workflow_step(url: str, model_dir: Path, work: Path, budget_s: float, dry: bool) -> dict[str, Any]:
    """The workflow (Snakemake) with token ids on, against the running winner (``server.mode: external``):
    audit -> shard -> tune -> generate -> validate -> merge -> re-audit; then every record's ids checked."""
    import shutil
    import subprocess

    import yaml

    wf = work / "workflow"
    shutil.rmtree(wf, ignore_errors=True)
    wf.mkdir(parents=True)
    for name in ("Snakefile", "rules", "scripts", "schemas", "envs", "report", "regen", "pyproject.toml"):
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, wf / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            shutil.copy2(src, wf / name)
    samples = prompts(64 if dry else 256, 256, "wf", 9)
    with open(wf / "dataset.jsonl", "w") as fh:
        for smp in samples:
            fh.write(json.dumps({"id": smp.id, "messages": [m.to_json() for m in smp.messages]}) + "\n")
    cfg = {
        "dataset": {"path": "dataset.jsonl", "format": "messages", "id_column": "id", "on_bad_row": "stop"},
        "tokenizer": str(model_dir),
        "audit": {"context_limit": 4096},
        "shards": {"count": 4},
        "generate": {
            "regenerate": "last",
            "thinking": "off",
            "sampling": {
                "temperature": 1.0,
                "top_p": 1.0,
                "top_k": -1,
                "max_tokens": 32 if dry else 128,
                "seed": 0,
            },
            "extra_body": {"ignore_eos": True},
            "request_timeout_s": 600,
            "max_attempts": 3,
            "backoff_base_s": 1.0,
        },
        "server": {
            "mode": "external",
            "url": url,
            "model_path": str(model_dir),
            "model_config": str(model_dir),
        },
        # dummy weights with ignore_eos: every answer ends at max_tokens, which the truncation gate rejects
        "reaudit": {"override_gates": True},
        # ... and which the token export leaves out by default: keep them (without an end-of-turn)
        "export": {"enabled": True, "include_truncated": True},
    }
    if "return_token_ids" in (REPO / "schemas" / "config.schema.yaml").read_text():
        cfg["generate"]["return_token_ids"] = True  # the client's token-id switch (issue 13)
    (wf / "config.yaml").write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, *shlex.split("-m snakemake --cores 8 --configfile config.yaml --scheduler greedy")]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=wf, capture_output=True, text=True, timeout=budget_s)
        rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired as exc:
        rc, tail = 124, str(exc.stdout or "")[-1500:] + str(exc.stderr or "")[-1500:]
    out: dict[str, Any] = {
        "snakemake_rc": rc,
        "wall_s": round(time.monotonic() - t0, 1),
        "tail": tail,
        "records": 0,
        "command": " ".join(cmd[2:]),
    }
    by_id = {smp.id: smp for smp in samples}
    recs = sorted((wf / "results" / "generations").glob("*.jsonl"))
    merged = wf / "_all_records.jsonl"
    with open(merged, "w") as fh:
        for r in recs:
            if not r.name.endswith(".failed.jsonl"):
                fh.write(r.read_text())
    out["ids"] = ids_in_records(merged, model_dir, by_id)
    out["records"] = out["ids"]["records"]
    summary = wf / "results" / "reaudit" / "summary.json"
    if summary.exists():
        out["reaudit_summary"] = json.loads(summary.read_text())
    out["token_export"] = token_export_check(wf / "results" / "export" / "tokenized.jsonl", merged)
    logs = work / "winner" / "logs"
    shutil.copytree(wf / "logs", logs / "workflow-logs", dirs_exist_ok=True) if (
        wf / "logs"
    ).exists() else None
    return out


# --------------------------------------------------------------------------------------- the winner
def read_log(path: Path, offset: int) -> str:
    from regen.serving.metrics import log_since

    return log_since(path, offset)


@contextlib.contextmanager
def restarted(cand: Any, model_dir: Path, dry: bool, root: Path) -> Iterator[tuple[Any, float]]:
    """The candidate's server started afresh through ``acquire_server`` on an OS-chosen port (servers and
    logs under ``root``); yields (endpoint, seconds to ready); stops it afterwards."""
    from regen.serving.lifecycle import acquire_server, stop_all_servers
    from regen.serving.ports import any_free_port
    from regen.tune.sweep import candidate_plan, sweep_command_builder, sweep_server_cfg

    base = sweep_server_cfg(server_cfg(model_dir, dry))
    cfg = dataclasses.replace(base, port_base=any_free_port(base.host))
    t = time.monotonic()
    try:
        with acquire_server(
            cfg,
            candidate_plan(cand),
            root / "servers",
            root / "logs",
            owner_pid=os.getpid(),
            command_builder=sweep_command_builder,
        ) as ep:
            yield ep, round(time.monotonic() - t, 1)
    finally:
        stop_all_servers(root / "servers", grace_s=60)


def shard_job_in(d: Path, samples: list[Sample], cfg: Any, ep: Any, shard: str) -> Any:
    """A shard job whose journal, records and failures are in ``d``."""
    from regen.generate.client import ShardJob

    return ShardJob(samples, d / "journal.jsonl", d / "records.jsonl", d / "failed.jsonl", cfg, ep, shard)


def run_on_winner(
    cand: Any,
    model_dir: Path,
    dry: bool,
    work: Path,
    long_samples: list[Sample],
    long_lengths: list[int],
    id_samples: list[Sample],
    decode_requests: int,
    decode_tokens: int,
    workflow_s: float = 0.0,
) -> dict[str, Any]:
    """Restart the winner through acquire_server; exact ids, the long run, the pure-decode plateau."""
    from bench.length_proxy import proxied
    from regen.generate.client import generate_shard
    from regen.serving.metrics import log_size, server_steady_state

    server_log = work / "winner" / "logs" / "gpu0.log"
    out: dict[str, Any] = {"label": cand.label, "args": list(cand.args)}
    try:
        with restarted(cand, model_dir, dry, work / "winner") as (ep, out["ready_s"]):
            out["effective_cap"] = ep.max_running_requests
            log(f"winner {cand.label}: ready in {out['ready_s']} s, cap {ep.max_running_requests}")
            out["exact_ids"] = exact_ids_check(ep.url, ep.model or "default", model_dir, id_samples, 32)
            log(f"exact ids: {brief(out['exact_ids'], 'first_differences')}")
            by_id = {s.id: n for s, n in zip(long_samples, long_lengths, strict=True)}
            if not long_samples:  # the sweep measured no rate to size it from
                out["long_run"] = {"skipped": "the sweep measured no rate to size it from"}
            else:
                d = work / "winner" / "long"
                d.mkdir(parents=True, exist_ok=True)
                offset = log_size(server_log)
                t0 = time.time()
                with proxied(ep, by_id) as via:
                    stats = generate_shard(
                        shard_job_in(d, long_samples, generate_cfg(max(long_lengths)), via, "long")
                    )
                wall = time.time() - t0
                tokens = reasons = 0
                finish: dict[str, int] = {}
                for line in (d / "records.jsonl").read_text().splitlines():
                    rec = json.loads(line)
                    tokens += int((rec.get("usage") or {}).get("completion_tokens") or 0)
                    fr = str(rec.get("finish_reason"))
                    finish[fr] = finish.get(fr, 0) + 1
                    reasons += 1
                steady = server_steady_state(read_log(server_log, offset))
                out["long_run"] = {
                    "requests": len(long_samples),
                    "records": reasons,
                    "failed": int(getattr(stats, "failed", 0)),
                    "output_tokens": tokens,
                    "expected_output_tokens": sum(long_lengths),
                    "wall_s": round(wall, 2),
                    "client_out_tok_s": round(tokens / wall, 1),
                    "finish_reasons": finish,
                    "server_steady_state": steady.to_json() if steady else None,
                    "wall_method": "regen.generate.client.generate_shard: first request sent to last answer",
                }
                log(f"long run: {reasons} records, {tokens} tokens in {wall:.1f} s")
                by_sample = {smp.id: smp for smp in long_samples}
                out["long_run_ids"] = ids_in_records(d / "records.jsonl", model_dir, by_sample)
                log(f"long run ids: {brief(out['long_run_ids'], 'first_differences')}")
            # pure decode plateau: every request at once, one fixed length (the 2026-11-29 method)
            d2 = work / "winner" / "decode"
            d2.mkdir(parents=True, exist_ok=True)
            offset = log_size(server_log)
            plain = prompts(decode_requests, 256, "dec", 11)
            t0 = time.time()
            generate_shard(shard_job_in(d2, plain, generate_cfg(decode_tokens), ep, "decode"))
            steady = server_steady_state(read_log(server_log, offset))
            out["pure_decode"] = {
                "requests": decode_requests,
                "output_tokens_each": decode_tokens,
                "wall_s": round(time.time() - t0, 1),
                "server_steady_state": steady.to_json() if steady else None,
            }
            log(f"pure decode: {out['pure_decode']}")
            if workflow_s > 0:
                out["workflow"] = workflow_step(ep.url, model_dir, work, workflow_s, dry)
                log(f"workflow: {brief(out['workflow'], 'tail', 'reaudit_summary')}")
    except Exception as exc:  # keep what was measured
        out["error"] = f"{type(exc).__name__}: {exc}"[:3000]
        log(f"winner: FAILED {out['error']}")
    finally:
        if not dry:
            out["gpu_used_after_stop_mib"] = wait_gpu_free()
    return out


# --------------------------------------------------------------------------------------- summary
def bound_for(
    shape: HybridShape, steady: dict[str, Any] | None, hw: dict[str, Any], ssm: str, ring: int | None = None
) -> dict[str, Any] | None:
    """The compute+bandwidth bound of the measured plateau: the issue's (state read and written every
    step), or with ``ring`` the traffic of ReplaySSM decode (state written every ``ring`` steps)."""
    if not steady:
        return None
    cost = decode_step_cost(shape, steady["plateau_running"], steady["mean_context_tokens"], ssm, ring)
    bw, fl = hw["hbm_bytes_per_s"], hw["bf16_flops_per_s"]
    gemm = cost.gemm_peak_bound_tps(fl, bw)
    return {
        "ssm_dtype": ssm,
        "state_traffic": f"ReplaySSM, ring {ring}" if ring else "read + write every step",
        "step": cost.to_json(),
        "bandwidth_bound_tps": round(cost.bandwidth_bound_tps(bw), 0),
        "compute_bandwidth_bound_tps": round(gemm, 0),
        "measured_tps": steady["median_decode_tps"],
        "fraction": round(steady["median_decode_tps"] / gemm, 4),
        "method": steady["method"],
    }


def replay_ring_len(args: list[str]) -> int | None:
    """The ReplaySSM ring length of a launch (``--linear-replayssm-cache-len``); None: off."""
    from regen.sglang.flags import parse_flags

    flags = parse_flags(list(args))
    return flags.linear_replayssm_cache_len if flags.enable_linear_replayssm else None


def recommendation(model_dir: Path, gpu_mib: int, prompt_tokens: int, *, replay_decode: bool) -> Any:
    """regen's recommendation for the bench model under the workload it plans for: prompts of
    ``prompt_tokens`` words, log-normal answers of median 512 (64-2,048), bf16 state allowed."""
    from regen.sglang.models import ModelShape
    from regen.sglang.plan import Workload
    from regen.sglang.recommend import recommend

    lengths = Lengths(median=512, sigma=0.7, lo=64, hi=2048)
    prompt = prompt_tokens + TEMPLATE_TOKENS
    workload = Workload(
        prompt_p50=prompt,
        prompt_p99=prompt,
        max_tokens=lengths.hi,
        target_concurrency=4096,
        expected_output_tokens=round(lengths.mean()),
    )
    shape = ModelShape.from_config(str(model_dir))
    return recommend(
        shape,
        gpu_mib,
        1,
        list(BASE_ARGS),
        workload,
        SGLANG_VERSION,
        allow_fp8_kv=False,
        allow_bf16_state=True,
        allow_replay_decode=replay_decode,
    )


def brief(doc: dict[str, Any], *left_out: str) -> str:
    """``doc`` as one JSON line for the log, without its bulky keys."""
    return json.dumps({k: v for k, v in doc.items() if k not in left_out})


def final_line(s: dict[str, Any]) -> str:
    return result_line(
        "sweep",
        recommended_tps=fmt(s.get("recommended_tps")),
        best_tps=fmt(s.get("best_tps")),
        best_vs_recommended=fmt(s.get("best_vs_recommended"), 3),
        bound_fraction=fmt(s.get("bound_fraction"), 3),
        projected_h=fmt(s.get("projected_h"), 4),
        measured_h=fmt(s.get("measured_h"), 4),
        projection_error=fmt(s.get("projection_error"), 3),
        prompt_ids_equal=fmt(s.get("prompt_ids_equal"), 3),
    )


def summarize(doc: dict[str, Any], shape: HybridShape) -> dict[str, Any]:
    sweep = doc.get("sweep") or {}
    rows = sweep.get("candidates") or []
    rec = next((r for r in rows if r["label"] == "recommended" and r["ok"]), None)
    best = rows[sweep["best_index"]] if rows and "best_index" in sweep else None
    s: dict[str, Any] = {
        "recommended_tps": rec.get("decode_tok_s") if rec else None,
        "best_label": best["label"] if best else None,
        "best_tps": best.get("decode_tok_s") if best else None,
        "rate_method": sweep.get("rate_method"),
    }
    if s["recommended_tps"] and s["best_tps"]:
        s["best_vs_recommended"] = round(s["best_tps"] / s["recommended_tps"], 4)
    win = doc.get("winner") or {}
    ssm = "bfloat16" if best and "bfloat16" in best["args"] else "float32"
    pure = (win.get("pure_decode") or {}).get("server_steady_state")
    s["bound_pure_decode"] = bound_for(shape, pure, doc["hardware"], ssm)
    s["bound_sweep_workload"] = bound_for(
        shape, (best or {}).get("server_steady_state"), doc["hardware"], ssm
    )
    s["bound_fraction"] = (s["bound_pure_decode"] or {}).get("fraction")
    ring = replay_ring_len(best["args"]) if best else None
    if ring:  # the winner moves less state than the bound assumes: its own bound too
        s["bound_pure_decode_replay_traffic"] = bound_for(shape, pure, doc["hardware"], ssm, ring)
        s["bound_fraction_replay_traffic"] = (s["bound_pure_decode_replay_traffic"] or {}).get("fraction")
    proj = doc.get("projection") or {}
    lr = win.get("long_run") or {}
    if proj.get("closed_loop") and lr.get("wall_s"):
        s["projected_h"] = proj["closed_loop"]["gpu_hours"]
        s["measured_h"] = lr["wall_s"] / 3600
        s["projection_error"] = round(s["projected_h"] / s["measured_h"] - 1, 4)
        s["plain_projected_h"] = proj.get("plain", {}).get("gpu_hours")
        if s["plain_projected_h"]:
            s["plain_projection_error"] = round(s["plain_projected_h"] / s["measured_h"] - 1, 4)
    checks = {
        "direct_http": (win.get("exact_ids") or {}, "requests"),
        "long_run_client": (win.get("long_run_ids") or {}, "records"),
        "workflow": ((win.get("workflow") or {}).get("ids") or {}, "records"),
    }
    total = equal = returned = mismatch = 0
    per: dict[str, Any] = {}
    for name, (c, key) in checks.items():
        if not c.get(key):
            continue
        total += c[key]
        equal += c["prompt_ids_equal"]
        returned += c["prompt_ids_returned"]
        mismatch += c["completion_retokenize_mismatch"]
        per[name] = {
            k: c.get(k)
            for k in (key, "prompt_ids_returned", "prompt_ids_equal", "completion_retokenize_mismatch_rate")
        }
    s["prompt_ids_checks"] = per
    s["prompt_ids_requests"] = total
    s["prompt_ids_equal"] = round(equal / total, 4) if total else None
    s["completion_retokenize_mismatch_rate"] = round(mismatch / returned, 4) if returned else None
    wf = win.get("workflow") or {}
    if wf:
        s["workflow"] = {
            "snakemake_rc": wf.get("snakemake_rc"),
            "records": wf.get("records"),
            "wall_s": wf.get("wall_s"),
            "prompt_ids_equal": (wf.get("ids") or {}).get("prompt_ids_equal"),
            "token_export_rows": (wf.get("token_export") or {}).get("rows"),
            "token_export_equal_to_served_ids": (wf.get("token_export") or {}).get("equal_to_served_ids"),
        }
    return s


# --------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/gpu/tune_live.py", description=__doc__.split("\n")[0])
    add_campaign_args(p)
    p.add_argument("--pilot-s", type=float, default=None)
    p.add_argument("--deadline-s", type=float, default=1330)
    p.add_argument(
        "--sweep-budget-s", type=float, help="no new candidate past this many seconds of the sweep"
    )
    p.add_argument("--workflow-s", type=float, default=None, help="budget of the workflow step (0: off)")
    p.add_argument("--labels", default=None, help="comma-separated candidate labels to run (default: all)")
    p.add_argument("--hw-json", default=None, help="measured hardware (hw.py's JSON) instead of measuring")
    a = p.parse_args(argv)
    dry = a.dry_cpu
    work = a.work or Path("/tmp/regen-tune-live" + ("-dry" if dry else ""))
    work.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    t_start = time.monotonic()

    def elapsed() -> float:
        return time.monotonic() - t_start

    date = dt.date.today().isoformat()
    stem = f"sweep-{date}" + ("-dry" if dry else "")
    json_path = a.out / f"{stem}.json"
    lengths = (
        Lengths(median=24, sigma=0.7, lo=4, hi=96) if dry else Lengths(median=512, sigma=0.7, lo=64, hi=2048)
    )
    pilot_s = a.pilot_s or (12.0 if dry else 45.0)
    a.sweep_budget_s = (80.0 if dry else 600.0) if a.sweep_budget_s is None else a.sweep_budget_s
    a.workflow_s = (150.0 if dry else 100.0) if a.workflow_s is None else a.workflow_s
    prompt_tokens = 256

    hw = {**json.loads(a.hw_json), "measured": True} if a.hw_json else measure_hw(dry)
    log(f"hardware: {hw}")
    model_dir = work / "model"
    model_cfg = make_model(model_dir, 64)
    shape = HybridShape.from_config(model_cfg)
    gpu_mib = gpu_memory_mib(dry)
    mean_len = lengths.mean()

    from bench.length_proxy import behind_proxy
    from regen.tune.projection import project
    from regen.tune.sweep import SweepTimes, closed_loop_projection, run_sweep

    rec = recommendation(model_dir, gpu_mib, prompt_tokens, replay_decode=True)
    cands = candidates_for(rec, dry)
    if a.labels:
        cands = [c for c in cands if c.label.replace(" ", "_") in a.labels.split(",")]
    for c in cands:
        log(f"candidate {c.label}: cap {c.predicted_running}: {' '.join(c.args)}")
    doc: dict[str, Any] = {
        "date": date,
        "dry_cpu": dry,
        "sglang_version": SGLANG_VERSION,
        "hardware": hw,
        "model": {"layers": 64, "params_b": round(shape.total_params() / 1e9, 3)},
        "workload": {
            "prompt_tokens": prompt_tokens,
            "lengths": dataclasses.asdict(lengths),
            "mean_output_tokens": round(mean_len, 1),
            "ignore_eos": True,
            "pilot_s": pilot_s,
        },
        "tuner": rec.to_json(),
        "candidates": [
            {"label": c.label, "args": list(c.args), "predicted_running": c.predicted_running} for c in cands
        ],
    }
    write_json(json_path, doc)

    # ---- the sweep (regen.tune.sweep.run_sweep) -------------------------------------------------------
    n_pilot = 300 if dry else 4000
    pilot = prompts(n_pilot, prompt_tokens, "pilot", 1)
    pilot_by_id = dict(zip((s.id for s in pilot), lengths.draw(n_pilot, 2), strict=True))
    log(f"sweep: {len(cands)} candidates x {pilot_s:.0f} s")
    # pilots as a run sends them (token ids on); candidates in priority order, no new one after the budget
    # each request's max_tokens from pilot_by_id: set between regen's client and the server
    result = run_sweep(
        server_cfg(model_dir, dry),
        cands,
        pilot,
        generate_cfg(lengths.hi),
        pilot_s,
        work / "sweep",
        times=SweepTimes(stop_grace_s=60, budget_s=a.sweep_budget_s),
        endpoint_wrapper=behind_proxy(pilot_by_id),
    )
    doc["sweep"] = result.to_json()
    doc["elapsed_after_sweep_s"] = round(elapsed(), 1)
    write_json(json_path, doc)
    best = result.best
    log(
        f"sweep: best {best.label} at {best.rate_tok_s:.0f} tok/s ({result.rate_method}); elapsed "
        + f"{elapsed():.0f} s"
    )

    # ---- the long run: sized from the time left ----------------------------------------------------
    restart_s = 20 if dry else 130
    decode_tokens = 24 if dry else 384
    decode_requests = int(best.measurement.concurrency) if best.measurement else 64
    decode_s = 15 if dry else decode_requests * decode_tokens / max(1.0, best.rate_tok_s) + 30
    import importlib.util

    workflow_s = a.workflow_s if importlib.util.find_spec("snakemake") is not None else 0.0
    reserve = restart_s + decode_s + (10 if dry else 60) + (5 if dry else 20)
    left = a.deadline_s - elapsed() - reserve
    min_long, max_long = (20.0, 30.0) if dry else (100.0, 300.0)
    if left - workflow_s < min_long:  # the longer run (the projection check) goes before the workflow
        workflow_s = 0.0
    if workflow_s <= 0:
        log("workflow step: off (snakemake not importable, --workflow-s 0, or no time left for it)")
    reserve += workflow_s
    long_s = max(min_long, min(max_long, left - workflow_s))
    n_long = int(long_s * best.rate_tok_s / mean_len)
    log(
        f"long run: {n_long} requests (~{long_s:.0f} s at {best.rate_tok_s:.0f} tok/s); "
        + f"reserve {reserve:.0f} s"
    )
    long_samples = prompts(n_long, prompt_tokens, "long", 3)
    long_lengths = lengths.draw(n_long, 4)
    fixed_s = shape.gemm_params() * 2.0 / hw["hbm_bytes_per_s"]  # weights streamed once per decode step
    if n_long > 0:
        closed = closed_loop_projection(result, n_long, 1, 1, lengths=long_lengths, fixed_step_s=fixed_s)
        fitted = closed_loop_projection(result, n_long, 1, 1, lengths=long_lengths)
        plain = project(n_long, statistics.fmean(long_lengths), best.rate_tok_s, 1, 1)
        doc["projection"] = {
            "closed_loop": closed,
            "closed_loop_fit": fitted,
            "plain": plain.to_json(),
            "fixed_step_s": fixed_s,
            "how": "closed_loop: regen.tune.closedloop with the step model fitted to the sweep's plateaus of "
            "the best one's state dtype (weights/bandwidth as the fixed part when one batch size); "
            "plain: tokens / rate",
        }
        log(f"projection: {json.dumps(doc['projection'])}")
    write_json(json_path, doc)
    id_samples = prompts(16 if dry else 256, prompt_tokens, "ids", 5)
    doc["winner"] = run_on_winner(
        best,
        model_dir,
        dry,
        work,
        long_samples,
        long_lengths,
        id_samples,
        decode_requests,
        decode_tokens,
        workflow_s,
    )
    doc["summary"] = summarize(doc, shape)
    doc["final_line"] = final_line(doc["summary"])
    doc["elapsed_s"] = round(elapsed(), 1)
    return publish(a.out, stem, doc, markdown(doc), doc["final_line"])


def markdown(doc: dict[str, Any]) -> str:
    s = doc["summary"]
    hw = doc["hardware"]
    w = doc["workload"]
    dry = "(DRY RUN: simulated server) " if doc["dry_cpu"] else ""
    lines = [
        f"# regen tune --sweep live on {dry}{hw.get('gpu', '?')} — {doc['date']}",
        "",
        f"SGLang {doc['sglang_version']}, dummy Qwen3.6-27B-shaped model (64 layers, `--load-format dummy`). "
        f"Workload: {w['prompt_tokens']}-token prompts, per-request max_tokens log-normal {w['lengths']} "
        f"(mean {w['mean_output_tokens']}), ignore_eos; pilot {w['pilot_s']:.0f} s per candidate. "
        f"Hardware measured in the run: {hw['hbm_bytes_per_s'] / 1e12:.2f} TB/s copy, "
        f"{hw['bf16_flops_per_s'] / 1e12:.0f} TFLOP/s bf16.",
        "",
        "| candidate | flags | predicted cap | plateau running | decode tok/s (server, plateau median) "
        "| client out tok/s (window) |",
        "|---|---|---|---|---|---|",
    ]
    sw = doc.get("sweep") or {}
    for i, r in enumerate(sw.get("candidates") or []):
        st = r.get("server_steady_state") or {}
        mark = " **(best)**" if i == sw.get("best_index") else ""
        head = f"| {r['label']}{mark} | `{' '.join(r['args'])}` | {r.get('predicted_running')} "
        measured = (
            f"{st.get('plateau_running', '–')} | {r.get('decode_tok_s') or '–'} | {r.get('out_tok_s', '–')}"
        )
        lines.append(
            head + (f"| {measured} |" if r["ok"] else f"| failed: {str(r.get('error'))[:200]} | | |")
        )
    proj = doc.get("projection") or {}
    win = doc.get("winner") or {}
    lines += [
        "",
        "## Projection vs the measured run (winner restarted)",
        "",
        f"- projection (headline, closed loop, fixed step part = weights / measured bandwidth): "
        f"`{json.dumps(proj.get('closed_loop'))}`",
        "- projection (closed loop, step line fitted to the sweep's plateaus): "
        f"`{json.dumps(proj.get('closed_loop_fit'))}`",
        f"- projection (plain: tokens / steady rate): `{json.dumps(proj.get('plain'))}`",
        f"- measured long run: `{json.dumps(win.get('long_run'))}`",
        f"- pure-decode plateau: `{json.dumps(win.get('pure_decode'))}`",
        f"- exact ids: `{json.dumps(win.get('exact_ids'))}`",
    ]
    lines += ["", "## Summary", ""]
    for k, v in s.items():
        lines.append(f"- {k}: {json.dumps(v) if isinstance(v, dict | list) else v}")
    lines += ["", f"`{doc['final_line']}`", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
