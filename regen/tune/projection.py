"""The run projection: how long the remaining samples take at a measured rate, and on how many GPUs.

One formula (:func:`project`), used by ``regen tune --sweep`` (``results/plan/pilot.json``), by
``regen status`` (re-projected for the samples left now) and by the report.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regen.generate.journal import read_heads
from regen.io import read_json
from regen.layout import RunLayout


class ProjectionError(RuntimeError):
    """A projection that cannot be made (no rate, no server fits) or a pilot file that is not one."""


@dataclass(frozen=True, slots=True)
class Remaining:
    shards: int
    samples: int
    finished: int

    @property
    def remaining(self) -> int:
        return self.samples - self.finished


@dataclass(frozen=True, slots=True)
class Projection:
    """Wall time and GPU-hours for ``remaining_samples`` at the pilot's measured rate."""

    remaining_samples: int
    tokens_per_sample: float
    out_tok_s_per_server: float
    gpus: int
    tp: int
    servers: int
    remaining_output_tokens: float
    wall_s: float
    gpu_hours: float

    def to_json(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "wall_h": self.wall_s / 3600,
        }


def shard_ids(path: str | os.PathLike[str]) -> list[str]:
    import pyarrow.parquet as pq

    return [str(x) for x in pq.read_table(path, columns=["id"]).column("id").to_pylist()]


def count_remaining(results_dir: str | os.PathLike[str], work_dir: str | os.PathLike[str]) -> Remaining:
    """Samples in ``results/shards/*.parquet`` minus the ids finished in ``work/journal/{shard}.jsonl``."""
    layout = RunLayout(results=Path(results_dir), work=Path(work_dir))
    shards = layout.shard_files()
    total = finished = 0
    for shard in shards:
        ids = set(shard_ids(shard))
        total += len(ids)
        done = {head.id for head in read_heads(layout.journal(shard.stem)).heads}
        finished += len(ids & done)
    return Remaining(shards=len(shards), samples=total, finished=finished)


def project(
    remaining_samples: int, tokens_per_sample: float, out_tok_s_per_server: float, gpus: int, tp: int
) -> Projection:
    """wall = remaining x tokens/sample / (tok/s per server x servers); GPU-hours = wall x servers x tp."""
    if out_tok_s_per_server <= 0:
        raise ProjectionError("cannot project from a measured rate of 0 tok/s")
    servers = gpus // tp
    if servers < 1:
        raise ProjectionError(f"{gpus} GPU(s) cannot hold one server of tp={tp}")
    tokens = remaining_samples * tokens_per_sample
    wall = tokens / (out_tok_s_per_server * servers)
    return Projection(
        remaining_samples=remaining_samples,
        tokens_per_sample=tokens_per_sample,
        out_tok_s_per_server=out_tok_s_per_server,
        gpus=gpus,
        tp=tp,
        servers=servers,
        remaining_output_tokens=tokens,
        wall_s=wall,
        gpu_hours=wall * servers * tp / 3600,
    )


PROJECTION_ASSUMPTIONS = (
    "every server sustains the best candidate's measured output tok/s (same model, flags, GPU kind)",
    "remaining samples produce the pilot's mean completion tokens per sample (same sampling and thinking)",
    "servers scale linearly; server startup, retries and stragglers at the end of shards are not counted",
    "GPU-hours count every GPU of every server for the whole wall time",
)


def read_pilot(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """``pilot.json`` if present (None otherwise)."""
    p = Path(path)
    if not p.is_file():
        return None
    data = read_json(p)
    if not isinstance(data, dict) or "projection" not in data:
        raise ProjectionError(f"{p}: not a pilot file (no 'projection' field)")
    return data
