"""regen's planner against SGLang itself (issue 33 item 5): one SGLang start per model, dummy weights.

For each target (a real public ``config.json`` under ``resources/models``, and the flags it runs with):
start ``python -m sglang.launch_server --model-path DIR --load-format dummy --skip-tokenizer-init FLAGS``,
read its log until the KV pool is allocated (``Memory pool end.``; the pool is sized before CUDA-graph
capture, so the server is killed there), and set what SGLang logged beside ``regen tune --json`` for the
same directory and flags, computed on the same host: the KV error (full-attention tokens), the weights
error, the sliding-window error, and, where SGLang failed to start, whether regen refused too.

The log lines read are SGLang 0.5.17's (``srt/model_executor/model_runner.py`` "Load weight end.",
``srt/mem_cache/memory_pool.py`` "KV Cache is allocated." with its "Full"/"SWA" labels from
``srt/mem_cache/swa_memory_pool.py``, "Mamba Cache is allocated.", ``srt/model_executor/
pool_configurator.py`` "Use sliding window memory pool.", ``srt/mem_cache/kv_cache_configurator.py``
"max_running_requests is capped to" and "Memory pool end.", ``srt/managers/scheduler.py``
"max_total_num_tokens=").

Multimodal checkpoints (``*ForConditionalGeneration``) load an image processor that needs files a
config-only directory lacks; their text model is served instead (``text_config`` with the text
architecture), for SGLang and regen alike.

``--dry-cpu`` runs the same sequence against regen's simulated server (``regen serve-simulated``)
launched with regen's own plan, so the numbers agree by construction: it checks the plumbing.
Last line: ``truth: models=… max_kv_error=… max_weights_error=… max_swa_error=… refused_as_sglang=…``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.gpu import harness, serverlog
from bench.harness import add_campaign_args, fmt, publish, write_json

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "resources" / "models"
GPU_MEMORY_MIB = 143771  # the H200's total as nvidia-smi reports it (issue 33)
#: the workload regen plans for in issue 33 (prompt p50/p99, answer budget)
WORKLOAD_ARGS = ("--prompt-p50", "300", "--prompt-p99", "2000", "--max-tokens", "8192")
#: the line after which SGLang's pools are sized and allocated (kv_cache_configurator.py)
POOL_END = "Memory pool end."
#: text architecture of each multimodal checkpoint served text-only
TEXT_ARCHITECTURE = {
    "Qwen3_5ForConditionalGeneration": "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForConditionalGeneration": "Qwen3_5MoeForCausalLM",
    "Gemma3ForConditionalGeneration": "Gemma3ForCausalLM",
}


@dataclass(frozen=True, slots=True)
class Target:
    """One SGLang start: a model directory under ``resources/models`` and the flags it runs with."""

    name: str
    model: str
    flags: tuple[str, ...] = ()
    #: flags for a second start when the first failed for want of a package on the host (not a planner
    #: question), e.g. gpt-oss's default MXFP4 MoE path needs ``triton_kernels``, which pip cannot fetch
    retry_flags: tuple[str, ...] | None = None
    why: str = ""


#: gpt-oss (20b and 120b alike): the flags that select SGLang's request-capped SWA configurator, and
#: the retry that adds the MXFP4 MoE backend a host without ``triton_kernels`` can run
GPT_OSS_FLAGS = ("--disable-radix-cache", "--max-running-requests", "256")
GPT_OSS_RETRY_FLAGS = (*GPT_OSS_FLAGS, "--moe-runner-backend", "flashinfer_mxfp4")

#: every family that fits one H200 with dummy weights (gemma-3-27b-it: no public config found), the ones
#: regen has never been checked on first (a run past --deadline-s drops the last)
TARGETS: tuple[Target, ...] = (
    Target("llama-3.1-8b", "llama-3.1-8b", why="dense GQA"),
    Target("mixtral-8x7b", "mixtral-8x7b", why="MoE (num_local_experts, no moe_intermediate_size)"),
    Target("qwen3-32b-fp8", "qwen3-32b-fp8", why="FP8 block weights"),
    Target("qwen3-30b-a3b-fp8", "qwen3-30b-a3b-fp8", why="FP8 block MoE"),
    Target(
        "gpt-oss-20b",
        "gpt-oss-20b",
        GPT_OSS_FLAGS,
        retry_flags=GPT_OSS_RETRY_FLAGS,
        why="MXFP4 + sliding window; these flags select SGLang's request-capped SWA configurator",
    ),
    Target("nemotron-3-nano-30b-a3b", "nemotron-3-nano-30b-a3b", why="Mamba2 hybrid MoE"),
    Target("qwen3.6-27b-text", "gpu-qwen3.6-27b-text", why="GDN hybrid dense"),
    Target("qwen3.5-35b-a3b-text", "qwen3.5-35b-a3b", why="GDN hybrid MoE (Qwen3.6-35B-A3B's shape)"),
    Target("qwen3-30b-a3b", "qwen3-30b-a3b", why="MoE (num_experts)"),
    Target("qwen3-8b", "qwen3-8b", why="dense GQA"),
    Target(
        "gpt-oss-120b",
        "gpt-oss-120b",
        GPT_OSS_FLAGS,
        retry_flags=GPT_OSS_RETRY_FLAGS,
        why="MXFP4 experts at 117B (issue 49 item 4: the weights as loaded, 128 experts a layer, 36 layers)",
    ),
)


# ------------------------------------------------------------------------------------ the server log

_KV = re.compile(
    r"(?:(?P<label>Full|SWA) )?KV Cache is allocated\. dtype: (?P<dtype>\S+), #tokens: (?P<tokens>\d+)"
)
_ERROR = re.compile(r"^.*\w(?:Error|Exception): .*$", re.M)  # a raised exception's message line
#: a failed import that ends the start (SGLang also logs imports it ignores: "Ignore import error when
#: loading sglang.srt.models.inkling: No module named 'helion'", which must not count)
_MISSING_PACKAGE = re.compile(r"(?:ModuleNotFoundError|ImportError): No module named '([\w.]+)'")


@dataclass(frozen=True, slots=True)
class Startup:
    """What one SGLang start logged about its memory, up to its pools (first occurrence of each line:
    the target model's, before any draft model's)."""

    weights_gib: float | None = None
    kv_tokens: int | None = None  # the full-attention pool (the only pool without sliding window)
    swa_tokens: int | None = None
    kv_dtype: str | None = None
    mamba_cache_size: int | None = None
    capped_running: int | None = None
    max_total_num_tokens: int | None = None
    max_running_requests: int | None = None
    pool_end_avail_gib: float | None = None
    mem_fraction_static: float | None = None
    pool_allocated: bool = False
    error: str | None = None
    missing_package: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def read_startup(text: str) -> Startup:
    """SGLang 0.5.17's startup memory lines from a log (see the module doc for where each is printed)."""
    facts = serverlog.startup_facts(text, first=True)
    kv: dict[str | None, tuple[int, str]] = {}
    for m in _KV.finditer(text):
        kv.setdefault(m["label"], (int(m["tokens"]), m["dtype"]))
    full = kv.get(None) or kv.get("Full")
    swa = kv.get("SWA")
    kv_tokens = full[0] if full else facts.get("swa_pool_full_tokens")
    swa_tokens = swa[0] if swa else facts.get("swa_pool_swa_tokens")
    errors = _ERROR.findall(text)
    missing = _MISSING_PACKAGE.findall(text)
    return Startup(
        weights_gib=facts.get("weight_mem_gb"),
        kv_tokens=kv_tokens,
        swa_tokens=swa_tokens,
        kv_dtype=full[1] if full else None,
        mamba_cache_size=facts.get("mamba_cache_size"),
        capped_running=facts.get("capped_running"),
        max_total_num_tokens=facts.get("max_total_num_tokens"),
        max_running_requests=facts.get("max_running_requests"),
        pool_end_avail_gib=facts.get("pool_end_avail_gib"),
        mem_fraction_static=facts.get("mem_fraction_static"),
        pool_allocated=POOL_END in text or "max_total_num_tokens=" in text,
        error=errors[-1].strip()[:400] if errors else None,
        missing_package=missing[-1] if missing else None,
    )


