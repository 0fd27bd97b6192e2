"""``regen status [--watch]``: a generation run's progress, per GPU server and overall.

Sources (all optional, so it works with no server running):
``work/status/{shard}.json`` (written by the client every few seconds: done, failed, retrying, in
flight, oldest request), each live server's ``/metrics`` (found through ``work/servers/gpu{k}.url``),
finished ``results/generations/*.jsonl`` (+ ``.failed.jsonl``) and the planned
``results/shards/*.parquet``, whose row counts (Parquet metadata) make the totals exact.
``progress_line`` is the same in one line; generate jobs print it to Snakemake's console.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from regen.io import read_json
from regen.layout import RUN, RunLayout, SlotFiles, url_files
from regen.projection import fmt_duration, project
from regen.sglang.progress import ProgressState
from regen.sglang.server import is_supervisor, read_url_state

#: a shard's status older than this (and not finished) is shown as stale
STALE_AFTER_S = 120.0
METRIC_NAMES = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:gen_throughput")
_METRIC_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


@dataclass(frozen=True, slots=True)
class ShardStatus:
    """One ``work/status/{shard}.json``."""

    shard: str
    server_id: str | None
    server_url: str | None
    done: int
    total: int | None
    failed: int
    truncated: int
    req_s: float
    out_tok_s: float
    eta_s: float | None
    updated_at: float
    finished: bool
    in_flight: int = 0
    retrying: int = 0
    retried_requests: int = 0
    oldest_in_flight_at: float | None = None

    @classmethod
    def from_json(cls, obj: dict[str, Any], path: Path) -> ShardStatus:
        server = obj.get("server") or {}
        try:
            return cls(
                shard=str(obj.get("shard") or path.stem),
                server_id=server.get("id"),
                server_url=server.get("url"),
                done=int(obj.get("done") or 0),
                total=None if obj.get("total") is None else int(obj["total"]),
                failed=int(obj.get("failed") or 0),
                truncated=int(obj.get("truncated") or 0),
                req_s=float(obj.get("req_s") or 0.0),
                out_tok_s=float(obj.get("out_tok_s") or 0.0),
                eta_s=None if obj.get("eta_s") is None else float(obj["eta_s"]),
                updated_at=float(obj.get("updated_at") or 0.0),
                finished=bool(obj.get("finished", False)),
                in_flight=int(obj.get("in_flight") or 0),
                retrying=int(obj.get("retrying") or 0),
                retried_requests=int(obj.get("retried_requests") or 0),
                oldest_in_flight_at=(
                    None if obj.get("oldest_in_flight_at") is None else float(obj["oldest_in_flight_at"])
                ),
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: bad status field: {exc}") from exc


@dataclass(frozen=True, slots=True)
class ServerView:
    """A GPU slot's server as seen now: url file state and its /metrics (None when unreachable)."""

    server_id: str
    url: str | None
    state: str  # ready | stalled since HH:MM:SS | starting | failed | gone
    running: float | None = None
    queued: float | None = None
    gen_throughput: float | None = None
    note: str | None = None  # what a stalled server's supervisor saw


def parse_prometheus(text: str, names: Iterable[str] = METRIC_NAMES) -> dict[str, float]:
    """Sum each named metric over its label sets in Prometheus text exposition format."""
    wanted = set(names)
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _METRIC_LINE.match(line)
        if m is None or m.group(1) not in wanted:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out


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


def fetch_metrics(url: str, timeout: float = 2.0) -> dict[str, float] | None:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=timeout) as resp:
            return parse_prometheus(resp.read().decode(errors="replace"))
    except (OSError, ValueError):
        return None


