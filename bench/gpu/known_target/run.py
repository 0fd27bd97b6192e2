"""The known-target campaign (issue 27 items 2 and 5) and its CPU rehearsal (item 6): the whole workflow
(``snakemake --cores all --resources gpu=1``, regen starting, tuning and stopping the server itself) on
a dataset of prompts with tools on part of them, thinking on, truncation retry, token ids on, the export;
then the measurements against the model's ``designed.json`` and the ``target: ...`` line.

  --mode simulated  regen's simulated SGLang in chain mode (REGEN_SIM_CHAIN: the model's chain.json):
                    the same chain the weights hold, sampled as SGLang samples; CPU, a few minutes
  --mode sglang     real SGLang on the model dir (the ``model`` step, full shape), with
                    ``--tool-call-parser qwen25`` in server.args
  --dense           the dense Qwen3ForCausalLM target (``model --dense``; also chosen when the model
                    dir's config.json names it): no tools, no tool-call parser (the drafter loop, issue 36),
                    each row ``[user, assistant]`` with an original answer (plain English, varied per row)
                    that regen audits and regenerates and the loop's baseline trains on; the simulated mode
                    plans for Qwen3-8B's full shape

Measured from the journals and results (every row): finish reasons vs the designed stop fraction;
reasoning/content split exact (SGLang's reasoning_content/content equal the Qwen3 split of the decoded
completion ids at the chain's ``</think>``, and usage.reasoning_tokens equals the position of
``</think>``); each step of every completion is a designed transition; tool calls parsed (rows with
tools whose ids spell a tool call have ``tool_calls`` with designed arguments); truncation retries and
how they ended; the exported ids equal the server's ids; the re-audit gates and READY verdict.
Fields the campaign fills later (the baselines' wall times: known_target/baselines.py) print as ``na``.
``--sweep`` (issue 37 item 4): ``snakemake --until shard tune``, ``regen tune --sweep`` (``--sweep-args``)
in the run dir, then the whole workflow; ``projection_error`` is then the sweep's pilot.json against the
generation phase (:func:`sweep_projection`), ``sweep_s`` its own seconds (not in ``regen_wall_s``, which
is the ``--until`` run plus the workflow). Without it, the projection is made from the workflow's
static plan, the designed lengths and a prior decode-step line (``projection``), unless ``--projected-s``
gives one. ``fixed_s`` and ``drain_token_share`` are regen's (:func:`regen_time_split`).
``--sweep-only`` stops after the sweep (its seconds in ``sweep-phases.json``), and a later ``--after-sweep``
runs the workflow on that run dir, counting the earlier prepare's seconds as ``--sweep`` does: the device
sequence makes the sweep's server the fresh machine's first (the warm-up) and runs the baselines between.

Usage: python -m bench.gpu.known_target run --model DIR --work DIR [--mode simulated] [--n 2000]
       [--max-tokens 4096] [--tools-fraction 0.3] [--dense [--eval-fraction 0.1]] [--sweep [--sweep-args S]]
       [--sweep-only | --after-sweep]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from bench.gpu.known_target import model as kt
from bench.gpu.serverlog import supervisor_times
from bench.harness import fmt
from bench.projection_replay import run_step_line
from regen.layout.run import RunLayout
from regen.pilot_file import PilotFile

REPO = Path(__file__).resolve().parents[3]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": kt.TOOL_NAME,
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    }
]


#: the pieces an original answer is made of (a chat dataset's answers: plain English, varied per row)
_WEATHER = ("sunny", "rainy", "cold and windy", "warm", "foggy in the morning", "humid", "snowy", "mild")
_WEAR = (
    "a light jacket",
    "a warm wool coat",
    "a t-shirt and shorts",
    "a raincoat and boots",
    "layers you can take off",
    "a sweater and jeans",
    "a hat and sunscreen",
    "gloves and a scarf",
)
_EXTRA = (
    "Take an umbrella just in case.",
    "Comfortable shoes help if you walk a lot.",
    "Check the forecast again before you leave.",
    "Evenings can be cooler, so bring something extra.",
    "Drink plenty of water.",
    "A small bag keeps your hands free.",
    "",
)


def original_answer(i: int) -> str:
    """Row ``i``'s original answer: a few plain sentences, varied by a generator seeded with the row."""
    import random

    rng = random.Random(i)
    weather, wear = rng.choice(_WEATHER), rng.choice(_WEAR)
    town = i % 97
    lines = [f"In town {town} it is likely to be {weather} today, so I would wear {wear}."]
    lines += [x for x in rng.sample(_EXTRA, k=rng.randint(1, 3)) if x]
    if rng.random() < 0.4:
        lines.append(f"If you are out after dark, {rng.choice(_WEAR)} is a good second choice.")
    return " ".join(lines)


