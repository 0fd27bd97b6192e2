"""The simulated server's logs: SGLang-style log lines, and the request log shared by every server
process and lifetime (one ``O_APPEND`` write per event)."""

from __future__ import annotations

import os
import sys
import time
from typing import IO, Any

import orjson


class LogWriter:
    """Writes lines in SGLang's log format: ``[YYYY-mm-dd HH:MM:SS TP0] message``."""

    def __init__(self, path: str | None) -> None:
        self._fh: IO[str] | None = open(path, "a", buffering=1) if path else None  # noqa: SIM115

    def __call__(self, msg: str, prefix: str = " TP0") -> None:
        if self._fh is None:
            return
        self._fh.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}{prefix}] {msg}\n")

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class RequestLog:
    """Append-only JSONL of chat requests, shared by every server process and lifetime."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._fd: int | None = None
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)

    def __call__(self, event: str, sample_id: str | None, **extra: Any) -> None:
        if self._fd is None:
            return
        line = orjson.dumps({"event": event, "id": sample_id, "pid": os.getpid(), "t": time.time(), **extra})
        os.write(self._fd, line + b"\n")  # one write with O_APPEND: lines never interleave

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_request_log(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The events of a request log (a torn last line, from a killed server, is skipped)."""
    out: list[dict[str, Any]] = []
    try:
        data = open(path, "rb").read()  # noqa: SIM115
    except FileNotFoundError:
        return out
    for raw in data.splitlines():
        try:
            out.append(orjson.loads(raw))
        except orjson.JSONDecodeError:
            continue
    return out


class LogWriterStderr(LogWriter):
    def __init__(self) -> None:
        self._fh = sys.stderr

    def close(self) -> None:
        self._fh = None
