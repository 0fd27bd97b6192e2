"""Read what a real SGLang server printed: decode-batch lines and the startup memory map.

This is the benchmark's own reading, independent of ``regen.sglang.plan.parse_startup_log``, so
that the two can be compared: a field regen's parser misses shows up as a divergence.
"""

from __future__ import annotations

import itertools
import re
import statistics
import time
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
    "swa_pool_full_tokens": (re.compile(r"Use sliding window memory pool\. full_layer_tokens=(\d+)"), int),
    "swa_pool_swa_tokens": (re.compile(r"Use sliding window memory pool.*?swa_layer_tokens=(\d+)"), int),
    "pool_end_avail_gib": (re.compile(r"Memory pool end\. avail mem=([0-9.]+) GB"), float),
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


_PREFILL = re.compile(
    r"Prefill batch(?: \[\d+\])?, #new-seq: (?P<seqs>\d+), #new-token: (?P<new>\d+), "
    r"#cached-token: (?P<cached>\d+),(?:.*?input throughput \(token/s\): (?P<tps>[0-9.]+))?"
)


def prefill_tokens(text: str) -> dict[str, Any]:
    """What the ``Prefill batch`` lines of a server log say was prefilled: lines, sequences, prompt tokens
    computed (``#new-token``) and read from the radix cache (``#cached-token``), and the cached share."""
    lines = seqs = new = cached = 0
    for m in _PREFILL.finditer(text):
        lines += 1
        seqs += int(m["seqs"])
        new += int(m["new"])
        cached += int(m["cached"])
    share = round(cached / (new + cached), 4) if new + cached else None
    return {
        "prefill_lines": lines,
        "prefill_seqs": seqs,
        "new_tokens": new,
        "cached_tokens": cached,
        "cached_share": share,
    }


#: a prefill line counts toward the prefill rate at this share of the largest batch's #new-token or more
FULL_PREFILL_SHARE = 0.9


def peak_rates(text: str) -> dict[str, float | None]:
    """How fast a server logged itself working, None where no line says:

    - ``peak_decode_tps``: its highest ``gen throughput`` (the tokens a decode interval gave, over its time);
    - ``prefill_tps``: the median ``input throughput`` of its full prefill batches (#new-token within 10% of
      the largest). Not the highest: SGLang 0.5.17 divides a batch's tokens by the time since the last
      prefill line, so a small batch right after another reads up to twice what the GPU computes;
    - ``fastest_token_ms``: the shortest time a request took per answer token (running / gen throughput),
      over the lines whose running count equals the line before's. A line where requests ended mid-interval
      counts their tokens against the fewer left running, and reads faster than any request went."""
    lines = [d for d in decode_lines(text) if d.running and d.gen_tps > 0]
    prefills = [(int(m["new"]), float(m["tps"])) for m in _PREFILL.finditer(text) if m["tps"]]
    largest = max((new for new, _ in prefills), default=0)
    full = [tps for new, tps in prefills if new >= FULL_PREFILL_SHARE * largest and tps > 0]
    flat = [d for before, d in itertools.pairwise(lines) if d.running == before.running]
    return {
        "peak_decode_tps": max((d.gen_tps for d in lines), default=None),
        "prefill_tps": statistics.median(full) if full else None,
        "fastest_token_ms": min((1000 * d.running / d.gen_tps for d in flat), default=None),
    }


def accept_lengths(text: str) -> dict[str, Any] | None:
    """SGLang's ``accept len`` over the decode lines that print one (MTP, EAGLE): lines, mean, median,
    running-weighted mean; None when no line has one."""
    pts = [(d.running, d.accept_len) for d in decode_lines(text) if d.accept_len is not None]
    if not pts:
        return None
    weight = sum(r for r, _ in pts)
    return {
        "lines": len(pts),
        "mean": statistics.fmean(a for _, a in pts),
        "median": statistics.median(a for _, a in pts),
        "running_weighted_mean": sum(r * a for r, a in pts) / weight if weight else None,
    }


#: a decode line below this share of the full batch (the largest #running-req) decodes in the drain
DRAIN_BELOW_FULL = 0.9


def line_tokens(line: DecodeLine) -> float:
    """Tokens decoded in the interval a decode line reports, up to SGLang's constant: it prints a line
    every ``decode_log_interval`` decode passes (0.5.17 ``metrics_reporter.py``: ``forward_ct_decode %
    decode_log_interval``), each giving every running request its accepted tokens (one without
    speculative decoding, ``accept len`` with it)."""
    return line.running * (line.accept_len if line.accept_len is not None else 1.0)


