"""The one writer of a shard journal (``regen.generate.journal``).

One writer per journal, always: ``Journal.open`` claims the journal (:class:`JournalWriter`, an
exclusive ``flock`` on ``{journal}.lock``) before it reads or appends, whatever Snakemake's own lock says
(``snakemake --unlock`` while a run is alive lets a second run start the same shards). A second writer
waits for the first, or refuses with :class:`JournalBusyError` naming the shard and the holder's pid and
host. The kernel drops the lock when its holder dies (kill, OOM, lost node: on NFS the server drops it
when the client's lease ends), so a killed job never blocks the rerun. On NFS Linux emulates ``flock``
with POSIX byte-range locks, which are cluster-wide and released by any ``close`` of the file in the
holding process: the holder opens the lock file once and keeps it open, and a process claims a journal
once (a generate job is one process per shard). On Lustre mount with ``-o flock`` (``localflock`` locks
per node only).
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from regen.layout.beside import journal_lock
from regen.layout.names import JOURNAL_SUFFIX


class JournalBusyError(RuntimeError):
    """Another live process writes this journal (its pid and host in the message)."""


#: seconds between tries, and between "still waiting" messages, of a writer waiting for the journal
WAIT_POLL_S = 0.5
WAIT_REPORT_S = 30.0


class JournalWriter:
    """The one writer's claim on a journal: an exclusive ``flock`` on ``{journal}.lock``, held on one
    open file until :meth:`release` or the process's death. The lock file names its holder (pid, host,
    since), for the message a second writer gets."""

    def __init__(self, journal: Path, fd: int) -> None:
        self.journal = journal
        self._fd: int | None = fd

    @classmethod
    def claim(
        cls,
        journal: str | os.PathLike[str],
        *,
        wait: bool,
        on_wait: Callable[[str], None] | None = None,
        poll_s: float = WAIT_POLL_S,
        report_s: float = WAIT_REPORT_S,
    ) -> JournalWriter:
        """Claim ``journal`` for writing. Held by another process: raise :class:`JournalBusyError`
        (``wait`` false), or wait for it, calling ``on_wait`` with who holds it at once and every
        ``report_s`` seconds."""
        p = Path(journal)
        p.parent.mkdir(parents=True, exist_ok=True)
        lock = journal_lock(p)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        next_report = time.monotonic()
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    message = busy_message(p)
                    if not wait:
                        raise JournalBusyError(message) from None
                    if on_wait is not None and time.monotonic() >= next_report:
                        on_wait(message + "; waiting for it to finish")
                        next_report = time.monotonic() + report_s
                    time.sleep(poll_s)
            holder = orjson.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()})
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder + b"\n", 0)
        except BaseException:
            os.close(fd)
            raise
        return cls(p, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> JournalWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        """Give the journal up (closing the lock file drops the lock). Idempotent."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


def busy_message(journal: Path) -> str:
    """Who holds ``journal``'s writer lock, as its lock file says."""
    try:
        holder = orjson.loads(journal_lock(journal).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        holder = None
    shard = journal.name.removesuffix(JOURNAL_SUFFIX)
    if not isinstance(holder, dict):
        who = "another process (its pid and host not written yet)"
    else:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("since", 0))))
        who = f"pid {holder.get('pid')} on host {holder.get('host')} (since {since})"
    return (
        f"shard {shard}: journal {journal} is being written by {who}: another run of this workflow is "
        "generating this shard in this directory (one writer per journal, whatever Snakemake's lock says)"
    )
