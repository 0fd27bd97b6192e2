"""GPU servers started while the data is prepared (issue 37 item 1): design B's slot supervisors, prestarted.

A local run's ``onstart`` (``rules/common.smk``) calls :func:`spawn_prestart`, which takes an exclusive
``flock`` on the slots' ``prestart.lock`` and hands it to ONE detached process (``python -m
regen.tune.prestart``, its own session, output in ``logs/prestart.log``); Snakemake does not wait. That
process, still holding the lock:

* picks the plan: the run's plan file when it is current (Snakemake's DAG says the ``tune`` rule will not
  run again: the very criterion by which its tracked ``settings`` param, its input and its output decide),
  else a **provisional plan**: :func:`regen.tune.workload_plan.plan_for_workload`, the tune rule's own
  planning, over the workload of the audit's code run over the dataset's first ``server.prestart_rows``
  rows (:func:`regen.ingest.audit_run.first_rows`); when the audit excludes every one of those rows, no
  server is started (the audit may stop the run: "before any server starts" stays true);
* records it (``RunLayout.provisional_plan``: the plan, its workload, where it came from, the owner);
* asks the one owner of server processes, :func:`regen.serving.lifecycle.start_slot_servers`, for the
  supervisors of min(GPU slots, shards still to generate) slots (a generate job's own code, under the
  slot's lease, without its ``gpu{k}.lock``), owned by the Snakemake process; then lets the lock go and exits.

A prestarted supervisor that no job ever leases counts its idle time from the moment its server is ready
(``Supervisor.monitor`` sets ``last_busy`` then): it waits ``server.idle_timeout_s`` for its first job, as
any idle server does, and exits with the Snakemake process.

The ``tune`` rule confirms (:func:`confirm_prestarted`, the lock taken shared: it waits while the prestart
process decides): a provisional server is adopted when its command differs from the audit's plan's only in
the running cap and the decode-graph batch (:data:`CAP_FLAGS`), by at most :data:`CAP_TOLERANCE`, and in
prefill graphs that cover the audit's or fall short by at most as much (:data:`COVER_FLAGS`), and never in
a numerics flag; the written plan then carries the provisional flags, so a generate job's command is the
running server's. Otherwise the prestarted supervisors are stopped and the audit's plan is written.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import logging
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regen.fingerprint import SERVER_NUMERICS_KEYS
from regen.ingest.audit_config import AuditConfig
from regen.ingest.audit_run import first_rows
from regen.ingest.dataset import DatasetConfig
from regen.io import read_json, write_json
from regen.layout.run import RUN, RunLayout
from regen.layout.slots import slurm_job_id
from regen.runconfig import RunConfig, ServerConfig, config_section
from regen.runlog import log_to
from regen.serving.base import ServerError
from regen.serving.launch_args import flag_name, split_flags
from regen.serving.lifecycle import build_server_command, mode_of, start_slot_servers, stop_all_servers
from regen.serving.procfs import proc_stat
from regen.serving.slots import shared_flock, slot_count
from regen.sglang.config import PlanFile
from regen.tune.workload_plan import plan_for_workload, variant_shares, workload_from_audit_histogram

log = logging.getLogger("regen.tune.prestart")

MODULE = "regen.tune.prestart"

#: how far the audit's cap may differ from the prestarted server's (relative to the running one) for
#: the tune rule to adopt it: a cap a little off costs a little batch, a restart costs the whole start
CAP_TOLERANCE = 0.10

#: the flags that may differ between an adopted server and the audit's plan: the running cap and the
#: decode CUDA graphs' largest batch, the only ones the prompt lengths move by a little
CAP_FLAGS: tuple[str, ...] = ("--max-running-requests", "--cuda-graph-max-bs", "--cuda-graph-max-bs-decode")

#: the flags that size what a server captures for the prompt lengths: the prefill CUDA graphs' largest token
#: count (the plan's refill passes, ``regen.sglang.alternatives.with_refill_prefill_graphs``). A running
#: server that captures at least what the audit's plan asks is adopted (absent: SGLang's default, every size
#: up to the chunked prefill size); one that captures less, within :data:`CAP_TOLERANCE`
COVER_FLAGS: tuple[str, ...] = ("--cuda-graph-max-bs-prefill",)

#: the launch flags of what decides an answer's numbers (``regen.fingerprint.SERVER_NUMERICS_KEYS``, which
#: a server reports as its ``/server_info`` fields of the same names)
NUMERICS_FLAGS: tuple[str, ...] = tuple(
    "--" + key.replace("_", "-") for key in SERVER_NUMERICS_KEYS if key != "version"
)


# ------------------------------------------------------------------------------- onstart --
@dataclass(frozen=True, slots=True)
class PrestartRequest:
    """What ``onstart`` knows and the prestart process needs (``RunLayout.prestart_request``)."""

    #: the run's validated config (the schema's defaults filled in)
    config: Mapping[str, Any]
    gpu_slots: int
    #: the Snakemake process: the prestarted supervisors' owner
    owner_pid: int
    shards_to_generate: int
    #: the run's plan file is current: Snakemake will not run the ``tune`` rule again
    plan_current: bool
    #: the local dataset file the first pass reads
    dataset_path: str

    def write(self, path: Path) -> None:
        write_json(path, dataclasses.asdict(self))

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> PrestartRequest:
        return cls(**read_json(path))


def prestart_skip_reason(
    cfg: ServerConfig, *, local: bool, dry_run: bool, shards_to_generate: int, dataset_path: str
) -> str | None:
    """Why this run starts no server before its generate jobs; None: it prestarts them."""
    if dry_run:
        return "a dry run"
    if not local:
        return "not a local run: every generate job starts its own server"
    if not mode_of(cfg).launches:
        return f"server.mode {cfg.mode} launches no server"
    if cfg.prestart_rows == 0:
        return "server.prestart_rows is 0"
    if shards_to_generate == 0:
        return "no shard left to generate"
    if not os.path.isfile(dataset_path):
        return f"the dataset {dataset_path} is not a local file yet"
    return None


def spawn_prestart(request: PrestartRequest, layout: RunLayout = RUN) -> str:
    """Start the prestart process detached, holding the prestart lock for it; a line for the console.
    A failure here is said and leaves the run as it would be without a prestart."""
    try:
        pid = _spawn(request, layout)
    except (OSError, TypeError, ValueError) as exc:
        return f"regen: no GPU server prestarted ({exc}); each generate job starts its own"
    return f"regen: starting the GPU servers while the data is prepared (PID {pid}, {layout.prestart_log})"


def _spawn(request: PrestartRequest, layout: RunLayout) -> int:
    lock = layout.prestart_lock(slurm_job_id())
    lock.parent.mkdir(parents=True, exist_ok=True)
    layout.prestart_log.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):  # an earlier run's: never confirmed as this run's
        layout.provisional_plan.unlink()
    request.write(layout.prestart_request)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the child inherits it: tune cannot read before it decided
        argv = [sys.executable, "-m", MODULE, "--request", str(layout.prestart_request), "--lock-fd", str(fd)]
        with open(layout.prestart_log, "ab") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=(fd,),
                start_new_session=True,
            )
    finally:
        os.close(fd)  # the lock stays held by the child's copy
    return proc.pid


# ------------------------------------------------------------------------ the process --
@dataclass(frozen=True, slots=True)
class ProvisionalPlan:
    """``RunLayout.provisional_plan``: the plan the servers were prestarted with, and where it came from."""

    plan: PlanFile
    #: "current plan file …" or "first pass over the dataset's first N rows"
    source: str
    #: the workload planned for (None: the current plan file's, not recomputed)
    workload: Mapping[str, Any] | None
    owner_pid: int
    slots: tuple[int, ...]

    def write(self, path: Path) -> None:
        write_json(path, {**dataclasses.asdict(self), "plan": self.plan.to_json(), "slots": list(self.slots)})

    @classmethod
    def read(cls, path: Path) -> ProvisionalPlan | None:
        """The record at ``path``; None when there is none."""
        try:
            data = read_json(path)
        except FileNotFoundError:
            return None
        plan = PlanFile.from_json(data["plan"])
        assert plan is not None
        return cls(plan, data["source"], data["workload"], int(data["owner_pid"]), tuple(data["slots"]))


class NothingToServe(Exception):
    """The first pass keeps no row: the audit may stop the run, so no server is started before it."""


def starting_plan(request: PrestartRequest, run: RunConfig, layout: RunLayout) -> tuple[PlanFile, str, Any]:
    """(plan, its source, its workload): the current plan file, else a provisional plan from a first pass."""
    if request.plan_current:
        return PlanFile.read(layout.server_plan), f"current plan file {layout.server_plan}", None
    config = request.config
    rows = run.server.prestart_rows
    first = first_rows(
        request.dataset_path,
        AuditConfig.from_dict(config_section(config, "audit"), run.generate.regenerate),
        run.tokenizer,
        DatasetConfig.from_dict(config_section(config, "dataset")),
        rows,
    )
    if first.excludes_all():  # the audit keeps none of these, so maybe none at all: no server yet
        raise NothingToServe(first.in_words())
    summary = first.summary.to_json()
    workload = workload_from_audit_histogram(
        summary, run.generate.sampling.max_tokens, variant_shares(run.generate)
    )
    if int(summary.get("total") or 0) >= rows:  # the dataset goes on: the run's size is not known yet
        workload = dataclasses.replace(workload, completions=None)
    planned = plan_for_workload(run.server, workload)
    return planned.plan, f"first pass over the dataset's first {rows} rows", dataclasses.asdict(workload)


def prestart(request: PrestartRequest, layout: RunLayout = RUN) -> ProvisionalPlan:
    """Pick the plan, record it, start the supervisors; the record."""
    run = RunConfig.from_config(dict(request.config), request.gpu_slots)
    cfg = dataclasses.replace(run.server, gpus=run.gpu_slots)  # as a generate job sees it
    plan, source, workload = starting_plan(request, run, layout)
    slots = tuple(range(min(slot_count(cfg, None), request.shards_to_generate)))
    record = ProvisionalPlan(plan, source, workload, request.owner_pid, slots)
    record.write(layout.provisional_plan)  # before any start: tune knows every server it may stop
    log.info(
        "prestarting %d GPU server(s), plan from the %s: %s", len(slots), source, " ".join(plan.launch_args)
    )
    job = slurm_job_id()  # as the generate job's slot directory (regen.generate.generation)
    start_slot_servers(
        cfg, plan, slots, request.owner_pid, (layout.servers_dir(job), layout.server_logs_dir(job))
    )
    return record


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=f"python -m {MODULE}", description="start a run's GPU servers early"
    )
    parser.add_argument("--request", type=Path, required=True)
    parser.add_argument("--lock-fd", type=int, required=True, help="the prestart lock, held until decided")
    ns = parser.parse_args(argv)
    log_to(str(RUN.prestart_log))
    started = time.monotonic()
    try:
        prestart(PrestartRequest.read(ns.request))
    except NothingToServe as exc:
        log.warning("no server prestarted: %s; the audit decides first", exc)
        return 0
    except Exception:  # never the run's failure: each generate job starts its own server then
        log.exception("no server prestarted; the first generate job on each GPU slot starts one")
        return 1
    finally:
        os.close(ns.lock_fd)
    log.info("prestart decided in %.1f s", time.monotonic() - started)
    return 0


# ------------------------------------------------------------------------- tune confirms --
@dataclass(frozen=True, slots=True)
class Adoption:
    """Whether the prestarted servers serve the audit's plan, and why (said in the plan and the log)."""

    adopted: bool
    reason: str


