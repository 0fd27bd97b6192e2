"""Append-only per-shard request journal: one JSON line per finished sample.

A line is either a completed record ``{"kind": "record", ...record}`` or a terminal
failure ``{"kind": "failed", "id", "reason", "attempts", "error", "at"}``. Both carry the sample's
generation ``fingerprint`` and ``settings_fingerprint`` (``regen.fingerprint``). The journal is not a
Snakemake output: it survives a failed or killed job. The next run replays an entry only when its
fingerprint equals the sample's current one (``outcome``); an entry written under other settings or
for an edited prompt stays in the file but is ignored, and the sample is generated again. A failure
is retried on a rerun unless the run keeps failures; every failed line stays as attempt history.

Durability: ``append`` buffers an encoded line; ``flush`` writes the buffer and flushes it to
the OS (the client calls it once per event-loop tick), and fsyncs every ``fsync_every_records``
lines or ``fsync_every_s`` seconds. A kill can therefore tear at most the last line, which
``Journal.open`` truncates away before appending.

``finalize`` writes the shard outputs from the journal, atomically, each id exactly once: given the
current fingerprint of every sample (``current``), only entries with that fingerprint count; a record
wins over failures, the first record wins over later ones, and the last failure stands when there is no
record. The failures before it are its ``history``. Without ``current`` (a journal written before
fingerprints) the first line per id wins.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
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


RECORD = "record"
FAILED = "failed"


@dataclass(frozen=True, slots=True)
class FinalizeCounts:
    records: int
    failed: int
    duplicates_ignored: int
    #: entries written under another fingerprint (changed settings or prompt) or for ids no longer sampled
    stale_ignored: int = 0


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
        outcomes: dict[str, dict[str, str]],
        n_records: int,
        n_failed: int,
        sync: JournalSink | None,
        fsync_every_records: int,
        fsync_every_s: float,
    ) -> None:
        self.path = path
        self.finished_ids = finished
        self._outcomes = outcomes
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
        outcomes: dict[str, dict[str, str]] = {}
        n_records = n_failed = 0
        if p.exists():
            data = p.read_bytes()
            entries, good_end = scan_journal(p, data)
            for entry in entries:
                _note_outcome(outcomes, entry)
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
        return cls(p, finished, outcomes, n_records, n_failed, sync, fsync_every_records, fsync_every_s)

    def __contains__(self, sample_id: str) -> bool:
        return sample_id in self.finished_ids

    def outcome(self, sample_id: str, fingerprint: str) -> str | None:
        """``record``, ``failed`` or None: what the journal holds for this sample under this fingerprint."""
        return self._outcomes.get(sample_id, {}).get(fingerprint)

    def fingerprints(self, sample_id: str) -> dict[str, str]:
        """Every fingerprint the journal holds for this sample, with its outcome."""
        return dict(self._outcomes.get(sample_id, {}))

    def append(self, entry: dict[str, Any], *, flush: bool = True) -> None:
        """Add one finished sample (``entry["kind"]`` is ``record`` or ``failed``)."""
        line = orjson.dumps(entry) + b"\n"
        _note_outcome(self._outcomes, entry)
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
        self,
        records_out: str | os.PathLike[str],
        failed_out: str | os.PathLike[str],
        current: Mapping[str, str] | None = None,
    ) -> FinalizeCounts:
        """Write records and failures from the journal file, atomically, each id once."""
        if not self._fh.closed:
            self.flush()
            self._fsync()
        return finalize_journal(self.path, records_out, failed_out, current)


def _note_outcome(outcomes: dict[str, dict[str, str]], entry: Mapping[str, Any]) -> None:
    fingerprint = entry.get("fingerprint")
    if not isinstance(fingerprint, str):
        return  # written before fingerprints: never replayed
    by_fp = outcomes.setdefault(entry["id"], {})
    if by_fp.get(fingerprint) != RECORD:
        by_fp[fingerprint] = entry["kind"]


def _failure_line(entry: Mapping[str, Any], history: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("id", "reason", "attempts", "error", "fingerprint", "settings_fingerprint")
    fail = {k: entry.get(k) for k in keys if k in entry or k in ("id", "reason", "attempts", "error")}
    if history:
        fail["history"] = history
    return fail


def _history_item(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {k: entry.get(k) for k in ("reason", "attempts", "error", "at")}


def finalize_journal(
    journal_path: str | os.PathLike[str],
    records_out: str | os.PathLike[str],
    failed_out: str | os.PathLike[str],
    current: Mapping[str, str] | None = None,
) -> FinalizeCounts:
    """Write ``records_out`` (records without ``kind``) and ``failed_out`` from a journal file.

    ``current`` maps every sample id of the shard to its current fingerprint; entries under another
    fingerprint, or for ids not in it, are stale and left out. A record that follows failures of the
    same fingerprint carries them as ``history``; so does a failure that follows earlier ones.
    """
    path = Path(journal_path)
    written: set[str] = set()
    failures: dict[str, list[dict[str, Any]]] = {}
    n_rec = dups = stale = 0
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
            if current is not None and (sid not in current or entry.get("fingerprint") != current[sid]):
                stale += 1
                continue
            if sid in written:
                dups += 1
                continue
            kind = entry.pop("kind")
            if kind == RECORD:
                earlier = failures.pop(sid, [])
                if earlier:
                    entry["history"] = [_history_item(e) for e in earlier]
                rec_fh.write(orjson.dumps(entry) + b"\n")
                written.add(sid)
                n_rec += 1
            elif current is None:  # before fingerprints: the first line per id wins
                fail_fh.write(orjson.dumps(_failure_line(entry, [])) + b"\n")
                written.add(sid)
            else:
                failures.setdefault(sid, []).append(entry)
        for earlier in failures.values():
            *history, last = earlier
            fail_fh.write(orjson.dumps(_failure_line(last, [_history_item(e) for e in history])) + b"\n")
    n_fail = len(failures) if current is not None else len(written) - n_rec
    return FinalizeCounts(records=n_rec, failed=n_fail, duplicates_ignored=dups, stale_ignored=stale)
