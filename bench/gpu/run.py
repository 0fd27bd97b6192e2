"""Real SGLang on one GPU, driven through regen's own server lifecycle, tuner and client.

For each server configuration (SGLang's defaults, ``regen tune``'s recommendation with the model's
fp32 linear-attention state, the recommendation with ``--allow-bf16-state``, and other candidates
from the tuner's search) this starts the server with ``regen.serving.lifecycle.acquire_server``, sends a
fixed workload with ``regen.generate.client.generate_shard`` and reads the server's log and ``/server_info``:

- steady-state decode tok/s (median ``gen throughput`` while ``#running-req`` is at its plateau),
- client output tok/s, effective max running requests,
- the realized memory map vs. the tuner's prediction (running cap, mamba slots, KV tokens),
- a roofline for the best configuration from the measured copy bandwidth and bf16 matmul rate.

``--dry-cpu`` runs the same code against regen's simulated server (no GPU, small workload); ``--smoke``
(CI) is ``--dry-cpu`` with SGLang's defaults and regen's recommendation only, written to a temporary dir.
Writes ``<out>/gpu-<date>.json`` after every configuration (partial results survive a kill) and
``<out>/gpu-<date>.md`` at the end; the last line printed is
``gpu: default_tps=… regen_tps=… ratio=… predicted_cap=… realized_cap=…``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.gpu.harness import (
    BASE_ARGS,
    SGLANG_VERSION,
    TEMPLATE_TOKENS,
    Timer,
    bench_server_cfg,
    count_output_tokens,
    generate_dict,
    gpu_memory_mib,
    log,
    make_model,
    measure_hw,
    wait_gpu_free,
    word_prompts,
)
from bench.gpu.roofline import HybridShape, decode_step_cost
from bench.gpu.serverlog import decode_lines, startup_facts, steady_state
from bench.harness import add_campaign_args, add_smoke, fmt, parse_args, publish, write_json
from bench.workflow import free_port_base
from regen import runconfig
from regen.simulated.options import OPTIONS_ENV
from regen.types import Sample

# --------------------------------------------------------------------------------------------------
# workload


@dataclass(frozen=True, slots=True)
class Workload:
    """N requests of exactly ``prompt_tokens`` words ``t<i>`` (one token each), fixed output length."""

    requests: int
    prompt_tokens: int
    output_tokens: int
    seed: int = 1234

    def samples(self) -> list[Sample]:
        return word_prompts(self.requests, self.prompt_tokens, "bench", self.seed)

    def generate_cfg(self, concurrency: int | None) -> dict[str, Any]:
        return generate_dict(self.output_tokens, concurrency)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------------------------------
# configurations


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """One server configuration to measure.

    ``args`` go to ``server.args``; ``plan`` is the plan-file dict (its ``launch_args`` are the tuner's
    flags) handed to ``acquire_server``; ``memory_plan`` is the tuner's ``MemoryPlan`` for ``compare``.
    """

    name: str
    label: str
    args: tuple[str, ...]
    plan: dict[str, Any] | None = None
    predicted: dict[str, Any] = field(default_factory=dict)
    memory_plan: Any = None
    tuner_args: tuple[str, ...] = ()

    @property
    def launch_args(self) -> list[str]:
        return [*self.tuner_args, *self.args]


# --------------------------------------------------------------------------------------------------
# one configuration


def server_cfg_for(cfg: ServerConfig, model_dir: Path, dry: bool, port_base: int) -> runconfig.ServerConfig:
    simulated = {
        "token_rate": 20,
        "max_running_requests": int(cfg.predicted.get("running") or 16),
        "startup_delay_s": 1.0,
    }
    return bench_server_cfg(
        model_dir,
        dry,
        args=cfg.args,
        use_tuner=cfg.plan is not None,
        port_base=port_base,
        simulated=simulated,
    )


def run_config(
    cfg: ServerConfig, work: Path, model_dir: Path, workload: Workload, dry: bool, port_base: int
) -> dict[str, Any]:
    """Start the server through regen, run the workload through regen's client, read what happened."""
    from regen.generate.client import ShardJob, generate_shard
    from regen.runconfig import GenerateConfig
    from regen.serving import lifecycle as server_mod
    from regen.serving.lifecycle import stop_all_servers
    from regen.serving.probes import fetch_server_info
    from regen.sglang.config import PlanFile

    servers = work / f"servers-{cfg.name}"
    logs = work / f"logs-{cfg.name}"
    out = work / f"out-{cfg.name}"
    out.mkdir(parents=True, exist_ok=True)
    server_cfg = server_cfg_for(cfg, model_dir, dry, port_base)
    result: dict[str, Any] = {
        "name": cfg.name,
        "label": cfg.label,
        "args": cfg.launch_args,
        "predicted": cfg.predicted,
    }
    t = Timer()
    try:
        plan = PlanFile.from_json(cfg.plan)
        with server_mod.acquire_server(server_cfg, plan, servers, logs, owner_pid=os.getpid()) as ep:
            result["ready_s"] = round(t(), 1)
            result["endpoint"] = {
                "url": ep.url,
                "max_running_requests": ep.max_running_requests,
                "version": ep.version,
                "model": ep.model,
            }
            info = fetch_server_info(ep.url, None)
            log(f"{cfg.name}: ready in {result['ready_s']} s, effective cap {ep.max_running_requests}")
            samples = workload.samples()
            gen_cfg = workload.generate_cfg(None)
            tg = Timer()
            stats = generate_shard(
                ShardJob(
                    samples,
                    str(out / "journal.jsonl"),
                    str(out / "records.jsonl"),
                    str(out / "failed.jsonl"),
                    GenerateConfig.from_dict(gen_cfg),  # extra_body carries ignore_eos
                    ep,
                    "00000",
                )
            )
            wall = tg()
            n, tokens, reasons = count_output_tokens(out / "records.jsonl")
            result["client"] = {
                "wall_s": round(wall, 1),
                "records": n,
                "output_tokens": tokens,
                "output_tps": round(tokens / wall, 1),
                "finish_reasons": reasons,
                "stats": _jsonable(stats),
            }
            log(f"{cfg.name}: {n} records, {tokens} tokens in {wall:.1f} s = {tokens / wall:.0f} tok/s")
    finally:
        stopped = stop_all_servers(servers, grace_s=60)
        result["stopped_supervisors"] = stopped
        if not dry:
            result["gpu_used_after_stop_mib"] = wait_gpu_free()
    result["total_s"] = round(t(), 1)
    log_text = (logs / "gpu0.log").read_text(errors="replace") if (logs / "gpu0.log").exists() else ""
    result.update(read_server_side(cfg, log_text, info, servers))
    return result