def read_servers(servers_dir: Path) -> list[ServerView]:
    """One view per ``gpu{k}.url`` file (per node, and per Slurm job as ``slurm-{job}/gpu{k}``), with
    live metrics for ready servers."""
    views = []
    for url_file in sorted(url_files(servers_dir), key=lambda p: _slot_key(_server_id(p, servers_dir))):
        state = read_url_state(url_file)
        sid = _server_id(url_file, servers_dir)
        if state is None or not is_supervisor(state.supervisor_pid, url_file):
            views.append(ServerView(sid, None, "gone"))
            continue
        if state.failed:
            views.append(ServerView(sid, None, "failed"))
            continue
        if state.url is None:
            views.append(ServerView(sid, None, "starting"))
            continue
        metrics = fetch_metrics(state.url)
        if metrics is None:
            views.append(ServerView(sid, state.url, "unreachable"))
            continue
        stalled = stall_of(ProgressState.read(SlotFiles.beside(url_file).progress), state.server_pid)
        views.append(
            ServerView(
                sid,
                state.url,
                stalled[0] if stalled else "ready",
                running=metrics.get("sglang:num_running_reqs"),
                queued=metrics.get("sglang:num_queue_reqs"),
                gen_throughput=metrics.get("sglang:gen_throughput"),
                note=stalled[1] if stalled else None,
            )
        )
    return views


def stall_of(progress: ProgressState | None, server_pid: int | None) -> tuple[str, str] | None:
    """(``stalled since 04:51:02``, what the supervisor saw) while its latest look at this server found
    no progress overdue with requests in flight; None otherwise."""
    if progress is None or progress.stalled_since is None or progress.server_pid != server_pid:
        return None
    since = time.strftime("%H:%M:%S", time.localtime(progress.stalled_since))
    idle = max(0.0, progress.updated_at - progress.stalled_since)
    mamba = f"; mamba usage {progress.mamba_usage:.2f}" if progress.mamba_usage is not None else ""
    return f"stalled since {since}", (
        f"no tokens generated for {idle:.0f} s with {progress.in_flight} requests in flight{mamba}; "
        f"its supervisor restarts it at {progress.stall_timeout_s:.0f} s (server.stall_timeout_s)"
    )


def _server_id(url_file: Path, servers_dir: Path) -> str:
    """``gpu{k}`` for a per-node slot, ``slurm-{job}/gpu{k}`` for a per-Slurm-job one."""
    return url_file.stem if url_file.parent == servers_dir else f"{url_file.parent.name}/{url_file.stem}"


def _slot_key(server_id: str) -> tuple[int, str]:
    digits = re.sub(r"\D", "", server_id)
    return (int(digits) if digits else 1 << 30, server_id)


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
    sizes = planned if isinstance(planned, dict) else dict.fromkeys(planned)
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
    )


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}"


def fmt_eta(eta_s: float | None, now: float) -> str:
    """ETA as the clock time it will be done, with the time left: ``07:42 (in 12m30s)``."""
    if eta_s is None:
        return "?"
    at = time.localtime(now + eta_s)
    clock = time.strftime("%H:%M" if eta_s < 86400 else "%a %H:%M", at)
    return f"{clock} (in {fmt_duration(eta_s)})"


def summary_line(t: RunTotals, now: float) -> str:
    """The whole run in one line (``regen status`` footer and the generate jobs' console line)."""
    pct = f" ({100.0 * t.done / t.total:.1f}%)" if t.total else ""
    oldest = "" if t.oldest_in_flight_s is None else f", oldest {fmt_duration(t.oldest_in_flight_s)}"
    return (
        f"samples: {t.done}/{'?' if t.total is None else t.total}{pct} done, {t.failed} failed, "
        f"{t.retrying} retrying, {t.in_flight} in flight{oldest}; {t.req_s:.1f} req/s, "
        f"{t.out_tok_s:.0f} out tok/s; ETA {fmt_eta(t.eta_s, now)}"
    )


