"""Kill anywhere: SIGKILL the whole Snakemake process group during generate/validate/merge, rerun,
and check that nothing is lost, duplicated, half-written, re-sent after completion, leaked or left
running (``tests/support/soak.py``). Slow (about a minute on 2 cores) but part of the default run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import zstandard
from support.soak import (
    Campaign,
    SoakOptions,
    count_resent,
    incomplete_outputs,
    journaled_ids,
    phase_started,
    processes_in,
    run_soak,
)

pytestmark = pytest.mark.slow


def test_kill_anywhere_loses_nothing(tmp_path: Path) -> None:
    messages: list[str] = []
    result = run_soak(SoakOptions(rounds=3, seed=3, base_dir=tmp_path, keep=True), say=messages.append)
    detail = "\n".join(messages + result.problems)
    assert result.rounds >= 3 and result.kills >= 3, detail
    assert result.lost == 0 and result.duplicated == 0 and result.resent == 0, detail
    assert result.problems == [], detail
    assert result.faults > 0, "server faults (5xx, crashes) must have been injected"
    assert result.stalls > 0 and result.stall_detect_max_s is not None, "stalls injected and caught"
    assert result.stall_detect_max_s <= SoakOptions().stall_timeout_s + 0.5 + 1.0, detail
    for c in result.campaigns:
        assert c.input_count >= 250, "the demo dataset was reconciled id by id"
        table = orjson.loads(Path(c.directory, "results", "reconcile.json").read_bytes())
        assert table["ok"] and table["input"] == c.input_count
        assert processes_in(Path(c.directory)) == []
    assert result.line().startswith(f"soak: {result.rounds} rounds, 0 lost, 0 duplicated, 0 resent")


# ------------------------------------------------------------------ the checks can see what they claim


def test_checks_detect_half_written_files_resends_and_lost_ids(tmp_path: Path) -> None:
    results = tmp_path / "results"
    (results / "generations").mkdir(parents=True)
    (results / "generations" / "00000.jsonl.zst").write_bytes(
        zstandard.compress(b'{"id": "a"}\n{"id": "b"\n')[:-6]
    )
    (results / "generations" / ".00000.jsonl.x.tmp").write_bytes(b"partial")  # hidden temp: ignored
    (results / "valid").mkdir()
    (results / "valid" / "00000.parquet").write_bytes(b"PAR1 not really")
    bad = incomplete_outputs(results)
    assert len(bad) == 2 and all(name.startswith(("generations/00000.jsonl.zst", "valid/")) for name in bad)

    journal_dir = tmp_path / "work" / "journal"
    journal_dir.mkdir(parents=True)
    (journal_dir / "00000.jsonl").write_bytes(b'{"kind": "record", "id": "a"}\n{"kind": "rec')
    assert journaled_ids(journal_dir) == {"a"}, "a torn last line is not finished"
    log = tmp_path / "requests.jsonl"
    log.write_bytes(b'{"event": "received", "id": "a"}\n')
    offset = log.stat().st_size
    with open(log, "ab") as fh:
        fh.write(b'{"event": "received", "id": "a"}\n{"event": "received", "id": "b"}\n')
    assert count_resent(log, offset, {"a"}) == 1

    out = tmp_path / "snakemake.txt"
    out.write_text("localrule audit:\nrule generate:\n")
    assert phase_started(out, "generate") and not phase_started(out, "validate")
    out.write_text("localrule merge:\n")
    assert phase_started(out, "validate"), "a later phase counts: validation may already be done"


def test_a_killed_group_leaves_no_process_and_is_seen_by_the_scan(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
         "'import time; time.sleep(60)']); time.sleep(60)"],
        cwd=tmp_path, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while len(processes_in(tmp_path)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(processes_in(tmp_path)) == 2
    from support.soak import kill_group

    kill_group(proc)
    deadline = time.monotonic() + 5
    while processes_in(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_in(tmp_path) == []
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def test_campaign_copies_the_workflow_with_a_slow_faulty_server(tmp_path: Path) -> None:
    import random

    import yaml

    opts = SoakOptions(crash_after=40, error_rate=0.05, stall_after_tokens=900, stall_timeout_s=4)
    camp = Campaign(0, tmp_path / "c", opts, random.Random(0))
    for item in ("Snakefile", "rules", "scripts", "config/demo.yaml", "data/demo", "resources"):
        assert (camp.root / item).exists()
    over = yaml.safe_load((camp.root / "config" / "soak.yaml").read_text())
    faults = {"error_rate": 0.05, "crash_after": 40, "stall_after_tokens": 900, "seed": 7}
    assert over["server"]["simulated"]["faults"] == faults and over["server"]["stall_timeout_s"] == 4
    assert over["server"]["simulated"]["token_rate"] > 0
    assert camp.env["REGEN_SIM_REQUEST_LOG"] == str(camp.request_log)