def read_server_side(cfg: ServerConfig, log_text: str, info: dict[str, Any], servers: Path) -> dict[str, Any]:
    """Decode steady state, startup memory map (ours and regen's), /server_info realized fields."""
    from regen.serving.procfs import SERVER_START_MARK

    header = log_text.rfind(SERVER_START_MARK)
    this_start = log_text[header:] if header >= 0 else log_text
    lines = decode_lines(this_start)
    steady = steady_state(lines)
    facts = startup_facts(this_start)
    states = info.get("internal_states") or [{}]
    st = states[0] if states else {}
    server_info = {
        "version": info.get("version"),
        "max_running_requests": info.get("max_running_requests"),
        "max_total_num_tokens": info.get("max_total_num_tokens"),
        "mem_fraction_static": info.get("mem_fraction_static"),
        "attention_backend": info.get("attention_backend"),
        "page_size": info.get("page_size"),
        "chunked_prefill_size": info.get("chunked_prefill_size"),
        "cuda_graph_max_bs": info.get("cuda_graph_max_bs"),
        "cuda_graph_config": info.get("cuda_graph_config"),
        "disable_radix_cache": info.get("disable_radix_cache"),
        "mamba_ssm_dtype": info.get("mamba_ssm_dtype"),
        "max_mamba_cache_size": info.get("max_mamba_cache_size"),
        "internal.effective_max_running_requests_per_dp": st.get("effective_max_running_requests_per_dp"),
        "internal.max_mamba_cache_size": st.get("max_mamba_cache_size"),
        "internal.memory_usage": st.get("memory_usage"),
        "internal.mem_fraction_static": st.get("mem_fraction_static"),
        "internal.cuda_graph_config": st.get("cuda_graph_config"),
    }
    out: dict[str, Any] = {
        "decode": steady.to_json() if steady else None,
        "decode_lines": len(lines),
        "startup_log": facts,
        "server_info": server_info,
    }
    realized_file = servers / "gpu0.realized.json"
    if realized_file.exists():
        out["regen_realized_file"] = json.loads(realized_file.read_text())
    try:
        from regen.sglang import realized as plan_mod

        parsed = plan_mod.parse_startup_log(this_start)
        from_info = plan_mod.realized_from_server_info(dict(info))
        out["regen_parse_startup_log"] = _jsonable(parsed)
        out["regen_realized_from_server_info"] = _jsonable(from_info)
        if cfg.memory_plan is not None:
            out["regen_compare_log"] = [str(d) for d in plan_mod.compare(cfg.memory_plan, parsed)]
            out["regen_compare_server_info"] = [str(d) for d in plan_mod.compare(cfg.memory_plan, from_info)]
    except Exception as exc:  # report regen's failure on real output; keep the measurement
        out["regen_plan_error"] = f"{type(exc).__name__}: {exc}"
    out["realized"] = realized_summary(facts, server_info, steady)
    return out