def trimmed_log(text: str, head: int = 12, tail: int = 25) -> str:
    """The lines worth keeping from a server log: its first lines, every memory line, its last lines
    (``server_args=`` is cut to 2,000 characters)."""
    lines = text.splitlines()
    keep = re.compile(
        r"Load weight|KV Cache|Mamba Cache|sliding window|Memory pool|max_running_requests|"
        r"max_total_num_tokens|mem_fraction|Capture|Error|error|Traceback|fired up|Decode batch|"
        r"REGEN_MEMPROBE"
    )
    chosen = set(range(min(head, len(lines)))) | set(range(max(0, len(lines) - tail), len(lines)))
    chosen |= {i for i, line in enumerate(lines) if keep.search(line)}
    out = []
    for i in sorted(chosen):
        line = lines[i]
        out.append(line[:2000] + (" …" if len(line) > 2000 else ""))
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------ regen's plan


def regen_argv(*args: str) -> list[str]:
    """``regen ARGS`` through this interpreter (the host has no ``regen`` script: PYTHONPATH only)."""
    return [sys.executable, "-c", "import sys; from regen.cli import main; sys.exit(main())", *args]


@dataclass(frozen=True, slots=True)
class RegenPlan:
    """``regen tune --json`` for a model directory under given flags: its exit status and plan."""

    rc: int
    plan: dict[str, Any] | None
    message: str  # stderr's last lines (a refusal's reason)

    @property
    def refused(self) -> bool:
        return self.rc != 0

    def number(self, key: str) -> float | None:
        value = (self.plan or {}).get(key)
        return float(value) if isinstance(value, (int, float)) else None


