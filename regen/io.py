"""Atomic file output and small JSON helpers shared by every stage."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import orjson


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


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    with atomic_open(path, "wb") as fh:
        fh.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
        fh.write(b"\n")


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file."""
    with open(path, "rb") as fh:
        return orjson.loads(fh.read())
