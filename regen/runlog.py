"""Logging set-up for Snakemake scripts: everything a job says goes to its rule's log file; a Ctrl-C
stops the job with one line (in its log and on Snakemake's console), not a traceback; and a job whose
Snakemake controller dies (``kill -9``, a lost login shell, the OOM killer) stops the same way instead of
running on as an orphan beside the rerun (its journal writer lock makes the rerun wait for it meanwhile:
``regen.generate.journal_writer``).

Every attempt's log is kept: Snakemake removes a job's log before it runs the job again (a retry after a
lost Slurm node, a rerun after a kill), so each attempt also names its log ``{log stem}.attempt-N.log``
(``regen.layout.beside.attempt_log``, a hard link: no second copy) and drops that name when it ends without an
exception. An attempt that did not finish (killed, its node lost, failed) leaves it, and the next
attempt's log names them."""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import TracebackType

from regen.layout.beside import attempt_log, attempt_logs

#: what the workflow prints once when a run stops before its end (Snakefile ``onerror``)
RESUME_HINT = (
    "regen: the run stopped before its end: rerun the same snakemake command to resume (after fixing "
    "the error above, if any): finished samples are replayed from the journals, not generated again"
)


def job_name(log_path: str) -> str:
    """``generate 00003`` for ``logs/generate/00003.log``, ``merge`` for ``logs/merge.log``."""
    parts = Path(log_path).with_suffix("").parts
    under = len(parts) - 1 - parts[::-1].index("logs") if "logs" in parts else len(parts) - 2
    return " ".join(parts[under + 1 :])


def log_to(path: str) -> logging.Logger:
    """Send the ``regen`` loggers and stderr to ``path`` (the rule's ``log:``), line-buffered."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    stream = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the job
    sys.stderr = stream
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("regen")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    earlier = attempt_logs(path)
    attempt = keep_attempt_log(Path(path))
    if earlier:
        root.warning(
            "earlier attempts of this job did not finish; their logs: %s",
            ", ".join(str(p) for p in earlier.values()),
        )
    if attempt is None:
        root.warning(
            "this attempt's log cannot be kept beside %s (no hard link there): a retry replaces it", path
        )
    outcome = AttemptOutcome(attempt)
    sys.excepthook = outcome.hook(stopped_quietly(job_name(path), sys.excepthook))
    atexit.register(outcome.at_exit)
    stop_when_owner_dies()
    stop_if_controller_gone()  # an orphan from its start (the controller died before the watch began)
    return root


def keep_attempt_log(log: Path) -> Path | None:
    """Give the log a second name, ``attempt_log(log, N)`` with N the next free number (a hard link, so
    Snakemake's removal of the rule's log before a retry leaves this attempt's lines there); None when
    the filesystem has no hard links."""
    n = max(attempt_logs(log), default=0) + 1
    while True:
        try:
            os.link(log, attempt_log(log, n))
            return attempt_log(log, n)
        except FileExistsError:
            n += 1
        except OSError:
            return None


class AttemptOutcome:
    """Whether this attempt ends by an exception (or Ctrl-C); at exit without one, its attempt name goes
    (the rule's log holds the same lines). A killed process runs no exit code: the name stays."""

    def __init__(self, attempt: Path | None) -> None:
        self.attempt = attempt
        self.failed = False

    def hook(self, inner: object) -> object:
        def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
            self.failed = True
            inner(kind, value, tb)  # type: ignore[operator]

        return hook

    def at_exit(self) -> None:
        if self.attempt is not None and not self.failed:
            self.attempt.unlink(missing_ok=True)


#: how often a job looks whether its Snakemake controller still lives
OWNER_CHECK_S = 2.0


def stop_when_owner_dies(every_s: float = OWNER_CHECK_S) -> threading.Thread | None:
    """Watch this job's Snakemake controller (``find_owner_pid``) and, once it is gone (or its pid
    reused), interrupt the job as Ctrl-C would: what it finished is kept, and the rerun's job for the
    same shard does not wait behind an orphan. None when no Snakemake controller is found above it."""
    from regen.run_marker import process_start_time, same_process_alive
    from regen.serving.procfs import find_owner_pid, proc_cmdline

    owner = find_owner_pid()
    if owner <= 1 or not any("snakemake" in a for a in proc_cmdline(owner)):
        return None
    started = process_start_time(owner)
    _WATCHED[:] = [(owner, started)]
    if (
        signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        and threading.current_thread() is threading.main_thread()
    ):
        # started from a background job of a shell script (``snakemake ... &``, nohup): SIGINT arrives
        # ignored, and Python then installs no KeyboardInterrupt handler, so the stop below would be lost
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def watch() -> None:
        while same_process_alive(owner, started):
            threading.Event().wait(every_s)
        logging.getLogger("regen").warning(
            "the Snakemake controller (pid %d) is gone: stopping this job", owner
        )
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=watch, name="owner-watch", daemon=True)
    thread.start()
    return thread


#: the controller the watch follows: (pid, process start time), set by ``stop_when_owner_dies``
_WATCHED: list[tuple[int, float | None]] = []


def controller_gone(marker: str | os.PathLike[str] | None = None) -> str | None:
    """Why this job's Snakemake controller is gone (None: alive, or a job run without one).

    The controller found above the job when its watch began, if any; else the run marker (``marker``,
    default ``RUN.run_marker``): a job with no Snakemake above it on the marker's host whose run is dead
    or ended, or began after this job started, was orphaned before its watch could begin (issue 58 item 3:
    ``kill -9`` of the controller between the job's launch and its first line)."""
    from regen.run_marker import RunMarker, process_start_time, same_process_alive

    if _WATCHED:
        pid, started = _WATCHED[0]
        return None if same_process_alive(pid, started) else f"the Snakemake controller (pid {pid}) is gone"
    from regen.layout.run import RUN

    run = RunMarker.read(RUN.run_marker if marker is None else marker)
    if run is None or os.environ.get("SLURM_JOB_ID"):  # a cluster job's controller is elsewhere
        return None
    mine = process_start_time(os.getpid())
    if mine is not None and run.started_at > mine:
        return f"a newer run ({run.describe()}) started after this job: its own controller is gone"
    state = run.liveness()
    if state != "running":
        return f"the run that started this job ({run.describe()}) is {state}"
    return None


def stop_if_controller_gone(marker: str | os.PathLike[str] | None = None) -> None:
    """Stop this job as Ctrl-C would when its controller is gone (``controller_gone``): a generate job calls
    it before it starts a server and before it sends its first request, not only from the watch."""
    why = controller_gone(marker)
    if why is not None:
        logging.getLogger("regen").warning("%s: stopping this job before it starts work", why)
        raise KeyboardInterrupt(why)


def stopped_quietly(job: str, previous: object) -> object:
    """An excepthook: a KeyboardInterrupt is one line (the process still ends by SIGINT, as Python's
    own handling does, so Snakemake sees a job stopped by the user); anything else goes to ``previous``."""

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if not issubclass(kind, KeyboardInterrupt):
            previous(kind, value, tb)  # type: ignore[operator]
            return
        line = f"regen: {job}: stopped (Ctrl-C); what finished is kept"
        for stream in {id(s): s for s in (sys.stderr, sys.__stderr__) if s is not None}.values():
            print(line, file=stream, flush=True)

    return hook
