"""Storage faults: a full disk under the journal or the outputs.

The disk fills for real: a 64 KiB tmpfs when this process may mount one (root), and in every case
a per-process file size limit (``RLIMIT_FSIZE``, with SIGXFSZ ignored so writes fail with EFBIG) in
a child process. Expected: the job fails cleanly (raises, exits non-zero), the journal reads back
every record it acknowledged, a rerun with space finishes the shard with each id once, and a final
output is never left half-written (atomic rename).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from regen.generate.client import Endpoint, ShardJob, generate_shard
from regen.generate.journal import Journal, finalize_journal
from regen.runconfig import GenerateConfig
from regen.simulated.launcher import start_simulated_server
from regen.types import Message, Sample

N = 120

# One generate job in a child process: an in-thread simulated server, then generate_shard.
# argv: journal records failed fsize_limit(0 = none) n
JOB = textwrap.dedent(
    """
    import resource, signal, sys
    from regen.generate.client import Endpoint, ShardJob, generate_shard
    from regen.runconfig import GenerateConfig
    from regen.simulated.launcher import start_simulated_server
    from regen.types import Message, Sample
    journal, records, failed = sys.argv[1:4]
    limit, n = int(sys.argv[4]), int(sys.argv[5])
    samples = [Sample(id=f"d{i:04d}", messages=(Message("user", f"question {i} " * 20),)) for i in range(n)]
    url, stop = start_simulated_server(inline=True, mean_answer_tokens=60, mean_reasoning_tokens=60)
    if limit:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    cfg = {"concurrency": 4, "backoff_base_s": 0.001, "request_timeout_s": 10}
    try:
        generate_shard(ShardJob(samples, journal, records, failed, GenerateConfig.from_dict(cfg),
                                Endpoint(url, "gpu0"), "00000"))
    finally:
        import json, urllib.request
        stats = json.loads(urllib.request.urlopen(url + "/_sim/stats").read())
        print(f"RECEIVED={stats['received']}", file=sys.stderr)
        stop()
    """
)


def samples(n: int = N) -> list[Sample]:
    return [Sample(id=f"d{i:04d}", messages=(Message("user", f"question {i} " * 20),)) for i in range(n)]


def run_job(
    journal: Path, records: Path, failed: Path, limit: int = 0, n: int = N
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", JOB, str(journal), str(records), str(failed), str(limit), str(n)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def journal_lines(path: Path) -> list[bytes]:
    return [line for line in path.read_bytes().split(b"\n") if line]


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str = "64k") -> Iterator[Path]:
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", f"regen-test-{uuid.uuid4().hex[:8]}", str(where)],
        capture_output=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture(params=["tmpfs", "rlimit"])
def full_disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """(directory for the journal, file size limit for the child) that runs out of space mid-shard."""
    if request.param == "tmpfs":
        with small_tmpfs(tmp_path / "small") as d:
            yield d, 0
    else:
        d = tmp_path / "limited"
        d.mkdir()
        yield d, 48 * 1024


def test_full_disk_under_the_journal_fails_the_job_and_loses_no_acknowledged_record(
    full_disk: tuple[Path, int], tmp_path: Path
) -> None:
    small, limit = full_disk
    journal = small / "journal.jsonl"
    records, failed = tmp_path / "out" / "00000.jsonl", tmp_path / "out" / "00000.failed.jsonl"
    done = run_job(journal, records, failed, limit)
    assert done.returncode != 0, "a job whose journal cannot be written must fail"
    assert "No space left on device" in done.stderr or "File too large" in done.stderr, done.stderr[-2000:]
    assert not records.exists() and not failed.exists(), "a failed job writes no outputs"
    assert 0 < journal.stat().st_size <= 64 * 1024
    received = int(done.stderr.rsplit("RECEIVED=", 1)[1].split()[0])
    n_lines = len(journal_lines(journal))
    assert received <= n_lines + 2 * 4 + 1, "the job stops sending requests once the journal fails"
    # move the journal where there is space, as an operator would, and resume from it
    roomy = tmp_path / "roomy" / "journal.jsonl"
    roomy.parent.mkdir()
    roomy.write_bytes(journal.read_bytes())
    complete = [orjson.loads(x) for x in roomy.read_bytes().split(b"\n")[:-1] if x]
    with Journal.open(roomy) as j:  # a torn last line is cut; anything else wrong raises
        assert j.finished_ids == {e["id"] for e in complete}
        kept = len(j.finished_ids)
    assert kept > 5
    done = run_job(roomy, records, failed, 0)
    assert done.returncode == 0, done.stderr[-2000:]
    out = [orjson.loads(x) for x in records.read_bytes().splitlines()]
    assert sorted(r["id"] for r in out) == [s.id for s in samples()]
    assert failed.read_bytes() == b""
    first = {e["id"]: e for e in complete}
    for r in out:  # the records journaled before the disk filled are the ones kept, not redone
        if r["id"] in first:
            assert r["timings"] == first[r["id"]]["timings"]


def test_full_disk_under_the_outputs_leaves_no_half_written_file(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    records, failed = tmp_path / "out" / "00000.jsonl", tmp_path / "out" / "00000.failed.jsonl"
    # the journal fills without a limit, then finalize runs under a limit smaller than the records
    url, stop = start_simulated_server(inline=True, mean_answer_tokens=60, mean_reasoning_tokens=60)
    try:
        generate_shard(
            ShardJob(
                samples(40),
                journal,
                records,
                failed,
                GenerateConfig.from_dict({"concurrency": 4}),
                Endpoint(url, "g"),
                "00000",
            )
        )
    finally:
        stop()
    good = records.read_bytes()
    records.unlink()
    failed.unlink()
    limit = len(good) // 2
    script = textwrap.dedent(
        f"""
        import resource, signal
        from regen.generate.journal import finalize_journal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
        finalize_journal({str(journal)!r}, {str(records)!r}, {str(failed)!r})
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "File too large" in done.stderr, done.stderr[-2000:]
    assert not records.exists() and not failed.exists(), "no final file after a failed write"
    assert list(records.parent.iterdir()) == [], "temporary files are removed too"
    counts = finalize_journal(journal, records, failed)  # with space: complete, identical
    assert counts.records == 40 and records.read_bytes() == good