def drain_token_share(lines: list[DecodeLine], below: float = DRAIN_BELOW_FULL) -> float:
    """The share of decoded tokens decoded while the running batch was under ``below`` x the full batch
    (the largest ``#running-req`` of ``lines``): the ramp's and the drain's, what a short tail cuts.
    Read from the lines alone (:func:`line_tokens`), so it needs no timestamps; 0.0 without lines.
    Owns issue 37's ``drain_token_share``."""
    if not lines:
        return 0.0
    full = max(line.running for line in lines)
    total = sum(line_tokens(line) for line in lines)
    low = sum(line_tokens(line) for line in lines if line.running < below * full)
    return low / total if total else 0.0


#: a steady window (issue 57 item 3): between its first and last decode lines the KV in use moved less
#: than this share of the KV in use (not of the pool), and the running count less than this share of itself
STEADY_SHARE = 0.05
#: decode lines read at each end of a window (their medians): one line can catch a retraction or a refill
WINDOW_END_LINES = 3


def window_ends(lines: list[DecodeLine]) -> dict[str, float | None]:
    """A window's ends as the benches record them: the medians of the ``#token`` and ``#running-req`` of
    its first and last :data:`WINDOW_END_LINES` decode lines (None without lines)."""
    head, tail = lines[:WINDOW_END_LINES], lines[-WINDOW_END_LINES:]
    if not lines:
        return dict.fromkeys(("log_tokens_first", "log_tokens_last", "log_running_first", "log_running_last"))
    return {
        "log_tokens_first": round(statistics.median(x.tokens for x in head)),
        "log_tokens_last": round(statistics.median(x.tokens for x in tail)),
        "log_running_first": statistics.median(x.running for x in head),
        "log_running_last": statistics.median(x.running for x in tail),
    }


def _moved_less(first: float | None, last: float | None, share: float) -> bool:
    if first is None or last is None or min(first, last) <= 0:
        return False
    return abs(last - first) < share * min(first, last)


def steady_window(window: dict[str, Any], share: float = STEADY_SHARE) -> bool:
    """The one rule for a steady window (every bench's): the KV in use moved less than ``share`` of the
    KV in use and the running count less than ``share`` of itself between the window's ends
    (:func:`window_ends`; a window recorded without them is not steady: it cannot be told)."""
    kv = _moved_less(window.get("log_tokens_first"), window.get("log_tokens_last"), share)
    running = _moved_less(window.get("log_running_first"), window.get("log_running_last"), share)
    return kv and running


def steady_count(windows: list[dict[str, Any]]) -> str:
    """``k/n``: how many of ``windows`` qualify as steady (:func:`steady_window`), for a bench's line."""
    return f"{sum(steady_window(w) for w in windows)}/{len(windows)}"


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


def startup_facts(text: str, first: bool = False) -> dict[str, Any]:
    """The memory map a server printed at startup (last occurrence of each line; ``first``: the first,
    the target model's, before any draft model's)."""
    facts: dict[str, Any] = {}
    for key, (pattern, kind) in _FACTS.items():
        found = pattern.findall(text)
        if found:
            facts[key] = kind(found[0 if first else -1])
    return facts


# --- where a server's time went: its startup phases and its generation phases, from its timestamps ---

_STAMPED = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] (.*)$", re.M)
_SUPERVISOR = r"^\[regen-supervisor \S+ pid \d+ (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] "
_LAUNCH = re.compile(_SUPERVISOR + "=== regen supervisor: starting server", re.M)
_READY = re.compile(_SUPERVISOR + "server ready at ", re.M)
_ELAPSED = re.compile(r"elapsed=([0-9.]+) s")
#: (phase, the line that ends it); a phase runs from the previous mark (or the launch) to its own; the
#: last phase ends when the supervisor found the server ready (its probe answered)
STARTUP_MARKS: tuple[tuple[str, str], ...] = (
    ("interpreter and imports", "server_args=ServerArgs("),
    ("scheduler process and model config", "Load weight begin."),
    ("weights (target, then draft)", "Load weight end."),
    ("pools and prefill CUDA graphs", "Capture target prefill CUDA graph end."),
)
_GENERATED = 'POST /v1/chat/completions HTTP/1.1" 200'


