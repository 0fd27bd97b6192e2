"""Read what a real SGLang server printed: decode-batch lines and the startup memory map.

This is the benchmark's own reading, independent of ``regen.sglang.plan.parse_startup_log``, so
that the two can be compared: a field regen's parser misses shows up as a divergence.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import Any

_DECODE = re.compile(
    r"Decode batch(?: \[\d+\])?, #running-req: (?P<running>\d+), .*?"
    r"#(?:full )?token: (?P<tokens>\d+), .*?"
    r"(?:mamba num: (?P<mamba>\d+), .*?)?"
    r"(?:accept len: (?P<accept>[0-9.]+), .*?)?"
    r"(?:cuda graph|graph): (?P<graph>True|False), "
    r"gen throughput \(token/s\): (?P<tps>[0-9.]+), #queue-req: (?P<queue>\d+)"
)
_FACTS: dict[str, tuple[re.Pattern[str], type]] = {
    "capped_running": (re.compile(r"max_running_requests is capped to (\d+) by the mamba state"), int),
    "capped_slots_per_req": (
        re.compile(r"\((?:max_mamba_cache_size=\d+), (\d+) state slots per request"),
        int,
    ),
    "mamba_cache_size": (re.compile(r"Mamba Cache is allocated\. max_mamba_cache_size: (\d+)"), int),
    "ssm_state_gb": (re.compile(r"ssm_state size: ([0-9.]+)GB"), float),
    "conv_state_gb": (re.compile(r"conv_state size: ([0-9.]+)GB"), float),
    "kv_tokens": (re.compile(r"KV Cache is allocated\..*?#tokens: (\d+)"), int),
    "max_total_num_tokens": (re.compile(r"max_total_num_tokens=(\d+)"), int),
    "max_running_requests": (re.compile(r"max_total_num_tokens=\d+.*?max_running_requests=(\d+)"), int),
    "available_gpu_mem_gb": (re.compile(r"available_gpu_mem=([0-9.]+) GB"), float),
    "weight_mem_gb": (re.compile(r"Load weight end\..*?mem usage=([0-9.]+) GB"), float),
    "decode_graph_mem_gb": (
        re.compile(r"Capture target decode CUDA graph end\..*?mem usage=([0-9.]+) GB"),
        float,
    ),
    "mem_fraction_static": (re.compile(r"mem_fraction_static=([0-9.]+)"), float),
    "decode_graph_max_bs": (
        re.compile(r"Capture target decode CUDA graph begin\..*?bs=\[[^\]]*?(\d+)\]"),
        int,
    ),
}


@dataclass(frozen=True, slots=True)
class DecodeLine:
    """One ``Decode batch`` log line."""

    running: int
    tokens: int
    mamba: int | None
    cuda_graph: bool
    gen_tps: float
    queue: int
    accept_len: float | None = None  # speculative decoding: accepted tokens per verify step


def decode_lines(text: str) -> list[DecodeLine]:
    """Every ``Decode batch`` line of a server log, in order."""
    out = []
    for m in _DECODE.finditer(text):
        out.append(
            DecodeLine(
                running=int(m["running"]),
                tokens=int(m["tokens"]),
                mamba=int(m["mamba"]) if m["mamba"] else None,
                cuda_graph=m["graph"] == "True",
                gen_tps=float(m["tps"]),
                queue=int(m["queue"]),
                accept_len=float(m["accept"]) if m["accept"] else None,
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class SteadyState:
    """The decode rate while the running batch sits at its plateau."""

    plateau_running: int
    lines: int
    median_tps: float
    peak_tps: float
    mean_context: float
    cuda_graph_fraction: float
    median_accept_len: float | None = None  # speculative decoding; None without it

    def to_json(self) -> dict[str, Any]:
        return {
            "median_accept_len": None if self.median_accept_len is None else round(self.median_accept_len, 3),
            "plateau_running": self.plateau_running,
            "lines": self.lines,
            "median_decode_tps": round(self.median_tps, 1),
            "peak_decode_tps": round(self.peak_tps, 1),
            "mean_context_tokens": round(self.mean_context, 1),
            "cuda_graph_fraction": round(self.cuda_graph_fraction, 3),
        }


def steady_state(lines: list[DecodeLine], tolerance: float = 0.02) -> SteadyState | None:
    """Median gen throughput of the lines whose #running-req is within ``tolerance`` of its maximum.

    The first line after a ramp mixes in prefill time; lines below the plateau are the tail.
    """
    if not lines:
        return None
    top = max(line.running for line in lines)
    at = [line for line in lines if line.running >= top * (1 - tolerance)]
    if len(at) > 2:
        at = at[1:]  # the first plateau line still averages over the ramp
    tps = [line.gen_tps for line in at]
    accepts = [line.accept_len for line in at if line.accept_len is not None]
    return SteadyState(
        plateau_running=top,
        lines=len(at),
        median_tps=statistics.median(tps),
        peak_tps=max(line.gen_tps for line in lines),
        mean_context=statistics.median(line.tokens / max(1, line.running) for line in at),
        cuda_graph_fraction=sum(line.cuda_graph for line in at) / len(at),
        median_accept_len=statistics.median(accepts) if accepts else None,
    )


def startup_facts(text: str) -> dict[str, Any]:
    """The memory map a server printed at startup (last occurrence of each line)."""
    facts: dict[str, Any] = {}
    for key, (pattern, kind) in _FACTS.items():
        found = pattern.findall(text)
        if found:
            facts[key] = kind(found[-1])
    return facts
