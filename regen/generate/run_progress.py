"""A generation run's progress from its files, read once: the shards' status records
(``work/status/{shard}.json``, :class:`regen.records.ShardStatus`), the planned shards' row counts and
the finished shards, summed into :class:`RunTotals` and the one-line summary.

``regen status`` renders these as its table; the generate jobs print :func:`progress_line` to
Snakemake's console (so the generate path reads the run's progress without the ``regen status``
command module).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from regen.io import read_json
from regen.layout.run import RunLayout
from regen.records import ShardStatus

#: a shard's status older than this (and not finished) is shown as stale
STALE_AFTER_S = 120.0


def read_shard_statuses(status_dir: Path) -> list[ShardStatus]:
    """Every readable status file (a file being replaced right now is skipped, never half-read)."""
    statuses = []
    for path in sorted(status_dir.glob("*.json")):
        try:
            obj = read_json(path)
        except (OSError, ValueError) as exc:
            print(f"warning: {path}: unreadable ({exc})", file=sys.stderr)
            continue
        statuses.append(ShardStatus.from_json(obj, path))
    return statuses


def shard_sizes(shards_dir: Path) -> dict[str, int | None]:
    """Rows per planned shard from its Parquet footer (None when the file cannot be read yet)."""
    import pyarrow.parquet as pq

    sizes: dict[str, int | None] = {}
    for path in sorted(shards_dir.glob("*.parquet")):
        if path.name.startswith("."):
            continue
        try:
            sizes[path.stem] = pq.ParquetFile(path).metadata.num_rows
        except (OSError, ValueError):
            sizes[path.stem] = None
    return sizes


def count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(1 for line in fh if line.strip())
    except OSError:
        return 0


@dataclass(frozen=True, slots=True)
class RunTotals:
    planned_shards: int
    finished_shards: int
    done: int
    total: int | None
    failed: int
    req_s: float
    eta_s: float | None
    retrying: int = 0
    in_flight: int = 0
    out_tok_s: float = 0.0
    oldest_in_flight_s: float | None = None
    #: records a sample makes (its variants' completions): ``done``, ``total`` and ``failed`` count records
    completions_per_sample: int = 1

    @property
    def remaining(self) -> int | None:
        return None if self.total is None else max(0, self.total - self.done)


def _latest_per_server(statuses: list[ShardStatus], now: float) -> list[ShardStatus]:
    """Each server's most recently updated status, if fresh: the rate a GPU runs at now, also in the
    gap between its shards."""
    latest: dict[str, ShardStatus] = {}
    for st in statuses:
        key = st.server_id or st.shard
        if now - st.updated_at < STALE_AFTER_S and (
            key not in latest or st.updated_at > latest[key].updated_at
        ):
            latest[key] = st
    return list(latest.values())


def run_totals(
    statuses: list[ShardStatus],
    planned: set[str] | dict[str, int | None],
    finished: set[str] | dict[str, int],
    now: float,
    rate: float | None = None,
) -> RunTotals:
    """Whole-run progress. ``planned``: shard -> rows (exact, from the shard files) or a set of names;
    ``finished``: shard -> failed samples, or a set of names. ``rate`` (samples/s, e.g. measured over
    a window by ``--watch``) replaces the shards' own rates for the ETA."""
    # the shard files count samples, the statuses records: a sample makes one per completion
    per = max((s.completions_per_sample for s in statuses), default=1)
    sizes = (
        {k: None if v is None else v * per for k, v in planned.items()}
        if isinstance(planned, dict)
        else dict.fromkeys(planned)
    )
    failed_by_shard = finished if isinstance(finished, dict) else dict.fromkeys(finished, 0)
    by_shard = {s.shard: s for s in statuses}
    total: int | None = 0
    done = failed = 0
    for shard in set(sizes) | set(failed_by_shard) | set(by_shard):
        st = by_shard.get(shard)
        size = sizes.get(shard)
        if size is None and st is not None:
            size = st.total
        if size is None:
            total = None
        elif total is not None:
            total += size
        if shard in failed_by_shard:
            done += size if size is not None else (st.done if st is not None else 0)
            failed += failed_by_shard[shard] if isinstance(finished, dict) else (st.failed if st else 0)
        elif st is not None:
            done += st.done
            failed += st.failed
    active = [
        s
        for s in statuses
        if not s.finished and s.shard not in failed_by_shard and now - s.updated_at < STALE_AFTER_S
    ]
    recent = _latest_per_server(statuses, now)
    req_s = rate if rate is not None else sum(s.req_s for s in recent)
    remaining = None if total is None else max(0, total - done)
    eta = None
    if remaining == 0:
        eta = 0.0
    elif remaining is not None and req_s > 0:
        eta = remaining / req_s
        newest = max((s.updated_at for s in recent), default=now)
        if rate is None and eta < now - newest:
            eta = None  # at the last reported rates it would be done by now, and it is not: unknown
    oldest = min((s.oldest_in_flight_at for s in active if s.oldest_in_flight_at is not None), default=None)
    return RunTotals(
        planned_shards=len(sizes),
        finished_shards=len(failed_by_shard),
        done=done,
        total=total,
        failed=failed,
        req_s=req_s,
        eta_s=eta,
        retrying=sum(s.retrying for s in active),
        in_flight=sum(s.in_flight for s in active),
        out_tok_s=sum(s.out_tok_s for s in recent),
        oldest_in_flight_s=None if oldest is None else max(0.0, now - oldest),
        completions_per_sample=per,
    )


