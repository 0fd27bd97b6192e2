"""Shared pieces of the benchmarks: synthetic vocabulary and running one side in its own process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

#: Synthetic English-ish vocabulary for generated prompts and answers (first 40 are the merge bench's).
WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "with",
    "was",
    "on",
    "be",
    "by",
    "this",
    "are",
    "or",
    "from",
    "at",
    "an",
    "which",
    "but",
    "not",
    "have",
    "model",
    "token",
    "reason",
    "answer",
    "step",
    "first",
    "then",
    "because",
    "value",
    "number",
    "compute",
    "check",
    "result",
    "so",
    "thus",
    "water",
    "energy",
    "signal",
    "system",
    "pattern",
    "balance",
    "memory",
    "process",
    "example",
    "structure",
    "simple",
    "clear",
]


def run_side(script: str, args: list[str], cwd: Path | None = None) -> dict[str, Any]:
    """Run one side of a benchmark in a fresh process (so its peak RSS is its own) and return
    the JSON object it prints on its last line."""
    proc = subprocess.run(
        [sys.executable, script, *args], check=True, capture_output=True, text=True, cwd=cwd
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])