def write_dataset(path: Path, n: int, tools_fraction: float, answers: bool = False) -> None:
    """``n`` prompts (tools on ``tools_fraction`` of them); ``answers``: each row ``[user, assistant]``
    with its original answer (:func:`original_answer`), which regen regenerates."""
    every = max(1, round(1 / tools_fraction)) if tools_fraction > 0 else 0
    with open(path, "w") as fh:
        for i in range(n):
            row: dict[str, Any] = {
                "id": f"kt-{i:06d}",
                "messages": [
                    {"role": "user", "content": f"Question {i}: what should I wear today in town {i % 97}?"}
                ],
            }
            if answers:
                row["messages"].append({"role": "assistant", "content": original_answer(i)})
            if every and i % every == 0:
                row["tools"] = TOOLS
            fh.write(json.dumps(row) + "\n")


def write_config(path: Path, a: argparse.Namespace, dataset: Path) -> None:
    model = str(a.model.resolve())
    cfg: dict[str, Any] = {
        "dataset": {"path": str(dataset), "format": "auto", "id_column": "id"},
        "tokenizer": model,
        "audit": {"context_limit": 4096},
        "generate": {
            "thinking": "on",
            "sampling": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": a.max_tokens},
            "truncation": "retry",
            "retry_max_tokens_factor": 2,
        },
        "merge": {"include_token_ids": True},
        "export": {"enabled": True},
        "server": {"mode": a.mode, "model_path": model, "gpus": 1},
    }
    cfg["generate"]["return_token_ids"] = True
    cfg["server"]["prestart_rows"] = 1000  # issue 37 item 1: the server starts while the data is audited
    if a.dense:  # the loop's eval prompts, and SpecForge's default window named (rows end far inside it)
        cfg["export"].update({"eval_fraction": a.eval_fraction, "max_length": 2048})
    if a.mode == "sglang":
        cfg["generate"]["request_timeout_s"] = 3600
        parser = [] if a.dense else ["--tool-call-parser", "qwen25"]
        cfg["server"].update({"args": parser, "startup_timeout_s": 900, "idle_timeout_s": 1800})
    else:
        full = a.work / "full-shape-config.json"  # the tuner plans for the real shape, as on the GPU
        shape = kt.dense_config_json(kt.DENSE, 2, 0) if a.dense else kt.config_json(kt.Shape(), 2, 0)
        full.write_text(json.dumps(shape))
        cfg["server"].update(
            {
                "model_config": str(full),
                "gpu_memory_mib": 143771,
                "startup_timeout_s": 120,
                "simulated": {
                    "token_rate": a.sim_token_rate,
                    "startup_delay_s": 1.0,
                    "tokenizer_path": model,
                },
            }
        )
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))


def generation_records(run: Path) -> list[dict[str, Any]]:
    """The run's generation records (``results/generations/{shard}.jsonl.zst``, regen.layout's names)."""
    from regen.io import open_lines

    out = []
    for f in RunLayout.shard_outputs_in(run / "results" / "generations"):
        with open_lines(f) as lines:
            out += [r for r in (json.loads(line) for line in lines if line.strip()) if "id" in r]
    return out


def measure(a: argparse.Namespace, wall_s: float, phases: dict[str, Any] | None) -> dict[str, Any]:
    from tokenizers import Tokenizer

    from regen.simulated.parsers import parse_qwen3_reasoning, parse_qwen25_tool_calls

    chain = kt.Chain.from_json(json.loads((a.model / "chain.json").read_text()))
    designed = json.loads((a.model / "designed.json").read_text())
    d = next((b for b in designed["by_max_tokens"] if b["max_tokens"] == a.max_tokens), None)
    d = d or kt.designed_stats(chain, a.max_tokens)  # a budget the build did not tabulate
    tok = Tokenizer.from_file(str(a.model / "tokenizer.json"))
    run = a.work / "run"
    recs = generation_records(run)
    n = len(recs)
    stop = split_ok = steps_ok = tool_rows = tool_spelled = tool_parsed = args_ok = ids_missing = 0
    retried = retried_done = 0
    bad: list[str] = []
    for r in recs:
        ids = r.get("completion_token_ids")
        fin = r.get("finish_reason")
        stop += fin in ("stop", "tool_calls")
        if ((r.get("sampling") or {}).get("max_tokens") or 0) > a.max_tokens:  # as last sent: raised
            retried += 1
            retried_done += fin in ("stop", "tool_calls")
        if not ids:
            ids_missing += 1
            continue
        prev = chain.start_thinking
        ok = True
        for t in ids:
            if t not in chain.probs(prev):
                ok = False
                break
            prev = t
        steps_ok += ok
        text = tok.decode(ids, skip_special_tokens=True)
        reasoning, content = parse_qwen3_reasoning(text, True)
        want_rt = ids.index(chain.think_close) + 1 if chain.think_close in ids else len(ids)
        usage = r.get("usage") or {}
        tools = r.get("tools")
        calls = r.get("tool_calls")
        if tools:
            tool_rows += 1
            parsed = parse_qwen25_tool_calls(content, tools)
            if parsed is not None and parsed[1]:
                tool_spelled += 1
                content = parsed[0]
                if calls:
                    tool_parsed += 1
                    got = json.dumps(json.loads(calls[0]["function"]["arguments"]), sort_keys=True)
                    args_ok += (
                        got in designed["tool"]["arguments"] and calls[0]["function"]["name"] == kt.TOOL_NAME
                    )
        exact = (
            (r.get("reasoning_content") or None) == (reasoning or None)
            and (r.get("content") or "") == (content or "")
            and usage.get("reasoning_tokens", want_rt) == want_rt
        )
        split_ok += exact
        if not exact and len(bad) < 3:
            bad.append(r["id"])
    lengths = length_check(recs, d, a.model)
    export_ok = export_equal(run, recs)
    ready = (
        json.loads((run / "results" / "READY.json").read_text())
        if (run / "results" / "READY.json").exists()
        else {}
    )
    reaudit = run / "results" / "reaudit" / "summary.json"
    return {
        "requests": n,
        "stop_fraction": stop / max(1, n),
        "designed_stop_fraction": d["retry"]["stop_fraction_after_retry_fresh"] if d else None,
        "designed_first_attempt_stop_fraction": d["stop_fraction"] if d else None,
        "reasoning_split_exact": split_ok / max(1, n - ids_missing),
        "chain_steps_valid": steps_ok / max(1, n - ids_missing),
        "rows_without_ids": ids_missing,
        "tool_rows": tool_rows,
        "tool_calls_spelled": tool_spelled,
        "tool_calls_parsed": tool_parsed / max(1, tool_spelled),
        "tool_arguments_designed": args_ok / max(1, tool_parsed),
        "designed_tool_share": d["tool_call_fraction_of_stopped"] if d else None,
        "output_tokens": sum(int((r.get("usage") or {}).get("completion_tokens") or 0) for r in recs),
        "retried": retried,
        "retried_finished": retried_done,
        "export_ids_equal": export_ok,
        "lengths": lengths,
        "reaudit": json.loads(reaudit.read_text()) if reaudit.exists() else None,
        "ready": ready,
        "wall_s": wall_s,
        "phases": phases,
        "split_mismatch_examples": bad,
    }


