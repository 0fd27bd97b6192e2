"""The request journal: resume set, torn last line, finalize each id once and atomically."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from regen.generate.journal import (
    Journal,
    JournalError,
    JournalSink,
    finalize_journal,
    read_heads,
)
from regen.layout.beside import journal_index


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
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "00000.jsonl",
        "00000.jsonl.index",
        "00000.jsonl.lock",
        "out.jsonl",
    ]


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


# ------------------------------------------------------------------------ the index beside the journal


def test_index_holds_heads_and_reopen_reads_them_without_the_answers(tmp_path: Path) -> None:
    path = tmp_path / "00000.jsonl"
    settings = {"temperature": 0.6}
    with Journal.open(path) as j:
        for i in range(3):
            j.append(
                {
                    **rec(i, "x" * 1000),
                    "fingerprint": f"f{i}",
                    "settings_fingerprint": "S",
                    "settings": settings,
                }
            )
    index = [orjson.loads(x) for x in journal_index(path).read_bytes().splitlines()]
    assert index[0] == ["settings", "S", settings], "settings are indexed once, at first sight"
    assert [row[:4] for row in index[1:]] == [["record", f"s{i}", f"f{i}", "S"] for i in range(3)]
    assert max(len(orjson.dumps(row)) for row in index[1:]) < 100, "the index never holds the answer"
    heads = read_heads(path)
    assert [h.id for h in heads.heads] == ["s0", "s1", "s2"] and heads.settings == {"S": settings}
    with Journal.open(path) as j2:
        assert j2.outcome("s1", "f1") == "record" and j2.outcome("s1", "other") is None


def test_journal_lines_the_index_lacks_are_read_and_indexed(tmp_path: Path) -> None:
    """A kill between the journal's write and its index's: the journal's extra lines still count."""
    path = tmp_path / "00000.jsonl"
    with Journal.open(path) as j:
        j.append(rec(1))
    with open(path, "ab") as fh:
        fh.write(orjson.dumps(rec(2)) + b"\n" + orjson.dumps(rec(3))[:9])  # one whole line, one torn
    with Journal.open(path) as j:
        assert j.finished_ids == {"s1", "s2"}
        j.append(rec(4))
    assert [e["id"] for e in lines(path)] == ["s1", "s2", "s4"]
    assert [h.id for h in read_heads(path).heads] == ["s1", "s2", "s4"]
    assert len(journal_index(path).read_bytes().splitlines()) == 3, "the index caught up"


def test_torn_index_line_is_dropped_and_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "00000.jsonl"
    with Journal.open(path) as j:
        j.append(rec(1))
        j.append(rec(2))
    index = journal_index(path)
    index.write_bytes(index.read_bytes()[:-7])  # the last index line torn
    with Journal.open(path) as j:
        assert j.finished_ids == {"s1", "s2"}
    assert [orjson.loads(x)[1] for x in index.read_bytes().splitlines()] == ["s1", "s2"]


@pytest.mark.parametrize("how", ["replaced", "garbage", "shorter"])
def test_an_index_that_does_not_match_its_journal_is_rebuilt(tmp_path: Path, how: str) -> None:
    path = tmp_path / "00000.jsonl"
    with Journal.open(path) as j:
        for i in range(4):
            j.append(rec(i))
    index = journal_index(path)
    if how == "replaced":  # another journal under the same name (e.g. restored from elsewhere)
        path.write_bytes(b"".join(orjson.dumps(rec(i)) + b"\n" for i in (7, 8, 9, 10, 11)))
    elif how == "garbage":
        index.write_bytes(b"not json\n[1,2]\n")
    else:  # the journal lost lines the index names
        path.write_bytes(b"".join(orjson.dumps(rec(i)) + b"\n" for i in (0, 1)))
    want = {"replaced": {"s7", "s8", "s9", "s10", "s11"}, "garbage": {f"s{i}" for i in range(4)}}
    with Journal.open(path) as j:
        assert j.finished_ids == want.get(how, {"s0", "s1"})
    assert {h.id for h in read_heads(path).heads} == want.get(how, {"s0", "s1"})
    assert len(index.read_bytes().splitlines()) == len(lines(path))


# ------------------------------------------------------------------------ finalize's bytes


def _reference_finalize(path: Path, current: dict[str, str] | None) -> tuple[bytes, bytes, tuple[int, ...]]:
    """Finalize by the journal's rules, every line parsed and dumped again: what the records and
    failures files must hold, byte for byte, and the counts (records, failed, duplicates, stale)."""
    recs, fails, written, failures = [], [], set(), {}
    dups = stale = 0

    def history(es: list[dict]) -> list[dict]:
        return [{k: e.get(k) for k in ("reason", "attempts", "error", "at")} for e in es]

    def failure(e: dict, hist: list[dict]) -> dict:
        keys = ("id", "reason", "attempts", "error", "fingerprint", "settings_fingerprint")
        out = {k: e.get(k) for k in keys if k in e or k in ("id", "reason", "attempts", "error")}
        return {**out, "history": hist} if hist else out

    for raw in path.read_bytes().splitlines():
        if not raw.strip():
            continue
        e = orjson.loads(raw)
        sid = e["id"]
        if current is not None and e.get("fingerprint") != current.get(sid, object()):
            stale += 1
        elif sid in written:
            dups += 1
        elif e.pop("kind") == "record":
            if earlier := failures.pop(sid, []):
                e["history"] = history(earlier)
            recs.append(e)
            written.add(sid)
        elif current is None:
            fails.append(failure(e, []))
            written.add(sid)
        else:
            failures.setdefault(sid, []).append(e)
    fails += [failure(es[-1], history(es[:-1])) for es in failures.values()]
    dump = lambda es: b"".join(orjson.dumps(e) + b"\n" for e in es)  # noqa: E731
    n_fail = len(failures) if current is not None else len(written) - len(recs)
    return dump(recs), dump(fails), (len(recs), n_fail, dups, stale)