def fmt_eta(eta_s: float | None, now: float) -> str:
    """ETA as the clock time it will be done, with the time left: ``07:42 (in 12m30s)``."""
    if eta_s is None:
        return "?"
    at = time.localtime(now + eta_s)
    clock = time.strftime("%H:%M" if eta_s < 86400 else "%a %H:%M", at)
    left = "<1s" if 0 < eta_s < 0.5 else fmt_duration(eta_s)  # never "in 0s" with work left
    return f"{clock} (in {left})"


def summary_line(t: RunTotals, now: float) -> str:
    """The whole run in one line (``regen status`` footer and the generate jobs' console line)."""
    pct = f" ({100.0 * t.done / t.total:.1f}%)" if t.total else ""
    oldest = "" if t.oldest_in_flight_s is None else f", oldest {fmt_duration(t.oldest_in_flight_s)}"
    what = (
        "samples" if t.completions_per_sample == 1 else f"completions ({t.completions_per_sample} a sample)"
    )
    return (
        f"{what}: {t.done}/{'?' if t.total is None else t.total}{pct} done, {t.failed} failed, "
        f"{t.retrying} retrying, {t.in_flight} in flight{oldest}; {t.req_s:.1f} req/s, "
        f"{t.out_tok_s:.0f} out tok/s; ETA {fmt_eta(t.eta_s, now)}"
    )


@dataclass(frozen=True, slots=True)
class RunSnapshot:
    """Everything ``regen status`` reads, read once."""

    statuses: list[ShardStatus]
    planned: dict[str, int | None]
    finished: dict[str, int]  # shard -> failed samples

    @classmethod
    def read(cls, workdir: Path, results: Path) -> RunSnapshot:
        layout = RunLayout(results=Path(results), work=Path(workdir))
        finished = {name: count_lines(layout.failed(name)) for name in layout.finished_shards()}
        return cls(read_shard_statuses(layout.status_dir), shard_sizes(layout.shards_dir), finished)

    def totals(self, now: float, rate: float | None = None) -> RunTotals:
        return run_totals(self.statuses, self.planned, self.finished, now, rate)


def progress_line(workdir: Path, results: Path, now: float | None = None) -> str:
    """The whole run in one line, prefixed with ``regen:`` (for Snakemake's console)."""
    t_now = time.time() if now is None else now
    snap = RunSnapshot.read(workdir, results)
    t = snap.totals(t_now)
    return f"regen: shards {t.finished_shards}/{t.planned_shards}; {summary_line(t, t_now)}"


def fmt_duration(seconds: float | None) -> str:
    """A duration as ``1h02m``, ``3m05s`` or ``42s`` (``?`` when unknown)."""
    if seconds is None:
        return "?"
    s = round(seconds)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{sec:02d}s" if m else f"{sec}s")
