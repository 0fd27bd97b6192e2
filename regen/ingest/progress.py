"""Console progress of a long pass over rows (the audit reads 914,000 rows in minutes): rows read, rows/s,
and the share done with an ETA when the row count is known, logged every ``every_s`` seconds."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

log = logging.getLogger(__name__)
CONSOLE_FORMAT = "regen %(message)s"

#: rows between two looks at the clock (a look costs far more than counting a row)
CHECK_EVERY_ROWS = 2048
#: seconds between two progress lines
LOG_EVERY_S = 10.0


def console_log() -> logging.Logger:
    """This module's logger, whose lines reach the terminal as well as the job's log.

    A Snakemake job's stderr is its rule's log file (``regen.runlog.log_to``), so a line only logged would
    be seen by no one while the step runs; the stderr the process started with is the console (Snakemake's,
    or the shell's for ``regen audit``). One handler, added once."""
    if not any(getattr(h, "regen_console", False) for h in log.handlers):
        handler = logging.StreamHandler(sys.__stderr__)
        handler.setFormatter(logging.Formatter(CONSOLE_FORMAT))
        handler.regen_console = True  # type: ignore[attr-defined]
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    return log


class RowCounter(Protocol):
    """What a pass over rows reports its rows to: :class:`RowProgress` (the console), or the workflow's
    ``regen.observe.stage_progress.StageProgress`` (the console and ``regen status``)."""

    def advance(self, rows: int, /) -> None: ...

    def finish(self) -> object: ...


@dataclass(frozen=True, slots=True)
class RowCount:
    """Where a pass stands: ``rows`` done of ``total`` (None: not known ahead) after ``elapsed_s``."""

    stage: str
    rows: int
    total: int | None
    elapsed_s: float

    @property
    def rate(self) -> float:
        return self.rows / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        if self.total is None or self.rate <= 0:
            return None
        return max(0.0, (self.total - self.rows) / self.rate)

    def in_words(self) -> str:
        head = f"{self.stage}: {self.rows:,} rows read ({self.rate:,.0f} rows/s"
        if self.total is None or self.total <= 0:
            return f"{head}, total not known ahead)"
        if self.rows >= self.total:
            took = _duration(self.elapsed_s)
            return f"{self.stage}: all {self.total:,} rows read in {took} ({self.rate:,.0f} rows/s)"
        eta = self.eta_s
        left = "" if eta is None else f", about {_duration(eta)} left"
        return f"{head}; {min(self.rows / self.total, 1.0):.0%} of {self.total:,}{left})"


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s < 1:
        return "under a second"
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


@dataclass(slots=True)
class RowProgress:
    """Counts rows and logs a :class:`RowCount` line every ``every_s`` seconds, and once at the end.

    ``on_count``, where given, gets every count that is logged."""

    stage: str
    total: int | None
    every_s: float = LOG_EVERY_S
    clock: Callable[[], float] = time.monotonic
    on_count: Callable[[RowCount], None] | None = None
    rows: int = 0
    _start: float = field(default=0.0, init=False)
    _next_log: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self._start = self.clock()
        self._next_log = self._start + self.every_s

    def advance(self, n: int) -> None:
        before = self.rows
        self.rows += n
        if before // CHECK_EVERY_ROWS == self.rows // CHECK_EVERY_ROWS:
            return
        now = self.clock()
        if now >= self._next_log:
            self._next_log = now + self.every_s
            self._emit(now)

    def finish(self) -> RowCount:
        return self._emit(self.clock())

    def _emit(self, now: float) -> RowCount:
        count = RowCount(self.stage, self.rows, self.total, now - self._start)
        console_log().info("%s", count.in_words())
        if self.on_count is not None:
            self.on_count(count)
        return count
