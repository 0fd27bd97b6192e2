"""One writer per shard journal: a second process refuses (or waits) with a message naming the shard
and the holder's pid and host; the kernel drops the claim when its holder dies."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from regen.generate.journal import Journal
from regen.generate.journal_writer import JournalBusyError, JournalWriter
from regen.layout.beside import journal_lock

HOLD = """
import sys, time
from regen.generate.journal import Journal
j = Journal.open(sys.argv[1])
j.append({"kind": "record", "id": "a", "fingerprint": "f"})
print("held", flush=True)
time.sleep(float(sys.argv[2]))
j.close()
"""


def hold(journal: Path, seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(journal), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_is_refused_naming_shard_pid_and_host(tmp_path: Path) -> None:
    journal = tmp_path / "journal" / "00003.jsonl"
    holder = hold(journal, 30)
    try:
        with pytest.raises(JournalBusyError) as caught:
            Journal.open(journal)
        message = str(caught.value)
        assert "shard 00003" in message and f"pid {holder.pid}" in message
        assert f"host {socket.gethostname()}" in message and str(journal) in message
        assert journal.read_bytes().count(b"\n") == 1, "the refused writer wrote nothing"
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_holder_does_not_block_the_rerun(tmp_path: Path) -> None:
    journal = tmp_path / "00000.jsonl"
    holder = hold(journal, 60)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with Journal.open(journal) as j:  # no wait, no stale lock
        assert "a" in j
    assert journal_lock(journal).exists()


def test_a_waiting_writer_goes_on_when_the_holder_is_done(tmp_path: Path) -> None:
    journal = tmp_path / "00001.jsonl"
    holder = hold(journal, 1.5)
    said: list[str] = []
    t0 = time.monotonic()
    with JournalWriter.claim(journal, wait=True, on_wait=said.append, poll_s=0.05) as writer:
        assert time.monotonic() - t0 >= 0.5, "it waited for the holder"
        assert holder.wait(5) == 0
        assert len(said) == 1 and f"pid {holder.pid}" in said[0] and "waiting" in said[0]
        with Journal.open(journal, writer=writer) as j:  # the claim given: the holder's entry is there
            assert "a" in j
        with pytest.raises(JournalBusyError):
            Journal.open(journal)  # the claim is held until the job releases it
    with Journal.open(journal) as j:
        assert j.finished_ids == {"a"}


def test_one_process_cannot_open_a_journal_twice(tmp_path: Path) -> None:
    journal = tmp_path / "00002.jsonl"
    with Journal.open(journal), pytest.raises(JournalBusyError, match=f"pid {os.getpid()}"):
        Journal.open(journal)
    released = JournalWriter.claim(journal, wait=False)
    released.release()
    with pytest.raises(ValueError, match="released"):
        Journal.open(journal, writer=released)
