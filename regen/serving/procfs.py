"""Per-slot url files and process checks through /proc: never trust a bare PID."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: the module the per-slot supervisor runs as (``python -m``); how its processes are recognised
SUPERVISOR_MODULE = "regen.serving.supervisor"
#: the supervisor writes this line to the log before each server start
SERVER_START_MARK = "=== regen supervisor: starting server"
#: what the supervisor says once its readiness probe answered (``regen.serving.startup_split`` reads it)
SERVER_READY_MARK = "server ready at "


@dataclass(frozen=True, slots=True)
class UrlState:
    """Content of a ``gpu{k}.url`` file: ``starting PID`` | ``URL PID SERVER_PID`` | ``failed PID``."""

    supervisor_pid: int
    url: str | None = None
    server_pid: int | None = None
    failed: bool = False

    def to_line(self) -> str:
        if self.failed:
            return f"failed {self.supervisor_pid}\n"
        if self.url is None:
            return f"starting {self.supervisor_pid}\n"
        return f"{self.url} {self.supervisor_pid} {self.server_pid or 0}\n"


def read_url_state(path: str | os.PathLike[str]) -> UrlState | None:
    """Parse a url file; ``None`` when it is missing or unreadable."""
    try:
        fields = Path(path).read_text().split()
        pid = int(fields[1])
    except (OSError, ValueError, IndexError):
        return None
    head = fields[0]
    if head == "failed":
        return UrlState(pid, failed=True)
    if head.startswith("http"):
        server_pid = int(fields[2]) if len(fields) > 2 and fields[2].isdigit() else None
        return UrlState(pid, url=head, server_pid=server_pid or None)
    return UrlState(pid)


def write_url_state(path: str | os.PathLike[str], state: UrlState) -> None:
    """Replace the url file atomically (temp file + rename)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(state.to_line())
    os.replace(tmp, target)


def proc_cmdline(pid: int) -> list[str]:
    """The argv of a running (non-zombie) process, or [] when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def proc_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, pgrp, starttime) from /proc/PID/stat, or None when the process is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = raw[raw.rindex(")") + 2 :].split()
    return rest[0], int(rest[1]), int(rest[2]), int(rest[19])


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as dead)."""
    stat = proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def is_supervisor(pid: int, url_file: str | os.PathLike[str] | None = None) -> bool:
    """True when ``pid`` is a live regen supervisor (for ``url_file`` if given): never trust a bare PID."""
    argv = proc_cmdline(pid)
    if SUPERVISOR_MODULE not in argv:
        return False
    if url_file is None:
        return True
    try:
        recorded = argv[argv.index("--url-file") + 1]
    except (ValueError, IndexError):
        return False
    return os.path.realpath(recorded) == os.path.realpath(url_file)


def supervisor_owner(pid: int) -> int | None:
    """The ``--owner-pid`` a live supervisor was started with (None: not a supervisor, or none given)."""
    argv = proc_cmdline(pid)
    try:
        return int(argv[argv.index("--owner-pid") + 1]) if SUPERVISOR_MODULE in argv else None
    except (ValueError, IndexError):
        return None


def find_owner_pid() -> int:
    """The Snakemake process that owns this job, else the parent.

    Walks up from the parent to the first ancestor with ``snakemake`` in its argv, then keeps going
    while the next ancestors mention snakemake too: a ``run:`` job runs in a per-job snakemake
    process below the main one, which must not count as the owner (it exits after each job).
    """
    parent = os.getppid()
    owner: int | None = None
    pid = parent
    for _ in range(64):
        if pid <= 1:
            break
        mentions = any("snakemake" in a for a in proc_cmdline(pid))
        if mentions:
            owner = pid
        elif owner is not None:
            break
        stat = proc_stat(pid)
        if stat is None:
            break
        pid = stat[1]
    return owner if owner is not None else parent


def log_tail(path: str | os.PathLike[str], lines: int = 40) -> str:
    """The last ``lines`` lines of a log file ('' when absent)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def startup_log_text(path: str | os.PathLike[str], limit: int = 512 * 1024) -> str:
    """The log of the latest server start: from the last start marker forward (``limit`` bytes),
    so the allocation lines are found however many decode lines followed them."""
    mark = SERVER_START_MARK.encode()
    start = 0
    try:
        with open(path, "rb") as fh:
            offset, carry = 0, b""
            while chunk := fh.read(1 << 20):
                found = (carry + chunk).rfind(mark)
                if found >= 0:
                    start = offset - len(carry) + found
                carry = chunk[-len(mark) :]
                offset += len(chunk)
            fh.seek(start)
            return fh.read(limit).decode(errors="replace")
    except OSError:
        return ""
