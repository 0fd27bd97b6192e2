"""SGLang's own throughput readings: ``Decode batch`` log lines and the ``/metrics`` gauges.

The live sweep ranks candidates by the server's steady-state decode rate, not by a client-side
window: SGLang logs one ``Decode batch`` line every ``decode_log_interval`` steps (40 by default)
with ``#running-req`` and ``gen throughput (token/s)``, the tokens generated since the previous
line over the wall time since it (prefill batches in between included). The steady state is the
**median gen throughput of the lines whose ``#running-req`` sits at its plateau** (within 2 % of
the maximum, the first such line dropped because it still averages over the ramp) — the method of
the 2026-11-29 H200 run. Medians over every line (ramp and tail included) read differently, so
every figure carries its method (:attr:`SteadyState.method`).

``/metrics`` (``--enable-metrics``, which regen always passes) exposes the same reading as the gauge
``sglang:gen_throughput`` next to ``sglang:num_running_reqs``; :func:`sample_metrics` polls it, and
:func:`steady_state` applies the same plateau rule to the samples when no log is at hand.

Speculative decoding (EAGLE/NEXTN): the decode line adds ``accept len: a, accept rate: r`` (accepted
tokens per verify step, bonus token included) and ``/metrics`` the gauge ``sglang:spec_accept_length``.
``gen throughput`` already counts accepted tokens (a verify step adds each request's accepted drafts and
its bonus token to the tokens generated, ``MetricsReporter.update_spec_metrics``, 0.5.17 and 0.5.23), so
the steady rate of an MTP server is its accepted tokens per second; :attr:`SteadyState.accept_len` is the
median accept length at the plateau, for the record and the explanation, not a factor to apply.
"""

from __future__ import annotations

import re
import statistics
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regen.serving.probes import NO_ANSWER

PLATEAU_TOLERANCE = 0.02
METHOD_LOG = "median gen throughput of the server log's Decode batch lines at the #running-req plateau"
METHOD_METRICS = "median sglang:gen_throughput of /metrics samples at the num_running_reqs plateau"

_DECODE = re.compile(
    r"(?:^\[(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)[^\]\n]*\] )?"
    r"Decode batch(?: \[\d+\])?, #running-req: (?P<running>\d+), .*?"
    r"#(?:full )?token: (?P<tokens>\d+), .*?"
    r"(?:accept len: (?P<accept>[0-9.]+), .*?)?"
    r"(?:cuda graph|graph): (?P<graph>True|False), "
    r"gen throughput \(token/s\): (?P<tps>[0-9.]+), #queue-req: (?P<queue>\d+)",
    re.MULTILINE,
)
_PROM = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(?P<value>[-+0-9.eEinfINFaN]+)")


@dataclass(frozen=True, slots=True)
class DecodeSample:
    """One reading: running requests, context tokens held, gen tok/s, queue (log line or poll)."""

    running: int
    tokens: int
    gen_tps: float
    queue: int
    cuda_graph: bool | None = None
    at: float | None = None  # epoch seconds (the log line's local-time stamp; None for /metrics polls)
    accept_len: float | None = None  # speculative decoding: accepted tokens per verify step


@dataclass(frozen=True, slots=True)
class SteadyState:
    """The decode rate while the running batch sits at its plateau."""

    plateau_running: int
    samples: int
    median_tps: float
    peak_tps: float
    mean_context: float
    cuda_graph_fraction: float | None
    method: str
    plateau_from: float | None = None  # epoch seconds of the first sample at the plateau (log stamps)
    accept_len: float | None = None  # median accept length at the plateau (speculative decoding)
    #: (running, gen tok/s) of the samples after the plateau with the batch fallen below it (the drain)
    falling: tuple[tuple[int, float], ...] = ()

    def step_points(self) -> list[tuple[int, float]]:
        """(running, tok/s) to fit a decode step's cost to: the plateau (weighted by its samples) and the
        falling batch after it, whose small batches show the step's batch-independent part."""
        return [(self.plateau_running, self.median_tps)] * self.samples + list(self.falling)

    def to_json(self) -> dict[str, Any]:
        return {
            "plateau_running": self.plateau_running,
            "samples": self.samples,
            "median_decode_tps": round(self.median_tps, 1),
            "peak_decode_tps": round(self.peak_tps, 1),
            "mean_context_tokens": round(self.mean_context, 1),
            "cuda_graph_fraction": None
            if self.cuda_graph_fraction is None
            else round(self.cuda_graph_fraction, 3),
            "method": self.method,
            "plateau_from": self.plateau_from,
            "accept_len": None if self.accept_len is None else round(self.accept_len, 3),
            "falling_samples": len(self.falling),
        }


def decode_samples(log_text: str) -> list[DecodeSample]:
    """Every ``Decode batch`` line of a server log, in order."""
    return [
        DecodeSample(
            running=int(m["running"]),
            tokens=int(m["tokens"]),
            gen_tps=float(m["tps"]),
            queue=int(m["queue"]),
            cuda_graph=m["graph"] == "True",
            at=time.mktime(time.strptime(m["at"], "%Y-%m-%d %H:%M:%S")) if m["at"] else None,
            accept_len=float(m["accept"]) if m["accept"] else None,
        )
        for m in _DECODE.finditer(log_text)
    ]


