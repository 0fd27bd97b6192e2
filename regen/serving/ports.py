"""Ports: what listens where (/proc/net), and ports reserved across processes.

Two runs on one node (two checkouts, two users' demos) choose their ports without knowing each other.
On a GPU, SGLang binds its HTTP port only after loading weights and capturing graphs, so a port lost
to another run costs a whole server start. A port is therefore *held* before a server is started on it:
an exclusive ``flock`` on ``port-{N}.lock`` in one directory shared by every process on the node
(:func:`port_lock_dir`). The supervisor that launches a server holds its port's lock for the server's
life (the kernel drops it when the supervisor dies, and the server dies with it), so no run ever starts
a server on a port another run holds; a port a process outside regen listens on is skipped too.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from regen.serving.procfs import proc_stat

log = logging.getLogger("regen.serving.ports")

#: how long a job waits for a slot's preferred port to be released before taking any free port
PORT_WAIT_S = 1.0
#: the environment variable naming the node's port-lock directory (tests give each a private one)
PORT_LOCK_DIR_ENV = "REGEN_PORT_LOCK_DIR"
#: ports the kernel is asked for before giving up on finding one no other run holds
FREE_PORT_TRIES = 64


def port_lock_dir() -> Path:
    """The directory of the node's port locks: ``$REGEN_PORT_LOCK_DIR``, else ``<tmp>/regen-ports``
    (one for every user: sticky and world-writable, like /tmp itself)."""
    named = os.environ.get(PORT_LOCK_DIR_ENV)
    if named:
        return Path(named)
    shared = Path(tempfile.gettempdir()) / "regen-ports"
    if not shared.is_dir():
        with contextlib.suppress(FileExistsError):
            shared.mkdir()
            shared.chmod(0o1777)
    return shared


@dataclass(slots=True)
class PortHold:
    """An exclusive lock on one port's lock file; the port is this process's until :meth:`release`."""

    port: int
    fd: int | None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def hold_port(host: str, port: int, lock_dir: Path | None = None) -> PortHold | None:
    """Hold ``port`` when no other process holds it and nothing listens on it; None otherwise."""
    where = lock_dir if lock_dir is not None else port_lock_dir()
    where.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(where / f"port-{port}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except PermissionError:  # another user's lock file that user cannot share: held, as far as we know
        return None
    with contextlib.suppress(OSError):  # the umask's 0644 would keep every other user off this port
        os.fchmod(fd, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    if not port_is_free(host, port):  # held by nobody, but something outside regen listens there
        os.close(fd)
        return None
    return PortHold(port, fd)


def port_is_held(port: int, lock_dir: Path | None = None) -> bool:
    """True while another process holds ``port``'s lock (this process holding it counts as held too
    when through another open file)."""
    where = lock_dir if lock_dir is not None else port_lock_dir()
    try:
        fd = os.open(where / f"port-{port}.lock", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except PermissionError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def hold_free_port(host: str, lock_dir: Path | None = None) -> PortHold:
    """Hold a port the kernel picks as free and no other run holds."""
    for _ in range(FREE_PORT_TRIES):
        held = hold_port(host, any_free_port(host), lock_dir)
        if held is not None:
            return held
    raise OSError(f"no free port on {host} that another run does not hold after {FREE_PORT_TRIES} tries")


def port_is_free(host: str, port: int) -> bool:
    """True when nothing listens on ``host:port`` (TIME_WAIT sockets do not count)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _listener_inodes(port: int) -> set[str] | None:
    """The socket inodes listening on ``port`` (any address); None when /proc/net cannot be read."""
    found: set[str] = set()
    readable = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                found.add(f"socket:[{f[9]}]")
    return found if readable else None


def group_listens_on(pgid: int, port: int) -> bool | None:
    """Whether a process of group ``pgid`` (a server and its workers) holds the socket listening on
    ``port``: False when another process is seen holding it (a server answering there may be another
    run's that took the port first); None when no holder can be seen (the kernel's tables or the
    processes' file descriptors cannot be read)."""
    inodes = _listener_inodes(port)
    if not inodes:
        return None
    other = False
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/fd/{fd}") in inodes:
                    stat = proc_stat(int(entry))
                    if stat is not None and stat[2] == pgid:
                        return True
                    other = True
    return False if other else None


def client_host(host: str) -> str:
    """The address a client uses to reach a server bound to ``host``."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def pick_port(host: str, preferred: int, slot: int) -> int:
    """``preferred`` (port_base + slot) when free, else a free port the kernel picks.

    Another run or checkout on this node may hold the preferred port; the port actually used is
    recorded in the slot's url file (``UrlState.url``), which is where every job and ``regen status``
    read it from, so side-by-side runs never need to agree on ports. A port another run holds
    (:func:`hold_port`) is skipped; the supervisor holds the one it launches on.
    """
    if not port_is_held(preferred) and _wait_port_free(host, preferred, PORT_WAIT_S):
        return preferred
    port = any_free_port(host)
    log.info(
        "GPU slot %d: port %d on %s is in use (another run?); using free port %d", slot, preferred, host, port
    )
    return port


def any_free_port(host: str) -> int:
    """A port free on ``host`` now, as the kernel picks one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _wait_port_free(host: str, port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not port_is_free(host, port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)
    return True