def _answer(sid: str, fp: str, content: str) -> dict[str, object]:
    """A journal record shaped as the client writes it (floats, unicode, nested objects, token ids)."""
    return {
        "kind": "record", "id": sid, "shard": "00000",
        "messages": [{"role": "user", "content": "é \"quoted\"\n\u2028 \U0001f600"}],
        "reasoning_content": None, "content": content, "finish_reason": "stop", "truncated": False,
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "reasoning_tokens": None},
        "sampling": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 256}, "seed": 2**31 - 1,
        "timings": {"started_at": 1764589123.123456, "latency_s": 1e-07},
        "prompt_token_ids": [0, 1, 2**31 - 1], "completion_token_ids": [5, 6],
        "tool_calls": [{"function": {"name": "f", "arguments": {"fingerprint": fp, "x": -0.0}}}],
        "fingerprint": fp, "settings_fingerprint": "S",
        "settings": {"temperature": 0.6, "extra_body": {"fingerprint": "F-other"}, "nan": float("nan")},
    }  # fmt: skip


def _failed(sid: str, fp: str, reason: str, at: float) -> dict[str, object]:
    return {"kind": "failed", "id": sid, "reason": reason, "attempts": 2, "error": f"{reason}: x",
            "fingerprint": fp, "settings_fingerprint": "S", "at": at}  # fmt: skip


@pytest.mark.parametrize("index", ["as written", "missing", "rows lie", "pre-fingerprint"])
def test_finalize_writes_the_bytes_parsing_and_dumping_every_line_would(tmp_path: Path, index: str) -> None:
    """Finalize copies a record line's bytes instead of parsing it again: the records and failures
    files must be what parsing and dumping every line gives, with history, stale entries, duplicates,
    odd ids, a line of another writer, an index that lies about a line, and a journal of old."""
    path = tmp_path / "00000.jsonl"
    current = {sid: f"F{sid}" for sid in ("a", "b", "c", "d", "e", "g", "h")} | {'q"\n\u00e9': "Fq"}
    with Journal.open(path) as j:
        j.append(_answer("a", "Fa", "first"))
        j.append(_failed("b", "Fb", "server_error", 1.5))
        j.append(_failed("b", "Fb", "timeout", 2.5))
        j.append(_answer("b", "Fb", "after two failures"))  # history
        j.append(_answer("c", "Fc-old", "stale: older settings"))
        j.append(_answer("c", "Fc", "current"))
        j.append(_answer("a", "Fa", "duplicate"))
        j.append(_answer("gone", "Fx", "stale: no longer sampled"))
        j.append(_failed("d", "Fd", "server_error", 3.0))
        j.append(_failed("d", "Fd", "client_error: bad", 4.0))  # a failure with history
        j.append(_answer('q"\n\u00e9', "Fq", "an id JSON escapes"))
        j.append({"kind": "record", "id": "g", "content": "no fingerprint"})
    with open(path, "ab") as fh:  # other writers' spacing, then a blank line
        fh.write(b'{"kind": "record", "id": "e", "fingerprint": "Fe", "content": "spaced"}\n')
        fh.write(b'{"kind":"record","id":"h","fingerprint":"Fh","settings_fingerprint":"S"} \n\n')
    with Journal.open(path):
        pass  # the index catches up with the appended line
    ipath = journal_index(path)
    if index == "missing":
        ipath.unlink()
    elif index == "rows lie":  # spans right, heads wrong: the line's own bytes decide
        rows = [orjson.loads(x) for x in ipath.read_bytes().splitlines()]
        lied = [
            [r[0], r[1], "Fa", *r[3:]] if r[1] == "c" else [r[0], "a", *r[2:]] if r[1] == 'q"\n\u00e9' else r
            for r in rows
        ]
        ipath.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in lied))
    cur = None if index == "pre-fingerprint" else current
    counts = finalize_journal(path, tmp_path / "out.jsonl", tmp_path / "out.failed.jsonl", cur)
    records, failures, want_counts = _reference_finalize(path, cur)
    assert (tmp_path / "out.jsonl").read_bytes() == records
    assert (tmp_path / "out.failed.jsonl").read_bytes() == failures
    assert (counts.records, counts.failed, counts.duplicates_ignored, counts.stale_ignored) == want_counts
    if cur is not None:
        assert want_counts == (6, 1, 1, 3)
        assert b'"history":[{"reason":"server_error"' in records
