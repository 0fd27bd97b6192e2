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

One writer per journal, always: ``Journal.open`` claims the journal first
(``regen.generate.journal_writer``), whatever Snakemake's own lock says.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import orjson

from regen.generate.journal_writer import JournalWriter
from regen.io import atomic_lines_writer, gc_paused
from regen.journal_lines import FAILED, RECORD, complete_lines
from regen.layout.beside import journal_index


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
    #: entries written under another fingerprint (changed settings or prompt) or for ids no longer sampled
    stale_ignored: int = 0


def _parse_line(path: Path, lineno: int, raw: bytes) -> dict[str, Any]:
    try:
        entry = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise JournalError(f"{path}: line {lineno}: not JSON ({exc})") from exc
    if not isinstance(entry, dict):
        raise JournalError(f"{path}: line {lineno}: not a JSON object")
    if entry.get("kind") not in (RECORD, FAILED):
        raise JournalError(f"{path}: line {lineno}: field 'kind': expected 'record' or 'failed'")
    if not isinstance(entry.get("id"), str):
        raise JournalError(f"{path}: line {lineno}: field 'id': expected a string")
    return entry


def scan_journal(path: Path, data: bytes) -> tuple[list[dict[str, Any]], int]:
    """Every complete entry of a journal's bytes (:func:`complete_lines`), and where they end; an
    unreadable line that is not the torn last one raises :class:`JournalError` naming file and line."""
    lines, good_end = complete_lines(data)
    with gc_paused():
        return [_parse_line(path, lineno, raw) for lineno, _, raw in lines], good_end