def _stamp(text: str) -> float:
    return time.mktime(time.strptime(text, "%Y-%m-%d %H:%M:%S"))


def _stamped_lines(text: str) -> list[tuple[float, str]]:
    return [(_stamp(m[1]), m[2]) for m in _STAMPED.finditer(text)]


def last_start(text: str) -> str:
    """A server log from its supervisor's last launch line on (a log reused by a later start appends)."""
    starts = [m.start() for m in _LAUNCH.finditer(text)]
    return text[starts[-1] :] if starts else text


def ready_at(text: str) -> float | None:
    """When the supervisor found the server ready: its launch-time probe answered. (SGLang's own
    "fired up" line can come seconds later, after its warm-up request, while clients already run.)"""
    found = _READY.search(text)
    return _stamp(found[1]) if found else None


def supervisor_times(text: str) -> dict[str, float | None]:
    """Epoch seconds (1 s resolution) of the supervisor's first launch line and first ready line."""
    launch = _LAUNCH.search(text)
    return {"start_mark": _stamp(launch[1]) if launch else None, "ready": ready_at(text)}


def startup_phases(text: str) -> dict[str, Any]:
    """Seconds of each startup phase (``STARTUP_MARKS``, then "graphs and warm-up" to ready), from
    the supervisor's launch line to its ready line; a "begin" mark's first occurrence, any other
    mark's last, ends its phase (MTP loads two sets of weights). Also the elapsed seconds SGLang
    printed for the weights and the graph captures."""
    times = supervisor_times(text)
    start, ready = times["start_mark"], times["ready"]
    if start is None or ready is None:
        return {}
    lines = _stamped_lines(text)
    phases: dict[str, float] = {}
    previous = start
    for name, mark in STARTUP_MARKS:
        seen = [t for t, line in lines if mark in line and t <= ready]
        first = mark.endswith("begin.")  # the target's weights begin first; an MTP draft's end last
        at = (min(seen) if first else max(seen)) if seen else previous
        phases[name] = at - previous
        previous = at
    phases["decode / verify / draft CUDA graphs and warm-up"] = ready - previous
    printed = {
        key: sum(
            float(e) for t, line in lines if needle in line and t <= ready for e in _ELAPSED.findall(line)
        )
        for key, needle in (
            ("weights_s", "Load weight end."),
            ("prefill_graphs_s", "Capture target prefill CUDA graph end."),
            ("decode_graphs_s", "CUDA graph end."),
        )
    }
    printed["decode_graphs_s"] -= printed["prefill_graphs_s"]  # every other capture
    return {"launch_to_ready_s": ready - start, "phases_s": phases, "printed_elapsed_s": printed}


_LOG_INTERVAL = re.compile(r"decode_log_interval=(\d+)")


@dataclass(frozen=True, slots=True)
class PrefillCost:
    """What one prefill batch costs the decode at the full batch: each decode line reports an interval of
    ``decode_log_interval`` decode passes, which lasts ``passes x running / gen throughput`` s; the
    interval with the fewest prefills in it is the clean one, and the rest of each interval is spread over
    its prefills."""

    clean_interval_s: float
    prefills_per_interval: float  # median over the intervals at the full batch
    cost_ms: float  # median over the intervals with a prefill

    def to_json(self) -> dict[str, Any]:
        return {
            "clean_interval_s": round(self.clean_interval_s, 3),
            "prefills_per_interval": self.prefills_per_interval,
            "cost_ms": round(self.cost_ms, 1),
        }