def render_table(
    statuses: list[ShardStatus],
    servers: list[ServerView],
    planned: set[str] | dict[str, int | None],
    finished: set[str] | dict[str, int],
    now: float,
    rate: float | None = None,
) -> str:
    """The status table (per GPU, then the whole run) as text."""
    server_by_id = {v.server_id: v for v in servers}
    finished_names = set(finished)
    in_progress: dict[str, ShardStatus] = {}
    for st in sorted(statuses, key=lambda s: s.updated_at):
        if st.finished or st.shard in finished_names or st.server_id is None:
            continue
        in_progress[st.server_id] = st  # the most recently updated shard on that server
    ids = sorted(set(server_by_id) | set(in_progress), key=_slot_key)
    header = ("gpu", "server", "shard", "done/total", "failed", "retrying", "in flight", "oldest", "req/s",
              "out tok/s", "running", "queued", "updated")  # fmt: skip
    rows: list[tuple[str, ...]] = [header]
    for sid in ids:
        view = server_by_id.get(sid)
        st = in_progress.get(sid)
        age = None if st is None else now - st.updated_at
        oldest = None if st is None or st.oldest_in_flight_at is None else now - st.oldest_in_flight_at
        rows.append(
            (
                sid,
                "-" if view is None else view.state,
                "-"
                if st is None
                else st.shard + (" (stale)" if age is not None and age > STALE_AFTER_S else ""),
                "-" if st is None else f"{st.done}/{'?' if st.total is None else st.total}",
                "-" if st is None else str(st.failed),
                "-" if st is None else str(st.retrying),
                "-" if st is None else str(st.in_flight),
                "-" if oldest is None else fmt_duration(oldest),
                "-" if st is None else _fmt(st.req_s, 1),
                "-" if st is None else _fmt(st.out_tok_s, 0),
                "-" if view is None else _fmt(view.running),
                "-" if view is None else _fmt(view.queued),
                "-" if age is None else f"{fmt_duration(age)} ago",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if len(rows) == 1:
        lines.append("(no GPU server or shard in progress)")
    lines += [f"{v.server_id}: {v.note}" for v in servers if v.note]
    t = run_totals(statuses, planned, finished, now, rate)
    lines.append("")
    lines.append(f"shards: {t.finished_shards}/{t.planned_shards} finished")
    lines.append(summary_line(t, now))
    return "\n".join(lines) + "\n"


def shard_names(directory: Path, suffix: str) -> set[str]:
    """Names of ``{shard}{suffix}`` files (``.failed.jsonl`` companions excluded)."""
    return {
        p.name[: -len(suffix)]
        for p in directory.glob(f"*{suffix}")
        if not p.name.endswith(".failed.jsonl") and not p.name.startswith(".")
    }


def projection_lines(pilot_path: Path, remaining_now: int | None) -> list[str]:
    """The pilot's projection (``regen tune --sweep``), re-projected for the samples left now when known."""
    if not pilot_path.is_file():
        return []
    try:
        pilot = read_json(pilot_path)
        proj = pilot["projection"]
        remaining = int(proj["remaining_samples"]) if remaining_now is None else max(0, remaining_now)
        now = project(
            remaining,
            float(proj["tokens_per_sample"]),
            float(proj["out_tok_s_per_server"]),
            int(proj["gpus"]),
            int(proj["tp"]),
        )
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        return [f"projection: {pilot_path} unreadable ({exc})"]
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(pilot.get("created_at") or 0)))
    return [
        f"projection (pilot {when}: {now.out_tok_s_per_server:.0f} out tok/s per server, "
        f"{now.tokens_per_sample:.0f} tokens/sample, {now.servers} server(s) x tp {now.tp}): "
        f"{now.remaining_samples} samples left, wall {fmt_duration(now.wall_s)}, "
        f"{now.gpu_hours:.2f} GPU-hours"
    ]


@dataclass(frozen=True, slots=True)
class RunSnapshot:
    """Everything ``regen status`` reads, read once."""

    statuses: list[ShardStatus]
    planned: dict[str, int | None]
    finished: dict[str, int]  # shard -> failed samples

    @classmethod
    def read(cls, workdir: Path, results: Path) -> RunSnapshot:
        layout = RunLayout(results=Path(results), work=Path(workdir))
        finished = {
            name: count_lines(layout.failed(name)) for name in shard_names(layout.generations_dir, ".jsonl")
        }
        return cls(read_shard_statuses(layout.status_dir), shard_sizes(layout.shards_dir), finished)

    def totals(self, now: float, rate: float | None = None) -> RunTotals:
        return run_totals(self.statuses, self.planned, self.finished, now, rate)


def status_report(workdir: Path, results: Path, now: float | None = None, rate: float | None = None) -> str:
    """Gather every source and render the table."""
    layout = RunLayout(results=Path(results), work=Path(workdir))
    snap = RunSnapshot.read(layout.work, layout.results)
    servers = read_servers(layout.servers_root)
    t_now = time.time() if now is None else now
    text = render_table(snap.statuses, servers, snap.planned, snap.finished, t_now, rate)
    totals = snap.totals(t_now, rate)
    left = totals.remaining if snap.statuses else None
    extra = projection_lines(layout.pilot, left)
    return text + "".join(line + "\n" for line in extra)


