"""Where a pure-decode step's time goes on the GPU (issue 17: the gap to the compute+bandwidth bound).

1. ``hw.py``: copy bandwidth and the bf16 peak (8192^3 matmul), as ``tune_live.py`` measures them.
2. ``hw.py --decode-gemms``: every decode GEMM of the model (``roofline.HybridShape.decode_gemms``) at the
   plateau's batch, timed as SGLang runs an unquantized bf16 linear (``F.linear``): the step's GEMM time as
   cuBLAS delivers it at that many rows, which the bound assumes to run at the 8192^3 peak.
3. The sweep's winner (regen's tuner, the label given) restarted through ``acquire_server``; a pure-decode
   load (``--batch`` requests x ``--tokens``, ``ignore_eos``); at the running plateau SGLang's own
   ``/start_profile`` records ``--steps`` decode steps (GPU activities only); the trace's kernels are
   summed by kind per step.
4. Two bounds for the measured plateau rate: the issue's (GEMMs at the peak) and the achievable one
   (GEMMs as measured at this batch), each plus state, KV and weights traffic at the copy bandwidth.

``--dry-cpu`` runs steps 3-4 against regen's simulated server (no trace there; the parse is tested on the
GPU's trace only). Last line: ``profile: batch=… step_ms=… gemm_ms=… linear_attn_ms=… attention_ms=…
sampling_ms=… other_ms=… gemm_tflop_s=… bound_fraction=… achievable_fraction=…``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.gpu.harness import (
    SGLANG_VERSION,
    gpu_memory_mib,
    make_model,
    measure_hw,
    run_module,
)
from bench.gpu.roofline import HybridShape, decode_step_cost
from bench.gpu.tune_live import (
    candidates_for,
    generate_cfg,
    log,
    prompts,
    recommendation,
    restarted,
)
from bench.harness import add_campaign_args, fmt, publish, result_line

#: kernel-name patterns, first match wins (SGLang 0.5.17 on Hopper: nvjet/cutlass GEMMs, fla/triton GDN,
#: FA3 attention, flashinfer sampling)
KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("linear_attn", re.compile(r"recurrent|gated_delta|replayssm|gdn|conv1d", re.I)),
    ("sampling", re.compile(r"sampling|topk|top_k|top_p|argmax|radix", re.I)),
    ("attention", re.compile(r"FlashAttn|flash::|fmha|mha_fwd|attention", re.I)),
    ("gemm", re.compile(r"gemm|nvjet|xmma|cutlass|cublas|matmul|splitK", re.I)),
    ("norm_act", re.compile(r"norm|silu|act_and_mul|gelu|rope|rotary", re.I)),
    ("sampling", re.compile(r"softmax|sort", re.I)),
)


def kind_of(name: str) -> str:
    return next((kind for kind, pat in KINDS if pat.search(name)), "other")


def summarize_trace(path: Path, steps: int) -> dict[str, Any]:
    """GPU kernel time per kind and the GPU span, per step, from a torch-profiler chrome trace."""
    with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as fh:
        events = json.load(fh).get("traceEvents", [])
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    if not kernels:
        return {"kernels": 0, "error": f"no kernel events in {path.name}"}
    by_kind: dict[str, float] = {}
    top: dict[str, float] = {}
    for e in kernels:
        kind = kind_of(e["name"]) if e["cat"] == "kernel" else "memcpy"
        by_kind[kind] = by_kind.get(kind, 0.0) + e["dur"]
        top[e["name"]] = top.get(e["name"], 0.0) + e["dur"]
    span_us = max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)
    busy_us = sum(by_kind.values())
    return {
        "kernels": len(kernels),
        "steps": steps,
        "span_ms_per_step": round(span_us / steps / 1e3, 2),
        "busy_ms_per_step": round(busy_us / steps / 1e3, 2),
        "ms_per_step": {
            k: round(v / steps / 1e3, 2) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])
        },
        "top_kernels_ms_per_step": {
            n[:120]: round(v / steps / 1e3, 3) for n, v in sorted(top.items(), key=lambda kv: -kv[1])[:15]
        },
        "how": "torch-profiler GPU activities from SGLang's /start_profile; "
        "kernel durations summed by name pattern",
    }


def running_now(log_path: Path) -> int:
    found = (
        re.findall(r"#running-req: (\d+)", log_path.read_text(errors="replace")) if log_path.exists() else []
    )
    return int(found[-1]) if found else 0


def post_json(url: str, body: dict[str, Any], timeout: float) -> str:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read().decode()[:500]


def profile_server(
    cand: Any, model_dir: Path, work: Path, batch: int, tokens: int, steps: int, dry: bool
) -> dict[str, Any]:
    """The winner restarted; a pure-decode load; SGLang's profiler over ``steps`` plateau steps."""
    from regen.generate.client import ShardJob, generate_shard
    from regen.serving.metrics import log_since, log_size, server_steady_state

    server_log = work / "logs" / "gpu0.log"
    trace_dir = work / "trace"
    out: dict[str, Any] = {"label": cand.label, "args": list(cand.args)}
    try:
        with restarted(cand, model_dir, dry, work) as (ep, out["ready_s"]):
            log(f"{cand.label}: ready in {out['ready_s']} s, cap {ep.max_running_requests}")
            d = work / "decode"
            d.mkdir(parents=True, exist_ok=True)
            offset = log_size(server_log)
            load = threading.Thread(
                target=generate_shard,
                args=(
                    ShardJob(
                        prompts(batch, 256, "prof", 13),
                        d / "journal.jsonl",
                        d / "records.jsonl",
                        d / "failed.jsonl",
                        generate_cfg(tokens),
                        ep,
                        "profile",
                    ),
                ),
                daemon=True,
            )
            load.start()
            deadline = time.monotonic() + 120
            while running_now(server_log) < 0.98 * batch and time.monotonic() < deadline and load.is_alive():
                time.sleep(0.5)
            out["running_at_profile"] = running_now(server_log)
            if not dry:
                time.sleep(3)  # a few plateau steps first
                body = {
                    "output_dir": str(trace_dir),
                    "num_steps": steps,
                    "activities": ["GPU"],
                    "with_stack": False,
                    "record_shapes": False,
                    "profile_id": "decode",
                }
                out["start_profile"] = post_json(ep.url + "/start_profile", body, 120)
                log(f"start_profile at {out['running_at_profile']} running: {out['start_profile']}")
            load.join(timeout=600)
            steady = server_steady_state(log_since(server_log, offset))
            out["pure_decode"] = steady.to_json() if steady else None
            log(f"pure decode: {out['pure_decode']}")
            traces = sorted(trace_dir.glob("*.trace.json*")) if trace_dir.exists() else []
            out["trace"] = summarize_trace(traces[-1], steps) if traces else {"error": "no trace written"}
            log(f"trace: {json.dumps(out['trace'])}")
    except Exception as exc:  # keep what was measured
        out["error"] = f"{type(exc).__name__}: {exc}"[:3000]
        log(f"FAILED {out['error']}")
    return out


