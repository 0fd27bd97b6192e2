"""One generate job: take this job's GPU slot and server, then drive it over one prompt shard.

The server's life belongs to ``regen.sglang.server``; the requests, journal and records to
``regen.client``; this module only joins them for the ``generate`` rule.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from regen.client import generate_shard
from regen.fingerprint import GenerationSettings, OperationalConfig
from regen.io import read_json
from regen.layout import RUN, RunLayout, slurm_job_id
from regen.sglang.config import ServerConfig
from regen.sglang.server import acquire_server
from regen.storage import sink_from_config

log = logging.getLogger("regen.generation")


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
    with acquire_server(cfg, plan, workdir=slots, log_dir=logs) as endpoint:
        log.info("shard %s on %s (%s)", shard, endpoint.server_id, endpoint.url)
        stats = generate_shard(
            shard_path,
            journal_path,
            records_out,
            failed_out,
            generate_cfg,
            endpoint,
            shard,
            journal_sync=sink_from_config(generate_cfg.get("journal_sync"), shard),
            settings=generation,
        )
    log.info("shard %s done: %s", shard, stats)
