"""Append-only per-shard request journal: one JSON line per finished sample.

A line is either a completed record ``{"kind": "record", ...record}`` or a terminal
failure ``{"kind": "failed", "id", "reason", "attempts", "error"}``. The journal is not a
Snakemake output: it survives a failed or killed job, and the next run skips every id in it.

Durability: ``append`` buffers an encoded line; ``flush`` writes the buffer and flushes it to
the OS (the client calls it once per event-loop tick), and fsyncs every ``fsync_every_records``
lines or ``fsync_every_s`` seconds. A kill can therefore tear at most the last line, which
``Journal.open`` truncates away before appending.

``finalize`` writes the shard outputs from the journal, atomically, each id exactly once (the
first line for an id wins; the client never writes two, so duplicates are impossible by
construction).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import orjson

from regen.io import atomic_open


@runtime_checkable
class JournalSink(Protocol):
    """Mirror of the journal somewhere else (e.g. S3 batches, in ``regen.storage``)."""

    def restore(self, local_path: Path) -> None:
        """Called before the journal is read; may merge remote batches into ``local_path``."""

    def on_append(self, line: bytes) -> None:
        """Called with every line appended (bytes, newline included)."""

    def flush(self) -> None:
        """Push whatever is pending."""

    def close(self) -> None:
        """Flush and release resources."""


class JournalError(ValueError):
    """A journal line that is not the torn last line could not be read."""


@dataclass(frozen=True, slots=True)
class FinalizeCounts:
    records: int
    failed: int
    duplicates_ignored: int


def _parse_line(path: Path, lineno: int, raw: bytes) -> dict[str, Any]:
    try:
        entry = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise JournalError(f"{path}: line {lineno}: not JSON ({exc})") from exc
    if not isinstance(entry, dict):
        raise JournalError(f"{path}: line {lineno}: not a JSON object")
    if entry.get("kind") not in ("record", "failed"):
        raise JournalError(f"{path}: line {lineno}: field 'kind': expected 'record' or 'failed'")
    if not isinstance(entry.get("id"), str):
        raise JournalError(f"{path}: line {lineno}: field 'id': expected a string")
    return entry


def _is_entry_like(raw: bytes) -> bool:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    return isinstance(obj, dict) and isinstance(obj.get("id"), str)


def complete_lines(data: bytes) -> tuple[list[tuple[int, bytes]], int]:
    """The journal's complete lines as ``(line number, line without its newline)`` (blank lines
    skipped), and the byte offset where they end.

    The one torn-line rule (every reader of a journal uses it): a kill can tear only the last line,
    so the bytes after the last newline are torn, and so is a final line that is not a JSON object
    with a string ``id`` (a complete-looking but unreadable write).
    """
    lines: list[tuple[int, bytes]] = []
    good_end = pos = lineno = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        lineno += 1
        if nl == -1:  # torn: no newline after the last line
            break
        raw = data[pos:nl]
        if raw.strip():
            last = not data[nl + 1 :].strip()
            if last and not _is_entry_like(raw):  # a complete-looking but unreadable final line: torn too
                break
            lines.append((lineno, raw))
        pos = nl + 1
        good_end = pos
    return lines, good_end


def scan_journal(path: Path, data: bytes) -> tuple[list[dict[str, Any]], int]:
    """Every complete entry of a journal's bytes (:func:`complete_lines`), and where they end; an
    unreadable line that is not the torn last one raises :class:`JournalError` naming file and line."""
    lines, good_end = complete_lines(data)
    return [_parse_line(path, lineno, raw) for lineno, raw in lines], good_end


def read_journal_entries(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The entries of a journal file, read-only ([] when it does not exist); a torn last line is left out."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return []
    return scan_journal(p, data)[0]


class Journal:
    """An open journal. Use ``Journal.open``; single writer (one generate job per shard)."""

    def __init__(
        self,
        path: Path,
        finished: set[str],
        n_records: int,
        n_failed: int,
        sync: JournalSink | None,
        fsync_every_records: int,
        fsync_every_s: float,
    ) -> None:
        self.path = path
        self.finished_ids = finished
        self.n_records = n_records
        self.n_failed = n_failed
        self._sync = sync
        self._fh = open(path, "ab")  # noqa: SIM115 - kept open for the journal's lifetime
        self._buf: list[bytes] = []
        self._fsync_every_records = fsync_every_records
        self._fsync_every_s = fsync_every_s
        self._unsynced = 0
        self._last_fsync = time.monotonic()

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        sync: JournalSink | None = None,
        *,
        fsync_every_records: int = 256,
        fsync_every_s: float = 5.0,
    ) -> Journal:
        """Open (creating) the journal; read the finished ids; cut a torn last line away."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        if sync is not None:
            sync.restore(p)
        finished: set[str] = set()
        n_records = n_failed = 0
        if p.exists():
            data = p.read_bytes()
            entries, good_end = scan_journal(p, data)
            for entry in entries:
                if entry["id"] not in finished:
                    finished.add(entry["id"])
                    if entry["kind"] == "record":
                        n_records += 1
                    else:
                        n_failed += 1
            if good_end < len(data):
                with open(p, "r+b") as fh:
                    fh.truncate(good_end)
                    fh.flush()
                    os.fsync(fh.fileno())
        return cls(p, finished, n_records, n_failed, sync, fsync_every_records, fsync_every_s)

    def __contains__(self, sample_id: str) -> bool:
        return sample_id in self.finished_ids

    def append(self, entry: dict[str, Any], *, flush: bool = True) -> None:
        """Add one finished sample (``entry["kind"]`` is ``record`` or ``failed``)."""
        line = orjson.dumps(entry) + b"\n"
        self.finished_ids.add(entry["id"])
        if entry["kind"] == "record":
            self.n_records += 1
        else:
            self.n_failed += 1
        self._buf.append(line)
        if self._sync is not None:
            self._sync.on_append(line)
        if flush:
            self.flush()

    def flush(self) -> None:
        """Write buffered lines and flush them to the OS; fsync by the configured policy."""
        if self._buf:
            self._fh.write(b"".join(self._buf))
            self._unsynced += len(self._buf)
            self._buf.clear()
            self._fh.flush()
        if self._unsynced and (
            self._unsynced >= self._fsync_every_records
            or time.monotonic() - self._last_fsync >= self._fsync_every_s
        ):
            self._fsync()

    def _fsync(self) -> None:
        os.fsync(self._fh.fileno())
        self._unsynced = 0
        self._last_fsync = time.monotonic()

    def close(self) -> None:
        """Flush, fsync, flush and close the sink. Idempotent."""
        if self._fh.closed:
            return
        self.flush()
        self._fsync()
        self._fh.close()
        if self._sync is not None:
            self._sync.flush()
            self._sync.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def finalize(
        self, records_out: str | os.PathLike[str], failed_out: str | os.PathLike[str]
    ) -> FinalizeCounts:
        """Write records and failures from the journal file, atomically, each id once."""
        if not self._fh.closed:
            self.flush()
            self._fsync()
        return finalize_journal(self.path, records_out, failed_out)


