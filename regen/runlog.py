"""Logging set-up for Snakemake scripts: everything a job says goes to its rule's log file; a Ctrl-C
stops the job with one line (in its log and on Snakemake's console), not a traceback."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from types import TracebackType

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
    sys.excepthook = stopped_quietly(job_name(path), sys.excepthook)
    return root


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
