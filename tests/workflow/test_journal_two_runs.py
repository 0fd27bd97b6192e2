"""Two workflows on one directory at once, as README step 10 once invited: the first run generating,
``snakemake --unlock``, a second run of the same command. Each shard journal has one writer: the second
run's generate jobs wait for the first's, then replay, and no request is generated twice."""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest
import yaml
from support.workflow import SNAKEMAKE, copy_workflow, free_port_base

from regen.generate.journal import read_journal_entries
from regen.layout.run import RunLayout
from regen.simulated.options import REQUEST_LOG_ENV

pytestmark = pytest.mark.slow

CONFIG = ("--configfile", "config/demo.yaml", "config/slow.yaml")


def start(wd: Path, env: dict[str, str], name: str) -> subprocess.Popen[bytes]:
    out = open(wd / f"{name}.txt", "wb")  # noqa: SIM115 - closed when the process is waited for
    return subprocess.Popen([SNAKEMAKE, "--cores", "2", *CONFIG], cwd=wd, env=env, stdout=out, stderr=out)


@pytest.mark.timeout(900)
def test_a_second_run_after_unlock_generates_nothing_twice(tmp_path: Path) -> None:
    wd = copy_workflow(tmp_path / "wf")
    layout = RunLayout.under(wd)
    # no faults (each id goes out once), and slow enough that the second run starts mid-generation even
    # when its Snakemake starts slowly on a loaded machine (at 120 tok/s the first run could finish first)
    slow = {
        "shards": {"count": 2},
        "server": {
            "port_base": free_port_base(),
            "simulated": {"token_rate": 40, "max_running_requests": 8, "faults": {"enabled": False}},
        },
    }
    (wd / "config" / "slow.yaml").write_text(yaml.safe_dump(slow))
    request_log = tmp_path / "requests.jsonl"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", REQUEST_LOG_ENV: str(request_log)}
    env.pop("CUDA_VISIBLE_DEVICES", None)

    first = start(wd, env, "first")
    deadline = time.monotonic() + 300
    while not any(read_journal_entries(j) for j in layout.journal_files()):
        assert first.poll() is None and time.monotonic() < deadline, (wd / "first.txt").read_text()[-3000:]
        time.sleep(0.2)
    unlock = subprocess.run([SNAKEMAKE, "--unlock", *CONFIG], cwd=wd, env=env, capture_output=True, text=True)
    assert unlock.returncode == 0, unlock.stderr
    second = start(wd, env, "second")
    # the two Snakemakes still delete and rewrite each other's outputs (a job's outputs are removed
    # before it starts), so either may fail a later job, as README step 10 says: the journals are what
    # must not be shared, and a generate job is what must not fail; the rerun after both ends completes
    runs = {"first": first.wait(600), "second": second.wait(600)}
    for name, rc in runs.items():
        out = (wd / f"{name}.txt").read_text()
        generate_failed = "Error in rule generate" in out or "Error in group gpu" in out
        assert rc == 0 or not generate_failed, f"{name}: {out[-3000:]}"
    again = start(wd, env, "again")
    assert again.wait(600) == 0, (wd / "again.txt").read_text()[-3000:]

    completed = Counter(
        ev["id"]
        for ev in map(orjson.loads, request_log.read_bytes().splitlines())
        if ev.get("event") == "completed" and ev.get("id")  # not the servers' readiness probes
    )
    twice = {i: n for i, n in completed.items() if n > 1}
    assert completed and not twice, f"generated more than once: {twice}"
    journaled = Counter(e["id"] for j in layout.journal_files() for e in read_journal_entries(j))
    assert set(journaled) == set(completed) and max(journaled.values()) == 1
    reconcile = orjson.loads(layout.reconcile.read_bytes())
    assert reconcile["ok"], reconcile
    second_out = (wd / "second.txt").read_text()
    assert "is being written by pid" in second_out, "the second run's jobs waited for the first's"
    assert f"pid {first.pid}" not in second_out, "the holder is the generate job, not Snakemake"