def progress_line(workdir: Path, results: Path, now: float | None = None) -> str:
    """The whole run in one line, prefixed with ``regen:`` (for Snakemake's console)."""
    t_now = time.time() if now is None else now
    snap = RunSnapshot.read(workdir, results)
    t = snap.totals(t_now)
    return f"regen: shards {t.finished_shards}/{t.planned_shards}; {summary_line(t, t_now)}"


class RateWindow:
    """Samples/s over the last ``window_s`` seconds of ``--watch`` refreshes: stalls (retries, a
    restarting server) lower it at once, unlike a shard's average since its start."""

    def __init__(self, window_s: float = 120.0) -> None:
        self.window_s = window_s
        self.points: list[tuple[float, int]] = []

    def add(self, now: float, done: int) -> float | None:
        self.points.append((now, done))
        self.points = [(t, d) for t, d in self.points if now - t <= self.window_s]
        (t0, d0), (t1, d1) = self.points[0], self.points[-1]
        return (d1 - d0) / (t1 - t0) if t1 - t0 >= 10.0 else None


def watch(workdir: Path, results: Path, every_s: float, out: TextIO, max_frames: int | None = None) -> int:
    """Redraw the status in place every ``every_s`` seconds until every shard is finished (or Ctrl-C)."""
    window = RateWindow()
    tty = out.isatty()
    frames = 0
    try:
        while True:
            now = time.time()
            snap = RunSnapshot.read(workdir, results)
            rate = window.add(now, snap.totals(now).done)
            text = status_report(workdir, results, now=now, rate=rate)
            stamp = time.strftime("%H:%M:%S", time.localtime(now))
            frame = f"regen status  {stamp}  (every {every_s:g} s, Ctrl-C to stop)\n\n{text}"
            out.write(("\x1b[H\x1b[2J" + frame) if tty else frame + "\n")
            out.flush()
            frames += 1
            done = bool(snap.planned) and set(snap.planned) <= set(snap.finished)
            if done or (max_frames is not None and frames >= max_frames):
                return 0
            time.sleep(every_s)
    except KeyboardInterrupt:
        return 0


def cli(argv: list[str], out: TextIO | None = None) -> int:
    p = argparse.ArgumentParser(prog="regen status", description="progress of a generation run")
    p.add_argument("--workdir", type=Path, default=RUN.work, help="working directory (default: %(default)s)")
    p.add_argument(
        "--results", type=Path, default=RUN.results, help="results directory (default: %(default)s)"
    )
    p.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=5.0,
        default=None,
        metavar="SECONDS",
        help="refresh in place every SECONDS (default 5) until the run's shards are all finished",
    )
    p.add_argument(
        "--configfile",
        nargs="+",
        type=Path,
        default=None,
        help="the workflow's config file(s), as given to snakemake: also say how many samples a rerun "
        "replays from the journals and how many it generates again, and why",
    )
    args = p.parse_args(argv)
    stream = out or sys.stdout
    if args.watch is not None:
        return watch(args.workdir, args.results, max(0.5, args.watch), stream)
    text = status_report(args.workdir, args.results)
    if args.configfile:
        from regen.replay import preview_lines  # reads the dataset and the journals: only when asked

        config = load_workflow_config(args.configfile)
        layout = RunLayout(results=args.results, work=args.workdir)
        journals = [str(j) for j in layout.journal_files()]
        text += "\n" + "".join(line + "\n" for line in preview_lines(config, journals, layout))
    stream.write(text)
    return 0


def load_workflow_config(paths: list[Path]) -> dict[str, Any]:
    """The config Snakemake would see: the files merged in order, validated, defaults filled in."""
    import yaml
    from snakemake.utils import update_config, validate

    config: dict[str, Any] = {}
    for path in paths:
        update_config(config, yaml.safe_load(path.read_text()) or {})
    validate(config, str(Path(__file__).resolve().parent.parent / "schemas" / "config.schema.yaml"))
    return config


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
