"""Other GPU slots' servers lent to a generate job while they have room (issue #16).

One shard runs per GPU slot; when its last requests drain, when the slot waits for Snakemake to start
the next job, and at the end of the run when no job is left for it, that GPU's server has free batch
places. ``SlotLenders`` finds the live servers of the other slots of this allocation (the
``gpu{k}.url`` files of ``regen.serving``), reads how busy each is from its Prometheus
``/metrics`` (SGLang's ``num_running_reqs`` + ``num_queue_reqs``), and offers the client a share of
the free places. The client sends its own samples there; each sample still goes out once and lands in
its own shard's journal, so exactly-once and resume are the journal's as before.

A lent server is held with a shared lease on its ``gpu{k}.lease`` (taken without waiting), so its
supervisor does not stop it for idleness while a borrower uses it; a slot whose supervisor is stopping
(it holds the lease exclusively) is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import math
import os
from pathlib import Path

import aiohttp

from regen.layout.slots import SlotFiles, slot_of
from regen.serving.metrics import sum_prometheus
from regen.serving.procfs import is_supervisor, read_url_state
from regen.types import Endpoint

#: seconds between looks at the other servers' load (SGLang refreshes its gauges every few seconds)
DEFAULT_POLL_S = 0.5
RUNNING, QUEUED = "sglang:num_running_reqs", "sglang:num_queue_reqs"


class SlotLenders:
    """The other slots' servers in ``workdir`` (one allocation's ``work/servers``), for ``own_slot``'s job.

    ``cap`` is the running-request cap of every server (one plan for all slots). Each server's free
    places (cap - running - queued) are split evenly among the jobs that may borrow them (every other
    live server's job), so borrowers together fill a server and do not pile a queue on it.
    """

    def __init__(
        self, workdir: str | os.PathLike[str], own_slot: int, cap: int, poll_s: float = DEFAULT_POLL_S
    ) -> None:
        self.workdir = Path(workdir)
        self.own_slot = own_slot
        self.cap = cap
        self.poll_s = poll_s
        self.leases: dict[int, int] = {}
        self.timeout = aiohttp.ClientTimeout(total=max(1.0, poll_s * 2))

    def live_slots(self) -> list[tuple[int, str]]:
        """(slot, url) of every other slot whose supervisor reports a ready server."""
        found = []
        for url_file in sorted(self.workdir.glob("gpu*.url")):
            slot = slot_of(url_file)
            if slot is None or slot == self.own_slot:
                continue
            state = read_url_state(url_file)
            if state is None or state.url is None or state.failed:
                continue
            if is_supervisor(state.supervisor_pid, url_file):
                found.append((slot, state.url))
        return found

    def hold(self, slot: int) -> bool:
        """A shared lease on ``slot``'s server (kept until ``close``); False while it is stopping."""
        if slot in self.leases:
            return True
        files = SlotFiles.of(slot, self.workdir, self.workdir)
        fd = os.open(files.lease, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self.leases[slot] = fd
        return True

    async def load(self, session: aiohttp.ClientSession, url: str) -> int | None:
        """Running + queued requests on the server at ``url`` (None when it does not answer)."""
        try:
            async with session.get(url.rstrip("/") + "/metrics", timeout=self.timeout) as resp:
                if resp.status != 200:
                    return None
                metrics = sum_prometheus(await resp.text(), (RUNNING, QUEUED))
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
            return None
        if RUNNING not in metrics:
            return None
        return int(metrics[RUNNING] + metrics.get(QUEUED, 0.0))

    async def spare(self, session: aiohttp.ClientSession) -> list[tuple[Endpoint, int]]:
        slots = self.live_slots()
        if not slots:
            return []
        loads = await asyncio.gather(*(self.load(session, url) for _, url in slots))
        sharers = len(slots)  # the jobs of the other live slots, this one included, minus the lender's
        offers = []
        for (slot, url), busy in zip(slots, loads, strict=True):
            room = self.cap - busy if busy is not None else 0
            if room <= 0 or not self.hold(slot):
                continue
            offers.append((Endpoint(url=url, server_id=f"gpu{slot}", slot=slot), math.ceil(room / sharers)))
        return offers

    def close(self) -> None:
        for fd in self.leases.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.leases.clear()
