"""A long stage's progress (the audit, the merge, the export): rows done of rows known, rows/s and ETA.

The stage's job counts rows through a :class:`StageProgress`; every ``every_s`` seconds, and once at the
end, it prints a line to the console Snakemake runs in (the job's own stderr goes to its log, which gets
the line too) and rewrites ``work/status/stages/{stage}.json`` (:meth:`regen.layout.run.RunLayout.
stage_progress`), which ``regen status`` reads back (:func:`stage_lines`).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, TypeVar

from regen.generate.run_progress import STALE_AFTER_S, fmt_duration, fmt_eta
from regen.ingest.readers import check_dataset_path, known_row_count
from regen.io import read_json, write_json
from regen.layout.run import RUN, RunLayout

log = logging.getLogger("regen.observe.stage_progress")

T = TypeVar("T")

#: how often a stage prints its line and rewrites its file
PROGRESS_EVERY_S = 10.0


def parquet_rows(paths: Iterable[str | os.PathLike[str]]) -> int:
    """Rows of Parquet files from their footers (the total a stage's ETA needs, read in milliseconds)."""
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(p).metadata.num_rows for p in paths)


def dataset_rows(path: str | os.PathLike[str]) -> int | None:
    """Rows of a dataset file, cheaply: a Parquet footer, or a JSON-lines file's newlines (about 1 GB/s);
    a folder's from its Parquet shards' footers; None for other formats (the stage then shows rows/s
    without an ETA)."""
    p = Path(path)
    if p.is_dir():
        return known_row_count(check_dataset_path(p))
    if p.suffix == ".parquet":
        return parquet_rows([p])
    if p.suffix != ".jsonl":
        return None
    with open(p, "rb") as fh:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 24), b""))


@dataclass(frozen=True, slots=True)
class StageState:
    """One ``work/status/stages/{stage}.json``."""

    stage: str
    done: int
    total: int | None
    started_at: float
    updated_at: float
    finished: bool = False

    @property
    def rate(self) -> float:
        return self.done / max(1e-9, self.updated_at - self.started_at)

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the stage's rate since its start, counted from its last update."""
        if self.finished:
            return 0.0
        if self.total is None or self.done == 0:
            return None
        return max(0.0, self.total - self.done) / self.rate

    def line(self, now: float) -> str:
        """``merge: 120,000/914,000 rows (13.1%), 2,400 rows/s, ETA 21:05 (in 5m30s)`` or ``... done``."""
        took = self.updated_at - self.started_at
        if self.finished:
            return f"{self.stage}: done, {self.done:,} rows in {fmt_duration(took)} ({self.rate:,.0f} rows/s)"
        if self.done == 0 and now - self.started_at < 1.0:
            return f"{self.stage}: started, {'?' if self.total is None else f'{self.total:,}'} rows to go"
        of = "" if self.total is None else f"/{self.total:,}"
        pct = f" ({100.0 * self.done / self.total:.1f}%)" if self.total else ""
        age = now - self.updated_at
        if age > STALE_AFTER_S:
            return f"{self.stage}: {self.done:,}{of} rows{pct}; no update for {fmt_duration(age)} (stopped?)"
        eta = self.eta_s
        left = None if eta is None else max(0.0, eta - age)
        return f"{self.stage}: {self.done:,}{of} rows{pct}, {self.rate:,.0f} rows/s, ETA {fmt_eta(left, now)}"

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "done": self.done,
            "total": self.total,
            "started_at": self.started_at,
            "updated_at": self.updated_at,
            "finished": self.finished,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> StageState:
        total = obj.get("total")
        return cls(
            stage=str(obj["stage"]),
            done=int(obj["done"]),
            total=None if total is None else int(total),
            started_at=float(obj["started_at"]),
            updated_at=float(obj["updated_at"]),
            finished=bool(obj.get("finished", False)),
        )


class StageProgress:
    """Counts a stage's rows; prints and writes its :class:`StageState` every ``every_s`` seconds and at
    :meth:`finish`. ``path`` None: no file; ``console`` None: no console line (the log still gets it)."""

    def __init__(
        self,
        stage: str,
        total: int | None,
        path: Path | None,
        *,
        every_s: float = PROGRESS_EVERY_S,
        console: TextIO | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.stage, self.total, self.path = stage, total, path
        self.every_s, self.console, self.clock = every_s, console, clock
        self.done = 0
        self.started_at = self.last = clock()
        self._report(self.state(self.started_at))

    @classmethod
    def for_workflow(cls, stage: str, total: int | None, layout: RunLayout = RUN) -> StageProgress:
        """A workflow job's: its file under ``layout``'s work directory, its line on Snakemake's console."""
        return cls(stage, total, layout.stage_progress(stage), console=sys.__stderr__)

    @classmethod
    def silent(cls, stage: str) -> StageProgress:
        """Counts only (a stage called outside the workflow, e.g. by a test)."""
        return cls(stage, None, None, every_s=float("inf"))

    def state(self, now: float, finished: bool = False) -> StageState:
        return StageState(self.stage, self.done, self.total, self.started_at, now, finished)

    def advance(self, rows: int = 1) -> None:
        self.done += rows
        now = self.clock()
        if now - self.last >= self.every_s:
            self.last = now
            self._report(self.state(now))

    def finish(self) -> None:
        self._report(self.state(self.clock(), finished=True))

    def _report(self, state: StageState) -> None:
        line = f"regen: {state.line(state.updated_at)}"
        if self.path is not None:
            write_json(self.path, state.to_json())
            log.info("%s", line)
        if self.console is not None:
            print(line, file=self.console, flush=True)


def tracked(items: Iterable[T], progress: StageProgress) -> Iterator[T]:
    """``items``, counted by ``progress`` one by one; finished once they run out (the audit's hook)."""
    for item in items:
        yield item
        progress.advance()
    progress.finish()


def read_stages(layout: RunLayout) -> list[StageState]:
    """Every readable stage progress file, oldest start first."""
    states = []
    for path in sorted(layout.stage_progress_dir.glob("*.json")):
        try:
            states.append(StageState.from_json(read_json(path)))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being replaced right now, or not one of ours
    return sorted(states, key=lambda s: s.started_at)


def stage_lines(layout: RunLayout, now: float) -> list[str]:
    """``regen status``'s lines for the long stages that have run (or are running)."""
    return [state.line(now) for state in read_stages(layout)]