def _flag_values(argv: Sequence[str]) -> dict[str, list[tuple[str, ...]]]:
    found: dict[str, list[tuple[str, ...]]] = {}
    for group in split_flags(argv):
        found.setdefault(flag_name(group[0]), []).append(tuple(group[1:]))
    return found


def _shown(values: list[tuple[str, ...]] | None) -> str:
    return "absent" if not values else " ".join(" ".join(v) or "(set)" for v in values)


def adoption_verdict(
    running: Sequence[str], planned: Sequence[str], tolerance: float = CAP_TOLERANCE
) -> Adoption:
    """Adopt the server launched with ``running`` for the plan that would launch ``planned``: every flag
    identical but the :data:`CAP_FLAGS`, which differ by at most ``tolerance`` of the running value, and
    the :data:`COVER_FLAGS`, whose running value covers the planned one or falls short by at most
    ``tolerance``; a numerics flag that differs refuses first (an answer's numbers would not be the
    plan's)."""
    have, want = _flag_values(running), _flag_values(planned)
    numerics = [n for n in NUMERICS_FLAGS if have.get(n) != want.get(n)]
    if numerics:
        what = ", ".join(f"{n} {_shown(have.get(n))} → {_shown(want.get(n))}" for n in numerics)
        return Adoption(False, f"a numerics flag differs ({what})")
    bounded = (*CAP_FLAGS, *COVER_FLAGS)
    others = sorted(n for n in have.keys() | want.keys() if n not in bounded and have.get(n) != want.get(n))
    if others:
        what = ", ".join(f"{n} {_shown(have.get(n))} → {_shown(want.get(n))}" for n in others)
        return Adoption(False, f"flags differ ({what})")
    changes = []
    for name in (*CAP_FLAGS, *COVER_FLAGS):
        a, b = have.get(name), want.get(name)
        if a == b:
            continue
        covers = name in COVER_FLAGS  # only a shortfall counts; absent is SGLang's default, which covers all
        if covers and a is None:
            changes.append(f"{name} absent → {_shown(b)}, covered")
            continue
        try:
            old, new = int(a[-1][0]), int(b[-1][0])  # type: ignore[index]
        except (TypeError, IndexError, ValueError):
            return Adoption(False, f"{name} {_shown(a)} → {_shown(b)}")
        change = (new - old) / old if old else float("inf")
        text = f"{name} {old} → {new}, " + ("covered" if covers and new <= old else f"{change:+.0%}")
        if (change if covers else abs(change)) > tolerance:
            return Adoption(False, f"{text} > {tolerance:.0%}")
        changes.append(text)
    if not changes:
        return Adoption(True, "every launch flag identical")
    return Adoption(True, f"{'; '.join(changes)}, within {tolerance:.0%}: the running server kept")


