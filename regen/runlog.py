"""Logging set-up for Snakemake scripts: everything a job says goes to its rule's log file."""

from __future__ import annotations

import logging
import sys
from pathlib import Path


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
    return root
