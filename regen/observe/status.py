"""``regen status [--watch]``: a generation run's progress, per GPU server and overall.

Sources (all optional, so it works with no server running):
``work/status/{shard}.json`` (written by the client every few seconds: done, failed, retrying, in
flight, oldest request), each live server's ``/metrics`` (found through ``work/servers/gpu{k}.url``),
finished shards' records (``RunLayout.finished_shards``, + ``.failed.jsonl``) and the planned
``results/shards/*.parquet``, whose row counts (Parquet metadata) make the totals exact. Reading and
summing the run's files is ``regen.generate.run_progress`` (whose ``progress_line`` the generate jobs print).

Which run it shows is the run marker's (``RunLayout.run_marker``, ``regen.run_marker``): the run in
progress, with its phase (while it checks its config and inputs, before its ``onstart`` has settled
``results/``, no shard is shown: the files there may be an earlier run's), or the last one that ended,
or a dead one (its controller gone: no ETA, nothing in flight). ``--watch`` stops once that run is no
longer running.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from regen.generate.replay import ShardReplay
from regen.generate.run_progress import STALE_AFTER_S, RunSnapshot, fmt_duration, run_totals, summary_line
from regen.io import read_json
from regen.layout.run import RUN, RunLayout
from regen.layout.slots import SlotFiles, url_files
from regen.observe.stage_progress import stage_lines
from regen.observe.variants import valid_breakdown, variant_lines
from regen.pilot_file import PilotFile
from regen.records import ShardStatus
from regen.run_marker import RunMarker
from regen.serving.metrics import fetch_metrics_page, sum_prometheus
from regen.serving.probes import NO_ANSWER
from regen.serving.procfs import is_supervisor, read_url_state
from regen.serving.progress import ProgressState
from regen.tune.projection import project

METRIC_NAMES = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:gen_throughput")


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


def fetch_metrics(url: str, timeout: float = 2.0) -> dict[str, float] | None:
    """The gauges ``regen status`` shows, summed over their label sets (None: the server does not answer)."""
    try:
        return sum_prometheus(fetch_metrics_page(url, timeout_s=timeout), METRIC_NAMES)
    except NO_ANSWER:
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


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}"


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


def projection_lines(pilot_path: Path, remaining_now: int | None) -> list[str]:
    """The pilot's projection (``regen tune --sweep``), re-projected for the samples left now when known."""
    try:
        pilot = PilotFile.read(pilot_path)
        if pilot is None:
            return []
        if pilot.projection is None:
            raise ValueError("no projection")
        proj = pilot.projection.projection
        remaining = proj.remaining_samples if remaining_now is None else max(0, remaining_now)
        now = project(remaining, proj.tokens_per_sample, proj.out_tok_s_per_server, proj.gpus, proj.tp)
    except (OSError, ValueError, RuntimeError) as exc:
        return [f"projection: {pilot_path} unreadable ({exc})"]
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(pilot.created_at or 0))
    return [
        f"projection (pilot {when}: {now.out_tok_s_per_server:.0f} out tok/s per server, "
        f"{now.tokens_per_sample:.0f} tokens/sample, {now.servers} server(s) x tp {now.tp}): "
        f"{now.remaining_samples} samples left, wall {fmt_duration(now.wall_s)}, "
        f"{now.gpu_hours:.2f} GPU-hours"
    ]


def _clock(t: float | None) -> str:
    return "?" if t is None else time.strftime("%H:%M:%S", time.localtime(t))


def run_phase(snap: RunSnapshot) -> str:
    """What a running run is doing, as its files say."""
    if not snap.planned:
        return "audit and shard"
    if not set(snap.planned) <= set(snap.finished):
        return "generate"
    return "validate, merge, re-audit and after"


def run_header(marker: RunMarker, state: str, snap: RunSnapshot) -> str:
    """The run ``regen status`` describes, and whether it is running, ended or dead."""
    if state == "running":
        if marker.phase in ("check", "settle"):
            return f"run: {marker.describe()}: running, phase check (config and inputs)"
        return f"run: {marker.describe()}: running, phase {run_phase(snap)}"
    if state == "starting":
        return (
            f"run: a new run is starting here (Snakemake builds its plan before it writes the run marker); "
            f"the last one, {marker.describe()}, is over"
        )
    if state == "dead":
        return (
            f"run: {marker.describe()}: DEAD (its controller is gone; last heartbeat "
            f"{_clock(marker.heartbeat_at)}): rerun the same snakemake command to resume"
        )
    how = "finished" if marker.outcome == "finished" else "stopped before its end (failed or stopped)"
    return f"run: {marker.describe()}: ended {_clock(marker.ended_at)}, {how}"


def stopped(statuses: list[ShardStatus]) -> list[ShardStatus]:
    """The shard statuses of a run no longer running: nothing in flight, no rate, no ETA."""
    return [
        st
        if st.finished
        else dataclasses.replace(
            st, in_flight=0, retrying=0, req_s=0.0, out_tok_s=0.0, eta_s=None, oldest_in_flight_at=None
        )
        for st in statuses
    ]


