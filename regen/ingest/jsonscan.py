"""JSON and JSON Lines readers: records one at a time, as ``(row, dict | BadRow)``; a JSON array is read
by an incremental scanner that holds one record at a time."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from regen.ingest.rawfile import FILE_FIELD, STREAM_ERRORS, UTF8_BOM, OpenInput, empty_file, open_input
from regen.ingest.rows import ROW_FIELD, row_format
from regen.types import BadRow

log = logging.getLogger(__name__)


JSON_CONTAINER_KEYS: tuple[str, ...] = ("data", "rows")


JSON_CHUNK_BYTES = 1 << 20


_LINE_END = frozenset(b"\r\n")


def _blank(piece: bytes | memoryview) -> bool:
    """True for an empty or all-whitespace line (copies only a line that starts with whitespace)."""
    return not piece or (bytes(piece[:1]).isspace() and not bytes(piece).strip())


def parse_json_bytes(raw: bytes | memoryview, file: str, row: int, id_column: str | None = None) -> Any:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        try:
            bytes(raw).decode("utf-8")
        except UnicodeDecodeError as uexc:
            return BadRow(file, row, ROW_FIELD, f"invalid UTF-8 at byte {uexc.start}")
        return BadRow(file, row, ROW_FIELD, f"malformed JSON: {exc}")
    if id_column and isinstance(value, dict) and isinstance(value.get(id_column), float):
        # orjson reads integers wider than 64 bits as floats; the standard parser keeps every digit
        exact = json.loads(bytes(raw))
        if isinstance(exact, dict):
            value[id_column] = exact.get(id_column)
    return value


def _split_cr(body: bytes) -> list[bytes]:
    """One physical line that still holds CRs: old-Mac line ends (split) or CR as JSON whitespace (kept)."""
    try:
        orjson.loads(body)
        return [body]
    except orjson.JSONDecodeError:
        return body.split(b"\r")


def _first_byte(path: Path) -> int | None:
    """The first non-whitespace byte of the (decompressed) file, None when there is none."""
    with open_input(path) as src:
        while chunk := src.stream.read(1 << 16):
            stripped = chunk.lstrip(UTF8_BOM).lstrip() if chunk.startswith(UTF8_BOM) else chunk.lstrip()
            if stripped:
                return stripped[0]
    return None


def iter_jsonl(path: Path, id_column: str | None) -> Iterator[tuple[int, Any]]:
    file = str(path)
    try:
        first = _first_byte(path)
    except STREAM_ERRORS:
        first = None  # the line reader below reports it with the amounts
    if first == ord("["):
        log.warning("%s: holds one JSON array, not JSON Lines: reading it as a JSON array", file)
        yield from iter_json(path, id_column, note=" (the .jsonl file holds a JSON array)")
        return
    seen_any = False
    row = -1
    with open_input(path) as src:
        try:
            for line in src.stream:
                src.read_bytes += len(line)
                if row < 0 and line.startswith(UTF8_BOM):
                    line = line[len(UTF8_BOM) :]
                end = len(line)
                while end and line[end - 1] in _LINE_END:
                    end -= 1
                if line.find(b"\r", 0, end) >= 0:
                    pieces: list[bytes] | tuple[memoryview] = _split_cr(line[:end])
                else:  # a view, not a copy: one huge line is held once
                    pieces = (memoryview(line)[:end],)
                unterminated = end == len(line)  # only the file's last line can lack its line end
                for k, piece in enumerate(pieces):
                    row += 1
                    if _blank(piece):
                        continue
                    seen_any = True
                    value = parse_json_bytes(piece, file, row, id_column)
                    if isinstance(value, BadRow) and unterminated and k == len(pieces) - 1:
                        start = src.read_bytes - len(line) + (end - len(piece))
                        value = cut_last_line(value, start, src)
                    yield row, value
        except STREAM_ERRORS as exc:  # a truncated compressed stream, an I/O error
            problem = src.unread_problem(exc, row + 1)
            yield row + 1, BadRow(file, row + 1, FILE_FIELD, problem, unread_tail=True)
            return
    if not seen_any:
        yield empty_file(path)


def cut_last_line(bad: BadRow, start: int, src: OpenInput) -> BadRow:
    """The file's last line has no line end and is not JSON: a copy cut short mid-line, so lost input
    (the ``max_unread_tail_files`` gate), not one bad row."""
    where = f"byte {start:,}" if src.compression is None else f"byte {start:,} of the decompressed data"
    problem = (
        f"the file ends mid-line: its last line (from {where} to the end, {src.read_bytes - start:,} bytes) "
        f"has no line end and is not complete JSON, so the file looks cut short and the rest of that row "
        f"and of any rows after it is missing ({bad.problem})"
    )
    return BadRow(bad.file, bad.row, FILE_FIELD, problem, unread_tail=True)


class _ScanError(Exception):
    """The JSON structure is broken: no further record can be found. ``row`` is the first lost one."""

    def __init__(self, problem: str, row: int = 0) -> None:
        super().__init__(problem)
        self.problem = problem
        self.row = row


# a whole string, a string cut off by the end of the buffer, or a bracket
_JSON_TOKEN = re.compile(
    rb'(?P<string>"[^"\\]*(?:\\.[^"\\]*)*")|(?P<open_string>"[^"\\]*(?:\\.[^"\\]*)*\\?\Z)|[\[\]{}]', re.S
)


_SCALAR_END = re.compile(rb"[,\]}\s]")


_WHITESPACE = frozenset(b" \t\r\n")


class JsonScanner:
    """Reads a JSON document piecewise: whole values as raw bytes, one at a time."""

    def __init__(self, fh: IO[bytes], chunk_bytes: int | None = None) -> None:
        self._fh = fh
        self._chunk = chunk_bytes or JSON_CHUNK_BYTES
        self._buf = b""
        self.pos = 0
        self._eof = False
        self.consumed = 0  # bytes read from the file so far

    def _more(self, keep_from: int) -> int:
        """Read another chunk, dropping bytes before ``keep_from``; return how far positions moved."""
        if self._eof:
            return -1
        data = self._fh.read(self._chunk)
        self.consumed += len(data)
        if not data:
            self._eof = True
            return -1
        self._buf = self._buf[keep_from:] + data
        self.pos -= keep_from
        return keep_from

    def peek(self) -> int | None:
        """The next non-whitespace byte (not consumed), or None at the end of the file."""
        while True:
            buf, n = self._buf, len(self._buf)
            while self.pos < n and buf[self.pos] in _WHITESPACE:
                self.pos += 1
            if self.pos < n:
                return buf[self.pos]
            if self._more(self.pos) < 0:
                return None

    def skip_bom(self) -> None:
        """Skip a UTF-8 byte-order mark at the start of the file."""
        while len(self._buf) - self.pos < len(UTF8_BOM) and self._more(self.pos) >= 0:
            pass
        if self._buf.startswith(UTF8_BOM, self.pos):
            self.pos += len(UTF8_BOM)

    def take(self) -> None:
        self.pos += 1

    def value(self) -> bytes:
        """Consume one JSON value (after optional whitespace) and return its raw bytes.

        Only the structure is scanned (brackets, and strings as whole tokens); the caller
        parses the bytes, so a malformed record still has a known extent and the next one
        is found.
        """
        first = self.peek()
        if first is None:
            raise _ScanError("file ends where a value was expected")
        if first in b",]}:":
            raise _ScanError(f"expected a value, found {chr(first)!r}")
        start = self.pos
        end = self._scalar_end(start) if first not in b'[{"' else self._container_end(start)
        start = self.pos  # _more() may have moved the buffer under us
        self.pos = end
        return self._buf[start:end]

    def _scalar_end(self, start: int) -> int:
        while True:
            m = _SCALAR_END.search(self._buf, start)
            if m is not None:
                return m.start()
            if self._more(start) < 0:
                return len(self._buf)
            start = self.pos

    def _container_end(self, start: int) -> int:
        """End of the string, array or object starting at ``start`` (== self.pos)."""
        i, depth = start, 0
        while True:
            resume = len(self._buf)
            for m in _JSON_TOKEN.finditer(self._buf, i):
                kind = m.lastgroup
                if kind == "string":
                    if depth == 0:
                        return m.end()
                elif kind == "open_string":
                    resume = m.start()
                    break
                elif self._buf[m.start()] in b"[{":
                    depth += 1
                else:
                    depth -= 1
                    if depth == 0:
                        return m.end()
            shift = self._more(start)
            if shift < 0:
                raise _ScanError(
                    "file ends inside a string" if resume < len(self._buf) else "file ends inside a record"
                )
            start, i = start - shift, resume - shift


def iter_json(path: Path, id_column: str | None = None, note: str = "") -> Iterator[tuple[int, Any]]:
    file = str(path)
    with open_input(path) as src:
        scanner = JsonScanner(src.stream)
        rows = _RowCounter()
        try:
            scanner.skip_bom()
            first = scanner.peek()
            if first is None:
                yield empty_file(path)
                return
            if first == ord("["):
                scanner.take()
                for row, raw in _iter_array(scanner):
                    rows.next = row + 1
                    yield row, parse_json_bytes(raw, file, row, id_column)
                if scanner.peek() is not None:
                    raise _ScanError("more data after the array's closing ']'", rows.next)
                return
            if first != ord("{"):
                raise _ScanError(f"expected a JSON array or object, found {chr(first)!r}")
            for row, item in _iter_json_object(scanner, file, id_column):
                rows.next = row + 1
                yield row, item
        except _ScanError as exc:
            problem = f"{exc.problem}{note} (the records from here on are lost)"
            yield exc.row, BadRow(file, exc.row, FILE_FIELD, problem, unread_tail=True)
        except STREAM_ERRORS as exc:
            src.read_bytes = scanner.consumed
            problem = src.unread_problem(exc, rows.next) + note
            yield rows.next, BadRow(file, rows.next, FILE_FIELD, problem, unread_tail=True)


@dataclass(slots=True)
class _RowCounter:
    next: int = 0


def _iter_array(scanner: JsonScanner) -> Iterator[tuple[int, bytes]]:
    """Yield (index, raw value) for the elements of an array whose '[' was just consumed."""
    row = 0
    if scanner.peek() == ord("]"):
        scanner.take()
        return
    while True:
        try:
            raw = scanner.value()
        except _ScanError as exc:
            raise _ScanError(exc.problem, row) from None
        yield row, raw
        row += 1
        nxt = scanner.peek()
        if nxt == ord(","):
            scanner.take()
        elif nxt == ord("]"):
            scanner.take()
            return
        elif nxt is None:
            raise _ScanError(f"file ends after row {row - 1} without the closing ']'", row)
        else:
            raise _ScanError(f"expected ',' or ']' after row {row - 1}, found {chr(nxt)!r}", row)


def _iter_json_object(
    scanner: JsonScanner, file: str, id_column: str | None = None
) -> Iterator[tuple[int, Any]]:
    """A top-level object: stream its data/rows list; a lone row object is one record."""
    scanner.take()  # '{'
    skipped: dict[str, Any] = {}
    while True:
        nxt = scanner.peek()
        if nxt == ord("}"):
            scanner.take()
            break
        key = orjson.loads(scanner.value())
        if not isinstance(key, str) or scanner.peek() != ord(":"):
            raise _ScanError("malformed top-level object")
        scanner.take()
        if key in JSON_CONTAINER_KEYS and scanner.peek() == ord("["):
            scanner.take()
            for row, raw in _iter_array(scanner):
                yield row, parse_json_bytes(raw, file, row, id_column)
            return
        raw_value = scanner.value()
        skipped[key] = parse_json_bytes(raw_value, file, 0)
        nxt = scanner.peek()
        if nxt == ord(","):
            scanner.take()
        elif nxt != ord("}"):
            raise _ScanError("malformed top-level object")
    if scanner.peek() == ord("{"):
        raise _ScanError("several top-level objects: this looks like JSON Lines; name the file .jsonl")
    if row_format(skipped) is not None:
        yield 0, skipped  # a single record stored as a .json object
        return
    raise _ScanError(f"top-level object has no {' or '.join(JSON_CONTAINER_KEYS)} list of records")
