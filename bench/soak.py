"""Kill-anywhere soak of the demo workflow: SIGKILL Snakemake at random moments, rerun, check nothing is lost.

    python bench/soak.py --rounds 20 [--seed 0] [--keep --dir /tmp/soak]

Prints one line per round and campaign on stderr, then the summary on stdout, ending with exactly
``soak: N rounds, L lost, D duplicated, R resent, faults=F kills=K stalls=S stall_detect_max_s=T``
(stalls injected; the longest time from a stall to its supervisor's restart). Exit status 1 if anything
was lost, duplicated, re-sent after completion, half-written, leaked or left running.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: tools/ is no package

from tools.soak import cli

if __name__ == "__main__":
    raise SystemExit(cli(sys.argv[1:]))