def realized_summary(facts: dict[str, Any], si: dict[str, Any], steady: Any) -> dict[str, Any]:
    """The realized numbers compared against the tuner: cap, mamba slots, KV tokens."""
    cap = si.get("internal.effective_max_running_requests_per_dp") or facts.get("max_running_requests")
    return {
        "running_cap": cap,
        "mamba_slots": facts.get("mamba_cache_size") or si.get("internal.max_mamba_cache_size"),
        "kv_tokens": si.get("max_total_num_tokens") or facts.get("kv_tokens"),
        "plateau_running": steady.plateau_running if steady else None,
        "mem_fraction_static": si.get("mem_fraction_static"),
        "decode_graph_max_bs": facts.get("decode_graph_max_bs"),
    }


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    return str(value)


# --------------------------------------------------------------------------------------------------
# tuner configurations


def tuner_workload(workload: Workload) -> Any:
    from regen.sglang.plan import Workload as PlanWorkload

    prompt = workload.prompt_tokens + TEMPLATE_TOKENS
    return PlanWorkload(
        prompt_p50=prompt,
        prompt_p99=prompt,
        max_tokens=workload.output_tokens,
        target_concurrency=workload.requests,
    )


def predicted_of(mp: Any) -> dict[str, Any]:
    """What the tuner predicts the server will realize."""
    return {
        "running": mp.effective_max_running_requests,
        "mamba_slots": mp.max_mamba_cache_size,
        "slots_per_request": mp.mamba_slots_per_request,
        "kv_tokens": mp.kv_cache_tokens,
        "mem_fraction_static": mp.mem_fraction_static,
        "cuda_graph_max_bs": mp.cuda_graph_max_bs,
        "binding": mp.binding_constraint,
        "workload_concurrency": mp.workload_concurrency,
        "state_pool_gib": round(mp.state_pool_gib, 2),
        "kv_cache_gib": round(mp.kv_cache_gib, 2),
    }


def plan_file_dict(rec: Any, model_dir: Path, gpu_mib: int, work: Path, name: str) -> dict[str, Any]:
    """The plan file ``regen tune --out`` writes (what the generate rule hands to acquire_server)."""
    from regen.sglang.recommend import write_plan_file

    path = work / f"plan-{name}.json"
    write_plan_file(
        path, rec, sglang_version=SGLANG_VERSION, model_config=str(model_dir), gpu_memory_mib=gpu_mib
    )
    return json.loads(path.read_text())


