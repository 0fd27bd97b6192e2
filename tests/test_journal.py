"""The request journal: resume set, torn last line, finalize each id once and atomically."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from regen.journal import Journal, JournalError, JournalSink, finalize_journal


def rec(i: int, content: str = "x") -> dict[str, object]:
    return {"kind": "record", "id": f"s{i}", "content": content}


def lines(path: Path) -> list[dict[str, object]]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines()]


def test_reopen_returns_finished_ids(tmp_path: Path) -> None:
    path = tmp_path / "j" / "00000.jsonl"
    with Journal.open(path) as j:
        j.append(rec(1))
        j.append({"kind": "failed", "id": "s2", "reason": "truncated", "attempts": 1, "error": "e"})
    j2 = Journal.open(path)
    assert j2.finished_ids == {"s1", "s2"} and (j2.n_records, j2.n_failed) == (1, 1)
    j2.close()


def test_torn_last_line_is_cut_before_appending(tmp_path: Path) -> None:
    path = tmp_path / "00000.jsonl"
    path.write_bytes(orjson.dumps(rec(1)) + b"\n" + orjson.dumps(rec(2))[:15])
    with Journal.open(path) as j:
        assert j.finished_ids == {"s1"}
        j.append(rec(3))
    assert [e["id"] for e in lines(path)] == ["s1", "s3"]


def test_unreadable_complete_last_line_counts_as_torn(tmp_path: Path) -> None:
    path = tmp_path / "00000.jsonl"
    path.write_bytes(orjson.dumps(rec(1)) + b"\n" + b'{"kind": "rec\n')
    with Journal.open(path) as j:
        assert j.finished_ids == {"s1"}
    assert len(lines(path)) == 1


def test_corrupt_middle_line_is_an_error_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "00000.jsonl"
    path.write_bytes(orjson.dumps(rec(1)) + b"\nnot json\n" + orjson.dumps(rec(2)) + b"\n")
    with pytest.raises(JournalError, match=r"00000.jsonl: line 2"):
        Journal.open(path)


def test_finalize_writes_each_id_once_first_wins(tmp_path: Path) -> None:
    path = tmp_path / "00000.jsonl"
    entries = [
        rec(1, "first"),
        rec(2),
        rec(1, "second"),
        {"kind": "failed", "id": "s3", "reason": "client_error: bad", "attempts": 1, "error": "HTTP 400"},
        {"kind": "failed", "id": "s2", "reason": "late", "attempts": 2, "error": "x"},
    ]
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in entries))
    with Journal.open(path) as j:
        counts = j.finalize(tmp_path / "out.jsonl", tmp_path / "out.failed.jsonl")
    assert (counts.records, counts.failed, counts.duplicates_ignored) == (2, 1, 2)
    assert lines(tmp_path / "out.jsonl") == [{"id": "s1", "content": "first"}, {"id": "s2", "content": "x"}]
    assert lines(tmp_path / "out.failed.jsonl") == [
        {"id": "s3", "reason": "client_error: bad", "attempts": 1, "error": "HTTP 400"}
    ]


def test_finalize_is_atomic_on_error(tmp_path: Path) -> None:
    path = tmp_path / "00000.jsonl"
    out = tmp_path / "out.jsonl"
    out.write_text("previous\n")
    with Journal.open(path) as j:
        j.append(rec(1))
    with open(path, "ab") as fh:  # a line without an id, then a good one
        fh.write(b'{"kind": "record"}\n' + orjson.dumps(rec(2)) + b"\n")
    with pytest.raises(JournalError, match="line 2: field 'id'"):
        finalize_journal(path, out, tmp_path / "out.failed.jsonl")
    assert out.read_text() == "previous\n"
    assert not (tmp_path / "out.failed.jsonl").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00000.jsonl", "out.jsonl"]


def test_buffered_appends_reach_disk_on_flush(tmp_path: Path) -> None:
    path = tmp_path / "00000.jsonl"
    j = Journal.open(path, fsync_every_records=2)
    j.append(rec(1), flush=False)
    j.append(rec(2), flush=False)
    assert path.read_bytes() == b""
    j.flush()
    assert [e["id"] for e in lines(path)] == ["s1", "s2"]
    j.close()


class DirSink:
    """A JournalSink that mirrors lines into another file (stands in for the S3 sink)."""

    def __init__(self, remote: Path) -> None:
        self.remote = remote
        self.pending: list[bytes] = []
        self.closed = False

    def restore(self, local_path: Path) -> None:
        if self.remote.exists() and not local_path.exists():
            local_path.write_bytes(self.remote.read_bytes())

    def on_append(self, line: bytes) -> None:
        self.pending.append(line)

    def flush(self) -> None:
        with open(self.remote, "ab") as fh:
            fh.write(b"".join(self.pending))
        self.pending.clear()

    def close(self) -> None:
        self.closed = True


def test_sink_restores_and_mirrors(tmp_path: Path) -> None:
    remote = tmp_path / "remote.jsonl"
    sink = DirSink(remote)
    assert isinstance(sink, JournalSink)
    with Journal.open(tmp_path / "a" / "00000.jsonl", sink) as j:
        j.append(rec(1))
        j.append(rec(2))
    assert sink.closed and [e["id"] for e in lines(remote)] == ["s1", "s2"]
    # a new machine: the local journal is gone, the sink restores it
    j2 = Journal.open(tmp_path / "b" / "00000.jsonl", DirSink(remote))
    assert j2.finished_ids == {"s1", "s2"}
    j2.close()