def replay_lines(layout: RunLayout, snap: RunSnapshot) -> list[str]:
    """What the generate jobs of this run found at their start (``regen.generate.replay``): replayed
    from the journals and to generate, in all and per shard."""
    notes = [n for n in ShardReplay.read_all(layout) if not snap.planned or n.shard in snap.planned]
    if not notes:
        return []
    per_shard = ", ".join(f"{n.shard} {n.replayed}+{n.to_generate}" for n in notes[:8])
    more = f", ... ({len(notes)} shards)" if len(notes) > 8 else ""
    return [
        f"journals: {sum(n.replayed for n in notes)} replayed, {sum(n.to_generate for n in notes)} to "
        f"generate in the shards started (replayed+to generate: {per_shard}{more})"
    ]


def newer_controller(project: Path, since: float) -> tuple[int, float] | None:
    """(pid, start time) of a live Snakemake on this host working in ``project`` that started after
    ``since``: a rerun still building its DAG, before its ``onstart`` writes the run marker (issue 58 item 6:
    for that while the marker still names the killed run)."""
    import psutil

    where = project.resolve()
    for proc in psutil.process_iter(["pid", "cmdline", "create_time"]):
        try:
            argv, started = proc.info["cmdline"] or [], proc.info["create_time"] or 0.0
            if started <= since or not any(Path(a).name == "snakemake" or a == "snakemake" for a in argv):
                continue
            if Path(proc.cwd()).resolve() == where:
                return proc.info["pid"], started
        except (psutil.Error, OSError):
            continue
    return None


def run_state(layout: RunLayout, now: float) -> tuple[RunMarker | None, str | None]:
    """The run marker and its state (``running``, ``ended``, ``dead``, or ``starting``: the marker's run
    is over and a newer Snakemake works here, not yet past its check), or (None, None) without one."""
    marker = RunMarker.read(layout.run_marker)
    if marker is None:
        return None, None
    state = marker.liveness(now)
    if state != "running" and newer_controller(layout.work.parent, marker.started_at) is not None:
        return marker, "starting"
    return marker, state


def status_variant_lines(layout: RunLayout) -> list[str]:
    """Completions, lengths, finish reasons and truncation (in the reasoning, in the answer) per sampling
    variant: the re-audit's once it has run, else the validated shards written so far; none on a run of
    one implicit variant."""
    summary = read_json(layout.reaudit_summary) if layout.reaudit_summary.is_file() else {}
    if summary.get("variants"):
        variants, source = summary["variants"], "the merged dataset, re-audited"
    else:
        valid = [p for p in (layout.valid(s) for s in layout.finished_shards()) if p.is_file()]
        variants, source = valid_breakdown(valid), f"{len(valid)} validated shard(s)"
    if list(variants) in ([], ["default"]):
        return []
    return variant_lines(variants, source)


def status_report(workdir: Path, results: Path, now: float | None = None, rate: float | None = None) -> str:
    """Gather every source and render the table."""
    layout = RunLayout(results=Path(results), work=Path(workdir))
    t_now = time.time() if now is None else now
    marker, state = run_state(layout, t_now)
    snap = RunSnapshot.read(layout.work, layout.results)
    header = "" if marker is None or state is None else run_header(marker, state, snap) + "\n\n"
    if state == "starting" or (
        marker is not None and state == "running" and marker.phase in ("check", "settle")
    ):
        return header + "(its shards show once its check is done: the files here may be an earlier run's)\n"
    statuses = snap.statuses if state in (None, "running") else stopped(snap.statuses)
    servers = read_servers(layout.servers_root)
    text = render_table(
        statuses, servers, snap.planned, snap.finished, t_now, rate if state != "dead" else 0.0
    )
    totals = run_totals(statuses, snap.planned, snap.finished, t_now, rate)
    left = totals.remaining if snap.statuses else None
    extra = replay_lines(layout, snap) + projection_lines(layout.pilot, left) + stage_lines(layout, t_now)
    extra += status_variant_lines(layout)
    return header + text + "".join(line + "\n" for line in extra)


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
    """Redraw the status in place every ``every_s`` seconds until the run ends, dies or is stopped (or
    Ctrl-C)."""
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
            marker, state = run_state(RunLayout(results=Path(results), work=Path(workdir)), now)
            if marker is None:  # no run marker (a run of an earlier regen): until every shard is finished
                done = bool(snap.planned) and set(snap.planned) <= set(snap.finished)
            else:
                done = state not in ("running", "starting")
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
        help="refresh in place every SECONDS (default 5) until the run ends, dies or is stopped",
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
        from regen.generate.replay import preview_lines  # reads the dataset and the journals: only when asked
        from regen.ingest.dataset import DatasetConfig
        from regen.runconfig import RunConfig, config_section

        try:
            config = load_workflow_config(args.configfile)
        except ValueError as exc:  # ConfigFileError: one line per config error, naming key and file
            print(f"regen status: {exc}", file=sys.stderr)
            return 2
        layout = RunLayout(results=args.results, work=args.workdir)
        lines = preview_lines(
            RunConfig.from_config(config),
            DatasetConfig.from_dict(config_section(config, "dataset")),
            layout.journal_shards(),
            layout,
        )
        text += "\n" + "".join(line + "\n" for line in lines)
    stream.write(text)
    return 0


def load_workflow_config(paths: list[Path]) -> dict[str, Any]:
    """The config Snakemake would see: the files merged in order, validated, defaults filled in."""
    from regen.configfile import load_config

    return load_config(paths)


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