def adopted_plan(running: PlanFile, audit: PlanFile, note: Mapping[str, Any]) -> PlanFile:
    """The plan file for adopted servers: the running server's flags and prediction (a generate job's
    command is the running one's, its realized file compares with what was launched), the client's
    in-flight count the lower of the two plans' (never above what the running server was planned for)."""
    launched = dict(running.launched_section)
    if running.client_concurrency and audit.client_concurrency:
        launched["client_concurrency"] = min(running.client_concurrency, audit.client_concurrency)
    sections = {
        "given": dict(running.given),
        "recommended": dict(running.recommended),
        running.launched: launched,
    }
    return dataclasses.replace(
        running, given=sections["given"], recommended=sections["recommended"], prestart=dict(note)
    )


def runs_under(pid: int) -> bool:
    """This process descends from ``pid`` (the Snakemake process that prestarted the servers)."""
    here = os.getppid()
    for _ in range(64):
        if here == pid:
            return True
        stat = proc_stat(here)
        if here <= 1 or stat is None:
            return False
        here = stat[1]
    return False


def confirm_prestarted(
    audit_plan: PlanFile, cfg: ServerConfig, layout: RunLayout = RUN, started_plan: PlanFile | None = None
) -> PlanFile:
    """The plan the ``tune`` rule writes: ``audit_plan``, or the plan of the servers this run prestarted
    when :func:`adoption_verdict` adopts them; servers not adopted are stopped first (logged, with why).
    ``started_plan``: the plan to adopt them for where ``audit_plan`` does not (a run too small to win
    back the start its plan adds keeps SGLang's defaults, ``regen.sglang.run_size``; servers already
    started with that plan have spent their start, so they are kept for it)."""
    lock = layout.prestart_lock(slurm_job_id())
    if not lock.exists():
        return audit_plan
    with shared_flock(lock):  # waits while the prestart process decides
        record = ProvisionalPlan.read(layout.provisional_plan)
    if record is None or not runs_under(record.owner_pid):  # none, or an earlier run's
        log.info("no server prestarted by this run")
        return audit_plan
    try:
        port, model = cfg.port_base, cfg.model_path
        verdict = adoption_verdict(
            build_server_command(cfg, record.plan, port, model),
            build_server_command(cfg, audit_plan, port, model),
        )
    except ServerError as exc:
        verdict = Adoption(False, str(exc))
    if not verdict.adopted and started_plan is not None:
        kept = adoption_verdict(
            build_server_command(cfg, record.plan, port, model),
            build_server_command(cfg, started_plan, port, model),
        )
        if kept.adopted:
            why = "the run is small enough for SGLang's defaults, but its servers have spent their start"
            verdict, audit_plan = Adoption(True, f"{kept.reason} ({why})"), started_plan
    note = {
        "adopted": verdict.adopted,
        "reason": verdict.reason,
        "tolerance": CAP_TOLERANCE,
        "source": record.source,
        "workload": record.workload,
        "slots": list(record.slots),
        "audit_launch_args": list(audit_plan.launch_args),
    }
    if verdict.adopted:
        log.info("prestarted server adopted: %s", verdict.reason)
        return adopted_plan(record.plan, audit_plan, note)
    stopped = stop_all_servers(layout.servers_root, owner_pid=record.owner_pid)  # this run's: no job yet
    log.warning("prestarted server not adopted: %s; %d supervisor(s) stopped", verdict.reason, stopped)
    return dataclasses.replace(audit_plan, prestart=note)


if __name__ == "__main__":
    sys.exit(main())
