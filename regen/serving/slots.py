"""One long-lived inference server per GPU slot, shared by the shard jobs that run on that slot.

Design "B" of docs/notes (self-managed per-GPU servers, no Snakemake service rules):

* a shard job takes an exclusive ``flock`` on the first free ``gpu{k}.lock`` (its GPU slot ``k``;
  the kernel drops it when the job dies), then a shared ``flock`` on ``gpu{k}.lease`` for its life;
* it reuses the live supervisor recorded in ``gpu{k}.url`` or starts one, detached
  (``python -m regen.serving.supervisor``), and waits until the server answers a one-token generation;
* the supervisor owns the server process: restarts it when it crashes (bounded), and exits when told
  to, when idle with no lease held, or when its owner is gone: the Snakemake process that owns the run,
  or in a Slurm job the job itself (``SLURM_JOB_ID``): the members of a group job run one after another,
  each in a Snakemake process (and job step) of its own, and all of them reuse the server the first one
  started. There the supervisor is started by the job's slot host (``regen.serving.slothost``, in the
  job's batch step) when it has one, so it outlives the step of the member that asked for it.

:func:`serve_on_slot` is what ``regen.serving.lifecycle.acquire_server`` runs for a mode that launches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from regen.fingerprint import server_numerics
from regen.io import read_json, write_json
from regen.layout.slots import SlotFiles, prestart_lock_in, slurm_job_id
from regen.runconfig import ServerConfig
from regen.serving.base import CommandBuilder, LaunchCheck, ServerError, api_key_from
from regen.serving.ports import client_host, pick_port
from regen.serving.probes import (
    effective_max_running,
    fetch_server_info,
    radix_cache_on,
    served_model,
    server_running_cap,
)
from regen.serving.procfs import (
    SUPERVISOR_MODULE,
    UrlState,
    find_owner_pid,
    is_supervisor,
    log_tail,
    pid_alive,
    read_url_state,
    startup_log_text,
)
from regen.serving.slothost import start_hosted
from regen.serving.startup_split import startup_split
from regen.sglang.config import PlanFile
from regen.sglang.realized import compare, parse_startup_log, realized_from_server_info
from regen.types import Endpoint

log = logging.getLogger("regen.serving.slots")


def visible_devices_for(slot: int, tp: int, inherited: str | None) -> str:
    """CUDA_VISIBLE_DEVICES for slot ``k``: devices k*tp..k*tp+tp-1, mapped onto a scheduler's list."""
    wanted = list(range(slot * tp, slot * tp + tp))
    if not inherited:
        return ",".join(str(d) for d in wanted)
    visible = [d for d in inherited.split(",") if d.strip()]
    if len(visible) == tp:  # the scheduler gave this job exactly its devices
        return ",".join(visible)
    if wanted[-1] >= len(visible):
        raise ServerError(
            f"GPU slot {slot} needs device(s) {wanted} but CUDA_VISIBLE_DEVICES={inherited!r} "
            f"lists only {len(visible)}; lower server.gpus / --resources gpu="
        )
    return ",".join(visible[d] for d in wanted)


def slot_count(cfg: ServerConfig, gpu_slots: int | None) -> int:
    """Server slots on this node: GPUs (``gpu_slots`` or ``server.gpus``) divided by ``server.tp``."""
    gpus = int(gpu_slots if gpu_slots else cfg.gpus)
    tp = cfg.tp
    if gpus < tp:
        raise ServerError(f"server.tp={tp} needs at least {tp} GPUs, but only {gpus} are available")
    return gpus // tp


def take_slot(lock_dir: Path, slots: int, poll_s: float = 0.5) -> tuple[int, int]:
    """Exclusive flock on the first free ``gpu{k}.lock``: (k, fd). Blocks until one is free."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    while True:
        for k in range(slots):
            fd = os.open(
                SlotFiles.of(k, lock_dir, lock_dir).lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644
            )
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return k, fd
        time.sleep(poll_s)


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """Everything needed to start one slot's supervisor."""

    files: SlotFiles
    url: str
    host: str
    port: int
    model: str
    command: list[str]
    env: dict[str, str]
    idle_timeout_s: float
    startup_timeout_s: float
    max_restarts: int
    owner_pid: int
    api_key_env: str | None
    #: no generated token for this long with requests in flight restarts the server; None: not watched
    stall_timeout_s: float | None = None
    #: the Slurm job that owns the server instead of ``owner_pid`` (a group job's members run one after
    #: another, each its own process: the server lives as long as the job, for all of them)
    owner_slurm_job: str | None = None


