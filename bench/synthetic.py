"""Shared pieces of the benchmarks: synthetic vocabulary and running one side in its own process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

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


def run_side(module: str, args: list[str]) -> dict[str, Any]:
    """Run one side of a benchmark as ``python -m module`` from the repo root, in a fresh process (so its
    peak RSS is its own), and return the JSON object it prints on its last line."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], check=True, capture_output=True, text=True, cwd=REPO
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])