def all_configs(
    model_dir: Path, gpu_mib: int, workload: Workload, work: Path, n_candidates: int
) -> tuple[list[ServerConfig], dict[str, Any]]:
    """(a) defaults, (b) regen's recommendation (fp32 state), (b2) with bf16 state allowed, (c) candidates."""
    from regen.sglang.models import ModelShape
    from regen.sglang.plan import plan
    from regen.sglang.recommend import Recommendation, recommend

    model = ModelShape.from_config(str(model_dir))
    wl = tuner_workload(workload)
    default_plan = plan(model, gpu_mib, 1, [], wl, SGLANG_VERSION)
    out = [
        ServerConfig("default", "SGLang defaults", BASE_ARGS, None, predicted_of(default_plan), default_plan)
    ]
    rec = recommend(model, gpu_mib, 1, [], wl, SGLANG_VERSION, allow_fp8_kv=False, allow_bf16_state=False)
    rec16 = recommend(model, gpu_mib, 1, [], wl, SGLANG_VERSION, allow_fp8_kv=False, allow_bf16_state=True)
    out.append(
        ServerConfig(
            "regen",
            "regen tune (fp32 state)",
            BASE_ARGS,
            plan_file_dict(rec, model_dir, gpu_mib, work, "regen"),
            predicted_of(rec.recommended),
            rec.recommended,
            tuple(rec.args),
        )
    )
    out.append(
        ServerConfig(
            "regen_bf16",
            "regen tune --allow-bf16-state",
            BASE_ARGS,
            plan_file_dict(rec16, model_dir, gpu_mib, work, "regen_bf16"),
            predicted_of(rec16.recommended),
            rec16.recommended,
            tuple(rec16.args),
        )
    )
    chosen = {tuple(rec.args), tuple(rec16.args)}
    k = 0
    for cand in [*rec.candidates, *rec16.candidates]:
        if tuple(cand.args) in chosen or k >= n_candidates:
            continue
        chosen.add(tuple(cand.args))
        k += 1
        crec = Recommendation(rec.given, cand.plan, tuple(cand.args), cand.reasons, (), ())
        out.append(
            ServerConfig(
                f"cand{k}",
                "tuner candidate",
                BASE_ARGS,
                plan_file_dict(crec, model_dir, gpu_mib, work, f"cand{k}"),
                predicted_of(cand.plan),
                cand.plan,
                tuple(cand.args),
            )
        )
    tuner = {
        "workload": dataclasses.asdict(wl),
        "gpu_memory_mib": gpu_mib,
        "fp32": rec.to_json(),
        "bf16": rec16.to_json(),
    }
    return out, tuner


# --------------------------------------------------------------------------------------------------
# summary