def regen_tune(
    model_dir: Path, flags: tuple[str, ...], *extra: str, gpu_mib: int = GPU_MEMORY_MIB
) -> RegenPlan:
    """Run ``regen tune --json`` (SGLang 0.5.17's rules) for ``model_dir``; ``flags`` follow ``--``."""
    argv = regen_argv(
        "tune",
        "--json",
        "--sglang-version",
        harness.SGLANG_VERSION,
        "--gpu-memory-mib",
        str(gpu_mib),
        "--model-config",
        str(model_dir),
        *extra,
    )
    if flags:
        argv += ["--", *flags]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    plan = None
    if done.returncode == 0:
        try:
            plan = json.loads(done.stdout)
        except json.JSONDecodeError:
            return RegenPlan(2, None, "regen tune --json printed no JSON: " + done.stdout[-300:])
    return RegenPlan(done.returncode, plan, "\n".join(done.stderr.strip().splitlines()[-5:]))


# ------------------------------------------------------------------------------------ model dirs


def model_dir_for(target: Target, work: Path) -> Path:
    """The directory served: the real config as it is, or its text model for a multimodal checkpoint."""
    src = MODELS / target.model
    config = json.loads((src / "config.json").read_text())
    arch = (config.get("architectures") or [""])[0]
    if arch not in TEXT_ARCHITECTURE:
        return src
    text = dict(config["text_config"])
    text["architectures"] = [TEXT_ARCHITECTURE[arch]]
    if "tie_word_embeddings" not in text and "tie_word_embeddings" in config:
        text["tie_word_embeddings"] = config["tie_word_embeddings"]
    out = work / "models" / target.name
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(text, indent=2) + "\n")
    (out / "DERIVED").write_text(
        f"text model of {src / 'config.json'} ({arch} -> {TEXT_ARCHITECTURE[arch]})\n"
    )
    return out


# ------------------------------------------------------------------------------------ servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sglang_argv(model_dir: Path, port: int, flags: tuple[str, ...]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model_dir),
        "--load-format",
        "dummy",
        "--skip-tokenizer-init",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *flags,
    ]


def simulated_argv(
    port: int, log: Path, options: dict[str, Any], max_running: int, token_rate: float
) -> list[str]:
    return regen_argv(
        "serve-simulated",
        "--port",
        str(port),
        "--log-file",
        str(log),
        "--version",
        harness.SGLANG_VERSION,
        "--max-running-requests",
        str(max_running),
        "--token-rate",
        str(token_rate),
        "--options",
        json.dumps(options),
    )


