"""The GPU benches' shared harness: the workload (word prompts, the ``generate`` section), the one server
section every bench starts, the GPU's memory, the hardware probe and the bench model, running a sibling
module in its own process, and the bar a bench line states (:func:`bar_of`). Campaigns (``python -m
bench.gpu.<campaign>`` from the repo root) import it; they do not import each other's entry points."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from regen import runconfig
from regen.types import Message, Sample

#: the bar of issue 49 and issue 57: regen at least this over SGLang's defaults where the bound allows it
TARGET_RATIO = 1.15


def bar_of(bound_ratio: float) -> str:
    """A bench line's ``bar``: ``1.15`` where the bound allows :data:`TARGET_RATIO` over the defaults, else
    ``bound`` (no plan can reach it; the line states the bound instead)."""
    return f"{TARGET_RATIO}" if bound_ratio >= TARGET_RATIO else "bound"


REPO = Path(__file__).resolve().parents[2]
SPECIAL_IDS = frozenset({248044, 248045, 248046})
SGLANG_VERSION = "0.5.17"
TEMPLATE_TOKENS = 5  # "<|im_start|> user … <|im_end|> <|im_start|> assistant" around the prompt words
BASE_ARGS = ("--load-format", "dummy")
#: flags every arm of a model runs with (the families bench and the race). Nemotron-H: SGLang 0.5.17 picks
#: the ``flashinfer_cutlass`` MoE runner (``arg_groups/overrides.py``, ``_nemotron_h_overrides``), which
#: FlashInfer JIT-compiles on first use (over 30 min on the H200 host, which has no JIT cache and no network);
#: its Triton fused MoE runs the model's non-gated relu2 experts (``moe_runner/triton_utils/fused_moe.py``)
#: and compiles in seconds. Held equal for every arm: the comparison is still the plan against the defaults.
BOTH_ARMS_FLAGS: dict[str, tuple[str, ...]] = {
    "nemotron-3-nano-30b-a3b": ("--moe-runner-backend", "triton"),
}


def run_module(module: str, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """``python -m bench.gpu.<module> ARGS`` in its own process, from the repo root (its CUDA context
    ends with it)."""
    return subprocess.run([sys.executable, "-m", f"bench.gpu.{module}", *args], cwd=REPO, **kwargs)


def word_prompts(n: int, prompt_tokens: int, prefix: str, seed: int, lowest_id: int = 1) -> list[Sample]:
    """``n`` one-turn samples of exactly ``prompt_tokens`` words ``t<i>`` (one token each with the
    WordLevel tokenizer of ``make_model.py``; special ids skipped), ids ``{prefix}-{k:05d}``."""
    rng = random.Random(seed)
    out = []
    for k in range(n):
        words: list[str] = []
        while len(words) < prompt_tokens:
            i = rng.randrange(lowest_id, 248000)
            if i not in SPECIAL_IDS:
                words.append(f"t{i}")
        out.append(
            Sample(
                id=f"{prefix}-{k:05d}",
                messages=(Message("user", " ".join(words)), Message("assistant", "t1")),
                source={"file": "bench", "row": k, "format": "messages"},
            )
        )
    return out


def generate_dict(max_tokens: int, concurrency: int | None = None, timeout_s: float = 3600) -> dict[str, Any]:
    """``generate`` config for regen's client: ignore_eos so every answer has the full length."""
    return {
        "regenerate": "last",
        "thinking": "off",
        "sampling": {
            "temperature": 0.6,
            "top_p": 0.95,
            "top_k": 20,
            "max_tokens": max_tokens,
            "n": 1,
            "seed": 0,
        },
        "extra_body": {"ignore_eos": True},
        "concurrency": concurrency,
        "request_timeout_s": timeout_s,
        "max_attempts": 2,
        "backoff_base_s": 1.0,
        "truncation": "keep",
    }


def gpu_memory_mib(dry: bool) -> int:
    if dry:
        return 143771
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return int(out.split()[0])


def gpu_memory_used_mib() -> int | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            check=True,
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout
        return int(out.split()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def wait_gpu_free(limit_mib: int = 4096, timeout_s: float = 90) -> int | None:
    """Wait until the previous server's memory is released (the next one profiles free memory)."""
    deadline = time.monotonic() + timeout_s
    used = gpu_memory_used_mib()
    while used is not None and used > limit_mib and time.monotonic() < deadline:
        time.sleep(1)
        used = gpu_memory_used_mib()
    return used


@dataclass
class Timer:
    start: float = field(default_factory=time.monotonic)

    def __call__(self) -> float:
        return time.monotonic() - self.start


def count_output_tokens(records_path: Path) -> tuple[int, int, dict[str, int]]:
    """(records, completion tokens, finish reasons) of a generation records file (zeros when absent)."""
    n = tokens = 0
    reasons: dict[str, int] = {}
    lines = records_path.read_text().splitlines() if records_path.exists() else []
    for rec in (json.loads(line) for line in lines if line.strip()):
        n += 1
        tokens += int((rec.get("usage") or {}).get("completion_tokens") or 0)
        reasons[str(rec.get("finish_reason"))] = reasons.get(str(rec.get("finish_reason")), 0) + 1
    return n, tokens, reasons


def bench_server_cfg(
    model_dir: Path,
    dry: bool,
    *,
    args: list[str],
    use_tuner: bool,
    port_base: int,
    simulated: dict[str, Any] | None,
) -> runconfig.ServerConfig:
    """The ``server`` section every GPU bench starts its one server with (the simulated server's
    behaviour, when given, for the CPU rehearsal), typed."""
    cfg: dict[str, Any] = {
        "mode": "simulated" if dry else "sglang",
        "model_path": str(model_dir),
        "args": list(args),
        "use_tuner": use_tuner,
        "host": "127.0.0.1",
        "port_base": port_base,
        "gpus": 1,
        "tp": 1,
        "reasoning_parser": "qwen3",
        "startup_timeout_s": 900,
        "idle_timeout_s": 1800,
        "max_restarts": 0,
    }
    if simulated is not None:
        cfg["simulated"] = simulated
    return runconfig.ServerConfig.from_mapping(cfg)


def measure_hw(dry: bool) -> dict[str, Any]:
    if dry:
        return {
            "gpu": "none (dry run)",
            "gpu_memory_mib": 143771,
            "hbm_bytes_per_s": 4.3e12,
            "bf16_flops_per_s": 790e12,
            "measured": False,
        }
    proc = run_module("hw", check=True, capture_output=True, text=True)
    hw = json.loads(proc.stdout.strip().splitlines()[-1])
    hw["measured"] = True
    return hw


def make_model(model_dir: Path, layers: int) -> dict[str, Any]:
    if not (model_dir / "tokenizer.json").exists():
        run_module("make_model", str(model_dir.resolve()), str(layers), check=True)
    return json.loads((model_dir / "config.json").read_text())
