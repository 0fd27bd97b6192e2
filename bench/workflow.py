"""The workflow as a bench runs it: a copy of the checkout's workflow in a fresh directory, free loopback
ports for its servers, one-turn chat datasets. (``--smoke`` and the last line: ``bench.harness``.)

Benches import this instead of reaching into ``tests/`` (issue 51); the soak harness
(``tests/support/soak.py``) imports it too (tests may depend on bench, never the reverse).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parent.parent
#: the project venv's Snakemake (the one that runs the benches)
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
#: what a run needs of the checkout (not results, work, logs or .snakemake)
WORKFLOW_ITEMS: tuple[str, ...] = (
    "Snakefile",
    "rules",
    "scripts",
    "schemas",
    "report",
    "envs",
    "config",
    "resources",
    "data/demo",
)


def copy_workflow(source: Path, dest: Path) -> None:
    """Copy the workflow's files from ``source`` (a checkout) into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for item in WORKFLOW_ITEMS:
        src = source / item
        if not src.exists():
            raise FileNotFoundError(f"bench: {src} is missing (the workflow is incomplete)")
        target = dest / item
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, target)


def write_chats(path: Path, rows: Iterable[tuple[str, str, str]]) -> None:
    """One-turn chats, one JSON line each, from ``(id, the user's question, the old answer)`` rows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        for id_, question, answer in rows:
            messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
            fh.write(orjson.dumps({"id": id_, "messages": messages}) + b"\n")


def free_port_base(n: int, rng: random.Random | None = None) -> int:
    """A port base with ``n`` free consecutive loopback ports."""
    from regen.serving.ports import port_is_free

    rng = rng or random.Random()
    for _ in range(500):
        base = rng.randint(20000, 60000)
        if all(port_is_free("127.0.0.1", base + i) for i in range(n)):
            return base
    raise RuntimeError("bench: no free port range on 127.0.0.1")


def run_snakemake(
    wd: Path, argv: Sequence[str], env: Mapping[str, str], timeout_s: float | None = None
) -> tuple[float, subprocess.CompletedProcess[str]]:
    """The venv's Snakemake with ``argv`` in the workflow copy ``wd``, its output captured: (its wall
    seconds, the finished process)."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [SNAKEMAKE, *argv], cwd=wd, env=dict(env), capture_output=True, text=True, timeout=timeout_s
    )
    return time.perf_counter() - t0, proc


def python_path() -> str:
    """``$PYTHONPATH`` with the checkout first: a bench's own process run from a workflow copy imports it."""
    return os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
