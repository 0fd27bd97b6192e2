"""Where a server's start went: imports, weights, pools, CUDA graphs, from the log of its latest start.

The log is the slot's server log (``regen.serving.procfs.startup_log_text``): the supervisor's own lines
(``[regen-supervisor gpuK pid N stamp] ...``: the launch and the moment its readiness probe answered)
and SGLang's. SGLang 0.5.17 and 0.5.23 print their own accounting once the engine is up
(``Engine startup timings (s): load_weight=..., kv_cache_allocation=..., cuda_graph={...}``,
``sglang/srt/entrypoints/engine.py``); without that line the weights and graphs are the sums of the
``Load weight end. elapsed=`` and ``Capture ... CUDA graph end. elapsed=`` lines
(``model_runner.py``, ``cuda_graph_setup.py``) and the pools are unknown. A part the log does not give
is None (unknown), never a guess.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from regen.serving.procfs import SERVER_READY_MARK, SERVER_START_MARK

_STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)"
_SUPERVISOR = rf"^\[regen-supervisor \S+ pid \d+ {_STAMP}\] "
_LAUNCH = re.compile(_SUPERVISOR + re.escape(SERVER_START_MARK), re.M)
_READY = re.compile(_SUPERVISOR + re.escape(SERVER_READY_MARK), re.M)
_WEIGHTS_BEGIN = re.compile(rf"^\[{_STAMP}\] Load weight begin\.", re.M)
_ENGINE = re.compile(
    r"Engine startup timings \(s\): load_weight=([0-9.]+), kv_cache_allocation=([0-9.]+),"
    r"[^\n]*?cuda_graph=\{([^}]*)\}"
)
_WEIGHTS_END = re.compile(r"Load weight end\. elapsed=([0-9.]+) s")
_GRAPH_END = re.compile(r"CUDA graph end\. elapsed=([0-9.]+) s")


@dataclass(frozen=True, slots=True)
class StartupSplit:
    """Seconds of one server start; None: the log does not say.

    ``imports_s``: the launch to SGLang's first ``Load weight begin.`` (interpreter, imports, the scheduler
    process and model config); ``weights_s``: target and draft weights; ``pools_s``: the KV and state
    pools; ``graphs_s``: every CUDA-graph capture (prefill, decode, verify, draft); ``total_s``: the launch
    to the supervisor's readiness probe answering; ``other_s``: the rest of ``total_s`` (scheduler and
    tokenizer set-up, SGLang's warm-up unless skipped, the probe), when all four parts are known."""

    imports_s: float | None = None
    weights_s: float | None = None
    pools_s: float | None = None
    graphs_s: float | None = None
    total_s: float | None = None
    other_s: float | None = None
    source: str = "none"  # "engine-timings" | "elapsed-lines" | "none": where weights/pools/graphs came from


def _epoch(stamp: str) -> float:
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S"))


def _sum_or_none(values: list[str]) -> float | None:
    return round(sum(float(v) for v in values), 2) if values else None


def startup_split(text: str) -> StartupSplit:
    """The split of the latest start in ``text`` (from its supervisor launch line to its ready line)."""
    launches = list(_LAUNCH.finditer(text))
    launch = launches[-1] if launches else None
    if launch is not None:
        text = text[launch.start() :]
    ready = _READY.search(text)
    if ready is not None:
        text = text[: ready.end()]
    start = _epoch(launch[1]) if launch is not None else None
    begin = _WEIGHTS_BEGIN.search(text)
    imports = _epoch(begin[1]) - start if start is not None and begin is not None else None
    total = _epoch(ready[1]) - start if start is not None and ready is not None else None
    engine = _ENGINE.search(text)
    if engine is not None:
        graphs = [part.split("=", 1)[1] for part in engine[3].split(", ") if "=" in part]
        weights, pools, graph_s = float(engine[1]), float(engine[2]), _sum_or_none(graphs)
        source = "engine-timings"
    else:
        weights, pools = _sum_or_none(_WEIGHTS_END.findall(text)), None
        graph_s = _sum_or_none(_GRAPH_END.findall(text))
        source = "elapsed-lines" if weights is not None or graph_s is not None else "none"
    parts = (imports, weights, pools, graph_s)
    other = None
    if total is not None and all(p is not None for p in parts):
        other = round(total - sum(p for p in parts if p is not None), 2)
    return StartupSplit(imports, weights, pools, graph_s, total, other, source)