def read_journal_entries(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The entries of a journal file, read-only ([] when it does not exist); a torn last line is left out."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return []
    return scan_journal(p, data)[0]


# ----------------------------------------------------------------------------------- the index
# Beside each journal, ``{journal}.index`` holds one short JSON array per journal line: what resume and
# the dry-run preview need (id, kind, fingerprints), never the answer, so opening a journal costs the
# same at 64 or 8,192 tokens an answer. It is a cache of the journal: written after the journal's own
# line, checked against the journal on every read (its last entry must be the journal line it names),
# caught up from the journal lines it lacks, and rebuilt from the journal when it does not match.
#   ["record"|"failed", id, fingerprint, settings_fingerprint, start, end]   one journal line's head
#   ["settings", settings_fingerprint, settings]                             first sight of settings


@dataclass(frozen=True, slots=True)
class EntryHead:
    """What resume and the preview need of one journal entry: never its answer."""

    id: str
    kind: str
    fingerprint: str | None
    settings_fingerprint: str | None


@dataclass(slots=True)
class JournalHeads:
    """Every complete entry of a journal, by head, in journal order."""

    heads: list[EntryHead]
    #: settings fingerprint -> the settings first seen with it
    settings: dict[str, dict[str, Any]]
    #: byte offset where the journal's complete lines end (a torn tail after it)
    good_end: int
    #: index lines for the journal lines the index lacks (``Journal.open`` writes them)
    missing_index_lines: list[bytes]
    #: where the index's usable lines end; None when it is missing or does not match the journal, so
    #: ``missing_index_lines`` is the whole index anew
    index_end: int | None


def _head_of(entry: Mapping[str, Any]) -> EntryHead:
    fp, sfp = entry.get("fingerprint"), entry.get("settings_fingerprint")
    return EntryHead(
        entry["id"], entry["kind"], fp if isinstance(fp, str) else None, sfp if isinstance(sfp, str) else None
    )


def _index_lines(entry: Mapping[str, Any], start: int, end: int, settings_seen: set[str]) -> list[bytes]:
    """The index lines of one journal entry written at ``[start, end)``."""
    out: list[bytes] = []
    sfp = entry.get("settings_fingerprint")
    settings = entry.get("settings")
    if isinstance(sfp, str) and sfp not in settings_seen and isinstance(settings, dict | orjson.Fragment):
        settings_seen.add(sfp)
        out.append(orjson.dumps(["settings", sfp, settings]) + b"\n")
    head = [entry["kind"], entry["id"], entry.get("fingerprint"), sfp, start, end]
    out.append(orjson.dumps(head, option=orjson.OPT_APPEND_NEWLINE))
    return out


def _read_index(path: Path) -> tuple[list[list[Any]], int] | None:
    """The index's complete rows (a torn last line left out) and the byte length they take; None when
    it is missing or unreadable."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    end = data.rfind(b"\n") + 1
    try:
        rows = orjson.loads(b"[" + data[:end].rstrip(b"\n").replace(b"\n", b",") + b"]")
    except orjson.JSONDecodeError:
        lines = data[:end].splitlines()  # a torn but newline-ended last line: drop it, nothing else
        try:
            rows = orjson.loads(b"[" + b",".join(lines[:-1]) + b"]")
        except orjson.JSONDecodeError:
            return None
        end -= len(lines[-1]) + 1
    if not isinstance(rows, list) or not all(type(r) is list for r in rows):
        return None
    return rows, end


def _span_matches(fh: Any, row: list[Any]) -> bool:
    """Whether the journal line at the index row's ``[start, end)`` is the entry the row names."""
    start, end = row[4], row[5]
    if not (isinstance(start, int) and isinstance(end, int) and 0 <= start < end):
        return False
    fh.seek(start)
    raw = fh.read(end - start)
    if not raw.endswith(b"\n"):
        return False
    try:
        entry = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    return (
        isinstance(entry, dict) and [entry.get("kind"), entry.get("id"), entry.get("fingerprint")] == row[:3]
    )


def read_heads(path: str | os.PathLike[str]) -> JournalHeads:
    """Every complete entry of a journal by its head, from the index where it matches the journal and
    from the journal lines after it (empty when the journal does not exist). An unreadable journal line
    that is not the torn last one raises :class:`JournalError` naming file and line."""
    with gc_paused():
        return _read_heads(Path(path))


def _read_heads(p: Path) -> JournalHeads:
    if not p.exists():
        return JournalHeads([], {}, 0, [], None)
    index = _read_index(journal_index(p))
    heads: list[EntryHead] = []
    settings: dict[str, dict[str, Any]] = {}
    covered = 0
    index_end = None
    with open(p, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        rows = index[0] if index is not None else []
        first = next((r for r in rows if len(r) == 6), None)
        last = next((r for r in reversed(rows) if len(r) == 6), None)
        if index is not None and (
            last is None or (last[5] <= size and _span_matches(fh, first) and _span_matches(fh, last))
        ):
            index_end = index[1]
            heads = [EntryHead(r[1], r[0], r[2], r[3]) for r in rows if len(r) == 6]
            for row in rows:
                if len(row) == 3:
                    settings.setdefault(row[1], row[2])
            covered = last[5] if last is not None else 0
        fh.seek(covered)
        tail = fh.read()
    lines, tail_end = complete_lines(tail)
    missing: list[bytes] = []
    seen = set(settings)
    lines_before = len(heads)  # the journal lines the index covers (the writer writes no blank lines)
    for lineno, start, raw in lines:
        entry = _parse_line(p, lines_before + lineno, raw)
        heads.append(_head_of(entry))
        sfp = entry.get("settings_fingerprint")
        if isinstance(sfp, str) and isinstance(entry.get("settings"), dict):
            settings.setdefault(sfp, entry["settings"])
        missing.extend(_index_lines(entry, covered + start, covered + start + len(raw) + 1, seen))
    return JournalHeads(heads, settings, covered + tail_end, missing, index_end)


class Journal:
    """An open journal. Use ``Journal.open``; one writer (:class:`JournalWriter`), held until ``close``."""

    def __init__(
        self,
        path: Path,
        heads: JournalHeads,
        sync: JournalSink | None,
        fsync_every_records: int,
        fsync_every_s: float,
        writer: JournalWriter,
        owns_writer: bool,
    ) -> None:
        self.path = path
        self.writer = writer
        self._owns_writer = owns_writer
        self.finished_ids: set[str] = set()
        self._outcomes: dict[str, dict[str, str]] = {}
        #: fingerprint -> outcome, whatever id the entry was journaled under (a fingerprint names one
        #: completion of one sample: an id spelt otherwise since, as when variants were added, replays)
        self._by_fingerprint: dict[str, str] = {}
        self.n_records = self.n_failed = 0
        for head in heads.heads:
            self._note(head.id, head.kind, head.fingerprint)
        self._sync = sync
        self._fh = open(path, "ab")  # noqa: SIM115 - kept open for the journal's lifetime
        self._size = heads.good_end
        self._index_fh = open(journal_index(path), "ab")  # noqa: SIM115 - closed with the journal
        self._settings_indexed = set(heads.settings)
        self._buf: list[bytes] = []
        self._index_buf: list[bytes] = []
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
        writer: JournalWriter | None = None,
    ) -> Journal:
        """Claim the journal; open (creating) it; read the finished ids (from its index,
        :func:`read_heads`); cut a torn last line away; bring the index up to date.

        ``writer``: a claim the caller made and releases (a job keeps it until its outputs are
        written); None: one taken here (``JournalWriter.claim``, refused while another process writes
        the journal), released on ``close``."""
        p = Path(path)
        owns = writer is None
        if writer is None:
            writer = JournalWriter.claim(p, wait=False)
        elif not writer.held or writer.journal != p:
            raise ValueError(f"{p}: the writer claim given is for {writer.journal} or released")
        try:
            return cls._open(p, sync, fsync_every_records, fsync_every_s, writer, owns)
        except BaseException:
            if owns:
                writer.release()
            raise

    @classmethod
    def _open(
        cls,
        p: Path,
        sync: JournalSink | None,
        fsync_every_records: int,
        fsync_every_s: float,
        writer: JournalWriter,
        owns_writer: bool,
    ) -> Journal:
        if sync is not None:
            sync.restore(p)
        heads = read_heads(p)
        if p.exists() and heads.good_end < p.stat().st_size:
            _truncate(p, heads.good_end)
        ipath = journal_index(p)
        if heads.index_end is None:
            with atomic_lines_writer(ipath) as fh:
                fh.write(b"".join(heads.missing_index_lines))
        else:
            if heads.index_end < ipath.stat().st_size:
                _truncate(ipath, heads.index_end)
            if heads.missing_index_lines:
                with open(ipath, "ab") as fh:
                    fh.write(b"".join(heads.missing_index_lines))
        return cls(p, heads, sync, fsync_every_records, fsync_every_s, writer, owns_writer)

    def __contains__(self, sample_id: str) -> bool:
        return sample_id in self.finished_ids

    def outcome(self, sample_id: str, fingerprint: str) -> str | None:
        """``record``, ``failed`` or None: what the journal holds for this sample under this fingerprint."""
        return self._outcomes.get(sample_id, {}).get(fingerprint)

    def outcome_of(self, fingerprint: str) -> str | None:
        """``record``, ``failed`` or None: what the journal holds under this request fingerprint."""
        return self._by_fingerprint.get(fingerprint)

    def fingerprints(self, sample_id: str) -> dict[str, str]:
        """Every fingerprint the journal holds for this sample, with its outcome."""
        return dict(self._outcomes.get(sample_id, {}))

    def append(self, entry: dict[str, Any], *, flush: bool = True) -> None:
        """Add one finished sample (``entry["kind"]`` is ``record`` or ``failed``; a value may be an
        ``orjson.Fragment``, JSON serialized already)."""
        line = orjson.dumps(entry, option=orjson.OPT_APPEND_NEWLINE)  # no copy of a long line for its newline
        fingerprint = entry.get("fingerprint")
        self._note(entry["id"], entry["kind"], fingerprint if isinstance(fingerprint, str) else None)
        self._buf.append(line)
        end = self._size + len(line)
        self._index_buf.extend(_index_lines(entry, self._size, end, self._settings_indexed))
        self._size = end
        if self._sync is not None:
            self._sync.on_append(line)
        if flush:
            self.flush()

    def _note(self, sample_id: str, kind: str, fingerprint: str | None) -> None:
        if sample_id not in self.finished_ids:
            self.finished_ids.add(sample_id)
            if kind == RECORD:
                self.n_records += 1
            else:
                self.n_failed += 1
        if fingerprint is None:
            return  # written before fingerprints: never replayed
        by_fp = self._outcomes.setdefault(sample_id, {})
        if by_fp.get(fingerprint) != RECORD:
            by_fp[fingerprint] = kind
        if self._by_fingerprint.get(fingerprint) != RECORD:
            self._by_fingerprint[fingerprint] = kind

    def flush(self) -> None:
        """Write buffered lines and flush them to the OS (the journal first, then its index); fsync the
        journal by the configured policy (the index is rebuilt from the journal when it lags)."""
        if self._buf:
            self._fh.write(b"".join(self._buf))
            self._unsynced += len(self._buf)
            self._buf.clear()
            self._fh.flush()
            self._index_fh.write(b"".join(self._index_buf))
            self._index_buf.clear()
            self._index_fh.flush()
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
        try:
            self.flush()
            self._fsync()
            self._fh.close()
            self._index_fh.close()
            if self._sync is not None:
                self._sync.flush()
                self._sync.close()
        finally:
            if self._owns_writer:
                self.writer.release()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def finalize(
        self,
        records_out: str | os.PathLike[str],
        failed_out: str | os.PathLike[str],
        current: Mapping[str, str] | None = None,
        identities: Mapping[str, RecordIdentity] | None = None,
    ) -> FinalizeCounts:
        """Write records and failures from the journal file, atomically, each id once."""
        if not self._fh.closed:
            self.flush()
            self._fsync()
        return finalize_journal(self.path, records_out, failed_out, current, identities)


def _truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(size)
        fh.flush()
        os.fsync(fh.fileno())


#: a failure line's keys, in order
_FAILURE_KEYS = (
    "id",
    "sample_id",
    "variant",
    "k",
    "reason",
    "attempts",
    "error",
    "fingerprint",
    "settings_fingerprint",
)


@dataclass(frozen=True, slots=True)
class RecordIdentity:
    """Which completion a record id names: its prompt's sample id, its variant, its index among the
    variant's ``n`` (``regen.records.GenerationRecord``)."""

    sample_id: str
    variant: str
    k: int


def _failure_line(entry: Mapping[str, Any], history: list[dict[str, Any]]) -> dict[str, Any]:
    keys = _FAILURE_KEYS
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
    identities: Mapping[str, RecordIdentity] | None = None,
) -> FinalizeCounts:
    """Write ``records_out`` (records without ``kind``) and ``failed_out`` from a journal file.

    ``current`` maps every record id of the shard to its current fingerprint; entries under another
    fingerprint, or for ids not in it, are stale and left out. A record that follows failures of the
    same fingerprint carries them as ``history``; so does a failure that follows earlier ones.

    ``identities`` (every id of ``current``): what completion each id names. Then an entry is current by
    its fingerprint alone, and written under the id that fingerprint has now, with its ``sample_id``,
    ``variant`` and ``k``: an answer journaled under the sample id before the run had more variants, or
    before records named their variant, is the same completion and replays.
    """
    with gc_paused():
        return _finalize(Path(journal_path), records_out, failed_out, current, identities)