def bounds(
    shape: HybridShape, steady: dict[str, Any], hw: dict[str, Any], gemm_s: float | None
) -> dict[str, Any]:
    """The issue's bound (GEMMs at the peak) and the achievable one (GEMMs as measured at this batch)."""
    batch, ctx = steady["plateau_running"], steady["mean_context_tokens"]
    cost = decode_step_cost(shape, batch, ctx, "bfloat16")
    bw = hw["hbm_bytes_per_s"]
    traffic_s = (cost.state_bytes + cost.kv_bytes) / bw
    issue = cost.gemm_peak_bound_tps(hw["bf16_flops_per_s"], bw)
    out = {
        "step": cost.to_json(),
        "state_kv_s": traffic_s,
        "issue_bound_tps": round(issue, 1),
        "measured_tps": steady["median_decode_tps"],
        "bound_fraction": round(steady["median_decode_tps"] / issue, 4),
    }
    if gemm_s:
        achievable = cost.bound_tps(gemm_s, bw)
        out |= {
            "measured_gemm_s": gemm_s,
            "achievable_bound_tps": round(achievable, 1),
            "achievable_fraction": round(steady["median_decode_tps"] / achievable, 4),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/gpu/profile_step.py", description=__doc__.split("\n")[0])
    add_campaign_args(p, work=Path("/tmp/regen-profile"))
    p.add_argument("--label", default="expected-length cap + refill batching")
    p.add_argument("--batch", type=int, default=None, help="decode requests (default: the candidate's cap)")
    p.add_argument("--tokens", type=int, default=384)
    p.add_argument("--steps", type=int, default=5)
    a = p.parse_args(argv)
    dry = a.dry_cpu
    a.work.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    model_dir = a.work / "model"
    shape = HybridShape.from_config(make_model(model_dir, 64))
    rec = recommendation(model_dir, gpu_memory_mib(dry), 256, replay_decode=False)
    cand = next(c for c in candidates_for(rec, dry) if c.label == a.label)
    batch = a.batch or cand.predicted_running
    doc: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "dry_cpu": dry,
        "sglang_version": SGLANG_VERSION,
    }
    doc["hardware"] = measure_hw(dry)
    log(f"hardware: {doc['hardware']}")
    gemm_s = None
    if not dry:
        config = str((model_dir / "config.json").resolve())
        got = run_module(
            "hw", "--decode-gemms", config, str(batch), capture_output=True, text=True, check=True
        )
        doc["decode_gemms"] = json.loads(got.stdout.strip().splitlines()[-1])
        gemm_s = doc["decode_gemms"]["step_gemm_s"]
        tflop_s = doc["decode_gemms"]["step_gemm_tflop_s"]
        log(f"decode GEMMs at {batch} rows: {gemm_s * 1e3:.1f} ms/step, {tflop_s:.0f} TFLOP/s")
    doc["server"] = profile_server(cand, model_dir, a.work, batch, 24 if dry else a.tokens, a.steps, dry)
    steady = doc["server"].get("pure_decode")
    doc["bounds"] = bounds(shape, steady, doc["hardware"], gemm_s) if steady else None
    tr = doc["server"].get("trace") or {}
    ms = tr.get("ms_per_step") or {}
    b = doc["bounds"] or {}

    other = (
        sum(v for k, v in ms.items() if k not in ("gemm", "linear_attn", "attention", "sampling"))
        if ms
        else None
    )
    doc["final_line"] = result_line(
        "profile",
        batch=batch,
        step_ms=fmt(tr.get("span_ms_per_step")),
        gemm_ms=fmt(ms.get("gemm")),
        linear_attn_ms=fmt(ms.get("linear_attn")),
        attention_ms=fmt(ms.get("attention")),
        sampling_ms=fmt(ms.get("sampling")),
        other_ms=fmt(other),
        gemm_tflop_s=fmt((doc.get("decode_gemms") or {}).get("step_gemm_tflop_s"), 0),
        bound_fraction=fmt(b.get("bound_fraction"), 3),
        achievable_fraction=fmt(b.get("achievable_fraction"), 3),
    )
    stem = f"profile-{doc['date']}" + ("-dry" if dry else "")
    return publish(a.out, stem, doc, line=doc["final_line"])


if __name__ == "__main__":
    sys.exit(main())
