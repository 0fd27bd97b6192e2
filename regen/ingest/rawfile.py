"""Opening a dataset file: compression judged by content, and the account of how much of a file that
broke part-way was left unread."""

from __future__ import annotations

import bz2
import contextlib
import gzip
import lzma
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from regen.types import BadRow

FILE_FIELD = "<file>"


# a compression suffix after the container suffix (``.jsonl.gz``); the content decides in the end
COMPRESSION_SUFFIXES: dict[str, str] = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".zst": "zstd"}


COMPRESSION_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bz2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
)


UTF8_BOM = b"\xef\xbb\xbf"


def compression_of(path: str | Path) -> str | None:
    """The compression of ``path`` judged by its first bytes (gzip, bz2, xz, zstd); None if plain."""
    with open(path, "rb") as fh:
        head = fh.read(8)
    return next((kind for magic, kind in COMPRESSION_MAGIC if head.startswith(magic)), None)


def empty_file(path: Path) -> tuple[int, BadRow]:
    return 0, BadRow(str(path), 0, FILE_FIELD, "file is empty")


@dataclass(slots=True)
class OpenInput:
    """An open dataset file: ``stream`` yields its (decompressed) bytes, ``raw`` is the file itself."""

    stream: IO[bytes]
    raw: IO[bytes]
    compression: str | None
    size: int
    read_bytes: int = 0  # bytes taken from ``stream`` so far

    def unread_problem(self, exc: BaseException, rows_read: int) -> str:
        """How much of the file could not be read, for the unread-tail BadRow."""
        what = f"{type(exc).__name__}: {exc}"
        if self.compression is None:
            unread = max(0, self.size - self.read_bytes)
            return (
                f"file unreadable after {self.read_bytes:,} of {self.size:,} bytes ({unread:,} bytes, "
                f"every row after row {rows_read - 1}, unread): {what}"
            )
        with contextlib.suppress(OSError, ValueError):
            consumed = self.raw.tell()
            if consumed < self.size:
                return (
                    f"{self.compression} data unreadable after {consumed:,} of {self.size:,} compressed "
                    f"bytes ({self.size - consumed:,} unread; {self.read_bytes:,} bytes decompressed, rows 0-"
                    f"{rows_read - 1}): {what}"
                )
        return (
            f"the {self.compression} stream is cut off: all {self.size:,} compressed bytes gave only "
            f"{self.read_bytes:,} bytes (rows 0-{rows_read - 1}) before it ended early; the rest of the "
            f"original file is missing, its size unknown: {what}"
        )


@contextlib.contextmanager
def open_input(path: Path) -> Iterator[OpenInput]:
    """Open ``path``, decompressing by content (gzip, bz2, xz, zstd) whatever its name says."""
    compression = compression_of(path)
    with open(path, "rb") as raw:
        size = os.fstat(raw.fileno()).st_size
        if compression is None:
            yield OpenInput(raw, raw, None, size)
            return
        with _decompressing(raw, compression) as stream:
            yield OpenInput(stream, raw, compression, size)


def _decompressing(raw: IO[bytes], compression: str) -> IO[bytes]:
    if compression == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if compression == "bz2":
        return bz2.BZ2File(raw, mode="rb")
    if compression == "xz":
        return lzma.LZMAFile(raw, mode="rb")
    import pyarrow as pa

    return pa.CompressedInputStream(pa.PythonFile(raw, mode="r"), "zstd")  # type: ignore[return-value]


# what a failing decompressor or disk raises part-way through a file
STREAM_ERRORS: tuple[type[BaseException], ...] = (OSError, EOFError, ValueError, lzma.LZMAError, zlib.error)
