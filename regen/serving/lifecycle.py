"""The server lifecycle: a server for ``server.mode`` held for a ``with`` block, and every server stopped.

The one owner of server processes: ``acquire_server`` starts a job's server, ``start_slot_servers`` the
same slot supervisors before any job (what ``regen.tune.prestart`` asks for); ``stop_all_servers``
is for the Snakefile's ``onsuccess``/``onerror`` handlers and for the tune rule's refusal of a prestarted
server. The modes (:data:`MODES`) are one module each.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from regen.layout.run import RUN
from regen.layout.slots import SlotFiles, url_files
from regen.runconfig import ServerConfig
from regen.serving.base import CommandBuilder, LaunchCheck, ServerError, ServerMode, api_key_from
from regen.serving.local_sglang import LocalSGLang
from regen.serving.procfs import (
    UrlState,
    is_supervisor,
    pid_alive,
    proc_stat,
    read_url_state,
    supervisor_owner,
)
from regen.serving.remote import RemoteEndpoint
from regen.serving.simulated_mode import Simulated
from regen.serving.slots import SlotPlace, live_or_start, serve_on_slot, take_lease_shared
from regen.sglang.config import PlanFile
from regen.types import Endpoint

log = logging.getLogger("regen.serving.lifecycle")

#: every server.mode, by name
MODES: dict[str, ServerMode] = {mode.name: mode for mode in (LocalSGLang(), Simulated(), RemoteEndpoint())}


def mode_of(cfg: ServerConfig) -> ServerMode:
    """The :class:`ServerMode` for ``server.mode``."""
    try:
        return MODES[cfg.mode]
    except KeyError:
        raise ServerError(f"server.mode {cfg.mode!r} is none of {sorted(MODES)}") from None


def build_server_command(cfg: ServerConfig, plan: PlanFile | None, port: int, model_path: str) -> list[str]:
    """The server command for ``server.mode`` (sglang or simulated)."""
    return mode_of(cfg).command(cfg, plan, port, model_path)


@contextlib.contextmanager
def acquire_server(
    cfg: ServerConfig,
    plan: PlanFile | None = None,
    workdir: str | os.PathLike[str] = RUN.servers_root,
    log_dir: str | os.PathLike[str] = RUN.server_logs_root,
    *,
    owner_pid: int | None = None,
    command_builder: CommandBuilder | None = None,
    command_check: LaunchCheck | None = None,
    poll_s: float = 0.25,
    on_slot: Callable[[Callable[[], None]], None] | None = None,
) -> Iterator[Endpoint]:
    """Hold a server for ``server.mode`` for the duration of the ``with`` block; yields the Endpoint.

    A mode that launches runs on a GPU slot (:func:`regen.serving.slots.serve_on_slot`), one of
    ``server.gpus`` / ``server.tp`` (a job passes ``server`` with ``gpus`` its GPU slots: Snakemake's
    ``--resources gpu=N``); ``owner_pid`` is the process whose
    death (with no lease held) stops the server (default: the Snakemake ancestor); ``command_builder``
    replaces the mode's command (tests use a stand-in server) and ``command_check`` is run on the command
    while its server starts (default: the mode's :meth:`~regen.serving.base.ServerMode.launch_check` for
    the mode's own command, none for a replaced one). ``on_slot`` is called with a function
    that gives the slot up before the block ends (idempotent): the next job waiting for a slot takes it
    and shares the server while this job's last requests drain (this job's lease keeps the server up).
    """
    mode = mode_of(cfg)
    if not mode.launches:
        yield mode.endpoint(cfg, plan)
        return
    place = SlotPlace(workdir, log_dir, owner_pid, poll_s, on_slot)
    own = mode.launch_check if command_builder is None else None  # a replaced command is not the mode's
    check = command_check if command_check is not None else own
    with serve_on_slot(cfg, plan, place, command_builder or mode.command, check) as endpoint:
        yield endpoint


def start_slot_servers(
    cfg: ServerConfig, plan: PlanFile, slots: Sequence[int], owner_pid: int, place: tuple[Path, Path]
) -> None:
    """Before any job (``regen.tune.prestart``): start (or find live) each slot's supervisor in ``place``
    (slot directory, log directory) as :func:`acquire_server` does, under its lease, not its lock; each
    started one has recorded itself in its url file on return."""
    workdir, log_dir = place
    workdir.mkdir(parents=True, exist_ok=True)
    api_key = api_key_from(cfg)
    for slot in slots:
        files = SlotFiles.of(slot, workdir, log_dir)
        lease_fd = take_lease_shared(files)
        try:
            mode = mode_of(cfg)
            found = live_or_start(files, cfg, plan, api_key, owner_pid, mode.command, mode.launch_check)
        finally:
            os.close(lease_fd)
        if isinstance(found, subprocess.Popen):
            wait_until_recorded(files, found)


#: how long the prestart waits for a supervisor it started to write its url file
RECORD_WAIT_S = 60.0


def wait_until_recorded(files: SlotFiles, started: subprocess.Popen[bytes]) -> None:
    """Until the started supervisor has written its pid to the slot's url file (or exited): only then may
    the prestart lock go, or a generate job that finds no url file yet starts a second supervisor on the
    slot (its own ``live_or_start`` sees none), and two supervisors contend for one slot's port and lease."""
    deadline = time.monotonic() + RECORD_WAIT_S
    while time.monotonic() < deadline and started.poll() is None:
        state = read_url_state(files.url)
        if state is not None and state.supervisor_pid == started.pid:
            return
        time.sleep(0.05)
    log.warning(
        "GPU slot %d: supervisor PID %d wrote no url file within %.0f s",
        files.slot,
        started.pid,
        RECORD_WAIT_S,
    )