def completion_pmf(model: Path, m2: int) -> Any:
    """The chain's completion length (tokens to ``<|im_end|>``, unbounded) as a pmf over 0..4*m2."""
    import numpy as np

    chain = kt.Chain.from_json(json.loads((model / "chain.json").read_text()))
    r = kt.first_passage(chain, chain.start_thinking, {chain.think_close}, 4 * m2)[chain.think_close]
    a = kt.first_passage(chain, chain.think_close, {chain.eos}, 4 * m2)[chain.eos]
    return np.convolve(r, a)[: 4 * m2 + 1]


#: decode plateaus (running requests, output tok/s) measured on this GPU at this shape with fp32 state,
#: SGLang 0.5.17: its defaults (82) and regen's plan (350) (measurements/gpu-2026-11-29.md)
PRIOR_PLATEAUS = "82:3178,350:5220"


def projection(a: argparse.Namespace, run: Path) -> dict[str, Any] | None:
    """Issue 27 item 3, from what is known before generation starts: the workflow's static plan
    (``results/plan/server.json``: the running cap), the designed length distribution (each row's first
    attempt capped at max_tokens, a truncated row's retry a fresh draw capped at the raised budget) and a
    decode-step line (``--prior-plateaus``; in simulated mode the simulated server's per-request rate),
    played out by ``regen.tune.closedloop`` (start burst and drain included, server start excluded, as regen's
    projection excludes it). Compared with the generation phase (first request to last answer)."""
    import numpy as np

    from regen.sglang.config import PlanFile
    from regen.tune.closedloop import StepModel, closed_loop_wall_s

    plan_file = run / "results" / "plan" / "server.json"
    if not plan_file.exists():
        return None
    cap = PlanFile.read(plan_file).launched_section.get("effective_max_running_requests")
    if not cap:
        return None
    m, m2 = a.max_tokens, 2 * a.max_tokens  # the config's retry_max_tokens_factor: 2
    pmf = completion_pmf(a.model, m2)
    rng = np.random.default_rng(0)
    first = rng.choice(len(pmf), size=a.n, p=pmf / pmf.sum())
    again = rng.choice(len(pmf), size=a.n, p=pmf / pmf.sum())
    lengths = np.minimum(first, m) + np.where(first > m, np.minimum(again, m2), 0)
    if a.mode == "simulated":
        step, source = StepModel(1.0 / a.sim_token_rate, 0.0), f"simulated {a.sim_token_rate:g} tok/s/request"
    else:
        pts = [tuple(float(x) for x in p.split(":")) for p in a.prior_plateaus.split(",")]
        step = StepModel.fit([(int(b), tps) for b, tps in pts])
        source = f"plateaus {a.prior_plateaus}"
    est = closed_loop_wall_s([int(x) for x in lengths], int(cap), step)
    return {
        "generation_s": est.wall_s,
        "estimate": est.to_json(),
        "cap": int(cap),
        "step_model": {"fixed_s": step.fixed_s, "per_request_s": step.per_request_s, "from": source},
        "designed_tokens_per_prompt": float(lengths.mean()),
    }