def log_since(path: str | Path, offset: int) -> str:
    """The text a log file gained after byte ``offset`` ('' when it does not exist)."""
    p = Path(path)
    if not p.is_file():
        return ""
    with open(p, "rb") as fh:
        fh.seek(offset)
        return fh.read().decode("utf-8", errors="replace")


def log_size(path: str | Path) -> int:
    p = Path(path)
    return p.stat().st_size if p.is_file() else 0


def steady_state(
    samples: Sequence[DecodeSample], method: str = METHOD_LOG, tolerance: float = PLATEAU_TOLERANCE
) -> SteadyState | None:
    """Median gen tok/s of the samples whose running count is within ``tolerance`` of its maximum.

    The first plateau sample still averages over the ramp and is dropped (when more than 2).
    None when there is no sample with a running request and a rate.
    """
    live = [s for s in samples if s.running > 0 and s.gen_tps > 0]
    if not live:
        return None
    top = max(s.running for s in live)
    floor = top * (1 - tolerance)
    at = [s for s in live if s.running >= floor]
    plateau_from = at[0].at
    falling = tuple((s.running, s.gen_tps) for s in live[live.index(at[0]) :] if s.running < floor)
    if len(at) > 2:
        at = at[1:]
    graphs = [s.cuda_graph for s in at if s.cuda_graph is not None]
    accepts = [s.accept_len for s in at if s.accept_len is not None]
    return SteadyState(
        plateau_running=top,
        samples=len(at),
        median_tps=statistics.median(s.gen_tps for s in at),
        peak_tps=max(s.gen_tps for s in live),
        mean_context=statistics.median(s.tokens / max(1, s.running) for s in at),
        cuda_graph_fraction=sum(graphs) / len(graphs) if graphs else None,
        method=method,
        plateau_from=plateau_from,
        accept_len=statistics.median(accepts) if accepts else None,
        falling=falling,
    )


def parse_prometheus(text: str) -> dict[str, float]:
    """``name -> value`` of a Prometheus text page (the first series of each name)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _PROM.match(line)
        if m and m["name"] not in out:
            try:
                out[m["name"]] = float(m["value"])
            except ValueError:
                continue
    return out


#: a Prometheus sample line: name, optional label set, value
_METRIC_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def sum_prometheus(text: str, names: Iterable[str]) -> dict[str, float]:
    """Each named metric summed over its label sets (every TP rank's gauge) in Prometheus text format."""
    wanted = set(names)
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _METRIC_LINE.match(line)
        if m is None or m.group(1) not in wanted:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out


def sample_from_metrics(values: Mapping[str, float]) -> DecodeSample | None:
    """A :class:`DecodeSample` from SGLang's gauges (None when the page lacks them)."""
    if "sglang:gen_throughput" not in values or "sglang:num_running_reqs" not in values:
        return None
    return DecodeSample(
        running=int(values["sglang:num_running_reqs"]),
        tokens=0,
        gen_tps=float(values["sglang:gen_throughput"]),
        queue=int(values.get("sglang:num_queue_reqs", 0)),
        accept_len=values.get("sglang:spec_accept_length") or None,
    )


def fetch_metrics_page(url: str, api_key: str | None = None, timeout_s: float = 5.0) -> str:
    """GET ``{url}/metrics``: the Prometheus text page (the one request regen makes of it)."""
    req = urllib.request.Request(url.rstrip("/") + "/metrics")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return resp.read().decode("utf-8", errors="replace")


def fetch_metrics(url: str, api_key: str | None = None, timeout_s: float = 5.0) -> dict[str, float]:
    """GET ``{url}/metrics`` and parse it."""
    return parse_prometheus(fetch_metrics_page(url, api_key, timeout_s))


def sample_metrics(url: str, api_key: str | None = None) -> DecodeSample | None:
    """One ``/metrics`` reading (None when the server has no metrics or does not answer)."""
    try:
        return sample_from_metrics(fetch_metrics(url, api_key))
    except NO_ANSWER:
        return None


def server_steady_state(log_text: str, polled: Iterable[DecodeSample] = ()) -> SteadyState | None:
    """The log's steady state; the ``/metrics`` samples' when the log has no decode lines."""
    found = steady_state(decode_samples(log_text), METHOD_LOG)
    if found is not None:
        return found
    return steady_state([s for s in polled if s is not None], METHOD_METRICS)


__all__ = [
    "METHOD_LOG",
    "METHOD_METRICS",
    "DecodeSample",
    "SteadyState",
    "decode_samples",
    "fetch_metrics",
    "fetch_metrics_page",
    "log_since",
    "log_size",
    "parse_prometheus",
    "sample_from_metrics",
    "sample_metrics",
    "server_steady_state",
    "steady_state",
    "sum_prometheus",
]