def supervisor_argv(spec: LaunchSpec) -> list[str]:
    """``python -m regen.serving.supervisor …  -- <server command>``."""
    argv = [
        sys.executable,
        "-m",
        SUPERVISOR_MODULE,
        "--slot",
        str(spec.files.slot),
        "--url",
        spec.url,
        "--url-file",
        str(spec.files.url.resolve()),
        "--lease-file",
        str(spec.files.lease.resolve()),
        "--log-file",
        str(spec.files.log.resolve()),
        "--progress-file",
        str(spec.files.progress.resolve()),
        "--restarts-file",
        str(spec.files.restarts.resolve()),
        "--idle-timeout",
        str(spec.idle_timeout_s),
        "--startup-timeout",
        str(spec.startup_timeout_s),
        "--max-restarts",
        str(spec.max_restarts),
        "--owner-pid",
        str(spec.owner_pid),
        "--model",
        spec.model,
        "--host",
        spec.host,
        "--port",
        str(spec.port),
    ]
    if spec.api_key_env:
        argv += ["--api-key-env", spec.api_key_env]
    if spec.stall_timeout_s is not None:
        argv += ["--stall-timeout", str(spec.stall_timeout_s)]
    if spec.owner_slurm_job is not None:
        argv += ["--owner-slurm-job", spec.owner_slurm_job]
    return [*argv, "--", *spec.command]


class Started(Protocol):
    """A supervisor this job started: its ``subprocess.Popen``, or the handle of one the job's slot host
    started for it (``regen.serving.slothost.HostedSupervisor``)."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def start_supervisor(spec: LaunchSpec) -> Started:
    """Start the slot's supervisor detached (own session, no inherited fds): in a Slurm job through the
    job's slot host when it has one on this node (it lives in the job's batch step, which outlives this
    member's step: ``regen.serving.slothost``), else as this process's child."""

    spec.files.log.parent.mkdir(parents=True, exist_ok=True)
    if spec.owner_slurm_job is not None:
        argv = supervisor_argv(spec)
        hosted = start_hosted(spec.owner_slurm_job, argv[3:], spec.env, spec.files.log, spec.files.url)
        if hosted is not None:
            log.info("GPU slot %d: the slot host of Slurm job %s started server supervisor PID %d (%s)",
                     spec.files.slot, spec.owner_slurm_job, hosted.pid, spec.url)  # fmt: skip
            return hosted
        log.warning(
            "GPU slot %d: Slurm job %s has no regen slot host on this node (the profile's precommand "
            "starts it: profiles/slurm/README.md); the server starts in this member's job step, and where "
            "Slurm tracks processes by cgroup it stops when this member ends",
            spec.files.slot, spec.owner_slurm_job,
        )  # fmt: skip
    with open(spec.files.log, "ab") as out:
        proc = subprocess.Popen(
            supervisor_argv(spec),
            env=spec.env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            close_fds=True,
            start_new_session=True,
        )
    log.info("GPU slot %d: started server supervisor PID %d (%s)", spec.files.slot, proc.pid, spec.url)
    return proc


#: how long a supervisor stopped for a rejected launch command gets to stop its server before SIGKILL
STOP_REJECTED_S = 60.0


def check_while_starting(started: Started, command: list[str], check: LaunchCheck) -> None:
    """``check`` on a supervisor's launch command while its server loads; a rejection stops the supervisor
    (SIGTERM: it stops its server; SIGKILL after :data:`STOP_REJECTED_S`) and is raised."""
    try:
        check(command)
    except ServerError:
        log.error("supervisor PID %d: its launch command was rejected; stopping it", started.pid)
        started.terminate()
        try:
            started.wait(STOP_REJECTED_S)
        except subprocess.TimeoutExpired:
            started.kill()
            started.wait()
        raise


def wait_supervisor_gone(pid: int, timeout_s: float) -> bool:
    """Wait until ``pid`` has exited; True if it did."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.1)
    return not pid_alive(pid)