#: ``regen tune --sweep``'s flags for the campaign: one candidate (the tuner's plan), no MTP candidates, not
#: the given flags (``--no-given``: the baselines measure SGLang as given)
# 100 s, not 20: on the H200 (2026-12-02) a 20-s pilot at 265 running (~12.5 tok/s a request) finished
# only the answers under ~250 tokens, 42 of 300 samples: 159 tokens a sample projected, 635 designed
SWEEP_ARGS = "--candidates 1 --no-mtp --no-given --seconds 100 --pilot-samples 300"


def generate_jobs_s(run: Path) -> float | None:
    """Seconds of the run's generate jobs (their Snakemake benchmarks, ``benchmarks/generate/*.tsv``): the
    GPU job's whole time, its server's start included."""
    tsvs = sorted((run / RunLayout().benchmarks / "generate").glob("*.tsv"))
    total = 0.0
    for f in tsvs:
        head, *rows = [line.split("\t") for line in f.read_text().splitlines() if line.strip()]
        total += sum(float(r[head.index("s")]) for r in rows)
    return total if tsvs else None


def planned_as(run: Path) -> list[str]:
    """``regen tune --sweep``'s flags for the SGLang version and GPU memory the workflow's tune rule planned
    for (``results/plan/server.json``): the sweep's defaults (the newest modelled SGLang, nvidia-smi) need
    not be the installed SGLang's that the tune rule reads."""
    from regen.sglang.config import PlanFile

    plan = PlanFile.read(run / RunLayout().server_plan)
    out = ["--sglang-version", plan.sglang_version] if plan.sglang_version else []
    return out + (["--gpu-memory-mib", str(plan.gpu_memory_mib)] if plan.gpu_memory_mib else [])


def workflow_cap(run: Path) -> int | None:
    """The running cap the workflow's own plan launched (``results/plan/server.json``)."""
    from regen.sglang.config import PlanFile

    plan = run / RunLayout().server_plan
    return (
        PlanFile.read(plan).launched_section.get("effective_max_running_requests") if plan.exists() else None
    )


def sweep_projection(run: Path, phases: dict[str, Any] | None) -> dict[str, Any] | None:
    """What ``regen tune --sweep`` projected before the run (``results/plan/pilot.json``) against what the
    run took. The pilot projects the generation of the remaining samples on the best candidate (its
    closed-loop projection: start burst and drain included; else the steady rate's), server start excluded
    (``regen.tune.projection.PROJECTION_ASSUMPTIONS``), in GPU-hours: so it is compared with the generation
    phase (first request to last answer, retries included) x the GPUs, like with like. The generate jobs'
    whole time (their server start in it) is kept beside it."""
    pilot_file = run / RunLayout().pilot
    pilot = PilotFile.read(pilot_file)
    if pilot is None:
        return None
    if pilot.projection is None:
        raise SystemExit(f"{pilot_file}: no projection")
    steady, closed = pilot.projection.projection, pilot.projection_closed_loop
    used = closed or pilot.projection.fields
    projected = used["gpu_hours"] * 3600
    gpus = steady.servers * steady.tp
    gen = (phases or {}).get("generation_s")
    measured = gen * gpus if gen else None
    return {
        "projected_gpu_s": projected,
        "projected_from": "projection_closed_loop" if closed else "projection (steady rate)",
        # which decode-step line the closed loop played (regen.tune.sweep.step_model_of)
        "step_basis": (pilot.step_model or {}).get("basis"),
        # the pilot saw too few whole answers: the projection is a lower bound (regen.tune.sweep)
        "lower_bound": bool(used.get("lower_bound")),
        "steady_projection_gpu_s": steady.gpu_hours * 3600,
        "remaining_samples": steady.remaining_samples,
        "best_args": list(pilot.best_args) or None,
        "workflow_cap": workflow_cap(run),  # the plan the run launched: the sweep's candidate should be it
        "measured_gpu_s": measured,
        "generate_jobs_s": generate_jobs_s(run),
        "error": (projected - measured) / measured if measured else None,
        # the step line the run itself decoded on (its server log, plateau and falling batch), beside the
        # pilot's: how much of the error is the step line (bench/projection_replay.py replays with it)
        "run_step_line": run_log_step_line(run),
    }


def run_log_step_line(run: Path) -> str | None:
    """The decode-step line fitted to the run's first server log, as text; None without one."""
    logs = sorted((run / RunLayout().server_logs_root).glob("*.log"))
    if not logs:
        return None
    step = run_step_line(logs[0])
    if step is None:
        return f"no decode plateau in {logs[0].name}"
    return f"{step.describe()} ({step.basis})"


