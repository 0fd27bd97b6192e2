"""One generate job: take this job's GPU slot and server, then drive it over one prompt shard.

The server's life belongs to ``regen.serving``; the requests, journal and records to
``regen.generate.client``; this module only joins them for the ``generate`` rule.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow.parquet as pq

from regen.fingerprint import RunSettings
from regen.generate.client import ShardJob, generate_shard, pacing_of
from regen.generate.journal_writer import JournalWriter
from regen.generate.lending import SlotLenders
from regen.generate.pacing import RequestTime
from regen.generate.replay import announce_replay
from regen.generate.run_progress import progress_line
from regen.generate.scheduler import ShardStats
from regen.generate.server_time import request_time_for, timeout_disagreement
from regen.ingest.shards import read_shard
from regen.layout.beside import failure_note
from regen.layout.run import RUN, RunLayout
from regen.layout.slots import slurm_job_id
from regen.runconfig import GenerateConfig, RunConfig
from regen.runlog import stop_if_controller_gone
from regen.serving.base import ServerError
from regen.serving.lifecycle import acquire_server
from regen.serving.procfs import find_owner_pid
from regen.serving.progress import SlotRestarts
from regen.sglang.config import PlanFile
from regen.storage import sink_from_config
from regen.types import Endpoint

log = logging.getLogger("regen.generate.generation")


def other_slots(
    endpoint: Endpoint, generate_cfg: GenerateConfig, slots: Path, request_time: RequestTime | None = None
) -> SlotLenders | None:
    """The other GPU slots' servers this job may fill while they have room (``generate.spill``): room up to
    the running cap, and no more than the server finishes within the request timeout (``pacing_of``: the
    lent server's own job keeps as many in flight there, so borrowers add none past it)."""
    if not generate_cfg.spill or endpoint.slot is None:
        return None
    cap = generate_cfg.concurrency or endpoint.max_running_requests
    if not cap:
        return None
    cap = min(int(cap), pacing_of(generate_cfg, endpoint, request_time).start)
    return SlotLenders(slots, endpoint.slot, cap)


def run_generate_job(
    *,
    shard_path: str,
    plan_path: str,
    records_out: str,
    failed_out: str,
    journal_path: str,
    shard: str,
    run: RunConfig,
    layout: RunLayout = RUN,
    log_path: str | None = None,
) -> None:
    """Generate every sample of ``shard_path`` the journal does not hold under its current fingerprint;
    raise if the shard failed.

    ``run`` is the typed run config: the requests and the fingerprint both come from its ``generate``
    section. A server that cannot start fails every shard on it for the same reason: the first shard
    states the cause in full, the others in one line pointing at it.
    """
    plan = PlanFile.read(plan_path)
    generation = RunSettings.for_run(run)
    generate_cfg = run.generate
    disagreement = timeout_disagreement(generate_cfg, run.server, plan, layout.pilot)
    if disagreement is not None:  # regen check says it too
        log.warning("shard %s: %s", shard, disagreement)
    cfg = dataclasses.replace(run.server, gpus=run.gpu_slots)
    job = slurm_job_id()  # per Slurm job on a cluster: its GPUs are its own (regen.layout)
    slots, logs = layout.servers_dir(job), layout.server_logs_dir(job)
    # what is slow (imports, opening the shard, the journal mirror) comes before taking the slot: the slot
    # is a GPU's batch, and a job given it while the previous one drains must start sending at once
    total = pq.ParquetFile(shard_path).metadata.num_rows
    samples = read_shard(shard_path)
    announce_replay(shard, shard_path, journal_path, run, layout)  # its first console line
    journal_sync = sink_from_config(generate_cfg.journal_sync, shard)
    give_slot_up: list[Callable[[], None]] = []
    stop_if_controller_gone(layout.run_marker)  # no server started for a run that is gone
    try:
        with (
            # the shard's one writer, before its GPU slot: a job waiting for another run's writer
            # (after a ``snakemake --unlock`` while that run lives) holds no GPU meanwhile
            JournalWriter.claim(journal_path, wait=True, on_wait=_tell_console) as writer,
            acquire_server(cfg, plan, workdir=slots, log_dir=logs, on_slot=give_slot_up.append) as endpoint,
            console_progress(endpoint.server_id, layout),
        ):
            stop_if_controller_gone(layout.run_marker)  # waiting for the slot took a while: no request sent
            job = ShardJob(
                samples,
                journal_path,
                records_out,
                failed_out,
                generate_cfg,
                endpoint,
                shard,
                total=total,
                journal_sync=journal_sync,
                on_exhausted=give_slot_up[0] if give_slot_up else None,
                settings=generation,
                restarts=SlotRestarts.of(slots, endpoint),
                writer=writer,
                request_time=request_time_for(run.server, layout.pilot),
            )
            stats = _generate_on(job, slots)
    except ServerError as exc:
        raise SystemExit(once_per_cause(exc, shard, log_path, layout.failure_notes_dir(job))) from None
    log.info("shard %s done: %s", shard, stats)


def _generate_on(job: ShardJob, slots: Path) -> ShardStats:
    """``job`` on its server, with the other slots' servers of ``slots`` lent to it while they have room."""
    endpoint = job.endpoint
    log.info("shard %s on %s (%s)", job.shard, endpoint.server_id, endpoint.url)
    lenders = other_slots(endpoint, job.cfg, slots, job.request_time)
    try:
        return generate_shard(dataclasses.replace(job, lenders=lenders))
    finally:
        if lenders is not None:
            lenders.close()


def _tell_console(message: str) -> None:
    """A line for the job's log and for the console Snakemake runs in (the job's stderr is its log)."""
    log.warning("%s", message)
    if sys.__stderr__ is not None:
        print(f"regen: {message}", file=sys.__stderr__, flush=True)


#: how often the job on GPU slot 0 prints the run's progress line to Snakemake's console
CONSOLE_PROGRESS_EVERY_S = 15.0


@contextlib.contextmanager
def console_progress(
    server_id: str, layout: RunLayout, every_s: float = CONSOLE_PROGRESS_EVERY_S
) -> Iterator[None]:
    """While the job on GPU slot 0 runs, print ``regen status``'s one-line progress of the whole run
    to the console Snakemake runs in (the job's own stderr goes to its log). One job at a time holds
    slot 0, so the console gets one line per interval, not one per GPU."""
    if server_id != "gpu0":
        yield
        return
    console = sys.__stderr__
    stop = threading.Event()

    def loop() -> None:
        while True:
            try:
                line = progress_line(layout.work, layout.results)
            except (OSError, ValueError) as exc:
                line = f"regen: progress unavailable ({exc})"
            if console is not None:
                print(line, file=console, flush=True)
            if stop.wait(every_s):
                return

    thread = threading.Thread(target=loop, name="console-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


def once_per_cause(exc: Exception, shard: str, log_path: str | None, cause_dir: Path) -> str:
    """The message for a shard failed by ``exc``: in full for the first shard of this Snakemake run
    with that cause, else one line naming the shard (and log) that has it in full."""
    text = str(exc)
    first_line = text.splitlines()[0] if text else type(exc).__name__
    cause = re.sub(r"\d+", "N", first_line)  # the same failure on slot 0 and slot 5 is one cause
    key = hashlib.sha256(f"{find_owner_pid()} {cause}".encode()).hexdigest()[:16]
    cause_dir.mkdir(parents=True, exist_ok=True)
    marker = failure_note(cause_dir, key)
    here = f"shard {shard}" + (f" ({log_path})" if log_path else "")
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        first = marker.read_text().strip() or "another shard"
        return f"shard {shard}: {first_line}\n(same cause as {first}: the full message is there)"
    with os.fdopen(fd, "w") as fh:
        fh.write(here + "\n")
    return f"shard {shard}: {text}"
