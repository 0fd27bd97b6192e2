"""One generate job: take this job's GPU slot and server, then drive it over one prompt shard.

The server's life belongs to ``regen.sglang.server``; the requests, journal and records to
``regen.client``; this module only joins them for the ``generate`` rule.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import pyarrow.parquet as pq

from regen.client import generate_shard
from regen.fingerprint import GenerationSettings, OperationalConfig
from regen.io import read_json
from regen.layout import RUN, RunLayout, slurm_job_id
from regen.lending import SlotLenders
from regen.sglang.config import ServerConfig
from regen.sglang.server import acquire_server
from regen.shards import read_shard
from regen.storage import sink_from_config
from regen.types import Endpoint

log = logging.getLogger("regen.generation")


def other_slots(endpoint: Endpoint, generate_cfg: dict[str, Any], slots: str) -> SlotLenders | None:
    """The other GPU slots' servers this job may fill while they have room (``generate.spill``)."""
    if not generate_cfg.get("spill", True) or not endpoint.server_id.startswith("gpu"):
        return None
    cap = generate_cfg.get("concurrency") or endpoint.max_running_requests
    if not cap:
        return None
    return SlotLenders(slots, int(endpoint.server_id[3:]), int(cap))


def run_generate_job(
    *,
    shard_path: str,
    plan_path: str,
    records_out: str,
    failed_out: str,
    journal_path: str,
    shard: str,
    settings: dict[str, Any],
    operational: OperationalConfig,
    layout: RunLayout = RUN,
) -> None:
    """Generate every sample of ``shard_path`` the journal does not hold under its current fingerprint;
    raise if the shard failed.

    ``settings`` is ``regen.fingerprint.decisive_config`` (what decides an answer), ``operational``
    the rest (how the job runs).
    """
    plan = read_json(plan_path)
    generation = GenerationSettings.from_decisive(settings)
    generate_cfg = {**operational.generate, **settings["generate"]}
    cfg = dataclasses.replace(ServerConfig.from_mapping(operational.server), gpus=operational.gpu_slots)
    job = slurm_job_id()  # per Slurm job on a cluster: its GPUs are its own (regen.layout)
    slots, logs = layout.servers_dir(job), layout.server_logs_dir(job)
    # what is slow (imports, opening the shard, the journal mirror) comes before taking the slot: the slot
    # is a GPU's batch, and a job given it while the previous one drains must start sending at once
    total = pq.ParquetFile(shard_path).metadata.num_rows
    samples = read_shard(shard_path)
    journal_sync = sink_from_config(generate_cfg.get("journal_sync"), shard)
    give_slot_up: list[Callable[[], None]] = []
    with acquire_server(cfg, plan, workdir=slots, log_dir=logs, on_slot=give_slot_up.append) as endpoint:
        log.info("shard %s on %s (%s)", shard, endpoint.server_id, endpoint.url)
        lenders = other_slots(endpoint, generate_cfg, str(slots))
        try:
            stats = generate_shard(
                samples,
                journal_path,
                records_out,
                failed_out,
                generate_cfg,
                endpoint,
                shard,
                total=total,
                journal_sync=journal_sync,
                lenders=lenders,
                on_exhausted=give_slot_up[0] if give_slot_up else None,
                settings=generation,
            )
        finally:
            if lenders is not None:
                lenders.close()
    log.info("shard %s done: %s", shard, stats)