def length_check(recs: list[dict[str, Any]], d: dict[str, Any] | None, model: Path) -> dict[str, Any]:
    """Completion and reasoning tokens of the rows that ended on a stop, against the designed distribution
    of a run with one retry (designed.json ``final_rows``): means, medians and the largest CDF gap (KS)."""
    if d is None:
        return {}
    import numpy as np

    m, m2 = d["max_tokens"], d["retry"]["max_tokens"]
    total = completion_pmf(model, m2)
    f_m = float(total[: m + 1].sum())
    comp = np.zeros(m2 + 1)
    comp[: m + 1] += total[: m + 1]
    comp += (1 - f_m) * total[: m2 + 1]
    stopped = [x for x in recs if x.get("finish_reason") in ("stop", "tool_calls")]
    out: dict[str, Any] = {"rows": len(stopped)}
    for name, designed_pmf, key in (
        ("completion_tokens", comp, "completion_tokens"),
        ("reasoning_tokens", None, "reasoning_tokens"),
    ):
        got = np.array([(x.get("usage") or {}).get(key, 0) for x in stopped], dtype=float)
        want = d["final_rows"][f"{name}_stopped"]
        row = {"mean": float(got.mean()) if len(got) else None, "designed_mean": want["mean"]}
        row["p50"] = float(np.median(got)) if len(got) else None
        row["designed_p50"] = want["p50"]
        if designed_pmf is not None and len(got):
            cdf = np.cumsum(designed_pmf) / designed_pmf.sum()
            emp = np.searchsorted(np.sort(got), np.arange(len(cdf)), side="right") / len(got)
            row["ks"] = float(np.abs(emp - cdf).max())
            row["ks_1pct_critical"] = 1.63 / np.sqrt(len(got))
        out[name] = row
    return out


def export_equal(run: Path, recs: list[dict[str, Any]]) -> float | None:
    """Share of exported rows whose completion ids (the assistant part of the token-exact export) end with
    the server's completion ids; None without an export."""
    path = run / "results" / "export" / "tokenized.jsonl"
    if not path.exists():
        return None
    by_id = {r["id"]: r.get("completion_token_ids") for r in recs}
    ok = total = 0
    with open(path) as fh:
        for line in fh:
            row = json.loads(line)
            ids = by_id.get(row.get("id"))
            inp = row.get("input_ids")
            if not ids or inp is None:
                continue
            total += 1
            ok += inp[-len(ids) :] == ids or any(
                inp[i : i + len(ids)] == ids for i in range(len(inp) - len(ids) + 1)
            )
    return ok / total if total else None


def regen_phases(run: Path, started_at: float, ended_at: float) -> dict[str, Any]:
    """Where regen's wall time went (issue 27 item 4), from its own files: before the server (prepare, audit,
    shard, tune), the server's start (the supervisor's 'starting server' to 'server ready', 1 s
    resolution), ready to the first request, generation (first request sent to last answer, retries
    included), and after (merge, validate, re-audit, export, report, the server's stop)."""
    logs = sorted((run / "logs" / "servers").rglob("gpu*.log"))
    sup = supervisor_times(logs[0].read_text(errors="replace")) if logs else {}
    recs = [r for r in generation_records(run) if "timings" in r]
    first = min((r["timings"]["started_at"] for r in recs), default=None)
    last = max((r["timings"]["started_at"] + r["timings"]["latency_s"] for r in recs), default=None)
    marks = [started_at, sup.get("start_mark"), sup.get("ready"), first, last, ended_at]
    names = ["before_server_s", "server_start_s", "ready_to_first_request_s", "generation_s", "after_s"]
    out: dict[str, Any] = {"started_at": started_at, "ended_at": ended_at, "wall_s": ended_at - started_at}
    for name, a, b in zip(names, marks[:-1], marks[1:], strict=True):
        out[name] = round(b - a, 1) if a is not None and b is not None else None
    out["launch_to_last_answer_s"] = (
        round(last - sup["start_mark"], 1) if last and sup.get("start_mark") else None
    )
    return out


def regen_time_split(work: Path, m: dict[str, Any]) -> dict[str, Any]:
    """regen's fixed part (``where_time_went``: outside the server, its start, ramp and drain) and the share
    of tokens decoded below 90% of the full batch (``serverlog.drain_token_share``), from its server log;
    None where the log does not say (the simulated server prints decode lines but no prefill or answer
    lines, so its fixed part is unknown)."""
    from bench.gpu import where_time_went as wtw
    from bench.gpu.serverlog import decode_lines, drain_token_share

    text = wtw.regen_log(work)
    lines = decode_lines(text)
    rt = wtw.regen_run_time(text, m)
    return {
        "fixed_s": round(rt.fixed_s, 1) if rt else None,
        "drain_token_share": drain_token_share(lines) if lines else None,
        "generation": rt.generation.to_json() if rt else None,
    }


def projection_error(m: dict[str, Any], a: argparse.Namespace) -> float | None:
    """(projected - measured) / measured: ``--projected-s`` against the generation phase, else the sweep's
    (:func:`sweep_projection`), else the static plan's (:func:`projection`)."""
    gen = (m.get("phases") or {}).get("generation_s") or m["wall_s"]  # projections exclude server start
    if a.projected_s and gen == gen:
        return (a.projected_s - gen) / gen
    if (m.get("sweep_projection") or {}).get("error") is not None:
        return m["sweep_projection"]["error"]
    static = m.get("projection")
    return (static["generation_s"] - gen) / gen if static and gen == gen else None


