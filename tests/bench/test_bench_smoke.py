"""Every bench runs in CI (issue 48 item 5): its smoke command, as ``bench/README.md`` documents it, in a
fresh process from the repo root, must exit 0 and end with its one ``NAME: key=value ... ratio=...`` line
with a number for ``ratio``. A bench that breaks fails here instead of when someone needs its number.

The commands are read from the README's table, so the README and CI cannot drift apart."""

from __future__ import annotations

import math
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "bench" / "README.md"
#: a table row of bench/README.md: | `module` | `smoke command` | `full command` | ... |
ROW = re.compile(r"^\| `(?P<module>bench\.[\w.]+)` \| `(?P<smoke>[^`]+)` \|", re.M)
#: the last line: NAME: key=value ... with a ratio among the keys
LAST_LINE = re.compile(r"^\w+: (\S+=\S+ )*ratio=(?P<ratio>\S+)( \S+=\S+)*$")
#: CI's budget for one bench's smoke run on a 2-core machine (all of them: about 2 minutes)
SMOKE_TIMEOUT_S = 150


def smoke_commands() -> list[tuple[str, str]]:
    return [(m["module"], m["smoke"]) for m in ROW.finditer(README.read_text())]


def test_the_readme_lists_every_bench_module_with_a_smoke_command() -> None:
    listed = {module for module, _ in smoke_commands()}
    mains = {
        "bench." + p.stem
        for p in (REPO / "bench").glob("*.py")
        if 'if __name__ == "__main__":' in p.read_text()
    }
    assert mains <= listed, f"bench/README.md has no smoke command for {sorted(mains - listed)}"


@pytest.mark.parametrize(("module", "command"), smoke_commands(), ids=[m for m, _ in smoke_commands()])
def test_smoke(module: str, command: str) -> None:
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", module], f"{module}: the smoke command runs another module: {command}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, *argv[1:]],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=SMOKE_TIMEOUT_S,
    )
    took = time.monotonic() - t0
    out = proc.stdout.strip().splitlines()
    tail = "\n".join(out[-15:]) + "\n--- stderr ---\n" + proc.stderr[-3000:]
    assert proc.returncode == 0, f"{command}: exit {proc.returncode} after {took:.0f} s\n{tail}"
    assert out, f"{command}: printed nothing\n{tail}"
    last = LAST_LINE.match(out[-1])
    assert last, f"{command}: last line is not `NAME: key=value ... ratio=...`: {out[-1]!r}\n{tail}"
    try:
        ratio = float(last["ratio"])
    except ValueError:
        ratio = math.nan
    assert math.isfinite(ratio), f"{command}: ratio is no number: {out[-1]!r}\n{tail}"
    print(f"{module}: {took:.1f} s: {out[-1]}")
