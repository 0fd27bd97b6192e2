"""Atomic file output and small JSON helpers shared by every stage."""

from __future__ import annotations

import contextlib
import gc
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import orjson
import zstandard


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def shared_temp_dir(parent: str | os.PathLike[str], prefix: str, suffix: str = ".tmp") -> Path:
    """A fresh directory in ``parent`` readable as the umask allows (``mkdtemp`` makes it 0700)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=parent))
    os.chmod(path, 0o777 & ~_umask())
    return path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it over ``path`` only on success.

    A crash or exception leaves ``path`` untouched (absent or the previous version),
    so a half-written file is never taken as complete.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes 0600; outputs are shared files
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w") -> Iterator[IO[Any]]:
    """Open a temporary file for writing; it replaces ``path`` only if the block succeeds."""
    with atomic_path(path) as tmp, open(tmp, mode) as fh:
        yield fh


#: a stage's JSON-lines output that copies answers (generation records, quarantine) is zstd-compressed:
#: the journal already holds every answer once, and at thousands of tokens an answer, each plain copy
#: costs as much disk (and S3 sync) as the journal itself
COMPRESSED_SUFFIX = ".zst"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


@contextlib.contextmanager
def atomic_lines_writer(path: str | os.PathLike[str]) -> Iterator[IO[bytes]]:
    """A binary writer of a JSON-lines output that replaces ``path`` only if the block succeeds;
    zstd-compressed when ``path`` ends in ``.zst``."""
    with atomic_path(path) as tmp, open(tmp, "wb") as raw:
        if str(path).endswith(COMPRESSED_SUFFIX):
            with zstandard.ZstdCompressor(level=3).stream_writer(raw, closefd=False) as fh:
                yield fh  # type: ignore[misc]
        else:
            yield raw


@contextlib.contextmanager
def open_lines(path: str | os.PathLike[str]) -> Iterator[Iterator[bytes]]:
    """The lines of a JSON-lines file (newline kept), plain or zstd-compressed (told by content). A
    compressed file cut short raises ``ValueError`` naming it, at the end, instead of reading as less."""
    with open(path, "rb") as raw:
        compressed = raw.read(4) == _ZSTD_MAGIC
        raw.seek(0)
        yield _zstd_lines(raw, path) if compressed else iter(raw)


def _zstd_lines(raw: IO[bytes], path: str | os.PathLike[str]) -> Iterator[bytes]:
    stream = zstandard.ZstdDecompressor().decompressobj()
    pending: list[bytes] = []  # the pieces of a line that spans chunks: joined once, when it ends
    while chunk := raw.read(1 << 20):
        *lines, tail = stream.decompress(chunk).split(b"\n")
        if lines:
            lines[0] = b"".join([*pending, lines[0]])
            pending.clear()
            for line in lines:
                yield line + b"\n"
        pending.append(tail)
    if not stream.eof:
        raise ValueError(f"{path}: the compressed data is cut short (a torn write)")
    if rest := b"".join(pending):
        yield rest


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a block builds many acyclic objects (a journal's
    130,000 parsed entries): its passes would rescan every live one, again and again."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    with atomic_open(path, "wb") as fh:
        fh.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
        fh.write(b"\n")


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file."""
    with open(path, "rb") as fh:
        return orjson.loads(fh.read())


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in 4 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()