def prefill_cost_at_full(text: str, tolerance: float = 0.06) -> PrefillCost | None:
    """:class:`PrefillCost` over the decode lines within ``tolerance`` of the largest running batch
    (None without such a line after more prefills than the cleanest)."""
    found = _LOG_INTERVAL.search(text)
    passes = int(found.group(1)) if found else 40  # ServerArgs.decode_log_interval's default
    decodes: list[tuple[int, DecodeLine]] = []  # each decode line with the prefills since the last one
    pending = 0
    for _, line in _stamped_lines(text):
        if line.startswith("Prefill batch"):
            pending += 1
            continue
        for d in decode_lines(line):
            decodes.append((pending, d))
            pending = 0
    top = max((d.running for _, d in decodes), default=0)
    intervals = [
        (n, passes * line_tokens(d) / d.gen_tps)
        for n, d in decodes
        if d.running >= top * (1 - tolerance) and d.gen_tps > 0
    ]
    if not intervals:
        return None
    fewest = min(n for n, _ in intervals)
    clean = min(s for n, s in intervals if n == fewest)
    costs = sorted((s - clean) / (n - fewest) for n, s in intervals if n > fewest)
    if not costs:
        return None
    counts = sorted(n for n, _ in intervals)
    return PrefillCost(clean, counts[len(counts) // 2], 1000 * costs[len(costs) // 2])


@dataclass(frozen=True, slots=True)
class GenerationPhases:
    """The generation window of a server log (first prefill after ready to the last answer), split
    where the running batch reached its plateau and where it left it for good."""

    answers: int  # chat completions answered (a truncation retry is one more)
    ramp_s: float
    full_s: float
    drain_s: float
    full_running: int
    full_decode_tps: float  # tokens per second while at the plateau, prefill interruptions included
    drain_tokens_fraction: float  # share of output tokens decoded after the plateau
    drain_token_share: float  # share of tokens decoded below 90% of the full batch (drain_token_share)
    decoded_tokens: float  # the decode lines' throughput integrated over the window
    prefill_batches: int
    prefill_batches_at_full: int
    last_percent_s: float  # from the answer that completes 99% of the requests to the last answer

    @property
    def total_s(self) -> float:
        return self.ramp_s + self.full_s + self.drain_s

    def to_json(self) -> dict[str, Any]:
        return {
            "answers": self.answers,
            "generation_s": round(self.total_s, 1),
            "ramp_s": round(self.ramp_s, 1),
            "full_s": round(self.full_s, 1),
            "drain_s": round(self.drain_s, 1),
            "full_running": self.full_running,
            "full_decode_tps": round(self.full_decode_tps, 1),
            "drain_tokens_fraction": round(self.drain_tokens_fraction, 3),
            "drain_token_share": round(self.drain_token_share, 3),
            "decoded_tokens": round(self.decoded_tokens),
            "prefill_batches": self.prefill_batches,
            "prefill_batches_at_full": self.prefill_batches_at_full,
            "last_percent_s": round(self.last_percent_s, 1),
        }


def generation_phases(text: str, tolerance: float = 0.02) -> GenerationPhases | None:
    """Split the generation window: ramp (to the first decode line at the plateau, within
    ``tolerance`` of the largest running batch), full (to the last such line) and drain (to the last
    answer). Tokens per decode line are its gen throughput times the seconds since the previous
    decode line (SGLang's throughput is over that interval), so prefill passes in between count as
    time without tokens, as they are."""
    lines = _stamped_lines(text)
    ready = ready_at(text)
    if ready is None:
        return None
    after = [(t, line) for t, line in lines if t >= ready]
    prefills = [t for t, line in after if line.startswith("Prefill batch")]
    answers = [t for t, line in after if _GENERATED in line]
    decodes = [(t, d) for t, line in after for d in decode_lines(line)]
    if not prefills or not answers or not decodes:
        return None
    start, end = prefills[0], answers[-1]
    top = max(d.running for _, d in decodes)
    at_full = [t for t, d in decodes if d.running >= top * (1 - tolerance)]
    full_from, full_to = at_full[0], at_full[-1]
    tokens_full = tokens_drain = 0.0  # the ramp's few lines average over the prefill burst: left out
    previous = start
    for t, d in decodes:
        tokens = d.gen_tps * max(t - previous, 0.0)
        previous = t
        if full_from < t <= full_to:
            tokens_full += tokens
        elif t > full_to:
            tokens_drain += tokens
    total_tokens = tokens_full + tokens_drain
    answers.sort()
    return GenerationPhases(
        answers=len(answers),
        ramp_s=full_from - start,
        full_s=full_to - full_from,
        drain_s=end - full_to,
        full_running=top,
        full_decode_tps=tokens_full / (full_to - full_from) if full_to > full_from else 0.0,
        drain_tokens_fraction=tokens_drain / total_tokens if total_tokens else 0.0,
        drain_token_share=drain_token_share([d for _, d in decodes]),
        decoded_tokens=tokens_full + tokens_drain,
        prefill_batches=len(prefills),
        prefill_batches_at_full=sum(full_from <= t <= full_to for t in prefills),
        last_percent_s=end - answers[int(0.99 * (len(answers) - 1))],
    )