def test_full_tmpfs_under_the_outputs_keeps_the_previous_version(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    url, stop = start_simulated_server(inline=True, mean_answer_tokens=60, mean_reasoning_tokens=60)
    with small_tmpfs(tmp_path / "small") as small:
        records, failed = small / "00000.jsonl", small / "00000.failed.jsonl"
        records.write_bytes(b'{"id": "previous"}\n')
        try:
            with pytest.raises(OSError, match="No space left on device"):
                generate_shard(
                    ShardJob(
                        samples(150),
                        journal,
                        records,
                        failed,
                        GenerateConfig.from_dict({"concurrency": 8}),
                        Endpoint(url, "g"),
                        "00000",
                    )
                )
        finally:
            stop()
        assert records.read_bytes() == b'{"id": "previous"}\n', "the old file stays until a new one is whole"
        assert sorted(p.name for p in small.iterdir()) == ["00000.jsonl"]
    with Journal.open(journal) as j:
        assert len(j.finished_ids) == 150, "the journal (on a roomy disk) kept every record"


def test_torn_last_journal_line_is_tolerated_on_resume(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    records, failed = tmp_path / "00000.jsonl", tmp_path / "00000.failed.jsonl"
    url, stop = start_simulated_server(inline=True, mean_answer_tokens=20, mean_reasoning_tokens=20)
    try:
        generate_shard(
            ShardJob(
                samples(30),
                journal,
                records,
                failed,
                GenerateConfig.from_dict({"concurrency": 4}),
                Endpoint(url, "g"),
                "00000",
            )
        )
        lines = journal_lines(journal)
        # a write cut short by a full disk or a kill: the last line stops half-way
        journal.write_bytes(b"\n".join(lines[:-1]) + b"\n" + lines[-1][: len(lines[-1]) // 2])
        torn_id = json.loads(lines[-1])["id"]
        stats = generate_shard(
            ShardJob(
                samples(30),
                journal,
                records,
                failed,
                GenerateConfig.from_dict({"concurrency": 4}),
                Endpoint(url, "g"),
                "0",
            )
        )
    finally:
        stop()
    assert stats.skipped_resumed == 29 and stats.completed == 1
    out = [orjson.loads(x) for x in records.read_bytes().splitlines()]
    assert sorted(r["id"] for r in out) == [s.id for s in samples(30)]
    assert [orjson.loads(x)["id"] for x in journal_lines(journal)][-1] == torn_id
    assert all(x.startswith(b"{") and x.endswith(b"}") for x in journal_lines(journal))


# The disk fills mid-write, then space comes back (a file elsewhere is deleted): the journal must not
# keep a half line in the middle of the file.
TRANSIENT = textwrap.dedent(
    """
    import resource, signal, sys
    import orjson
    from regen.generate.journal import Journal
    path, limit = sys.argv[1], int(sys.argv[2])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    j = Journal.open(path)
    failures = 0
    for i in range(60):
        j.append({"kind": "record", "id": f"t{i:03d}", "pad": "x" * 300}, flush=False)
        try:
            j.flush()
        except OSError as exc:
            failures += 1
            print(f"flush failed: {exc}", file=sys.stderr)
            resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    j.close()
    print(failures)
    """
)


def test_journal_survives_a_transient_full_disk_without_a_torn_line_in_the_middle(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", TRANSIENT, str(journal), str(10 * 1024 + 100)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "1" and "File too large" in done.stderr
    with Journal.open(journal) as j:  # raises JournalError on a torn line in the middle
        assert j.finished_ids == {f"t{i:03d}" for i in range(60)}
    assert all(orjson.loads(x)["kind"] == "record" for x in journal_lines(journal))