def wait_until_ready(
    files: SlotFiles,
    supervisor_pid: int,
    deadline_s: float,
    poll_s: float,
    started: Started | None = None,
) -> UrlState:
    """Poll the url file until the supervisor reports its server ready; ServerError if it gives up.

    ``started`` is the Popen (or slot host's handle) when this job started the supervisor (its /proc
    cmdline is the job's own until it execs, so liveness comes from the Popen then).
    """
    deadline = time.monotonic() + deadline_s
    while True:
        state = read_url_state(files.url)
        alive = started.poll() is None if started is not None else is_supervisor(supervisor_pid, files.url)
        if state is not None and state.supervisor_pid == supervisor_pid:
            if state.url is not None and alive:
                return state
            if state.failed:
                raise ServerError(
                    f"GPU slot {files.slot}: the server supervisor gave up; {files.log} ends with:\n"
                    f"{log_tail(files.log)}"
                )
        if not alive:
            raise ServerError(
                f"GPU slot {files.slot}: server supervisor PID {supervisor_pid} exited before the server "
                f"was ready; {files.log} ends with:\n{log_tail(files.log)}"
            )
        if time.monotonic() > deadline:
            raise ServerError(f"GPU slot {files.slot}: server not ready after {deadline_s:.0f} s")
        time.sleep(poll_s)


def realized_supervisor(files: SlotFiles) -> int | None:
    """The supervisor PID ``gpu{k}.realized.json`` was written for (None: none, or unreadable)."""
    try:
        pid = read_json(files.realized).get("supervisor_pid")
    except (OSError, ValueError, AttributeError):
        return None
    return pid if isinstance(pid, int) else None


def write_realized(
    files: SlotFiles,
    plan: PlanFile | None,
    info: Mapping[str, Any],
    server_id: str,
    url: str,
    supervisor_pid: int,
) -> None:
    """``gpu{k}.realized.json``: the memory map the server really got vs. the plan (drift logged) and
    where its start went (``regen.serving.startup_split``)."""
    out: dict[str, Any] = {
        "server_id": server_id,
        "url": url,
        "supervisor_pid": supervisor_pid,
        "written_at": time.time(),
        "server_info": {k: info.get(k) for k in ("version", "internal_states") if k in info},
    }
    log_text = startup_log_text(files.log)
    startup = parse_startup_log(log_text)
    realized = realized_from_server_info(dict(info), startup)
    out["startup_log"] = _jsonable(startup)
    out["startup_split"] = _jsonable(startup_split(log_text))
    out["realized"] = _jsonable(realized)
    if plan is not None:
        predicted = plan.launched_section
        out["predicted"] = _jsonable(predicted)
        drift = compare(predicted, realized)
        out["drift"] = _jsonable(drift)
        for item in drift or []:
            log.warning("GPU slot %d: plan vs. realized drift: %s", files.slot, item)
    write_json(files.realized, out)


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


@dataclass(frozen=True, slots=True)
class SlotPlace:
    """Where a job's slot lives and how it waits (``acquire_server``'s options, described there)."""

    workdir: str | os.PathLike[str]
    log_dir: str | os.PathLike[str]
    owner_pid: int | None
    poll_s: float
    on_slot: Callable[[Callable[[], None]], None] | None


@contextlib.contextmanager
def serve_on_slot(
    cfg: ServerConfig, plan: PlanFile | None, place: SlotPlace, command_builder: CommandBuilder,
    command_check: LaunchCheck | None = None,
) -> Iterator[Endpoint]:  # fmt: skip
    """Hold a GPU slot and its server (``command_builder``'s argv, ``command_check``'d while it starts) for
    the ``with`` block; the Endpoint."""
    workdir, log_dir, poll_s, on_slot = place.workdir, place.log_dir, place.poll_s, place.on_slot
    api_key = api_key_from(cfg)
    slots = slot_count(cfg, None)  # server.gpus: a job's GPU slots (regen.generate.generation)
    slot, lock_fd = take_slot(Path(workdir), slots, poll_s=max(poll_s, 0.1))
    files = SlotFiles.of(slot, workdir, log_dir)
    held = [lock_fd]

    def give_slot_up() -> None:
        if held:
            os.close(held.pop())
            log.info("GPU slot %d: given up to the next job (this one drains)", slot)

    try:
        lease_fd = take_lease_shared(files)
        try:
            wait_for_prestart(Path(workdir), cfg.startup_timeout_s, poll_s)
            found = live_or_start(files, cfg, plan, api_key, place.owner_pid, command_builder, command_check)
            started = None if isinstance(found, UrlState) else found
            pid = found.supervisor_pid if isinstance(found, UrlState) else found.pid
            budget = cfg.startup_timeout_s * (cfg.max_restarts + 1) + 120
            state = wait_until_ready(files, pid, budget, poll_s, started)
            assert state.url is not None
            info = fetch_server_info(state.url, api_key)
            server_id = f"gpu{slot}"
            # once per server start: this job's, or a supervisor started before it (regen.tune.prestart)
            if started is not None or realized_supervisor(files) != pid:
                try:
                    write_realized(files, plan, info, server_id, state.url, pid)
                except (OSError, ValueError, TypeError, KeyError) as exc:
                    log.warning("GPU slot %d: could not write %s: %s", slot, files.realized, exc)
            if on_slot is not None:
                on_slot(give_slot_up)
            yield Endpoint(
                url=state.url,
                server_id=server_id,
                slot=slot,
                max_running_requests=effective_max_running(info, plan),
                server_running_cap=server_running_cap(info, plan),
                version=info.get("version"),
                model=served_model(info, cfg.model_path),
                api_key=api_key,
                numerics=server_numerics(info) if info else None,  # None: the client asks again
                radix_cache=radix_cache_on(info),
            )
        finally:
            os.close(lease_fd)
    finally:
        if held:
            os.close(held.pop())