def pick(results: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    return next((r for r in results if r.get("name") == name and "error" not in r), None)


def decode_tps(r: dict[str, Any] | None) -> float | None:
    return (r or {}).get("decode", {}).get("median_decode_tps") if r and r.get("decode") else None


def within(pred: Any, real: Any, tol: float = 0.05) -> bool | None:
    if pred is None or real is None:
        return None
    return abs(float(pred) - float(real)) <= tol * max(1.0, abs(float(real)))


def prediction_checks(r: dict[str, Any]) -> dict[str, Any]:
    pred = r.get("predicted") or {}
    real = r.get("realized") or {}
    return {
        "cap": {
            "predicted": pred.get("running"),
            "realized": real.get("running_cap"),
            "equal": None if pred.get("running") is None else pred.get("running") == real.get("running_cap"),
        },
        "mamba_slots": {
            "predicted": pred.get("mamba_slots"),
            "realized": real.get("mamba_slots"),
            "within_5pct": within(pred.get("mamba_slots"), real.get("mamba_slots")),
        },
        "kv_tokens": {
            "predicted": pred.get("kv_tokens"),
            "realized": real.get("kv_tokens"),
            "within_5pct": within(pred.get("kv_tokens"), real.get("kv_tokens")),
        },
        "plateau_running": real.get("plateau_running"),
    }


def roofline_for(r: dict[str, Any], shape: HybridShape, hw: dict[str, Any]) -> dict[str, Any] | None:
    d = r.get("decode")
    if not d:
        return None
    ssm = "bfloat16" if "bfloat16" in " ".join(r.get("args") or []) else "float32"
    cost = decode_step_cost(shape, d["plateau_running"], d["mean_context_tokens"], ssm)
    bw, fl = hw["hbm_bytes_per_s"], hw["bf16_flops_per_s"]
    bw_bound = cost.bandwidth_bound_tps(bw)
    gemm_bound = cost.gemm_peak_bound_tps(fl, bw)
    return {
        "ssm_dtype": ssm,
        "step": cost.to_json(),
        "hbm_tb_per_s": round(bw / 1e12, 3),
        "bf16_tflop_per_s": round(fl / 1e12, 1),
        "bandwidth_bound_tps": round(bw_bound, 0),
        "gemm_peak_bound_tps": round(gemm_bound, 0),
        "fraction_of_bandwidth_bound": round(d["median_decode_tps"] / bw_bound, 3),
        "fraction_of_gemm_peak_bound": round(d["median_decode_tps"] / gemm_bound, 3),
        "measured_hw": bool(hw.get("measured")),
    }


def markdown(doc: dict[str, Any]) -> str:
    s = doc["summary"]
    hw = doc["hardware"]
    w = doc["workload"]
    dry_note = (
        "**DRY RUN on CPU against the simulated server — not a measurement.** " if doc["dry_cpu"] else ""
    )
    lines = [
        f"# regen on real SGLang — {doc['date']}",
        "",
        f"SGLang {doc['sglang_version']} on {hw.get('gpu', '?')} "
        f"({fmt(hw.get('gpu_memory_mib'), 0, '–', thousands=True)} MiB), "
        f"dummy Qwen3.6-27B-shaped model ({doc['model']['layers']} layers, `--load-format dummy`, "
        f"bf16 weights). {dry_note}",
        f"Workload: {w['requests']} requests × {w['prompt_tokens']} prompt tokens → {w['output_tokens']} "
        "output tokens, `ignore_eos`, sent by `regen.generate.client.generate_shard` at the server's "
        "effective cap. "
        f"Server started by `regen.serving.lifecycle.acquire_server`.",
        f"Measured in the same run: copy bandwidth {hw['hbm_bytes_per_s'] / 1e12:.2f} TB/s, "
        f"bf16 matmul {hw['bf16_flops_per_s'] / 1e12:.0f} TFLOP/s"
        f"{'' if hw.get('measured') else ' (nominal, not measured)'}.",
        "",
        "| config | flags | ready s | eff. cap (pred → real) | plateau running | mamba slots (pred → real) "
        "| KV tokens (pred → real) | CUDA graph | decode tok/s (median) | client out tok/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["configs"]:
        if "error" in r or "skipped" in r:
            why = r.get("error") or r.get("skipped")
            lines.append(
                f"| {r['name']} | `{' '.join(r.get('args') or []) or '(defaults)'}` | – | – | – | – | – | – "
                f"| not measured: {str(why)[:120]} | – |"
            )
            continue
        c = prediction_checks(r)
        d = r.get("decode") or {}
        cl = r.get("client") or {}

        def pr(k: str, c: dict[str, Any] = c) -> str:
            predicted, realized = (fmt(c[k][w], 0, "–", thousands=True) for w in ("predicted", "realized"))
            return f"{predicted} → {realized}"

        lines.append(
            f"| {r['name']} | `{' '.join(r['args']) or '(defaults)'}` | "
            f"{fmt(r.get('ready_s'), 0, '–', thousands=True)} "
            f"| {pr('cap')} "
            f"| {fmt(d.get('plateau_running'), 0, '–', thousands=True)} | {pr('mamba_slots')} | "
            f"{pr('kv_tokens')} "
            f"| {fmt(d.get('cuda_graph_fraction'), 2, '–', thousands=True)} | "
            f"{fmt(d.get('median_decode_tps'), 0, '–', thousands=True)} "
            f"| {fmt(cl.get('output_tps'), 0, '–', thousands=True)} |"
        )
    lines += ["", "## Summary", ""]
    for k, v in s.items():
        lines.append(f"- {k}: {json.dumps(v) if isinstance(v, dict | list) else v}")
    rf = s.get("roofline")
    if rf:
        st = rf["step"]
        lines += [
            "",
            f"Roofline ({s.get('best')}, batch {st['batch']}, mean context {st['mean_context']}): "
            f"per step weights {st['weight_gb']} GB + state r/w {st['state_rw_gb']} GB + KV {st['kv_gb']} GB "
            f"= {st['total_gb']} GB; GEMMs {st['gemm_tflop']} TFLOP. Bandwidth bound "
            f"{fmt(rf['bandwidth_bound_tps'], 0, '–', thousands=True)} tok/s "
            f"({rf['fraction_of_bandwidth_bound']:.0%} achieved); "
            "GEMMs at peak + state/KV at measured bandwidth "
            f"{fmt(rf['gemm_peak_bound_tps'], 0, '–', thousands=True)} tok/s "
            f"({rf['fraction_of_gemm_peak_bound']:.0%} achieved).",
        ]
    lines += ["", f"`{doc['final_line']}`", ""]
    return "\n".join(lines)


def summarize(doc: dict[str, Any], shape: HybridShape) -> dict[str, Any]:
    results = doc["configs"]
    default, regen, regen16 = pick(results, "default"), pick(results, "regen"), pick(results, "regen_bf16")
    d0, d1, d2 = decode_tps(default), decode_tps(regen), decode_tps(regen16)
    measured = [r for r in results if decode_tps(r)]
    best = max(measured, key=lambda r: decode_tps(r) or 0.0) if measured else None
    checks = {r["name"]: prediction_checks(r) for r in results if "error" not in r and "skipped" not in r}
    s: dict[str, Any] = {
        "default_decode_tps": d0,
        "regen_decode_tps": d1,
        "regen_bf16_decode_tps": d2,
        "ratio_fp32": round(d1 / d0, 3) if d0 and d1 else None,
        "ratio_bf16": round(d2 / d0, 3) if d0 and d2 else None,
        "client_ratio_fp32": _ratio(regen, default),
        "client_ratio_bf16": _ratio(regen16, default),
        "target_fp32_1.6x": (d1 / d0 >= 1.6) if d0 and d1 else None,
        "target_bf16_2.0x": (d2 / d0 >= 2.0) if d0 and d2 else None,
        "predictions": checks,
        "best": best["name"] if best else None,
    }
    if best:
        rf = roofline_for(best, shape, doc["hardware"])
        s["roofline"] = rf
        s["target_75pct_of_gemm_peak_bound"] = rf["fraction_of_gemm_peak_bound"] >= 0.75 if rf else None
    return s


def _ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
    x = (a or {}).get("client", {}).get("output_tps")
    y = (b or {}).get("client", {}).get("output_tps")
    return round(x / y, 3) if x and y else None


def final_line(doc: dict[str, Any]) -> str:
    s = doc["summary"]
    regen = pick(doc["configs"], "regen") or {}
    c = prediction_checks(regen) if regen else {"cap": {}}
    return (
        f"gpu: default_tps={fmt(s.get('default_decode_tps'), 0, '–', thousands=True)} "
        f"regen_tps={fmt(s.get('regen_decode_tps'), 0, '–', thousands=True)} "
        f"ratio={s.get('ratio_fp32')} bf16_tps={fmt(s.get('regen_bf16_decode_tps'), 0, '–', thousands=True)} "
        f"bf16_ratio={s.get('ratio_bf16')} predicted_cap={c['cap'].get('predicted')} "
        f"realized_cap={c['cap'].get('realized')}"
    ).replace(",", "")


# --------------------------------------------------------------------------------------------------
# main


def summarize_file(path: Path, out: Path) -> int:
    """Finish a results JSON left by a run that was stopped before its end."""
    doc = json.loads(path.read_text())
    shape = HybridShape.from_config(_model_config(doc["model"]["layers"]))
    doc["summary"] = summarize(doc, shape)
    doc["final_line"] = final_line(doc)
    return publish(out, path.stem, doc, markdown(doc), doc["final_line"])


def _model_config(layers: int) -> dict[str, Any]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        return make_model(Path(tmp) / "model", layers)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/gpu/run.py", description=__doc__.split("\n")[0])
    add_campaign_args(p, dry_help="simulated server, small workload, no GPU")
    p.add_argument("--requests", type=int, default=None)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--output-tokens", type=int, default=None)
    p.add_argument("--layers", type=int, default=64)
    p.add_argument("--configs", default="default,regen,regen_bf16,cand1")
    p.add_argument("--candidates", type=int, default=2)
    p.add_argument("--deadline-s", type=float, default=1080, help="skip configs that would end after this")
    p.add_argument("--port-base", type=int, default=30000)
    p.add_argument("--summarize", type=Path, help="finish a (partial) results JSON: summary, page, last line")
    add_smoke(p, dry_cpu=True, configs="default,regen")
    a = parse_args(p, argv)
    if a.summarize:
        return summarize_file(a.summarize, a.out)
    if a.smoke and a.out == p.get_default("out"):
        a.out = Path(tempfile.mkdtemp(prefix="regen-gpu-smoke-"))  # a rehearsal's files stay out of results
    if a.smoke and a.work is None:
        a.work = a.out / "work"
    if a.smoke and a.port_base == p.get_default("port_base"):
        a.port_base = free_port_base(1)  # beside other runs on the machine
    dry = a.dry_cpu
    if dry:  # a decode line every half second: the dry workload lasts seconds, SGLang's cadence is 40 steps
        os.environ.setdefault(OPTIONS_ENV, json.dumps({"log_interval_s": 0.5}))
    requests = a.requests or (96 if dry else 512)
    output_tokens = a.output_tokens or (64 if dry else 1024)
    workload = Workload(requests, a.prompt_tokens, output_tokens)
    work = a.work or Path("/tmp/regen-gpu-bench" + ("-dry" if dry else ""))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    t0 = Timer()
    date = dt.date.today().isoformat()
    stem = f"gpu-{date}" + ("-dry" if dry else "")
    json_path = a.out / f"{stem}.json"

    hw = measure_hw(dry)
    log(f"hardware: {hw}")
    model_cfg = make_model(work / "model", a.layers)
    shape = HybridShape.from_config(model_cfg)
    wanted = [c.strip() for c in a.configs.split(",") if c.strip()]
    gpu_mib = gpu_memory_mib(dry)
    configs, tuner = all_configs(work / "model", gpu_mib, workload, work, a.candidates)
    for c in configs:
        log(f"config {c.name}: {' '.join(c.launch_args)}; predicted {c.predicted}")
    configs = [c for c in configs if c.name in wanted or (c.name.startswith("cand") and "cand" in wanted)]
    doc: dict[str, Any] = {
        "date": date,
        "sglang_version": SGLANG_VERSION,
        "dry_cpu": dry,
        "hardware": hw,
        "model": {
            "layers": a.layers,
            "params_b": round(shape.total_params() / 1e9, 3),
            "state_mb_fp32": round(shape.state_bytes_per_request("float32") / 1e6, 2),
            "kv_bytes_per_token": shape.kv_bytes_per_token(),
        },
        "workload": workload.to_json(),
        "planned_configs": [
            {"name": c.name, "args": c.launch_args, "predicted": c.predicted} for c in configs
        ],
        "tuner": tuner,
        "configs": [],
    }
    write_json(json_path, doc)
    client_tps = 3000.0  # the slowest rate expected (SGLang defaults); updated from each run
    for i, cfg in enumerate(configs):
        estimate = (200 if i == 0 else 150) + requests * output_tokens / client_tps + 20
        if dry:
            estimate = 30
        left = a.deadline_s - t0()
        if estimate > left:
            log(f"{cfg.name}: skipped (needs ~{estimate:.0f} s, {left:.0f} s left)")
            doc["configs"].append(
                {
                    "name": cfg.name,
                    "label": cfg.label,
                    "args": cfg.launch_args,
                    "skipped": f"not enough time: ~{estimate:.0f} s needed, {left:.0f} s left",
                }
            )
            continue
        log(f"{cfg.name}: starting with {' '.join(cfg.launch_args)}")
        try:
            r = run_config(cfg, work, work / "model", workload, dry, a.port_base)
        except Exception as exc:
            log(f"{cfg.name}: FAILED {type(exc).__name__}: {exc}")
            r = {
                "name": cfg.name,
                "label": cfg.label,
                "args": cfg.launch_args,
                "error": f"{type(exc).__name__}: {exc}"[:4000],
            }
        doc["configs"].append(r)
        seen = [x.get("client", {}).get("output_tps") for x in doc["configs"] if x.get("client")]
        if seen:
            client_tps = statistics.median(float(v) for v in seen if v)
        doc["summary"] = summarize(doc, shape)
        doc["elapsed_s"] = round(t0(), 1)
        write_json(json_path, doc)
        log(f"{cfg.name}: done; decode {decode_tps(r)} tok/s; elapsed {t0():.0f} s")
    doc["summary"] = summarize(doc, shape)
    doc["final_line"] = final_line(doc)
    doc["elapsed_s"] = round(t0(), 1)
    return publish(a.out, stem, doc, markdown(doc), doc["final_line"])


if __name__ == "__main__":
    sys.exit(main())