def target_line(m: dict[str, Any], a: argparse.Namespace) -> str:
    """Issue 37 item 5's last line; the baselines' wall times come from the campaign's other steps
    (``--default-wall-s``, ``--seed-wall-s``), else ``na``; ``sweep_s`` is the sweep's own time, not in
    ``regen_wall_s``."""

    def f(x: Any) -> str:
        return "na" if x is None or x != x else (f"{x:.4f}" if isinstance(x, float) else str(x))

    wall = m["wall_s"]

    def ratio(base: float | None) -> float | None:
        return base / wall if base and wall == wall else None

    split = m.get("time_split") or {}
    fields = {
        "requests": m["requests"],
        "stop_fraction": m["stop_fraction"],
        "designed_stop_fraction": m["designed_stop_fraction"],
        "reasoning_split_exact": m["reasoning_split_exact"],
        "tool_calls_parsed": m["tool_calls_parsed"],
        "export_ids_equal": m["export_ids_equal"],
        "projection_error": projection_error(m, a),
        "default_wall_s": a.default_wall_s,
        "seed_wall_s": a.seed_wall_s,
        "regen_wall_s": wall,
        "vs_default": ratio(a.default_wall_s),
        "vs_seed": ratio(a.seed_wall_s),
        "fixed_s": split.get("fixed_s"),
        "drain_token_share": split.get("drain_token_share"),
        "sweep_s": (m.get("phases") or {}).get("sweep_s"),
        "projection_lower_bound": int(bool((m.get("sweep_projection") or {}).get("lower_bound"))),
    }
    return "target: " + " ".join(f"{k}={f(v)}" for k, v in fields.items())


def projection_lines(m: dict[str, Any]) -> list[str]:
    sw, p, ph = m.get("sweep_projection"), m.get("projection"), m.get("phases") or {}
    out = []
    if sw:
        out += [
            f"Projection by `regen tune --sweep` before the run ({sw['projected_from']} of "
            f"{sw['remaining_samples']} samples on `{' '.join(sw['best_args'] or [])}`"
            f"{'; step line from ' + sw['step_basis'] if sw.get('step_basis') else ''}): "
            f"{fmt(sw['projected_gpu_s'], '.4g', '')} GPU s; measured "
            f"{fmt(sw['measured_gpu_s'], '.4g', '')} GPU s (generation "
            f"phase); error {fmt(sw['error'], '.4g', '')}. The generate jobs' whole time, server start "
            "included: "
            f"{fmt(sw['generate_jobs_s'], '.4g', '')} s; the sweep itself: "
            f"{fmt(ph.get('sweep_s'), '.4g', '')} s."
            f"{' The run decoded on ' + sw['run_step_line'] + '.' if sw.get('run_step_line') else ''}",
            "",
        ]
    if not p:
        return out
    gen = (m.get("phases") or {}).get("generation_s")
    return [
        *out,
        f"Projection of the generation phase (cap {p['cap']} from the static plan, designed lengths "
        f"{p['designed_tokens_per_prompt']:.0f} tokens a prompt, step line from {p['step_model']['from']}): "
        f"{p['generation_s']:.1f} s, measured {fmt(gen, '.4g', '')} s.",
        "",
    ]


def baselines_table(work: Path, m: dict[str, Any]) -> list[str]:
    """The baselines (known_target/baselines.py's ``baseline-*.json`` in the work dir) next to regen."""
    rows = []
    for f in sorted(work.glob("baseline-*.json")):
        b = json.loads(f.read_text())
        if "error" in b:
            rows.append(f"| {b['which']} | failed: {b['error'][:200]} | | | | | | |")
            continue
        ans = b["answers"]
        acc = b["mtp"].get("server_avg_accept_len") or (b["mtp"]["measured_accept_len"] or {}).get(
            "running_weighted_mean"
        )
        rows.append(
            f"| {b['which']} (concurrency {b['concurrency']}) | {fmt(b['wall_s'], '.4g', '')} "
            f"| {fmt(b['server_start_s'], '.4g', '')} | {fmt(b['generation_s'], '.4g', '')} | "
            f"{ans['output_tokens']} "
            f"| {fmt(ans['stop_fraction'], '.4g', '')} | {fmt(acc, '.4g', '')} | "
            f"`{' '.join(b['launch_args'])}` |"
        )
    if not rows:
        return []
    ph = m.get("phases") or {}
    return [
        "Baselines (server launch to last answer; regen: Snakemake start to end):",
        "",
        "| run | wall s | server start s | generation s | output tokens | stop fraction | accept len "
        "| flags |",
        "|---|---|---|---|---|---|---|---|",
        f"| regen | {fmt(m['wall_s'], '.4g', '')} | {fmt(ph.get('server_start_s'), '.4g', '')} | "
        f"{fmt(ph.get('generation_s'), '.4g', '')} "
        f"| {m.get('output_tokens', '')} | {fmt(m['stop_fraction'], '.4g', '')} | | tuned by regen |",
        f"| regen, server launch to last answer | {fmt(ph.get('launch_to_last_answer_s'), '.4g', '')} | | | "
        "| | | |",
        *rows,
        "",
    ]