#: how every record line ``Journal.append`` writes begins: orjson's bytes of ``{"kind": "record", ...}``
_RECORD_LINE_HEAD = b'{"kind":"record",'


def _indexed_records(path: Path) -> dict[int, list[Any]]:
    """The journal index's record rows by the offset of the journal line they name (empty when the
    index is missing or unreadable)."""
    index = _read_index(journal_index(path))
    if index is None:
        return {}
    return {row[4]: row for row in index[0] if len(row) == 6 and row[0] == RECORD}


def _copied_record_head(raw: bytes, row: list[Any] | None, end: int) -> tuple[str, str] | None:
    """(id, fingerprint) of a record line whose bytes can go to the records file as they are: the
    index row names this line (its span, a string id and fingerprint) and the line's bytes agree with
    it (they begin with the kind and that id, and carry that fingerprint). None: parse the line."""
    if row is None or row[5] != end or not (raw.startswith(_RECORD_LINE_HEAD) and raw.endswith(b"}\n")):
        return None
    sid, fingerprint = row[1], row[2]
    if not (isinstance(sid, str) and isinstance(fingerprint, str)):
        return None
    if not raw.startswith(b'"id":' + orjson.dumps(sid) + b",", len(_RECORD_LINE_HEAD)):
        return None
    # rfind: the fingerprint is among the last fields (only the settings come after it)
    if raw.rfind(b',"fingerprint":' + orjson.dumps(fingerprint) + b',"settings_fingerprint":') == -1:
        return None
    return sid, fingerprint