@dataclass
class Server:
    """A server process in its own session (SGLang's scheduler and detokenizer are its children)."""

    argv: list[str]
    log: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = field(default_factory=time.time)
    #: added to the server's environment (the startup check's weight-load memory probe)
    extra_env: dict[str, str] = field(default_factory=dict)

    def start(self) -> Server:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as fh:
            fh.write(f"=== truth-bench: {' '.join(self.argv)}\n".encode())
            env = dict(os.environ, PYTHONUNBUFFERED="1", **self.extra_env)
            self.proc = subprocess.Popen(
                self.argv,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
        self.started = time.time()
        return self

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_for(self, needles: tuple[str, ...], timeout_s: float) -> str:
        """Wait until the log holds one of ``needles`` ("found"), the process ended ("exited") or the
        time ran out ("timeout")."""
        end = time.time() + timeout_s
        while time.time() < end:
            text = self.text()
            if any(n in text for n in needles):
                return "found"
            if not self.alive():
                return "exited"
            time.sleep(0.5)
        return "timeout"

    def stop(self) -> None:
        """Kill the process group: SIGTERM, then SIGKILL after 10 s."""
        if self.proc is None:
            return
        for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        # the group may outlive its leader (scheduler children): make sure it is gone
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


def wait_gpu_free(dry: bool, limit_mib: int = 2048, timeout_s: float = 60) -> int | None:
    """Wait until the GPU holds less than ``limit_mib`` (a killed server's memory takes seconds to go)."""
    return None if dry else harness.wait_gpu_free(limit_mib, timeout_s)


# ------------------------------------------------------------------------------------ one target


def simulated_options(plan: RegenPlan) -> dict[str, Any]:
    """The simulated server's memory map from regen's plan; a speculative step makes it print SGLang
    0.5.17's "Load weight end." and "KV Cache is allocated." lines (the target's come first)."""
    p = plan.plan or {}
    return {
        "max_total_num_tokens": int(p.get("kv_cache_tokens") or 1),
        "weights_gib": float(p.get("weights_gib") or 0.0),
        "kv_cache_gib": float(p.get("kv_cache_gib") or 0.0),
        "mem_fraction_static": float(p.get("mem_fraction_static") or 0.9),
        "speculative_num_steps": 1,
    }


def relative_error(predicted: float | None, realized: float | None) -> float | None:
    if predicted is None or realized is None or realized == 0:
        return None
    return (predicted - realized) / realized


MEMPROBE_DIR = Path(__file__).parent / "memprobe"
_MEMPROBE = re.compile(r"^.*REGEN_MEMPROBE (\{.*\})\s*$", re.M)


def memprobe_env() -> dict[str, str]:
    """The weight-load memory probe (``memprobe/sitecustomize.py``) on the server's PYTHONPATH: one log line
    that splits SGLang's "Load weight ... mem usage" into live tensors by kind, the caching allocator's
    stranded space and what PyTorch does not own (issue 49 item 4)."""
    path = os.pathsep.join(x for x in (str(MEMPROBE_DIR), os.environ.get("PYTHONPATH", "")) if x)
    return {"REGEN_MEMPROBE": "1", "PYTHONPATH": path}


def memprobe(text: str) -> dict[str, Any] | None:
    found = _MEMPROBE.search(text)
    if found is None:
        return None
    try:
        return dict(json.loads(found[1]))
    except ValueError:
        return None


def start_and_read(
    target: Target,
    model_dir: Path,
    flags: tuple[str, ...],
    plan: RegenPlan,
    work: Path,
    dry: bool,
    timeout_s: float,
) -> tuple[Startup, str, float]:
    """Start one server, read its log to the pools, kill it: (what it logged, its log, seconds)."""
    port = free_port()
    log = work / "logs" / f"{target.name}{'-retry' if flags == target.retry_flags else ''}.log"
    log.unlink(missing_ok=True)
    if dry:
        argv = simulated_argv(port, log, simulated_options(plan), max_running=256, token_rate=0.0)
    else:
        argv = sglang_argv(model_dir, port, flags)
    server = Server(argv, log, port, extra_env={} if dry else memprobe_env()).start()
    t0 = time.time()
    try:
        state = server.wait_for((POOL_END, "max_total_num_tokens="), timeout_s)
        if state == "found":
            time.sleep(1.0)  # the pool's last lines and the dry run's batch of startup lines
    finally:
        server.stop()
    text = server.text()
    seconds = time.time() - t0
    startup = read_startup(text)
    if state == "timeout" and not startup.pool_allocated:
        startup = Startup(**{**startup.to_json(), "error": f"no pool after {timeout_s:.0f} s"})
    return startup, text, seconds


def check_target(target: Target, work: Path, dry: bool, timeout_s: float) -> dict[str, Any]:
    """One target: regen's plan, SGLang's start (and the package-fallback start), the comparison."""
    model_dir = model_dir_for(target, work)
    flags = target.flags
    plan = regen_tune(model_dir, flags, *WORKLOAD_ARGS)
    # memory a previous server left would shrink this one's pools
    used = None if dry else harness.gpu_memory_used_mib()
    startup, text, seconds = start_and_read(target, model_dir, flags, plan, work, dry, timeout_s)
    attempts = [
        {
            "flags": list(flags),
            "seconds": round(seconds, 1),
            "gpu_used_before_mib": used,
            "startup": startup.to_json(),
        }
    ]
    if not startup.pool_allocated and startup.missing_package and target.retry_flags:
        wait_gpu_free(dry)
        flags = target.retry_flags
        plan = regen_tune(model_dir, flags, *WORKLOAD_ARGS)
        startup, text, seconds = start_and_read(target, model_dir, flags, plan, work, dry, timeout_s)
        attempts.append({"flags": list(flags), "seconds": round(seconds, 1), "startup": startup.to_json()})
    (work / "logs" / f"{target.name}.trimmed.log").write_text(trimmed_log(text))
    wait_gpu_free(dry)
    started = startup.pool_allocated
    row: dict[str, Any] = {
        "name": target.name,
        "model_dir": str(model_dir.relative_to(REPO) if model_dir.is_relative_to(REPO) else model_dir),
        "why": target.why,
        "flags": list(flags),
        "attempts": attempts,
        "sglang": startup.to_json(),
        "regen": {
            "rc": plan.rc,
            "message": plan.message,
            **{
                k: plan.number(k)
                for k in (
                    "kv_cache_tokens",
                    "swa_tokens",
                    "weights_gib",
                    "mem_fraction_static",
                    "effective_max_running_requests",
                    "max_mamba_cache_size",
                )
            },
        },
        "sglang_started": started,
        "regen_refused": plan.refused,
        "memprobe": memprobe(text),
    }
    if started and not plan.refused:
        row["kv_error"] = relative_error(plan.number("kv_cache_tokens"), startup.kv_tokens)
        row["weights_error"] = relative_error(plan.number("weights_gib"), startup.weights_gib)
        row["swa_error"] = (
            relative_error(plan.number("swa_tokens"), startup.swa_tokens)
            if startup.swa_tokens is not None
            else None
        )
        row["swa_missing_in_regen"] = startup.swa_tokens is not None and plan.number("swa_tokens") is None
    row["verdict"] = verdict(row, startup)
    return row


def verdict(row: dict[str, Any], startup: Startup) -> str:
    started, refused = row["sglang_started"], row["regen_refused"]
    if not started and startup.missing_package:
        return f"not measured: the host lacks {startup.missing_package}"
    if not started and refused:
        return "refused as SGLang"
    if not started:
        return "SGLang failed, regen planned"
    if refused:
        return "regen refused, SGLang ran"
    bad = [
        k
        for k, tol in (("kv_error", 0.01), ("weights_error", 0.02), ("swa_error", 0.01))
        if row.get(k) is not None and abs(row[k]) > tol
    ]
    if row.get("swa_missing_in_regen"):
        bad.append("swa_tokens missing")
    return "ok" if not bad else "off: " + ", ".join(bad)


# ------------------------------------------------------------------------------------ report


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def worst(key: str) -> tuple[float | None, str | None]:
        found = [(abs(r[key]), r["name"]) for r in rows if r.get(key) is not None]
        return max(found) if found else (None, None)

    failed = [r for r in rows if not r["sglang_started"] and not r["sglang"].get("missing_package")]
    out: dict[str, Any] = {
        "models": len(rows),
        "compared": sum(1 for r in rows if r.get("kv_error") is not None),
        "refused_as_sglang": sum(1 for r in failed if r["regen_refused"]),
        "sglang_failed": len(failed),
        "regen_refused_sglang_ran": [r["name"] for r in rows if r["sglang_started"] and r["regen_refused"]],
        "not_measured": [
            r["name"] for r in rows if r["sglang"].get("missing_package") and not r["sglang_started"]
        ],
    }
    for key in ("kv_error", "weights_error", "swa_error"):
        value, name = worst(key)
        out[f"max_{key}"], out[f"max_{key}_model"] = value, name
    holds = [r for r in rows if "hold" in r]
    if holds:
        out["hold_runs"] = len(holds)
        out["held"] = [r["name"] for r in holds if r["hold"].get("verdict") == "held"]
        out["not_held"] = {
            r["name"]: r["hold"].get("verdict") for r in holds if r["hold"].get("verdict") != "held"
        }
    return out


def pct(value: float | None) -> str:
    return "na" if value is None else f"{100 * value:.2f}%"


def final_line(s: dict[str, Any]) -> str:
    return (
        f"truth: models={s['models']} max_kv_error={pct(s['max_kv_error'])} "
        f"max_weights_error={pct(s['max_weights_error'])} max_swa_error={pct(s['max_swa_error'])} "
        f"refused_as_sglang={s['refused_as_sglang']}/{s['sglang_failed']}"
        + (f" held={len(s['held'])}/{s['hold_runs']}" if s.get("hold_runs") else "")
    )


def markdown(doc: dict[str, Any]) -> str:
    s = doc["summary"]
    lines = [
        f"# regen's planner against SGLang {harness.SGLANG_VERSION} ({doc['date']})",
        "",
        (
            "**DRY RUN on CPU against regen's simulated server (fed regen's own plan): not a measurement.**\n"
            if doc["dry_cpu"]
            else ""
        ),
        f"Host: {doc['host']}. One SGLang start per model (`--load-format dummy --skip-tokenizer-init`), "
        "killed once its pools were allocated; regen: `regen tune --json --sglang-version "
        f"{harness.SGLANG_VERSION} "
        f"--gpu-memory-mib {doc['gpu_memory_mib']} {' '.join(WORKLOAD_ARGS)} --model-config DIR -- FLAGS`. "
        "Errors are (regen − SGLang) / SGLang; targets: KV within 1%, weights within 2%.",
        "",
        "| model | flags | SGLang weights GiB | regen | KV tokens (SGLang) | regen | KV err | SWA tokens "
        "(SGLang) | regen | weights err | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        sg, rg = r["sglang"], r["regen"]
        lines.append(
            f"| {r['name']} | `{' '.join(r['flags']) or '(defaults)'}` | "
            f"{fmt(sg['weights_gib'], 2, '—', thousands=True)} | "
            f"{fmt(rg['weights_gib'], 2, '—', thousands=True)} | "
            f"{fmt(sg['kv_tokens'], 0, '—', thousands=True)} | "
            f"{fmt(rg['kv_cache_tokens'], 0, '—', thousands=True)} | "
            f"{pct(r.get('kv_error'))} | {fmt(sg['swa_tokens'], 0, '—', thousands=True)} | "
            f"{fmt(rg['swa_tokens'], 0, '—', thousands=True)} | "
            f"{pct(r.get('weights_error'))} | {r['verdict']} |"
        )
    lines += ["", "Failures (SGLang's last error line, regen's message):", ""]
    for r in doc["rows"]:
        if not r["sglang_started"] or r["regen_refused"]:
            lines.append(
                f"- {r['name']}: SGLang: {r['sglang'].get('error') or '—'}; regen (rc {r['regen']['rc']}): "
                f"{r['regen']['message'] or '—'}"
            )
    holds = [r for r in doc["rows"] if "hold" in r]
    if holds:
        workload = " ".join(holds[0]["hold"].get("workload_args") or [])
        lines += ["", f"Hold at the planned batch (regen's recommendation, `{workload}`):", ""]
        for r in holds:
            h = r["hold"]
            lines.append(
                f"- {r['name']}: {h.get('verdict')}; `{' '.join(h.get('args') or [])}`, client "
                f"{h.get('client_concurrency')}, median running {h.get('median_running')}, held "
                f"{h.get('held_s')} s, retracted {h.get('retracted_reqs')}, decode headroom "
                f"{h.get('decode_headroom')}"
            )
    lines += ["", "```", final_line(s), "```", ""]
    return "\n".join(lines)


def host_name(dry: bool) -> str:
    if dry:
        return "CPU (dry run)"
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return out or "unknown GPU"


#: the hold phase after a target's startup check (``bench/gpu/truth_run.py`` passes ``hold.with_hold``)
HoldPhase = Callable[[dict[str, Any], Target, argparse.Namespace], None]


def main(
    argv: list[str] | None = None, hold_phase: HoldPhase | None = None, default_hold_s: float = 0.0
) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_campaign_args(p, work=Path("/tmp/truth-work/planner"))
    p.add_argument("--only", default="", help="comma-separated target names, in that order")
    p.add_argument("--start-timeout-s", type=float, default=240.0, help="per start, launch to pools")
    p.add_argument("--deadline-s", type=float, default=720.0, help="start no model after this many seconds")
    p.add_argument(
        "--hold-s",
        type=float,
        default=default_hold_s,
        help="after the startup check, hold regen's recommended server at its planned batch this long "
        "(bench/gpu/hold.py; 0: startups only; default %(default)g)",
    )
    p.add_argument("--hold", default="", help="comma-separated targets to hold (default: every target run)")
    a = p.parse_args(argv)
    if a.hold_s > 0 and hold_phase is None:
        p.error("--hold-s needs the hold phase: run python -m bench.gpu.truth_run")
    t0 = time.time()
    targets = list(TARGETS)
    if a.only:
        by_name = {t.name: t for t in TARGETS}
        targets = [by_name[n] for n in a.only.split(",")]
    a.out.mkdir(parents=True, exist_ok=True)
    (a.work / "logs").mkdir(parents=True, exist_ok=True)
    stem = "planner-truth-" + dt.date.today().isoformat() + ("-dry" if a.dry_cpu else "")
    doc: dict[str, Any] = {
        "date": dt.date.today().isoformat(),
        "dry_cpu": a.dry_cpu,
        "host": host_name(a.dry_cpu),
        "gpu_memory_mib": GPU_MEMORY_MIB,
        "sglang_version": harness.SGLANG_VERSION,
        "rows": [],
        "skipped": [],
    }
    for target in targets:
        if time.time() - t0 > a.deadline_s:
            doc["skipped"].append(target.name)
            continue
        print(f"[{time.time() - t0:6.0f} s] {target.name} {' '.join(target.flags)}", flush=True)
        row = check_target(target, a.work, a.dry_cpu, a.start_timeout_s)
        if hold_phase is not None and a.hold_s > 0 and (not a.hold or target.name in a.hold.split(",")):
            hold_phase(row, target, a)
        doc["rows"].append(row)
        print(
            f"    sglang kv={row['sglang']['kv_tokens']} swa={row['sglang']['swa_tokens']} "
            f"weights={row['sglang']['weights_gib']} | regen kv={row['regen']['kv_cache_tokens']} "
            f"swa={row['regen']['swa_tokens']} weights={row['regen']['weights_gib']} rc={row['regen']['rc']} "
            f"-> {row['verdict']}",
            flush=True,
        )
        doc["summary"] = summary(doc["rows"])
        write_json(a.out / f"{stem}.json", doc)  # after every model: a partial run keeps what it measured
    doc["summary"] = summary(doc["rows"])
    return publish(a.out, stem, doc, markdown(doc), final_line(doc["summary"]))


if __name__ == "__main__":
    raise SystemExit(main())