def markdown(m: dict[str, Any], a: argparse.Namespace, line: str) -> str:
    """The measurements against the design, as measurements/ keeps them."""
    rows = [
        ("requests", m["requests"], ""),
        ("stop fraction (after one retry)", m["stop_fraction"], m["designed_stop_fraction"]),
        ("rows retried at 2x max_tokens / finished", f"{m['retried']} / {m['retried_finished']}", ""),
        (
            "first-attempt stop fraction",
            1 - m["retried"] / max(1, m["requests"]),
            m["designed_first_attempt_stop_fraction"],
        ),
        ("reasoning split exact (rows)", m["reasoning_split_exact"], 1.0),
        ("every step a designed transition (rows)", m["chain_steps_valid"], 1.0),
        ("tool rows / tool calls spelled", f"{m['tool_rows']} / {m['tool_calls_spelled']}", ""),
        (
            "tool calls parsed / designed arguments",
            f"{m['tool_calls_parsed']} / {m['tool_arguments_designed']}",
            1.0,
        ),
        ("export ids equal the server's", m["export_ids_equal"], 1.0),
    ]
    for name in ("completion_tokens", "reasoning_tokens"):
        x = m["lengths"].get(name) or {}
        rows.append((f"{name} of stopped rows: mean", x.get("mean"), x.get("designed_mean")))
        rows.append((f"{name} of stopped rows: median", x.get("p50"), x.get("designed_p50")))
        if "ks" in x:
            rows.append((f"{name}: KS distance (1% critical)", x["ks"], x["ks_1pct_critical"]))
    ph = m.get("phases") or {}
    timing = [
        f"| {k} | {fmt(ph.get(k.split()[0]), '.4g', '')} |"
        for k in (
            "prepare_s",
            "before_server_s",
            "server_start_s",
            "ready_to_first_request_s",
            "generation_s",
            "after_s",
            "sweep_s (not in the wall)",
        )
    ]
    split = m.get("time_split") or {}
    timing.append(f"| fixed part (where_time_went) | {fmt(split.get('fixed_s'), '.4g', '')} |")
    timing.append(f"| drain_token_share | {fmt(split.get('drain_token_share'), '.4g', '')} |")
    out = [
        f"# Known-answer target{' (dense)' if getattr(a, 'dense', False) else ''}, mode {a.mode}: "
        f"{m['requests']} prompts, max_tokens {a.max_tokens}",
        "",
        "| measure | measured | designed |",
        "|---|---|---|",
        *(f"| {k} | {fmt(v, '.4g', '')} | {fmt(w, '.4g', '')} |" for k, v, w in rows),
        "",
        f"Re-audit passed: {(m.get('reaudit') or {}).get('passed')}; "
        f"READY: {(m.get('ready') or {}).get('ready')}.",
        "",
        f"Where regen's {fmt(m['wall_s'], '.4g', '')} s went (Snakemake start to end):",
        "",
        "| phase | s |",
        "|---|---|",
        *timing,
        "",
        *projection_lines(m),
        *baselines_table(a.work, m),
        "    " + line,
        "",
    ]
    return "\n".join(out)


def sweep_phases_file(work: Path) -> Path:
    """Where ``--sweep-only`` leaves its prepare and sweep seconds for ``--after-sweep``."""
    return work / "sweep-phases.json"


def logged(log: Path, cmd: list[str], env: dict[str, str], cwd: Path = REPO) -> tuple[int, float]:
    """``cmd``'s rc and seconds, its output into ``log``."""
    t = time.time()
    with open(log, "w") as fh:
        rc = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=cwd).returncode
    return rc, time.time() - t