def _with_identity(entry: dict[str, Any], rid: str, who: RecordIdentity | None) -> dict[str, Any]:
    """``entry`` under record id ``rid``, naming the completion ``who`` (None: as journaled), the
    identity right after the id as a record line has it."""
    if who is None:
        return entry
    head = {"kind": entry.pop("kind"), "id": rid}
    head.update(sample_id=who.sample_id, variant=who.variant, k=who.k)
    for key in ("id", "sample_id", "variant", "k"):
        entry.pop(key, None)
    return {**head, **entry}


def _has_identity(raw: bytes, sid: str) -> bool:
    """Whether a record line copied as it is already names its completion (written since variants)."""
    return raw.startswith(b'"sample_id":', len(_RECORD_LINE_HEAD) + len(orjson.dumps(sid)) + 6)


def _record_line(entry: dict[str, Any], earlier: list[dict[str, Any]] | None) -> bytes:
    """The records-file line of a parsed journal record: the record less its ``kind``, the failures of
    the same fingerprint before it as its ``history``."""
    entry.pop("kind")
    if earlier:
        entry["history"] = [_history_item(e) for e in earlier]
    return orjson.dumps(entry, option=orjson.OPT_APPEND_NEWLINE)


def _finalize(
    path: Path,
    records_out: str | os.PathLike[str],
    failed_out: str | os.PathLike[str],
    current: Mapping[str, str] | None,
    identities: Mapping[str, RecordIdentity] | None = None,
) -> FinalizeCounts:
    written: set[str] = set()
    # with identities, an entry is current by its fingerprint, written under the id it has now
    by_fingerprint = {fp: rid for rid, fp in current.items()} if identities is not None and current else {}
    failures: dict[str, list[dict[str, Any]]] = {}
    n_rec = dups = stale = 0
    # speed: a record line that needs no history is copied less its kind instead of parsed and dumped
    # again (the same bytes: orjson dumps what it parsed from its own output as it was); its id and
    # fingerprint come from the index, which ``Journal.open`` keeps matching the journal
    indexed = _indexed_records(path)
    end = 0
    with (
        atomic_lines_writer(records_out) as rec_fh,
        atomic_lines_writer(failed_out) as fail_fh,
        open(path, "rb") as src,
    ):
        for lineno, raw in enumerate(src, start=1):
            start = end
            end += len(raw)
            if raw.isspace():  # blank (a line from the file is never empty)
                continue
            if not raw.endswith(b"\n"):
                raise JournalError(
                    f"{path}: line {lineno}: torn line (open the journal with Journal.open first)"
                )
            head = _copied_record_head(raw, indexed.get(start), end)
            if head is None:
                entry: dict[str, Any] | None = _parse_line(path, lineno, raw)
                sid, kind, fingerprint = entry["id"], entry["kind"], entry.get("fingerprint")
            else:
                entry, kind = None, RECORD
                sid, fingerprint = head
            who = None
            if identities is not None:
                rid = by_fingerprint.get(fingerprint) if isinstance(fingerprint, str) else None
                if rid is None:
                    stale += 1
                    continue
                if rid != sid or entry is not None or not _has_identity(raw, sid):
                    who = identities[rid]
                sid = rid
            elif current is not None and (sid not in current or fingerprint != current[sid]):
                stale += 1
                continue
            if sid in written:
                dups += 1
                continue
            if kind == RECORD:
                earlier = failures.pop(sid, None)
                if entry is None and not earlier and who is None:
                    rec_fh.write(b"{")
                    rec_fh.write(memoryview(raw)[len(_RECORD_LINE_HEAD) :])  # no copy of a long line
                else:
                    parsed = entry or _parse_line(path, lineno, raw)
                    rec_fh.write(_record_line(_with_identity(parsed, sid, who), earlier))
                written.add(sid)
                n_rec += 1
                continue
            assert entry is not None  # only record lines are copied
            entry = _with_identity(entry, sid, who)
            if current is None:  # before fingerprints: the first line per id wins
                fail_fh.write(orjson.dumps(_failure_line(entry, [])) + b"\n")
                written.add(sid)
            else:
                failures.setdefault(sid, []).append(entry)
        for earlier in failures.values():
            *history, last = earlier
            fail_fh.write(orjson.dumps(_failure_line(last, [_history_item(e) for e in history])) + b"\n")
    n_fail = len(failures) if current is not None else len(written) - n_rec
    return FinalizeCounts(records=n_rec, failed=n_fail, duplicates_ignored=dups, stale_ignored=stale)