@contextlib.contextmanager
def shared_flock(path: Path, timeout_s: float | None = None, poll_s: float = 0.1) -> Iterator[bool]:
    """A shared flock on ``path`` for the ``with`` block: waits while another process holds it
    exclusively, at most ``timeout_s`` (None: for as long as it takes); yields False when it timed out."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        if timeout_s is None:
            fcntl.flock(fd, fcntl.LOCK_SH)
            yield True
        else:
            yield _poll_shared(fd, time.monotonic() + timeout_s, poll_s)
    finally:
        os.close(fd)


def _poll_shared(fd: int, deadline: float, poll_s: float) -> bool:
    """Try a shared flock on ``fd`` until it is taken (True) or ``deadline`` passes (False)."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)


def wait_for_prestart(workdir: Path, timeout_s: float, poll_s: float) -> None:
    """Wait while this slot directory's prestart process decides (``regen.tune.prestart`` holds its
    ``prestart.lock`` from ``onstart`` until every supervisor it started has recorded itself in its url
    file). A job that looked at the url file before then found none and started a second supervisor on
    the slot: two servers on one GPU, the first crash-looping out of memory (the H200 race, 2026-12-02)."""
    lock = prestart_lock_in(workdir)
    if not lock.exists():
        return
    with shared_flock(lock, timeout_s, max(poll_s, 0.05)) as decided:
        if not decided:
            log.warning("the prestart process (%s) did not decide within %.0f s; going on without it", lock,
                        timeout_s)  # fmt: skip


def take_lease_shared(files: SlotFiles) -> int:
    """A shared flock on the slot's ``gpu{k}.lease`` (its fd): blocks while the previous supervisor is
    exiting (it holds LOCK_EX while it stops)."""
    fd = os.open(files.lease, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except BaseException:
        os.close(fd)
        raise
    return fd


def live_or_start(
    files: SlotFiles,
    cfg: ServerConfig,
    plan: PlanFile | None,
    api_key: str | None,
    owner_pid: int | None,
    command_builder: CommandBuilder,
    command_check: LaunchCheck | None = None,
) -> UrlState | Started:
    """The slot's live supervisor (its url state, reused) or a freshly started one (:class:`Started`): what a
    generate job does on its slot, and what ``regen.tune.prestart`` does before any job (the caller
    holds the slot's lease shared, :func:`take_lease_shared`). A started one's command is
    ``command_check``'d once it runs (:func:`check_while_starting`)."""
    state = read_url_state(files.url)
    if state is not None and is_supervisor(state.supervisor_pid, files.url):
        if not state.failed:
            log.info("GPU slot %d: reusing server supervisor PID %d", files.slot, state.supervisor_pid)
            return state
        wait_supervisor_gone(state.supervisor_pid, 30)
    host = cfg.host
    port = pick_port(host, cfg.port_base + files.slot, files.slot)
    model = cfg.model_path
    command = command_builder(cfg, plan, port, model)
    tp = cfg.tp
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = visible_devices_for(files.slot, tp, os.environ.get("CUDA_VISIBLE_DEVICES"))
    spec = LaunchSpec(
        files=files,
        url=f"http://{client_host(host)}:{port}",
        host=host,
        port=port,
        model=model,
        command=command,
        env=env,
        idle_timeout_s=cfg.idle_timeout_s,
        startup_timeout_s=cfg.startup_timeout_s,
        max_restarts=cfg.max_restarts,
        owner_pid=owner_pid if owner_pid is not None else find_owner_pid(),
        api_key_env=cfg.api_key_env if api_key else None,
        stall_timeout_s=cfg.stall_timeout_s,
        # a job's server in a Slurm job belongs to that job: its next group member reuses it
        owner_slurm_job=slurm_job_id() if owner_pid is None else None,
    )
    started = start_supervisor(spec)
    if command_check is not None:
        check_while_starting(started, command, command_check)
    return started
