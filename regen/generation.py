"""One generate job: take this job's GPU slot and server, then drive it over one prompt shard.

The server's life belongs to ``regen.sglang.server``; the requests, journal and records to
``regen.client``; this module only joins them for the ``generate`` rule.
"""

from __future__ import annotations

import logging
from typing import Any

from regen.client import generate_shard
from regen.io import read_json
from regen.journal import JournalSink
from regen.sglang.server import acquire_server

log = logging.getLogger("regen.generation")


def journal_sink(generate_cfg: dict[str, Any], shard: str) -> JournalSink | None:
    """The S3 journal sink when ``generate.journal_sync.s3_prefix`` is set, else none."""
    sync = generate_cfg.get("journal_sync") or {}
    prefix = sync.get("s3_prefix")
    if not prefix:
        return None
    from regen.storage import S3JournalSink

    return S3JournalSink(
        prefix,
        shard,
        every_records=int(sync.get("every_records", 500)),
        every_seconds=float(sync.get("every_seconds", 60)),
    )


def run_generate_job(
    *,
    shard_path: str,
    plan_path: str,
    records_out: str,
    failed_out: str,
    journal_path: str,
    shard: str,
    generate_cfg: dict[str, Any],
    server_cfg: dict[str, Any],
    gpu_slots: int,
    workdir: str = "work/servers",
    log_dir: str = "logs/servers",
) -> None:
    """Generate every sample of ``shard_path`` not already in the journal; raise if the shard failed."""
    plan = read_json(plan_path)
    cfg = {**server_cfg, "gpus": int(gpu_slots)}
    with acquire_server(cfg, plan, workdir=workdir, log_dir=log_dir) as endpoint:
        log.info("shard %s on %s (%s)", shard, endpoint.server_id, endpoint.url)
        stats = generate_shard(
            shard_path,
            journal_path,
            records_out,
            failed_out,
            generate_cfg,
            endpoint,
            shard,
            journal_sync=journal_sink(generate_cfg, shard),
        )
    log.info("shard %s done: %s", shard, stats)
