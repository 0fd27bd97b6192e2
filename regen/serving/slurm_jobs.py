"""The Slurm jobs a dead controller left in this directory (issue 50 item 4): its group jobs keep running
(or are still pending) after ``kill -9`` of the main ``snakemake``; the rerun waits for them before it
builds its DAG, so it adopts what they finish instead of submitting the same shards beside them (whose
start would remove the outputs the old job is about to write)."""

from __future__ import annotations

import getpass
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

#: squeue states of a job that has not ended
UNFINISHED = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"}
)


def unfinished_jobs_in(workdir: Path) -> list[str]:
    """Ids of this user's Slurm jobs that have not ended and run in ``workdir``; [] without Slurm."""
    if shutil.which("squeue") is None:
        return []
    try:
        out = subprocess.run(
            ["squeue", "-h", "-u", getpass.getuser(), "-o", "%i|%T|%Z"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    here = workdir.resolve()
    found = []
    for line in out.splitlines():
        job, _, rest = line.strip().partition("|")
        state, _, where = rest.partition("|")
        if state in UNFINISHED and where and Path(where).resolve() == here:
            found.append(job)
    return found


def wait_for_jobs_left_in(workdir: Path, say: Callable[[str], None], poll_s: float = 5.0) -> int:
    """Wait until no unfinished Slurm job of this user runs in ``workdir``; one line when waiting starts
    and one a minute. The number of jobs waited for."""
    jobs = unfinished_jobs_in(workdir)
    if not jobs:
        return 0
    say(
        f"regen: waiting for {len(jobs)} Slurm job(s) the dead run left in this directory "
        f"({', '.join(jobs)}) to end: what they finish is kept, not submitted again"
    )
    waited, last_said = len(jobs), time.monotonic()
    while jobs:
        time.sleep(poll_s)
        jobs = unfinished_jobs_in(workdir)
        if jobs and time.monotonic() - last_said >= 60:
            say(f"regen: still waiting for Slurm job(s) {', '.join(jobs)}")
            last_said = time.monotonic()
    return waited
