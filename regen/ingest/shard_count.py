"""How many prompt shards a run has: the configured number, or one per GPU slot (``shards.count: auto``).

With ``auto`` the count is derived from the GPU slots of the first run and written to
``RunLayout.shard_count_file`` (``work/plan/shards.json``); later runs read it back, so a rerun with
another ``--resources gpu=N`` keeps the shards (and journals) it already has. The count is known
when Snakemake plans the DAG.

One shard per GPU: no GPU waits between jobs, and at the end of the run the GPUs whose shard is done
serve the shards still running (``generate.spill``), so the run ends when the work does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regen.io import read_json, write_json
from regen.layout.run import RUN
from regen.runconfig import validated

AUTO = "auto"
PERSISTED = RUN.shard_count_file


@dataclass(frozen=True, slots=True)
class ShardsConfig:
    """The ``shards`` config section (the schema's defaults filled in): a number, or ``auto``."""

    count: int | str

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> ShardsConfig:
        return cls(count=validated("shards", raw)["count"])


def shard_count(
    configured: int | str, gpu_slots: int | None, persisted: str | os.PathLike[str] = PERSISTED
) -> int:
    """``configured`` when a number; with ``auto`` the persisted count, else ``gpu_slots``.

    Nothing is written here: the Snakefile is parsed before Snakemake knows the executor, so the count
    of a first ``auto`` run is settled later, once it does (:func:`settle_auto_count`)."""
    if configured != AUTO:
        return int(configured)
    path = Path(persisted)
    if path.exists():
        saved = read_json(path)
        count = saved.get("count") if isinstance(saved, dict) else None
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"{path}: field 'count': expected a positive integer, got {count!r}")
        return count
    if gpu_slots is None:
        raise ValueError(CLUSTER_REFUSAL)
    return max(1, int(gpu_slots))


CLUSTER_REFUSAL = (
    "config shards.count: auto takes one shard per GPU slot of a run on one node; on a cluster set "
    "shards.count to a number (several per GPU: docs/scaling.md)"
)


def settle_auto_count(
    configured: int | str,
    count: int,
    gpu_slots: int,
    on_cluster: bool,
    dry_run: bool,
    persisted: str | os.PathLike[str] = PERSISTED,
) -> None:
    """Once the executor is known: a first ``auto`` run writes its count (a dry run writes nothing); on a
    cluster ``auto`` is refused unless an earlier run on one node already settled it."""
    path = Path(persisted)
    if configured != AUTO or path.exists():
        return
    if on_cluster:
        raise ValueError(CLUSTER_REFUSAL)
    if not dry_run:
        write_json(path, {"count": int(count), "gpu_slots": int(gpu_slots), "rule": "one shard per GPU slot"})
