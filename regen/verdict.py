"""Gate verdicts that survive a failed job.

Snakemake deletes a failed job's outputs, so a gate that fails its job must keep its details
somewhere else: beside the rule's log (``logs/reaudit.log`` -> ``logs/reaudit.verdict.json``), which
Snakemake keeps. The failure message points there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from regen.io import write_json
from regen.layout.beside import verdict_for


def verdict_path_for(log_path: str | os.PathLike[str]) -> Path:
    """Where a rule's gate verdict is kept (``regen.layout.beside.verdict_for``; the name the scripts
    import)."""
    return verdict_for(log_path)


def keep_verdict(summary: dict[str, Any], path: str | os.PathLike[str] | None) -> None:
    """Write the gate summary to ``path`` (no-op without one), atomically."""
    if path is not None:
        write_json(path, summary)