def finalize_journal(
    journal_path: str | os.PathLike[str],
    records_out: str | os.PathLike[str],
    failed_out: str | os.PathLike[str],
) -> FinalizeCounts:
    """Write ``records_out`` (records without ``kind``) and ``failed_out`` from a journal file."""
    path = Path(journal_path)
    seen: set[str] = set()
    n_rec = n_fail = dups = 0
    with (
        atomic_open(records_out, "wb") as rec_fh,
        atomic_open(failed_out, "wb") as fail_fh,
        open(path, "rb") as src,
    ):
        for lineno, raw in enumerate(src, start=1):
            if not raw.strip():
                continue
            if not raw.endswith(b"\n"):
                raise JournalError(
                    f"{path}: line {lineno}: torn line (open the journal with Journal.open first)"
                )
            entry = _parse_line(path, lineno, raw)
            sid = entry["id"]
            if sid in seen:
                dups += 1
                continue
            seen.add(sid)
            kind = entry.pop("kind")
            if kind == "record":
                rec_fh.write(orjson.dumps(entry) + b"\n")
                n_rec += 1
            else:
                fail = {k: entry.get(k) for k in ("id", "reason", "attempts", "error")}
                fail_fh.write(orjson.dumps(fail) + b"\n")
                n_fail += 1
    return FinalizeCounts(records=n_rec, failed=n_fail, duplicates_ignored=dups)