def live_supervisors(workdir: str | os.PathLike[str]) -> list[tuple[Path, UrlState]]:
    """(url file, state) of every slot whose recorded supervisor PID is really a live supervisor, in
    ``workdir`` and in its per-Slurm-job slot directories (``regen.layout.slots.url_files``)."""
    found = []
    for url_file in url_files(workdir):
        state = read_url_state(url_file)
        if state is not None and is_supervisor(state.supervisor_pid, url_file):
            found.append((url_file, state))
    return found


def stop_all_servers(
    workdir: str | os.PathLike[str] = RUN.servers_root, grace_s: float = 30.0, owner_pid: int | None = None
) -> int:
    """SIGTERM every live supervisor (verified PIDs), wait, then SIGKILL; returns how many were stopped.

    ``workdir`` is the run's slot root: its per-node slots and every per-Slurm-job slot directory;
    ``owner_pid``: only the supervisors owned by that Snakemake process (a run's own, not another's).

    Safe to call from Snakemake's ``onsuccess``/``onerror`` when no server runs.
    """
    targets = [
        (url_file, state)
        for url_file, state in live_supervisors(workdir)
        if owner_pid is None or supervisor_owner(state.supervisor_pid) == owner_pid
    ]
    for url_file, state in targets:
        log.info("stopping server supervisor PID %d (%s)", state.supervisor_pid, url_file)
        with contextlib.suppress(ProcessLookupError):
            os.kill(state.supervisor_pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for url_file, state in targets:
        while pid_alive(state.supervisor_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if is_supervisor(state.supervisor_pid, url_file):
            log.warning("supervisor PID %d ignored SIGTERM; killing it", state.supervisor_pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(state.supervisor_pid, signal.SIGKILL)
        if state.server_pid:
            _kill_orphan_group(state.server_pid)
    return len(targets)


def _kill_orphan_group(pgid: int) -> None:
    """SIGKILL a server's process group left behind by a killed supervisor (if it still leads it)."""
    stat = proc_stat(pgid)
    if stat is None or stat[2] != pgid or stat[0] in ("Z", "X"):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