def is_dense(model: Path) -> bool:
    """The model dir holds the dense known-answer target (its config.json names Qwen3ForCausalLM)."""
    cfg = model / "config.json"
    return cfg.exists() and "Qwen3ForCausalLM" in json.loads(cfg.read_text()).get("architectures", [])


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--model", type=Path, required=True, help="the model step's output (built if absent, tiny)"
    )
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--mode", choices=("simulated", "sglang"), default="simulated")
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--tools-fraction", type=float, default=0.3, help="0 with --dense (no tool-call parser)")
    p.add_argument("--dense", action="store_true", help="dense target: rows with original answers, no tools")
    p.add_argument("--eval-fraction", type=float, default=0.1, help="--dense: export.eval_fraction")
    p.add_argument("--sim-token-rate", type=float, default=20000.0, help="simulated decode tok/s per request")
    p.add_argument("--snakemake", default=os.environ.get("SNAKEMAKE", f"{sys.executable} -m snakemake"))
    p.add_argument("--measure-only", action="store_true", help="skip the workflow; measure an existing run")
    p.add_argument("--default-wall-s", type=float, default=None, help="SGLang defaults, concurrency 48")
    p.add_argument("--seed-wall-s", type=float, default=None, help="the original run's hand-tuned flags")
    p.add_argument("--projected-s", type=float, default=None, help="a projection of the generation phase")
    p.add_argument("--prior-plateaus", default=PRIOR_PLATEAUS, help="running:tok/s,... for the projection")
    p.add_argument("--no-projection", action="store_true", help="no projection from the plan and design")
    p.add_argument("--sweep", action="store_true", help="--until shard, regen tune --sweep, then the run")
    p.add_argument("--sweep-args", default=SWEEP_ARGS, help="regen tune --sweep's flags (one string)")
    p.add_argument("--sweep-only", action="store_true", help="--sweep's prepare and sweep, no workflow")
    p.add_argument("--after-sweep", action="store_true", help="the workflow after an earlier --sweep-only")
    a = p.parse_args(argv)
    a.sweep = a.sweep or a.sweep_only or a.after_sweep
    a.work.mkdir(parents=True, exist_ok=True)
    a.dense = a.dense or is_dense(a.model)
    if a.dense:
        a.tools_fraction = 0.0
    if not (a.model / "chain.json").exists():
        shape, spec = (kt.TINY_DENSE, kt.DENSE_CHAIN) if a.dense else (kt.TINY, kt.ChainSpec())
        kt.build(a.model, shape, spec, [a.max_tokens])
    wall = float("nan")
    phases = None
    previous = a.work / "known_target_measured.json"
    if a.measure_only and previous.exists():  # e.g. again with the baselines' wall times: keep the run's own
        before = json.loads(previous.read_text())
        wall = before["wall_s"] if before.get("wall_s") is not None else wall
        phases = before.get("phases")
    if not a.measure_only:
        dataset = a.work / "dataset.jsonl"
        cfg = a.work / "config.yaml"
        if not a.after_sweep:  # rewritten, they would be newer than the audit: Snakemake would redo it
            write_dataset(dataset, a.n, a.tools_fraction, answers=a.dense)
            write_config(cfg, a, dataset)
        run = a.work / "run"
        run.mkdir(exist_ok=True)
        paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(":"))]  # keep /tmp/site etc.
        env = {**os.environ, "PYTHONPATH": ":".join(paths)}
        if a.mode == "simulated":
            env.update(
                {
                    "REGEN_SIM_CHAIN": str((a.model / "chain.json").resolve()),
                    "REGEN_SIM_SERVER": "bench.sim_chain:chain_server",  # the simulated server's hook
                    **({} if a.dense else {"REGEN_SIM_TOOL_CALL_PARSER": "qwen25"}),
                }
            )
        cmd = [*a.snakemake.split(), "-s", str(REPO / "Snakefile"), "--directory", str(run), "--cores", "all"]
        cmd += ["--resources", "gpu=1", "--configfile", str(cfg)]
        before: dict[str, float] = {}
        if a.after_sweep:  # an earlier --sweep-only's prepare and sweep
            before = json.loads(sweep_phases_file(a.work).read_text())
        elif a.sweep:  # as a user would: audit, shards, the sweep's pilot, the workflow
            prepare = [*cmd, "--until", "shard", "tune"]  # the plan too: the sweep plans as it does
            rc, before["prepare_s"] = logged(a.work / "snakemake-prepare.log", prepare, env)
            if rc == 0:
                sweep = [sys.executable, "-m", "regen.cli", "tune", "--sweep", "--configfile", str(cfg)]
                # the audit's summary, as the tune rule plans from it (else: a default workload)
                sweep += ["--audit-summary", str(run / RunLayout().audit.summary), *planned_as(run)]
                sweep += a.sweep_args.split()
                rc, before["sweep_s"] = logged(a.work / "sweep.log", sweep, env, run)
            print(
                f"sweep rc={rc}: prepare {before['prepare_s']:.0f} s, sweep {before.get('sweep_s', 0):.0f} s"
            )
            if rc != 0:
                return rc
            if a.sweep_only:
                sweep_phases_file(a.work).write_text(json.dumps(before))
                return 0
        t0 = time.time()
        rc, _ = logged(a.work / "snakemake.log", cmd, env)
        t1 = time.time()
        wall = t1 - t0 + before.get("prepare_s", 0.0)  # the workflow's own stages; the sweep's beside it
        print(f"workflow rc={rc} in {wall:.0f} s (log: {a.work / 'snakemake.log'})")
        if rc != 0:
            return rc
        phases = {**regen_phases(run, t0, t1), **before}
        print("regen phases:", json.dumps(phases))
    m = measure(a, wall, phases)
    m["projection"] = projection(a, a.work / "run") if not a.no_projection else None
    m["sweep_projection"] = sweep_projection(a.work / "run", phases)
    m["time_split"] = regen_time_split(a.work, m)
    (a.work / "known_target_measured.json").write_text(json.dumps(m, indent=1))
    print(json.dumps({k: v for k, v in m.items() if k not in ("reaudit",)}, indent=1))

    line = target_line(m, a)
    (a.work / "known_target_measured.md").write_text(markdown(m, a, line))
    print(line)
    return 0
