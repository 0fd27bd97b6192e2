"""``regen status``: one table of a generation run's progress, per GPU server and overall.

Sources (all optional, so it works with no server running):
``work/status/{shard}.json`` (written by the client), each live server's ``/metrics``
(found through ``work/servers/gpu{k}.url``), finished ``results/generations/*.jsonl`` and planned
``results/shards/*.parquet``.
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
from regen.layout import RunLayout, url_files
from regen.projection import fmt_duration, project
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
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: bad status field: {exc}") from exc


@dataclass(frozen=True, slots=True)
class ServerView:
    """A GPU slot's server as seen now: url file state and its /metrics (None when unreachable)."""

    server_id: str
    url: str | None
    state: str  # ready | starting | failed | gone
    running: float | None = None
    queued: float | None = None
    gen_throughput: float | None = None


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
        views.append(
            ServerView(
                sid,
                state.url,
                "ready",
                running=metrics.get("sglang:num_running_reqs"),
                queued=metrics.get("sglang:num_queue_reqs"),
                gen_throughput=metrics.get("sglang:gen_throughput"),
            )
        )
    return views


def _server_id(url_file: Path, servers_dir: Path) -> str:
    """``gpu{k}`` for a per-node slot, ``slurm-{job}/gpu{k}`` for a per-Slurm-job one."""
    return url_file.stem if url_file.parent == servers_dir else f"{url_file.parent.name}/{url_file.stem}"


def _slot_key(server_id: str) -> tuple[int, str]:
    digits = re.sub(r"\D", "", server_id)
    return (int(digits) if digits else 1 << 30, server_id)


@dataclass(frozen=True, slots=True)
class RunTotals:
    planned_shards: int
    finished_shards: int
    done: int
    total: int | None
    failed: int
    req_s: float
    eta_s: float | None


def run_totals(statuses: list[ShardStatus], planned: set[str], finished: set[str], now: float) -> RunTotals:
    """Whole-run progress; shards not started yet are counted at the mean size of the known ones."""
    by_shard = {s.shard: s for s in statuses}
    known_totals = [s.total for s in statuses if s.total is not None]
    mean_total = sum(known_totals) / len(known_totals) if known_totals else None
    shards = planned | finished | set(by_shard)
    done = sum(s.done for s in statuses)
    total: float | None = 0.0
    for shard in shards:
        st = by_shard.get(shard)
        size = st.total if st is not None and st.total is not None else mean_total
        if size is None:
            total = None
            break
        total += size
    active = [
        s
        for s in statuses
        if not s.finished and s.shard not in finished and now - s.updated_at < STALE_AFTER_S
    ]
    rate = sum(s.req_s for s in active)
    eta = (total - done) / rate if total is not None and rate > 0 else None
    return RunTotals(
        planned_shards=len(planned),
        finished_shards=len(finished),
        done=done,
        total=None if total is None else round(total),
        failed=sum(s.failed for s in statuses),
        req_s=rate,
        eta_s=None if eta is None else max(0.0, eta),
    )


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}"


def render_table(
    statuses: list[ShardStatus], servers: list[ServerView], planned: set[str], finished: set[str], now: float
) -> str:
    """The status table (per GPU, then the whole run) as text."""
    server_by_id = {v.server_id: v for v in servers}
    in_progress: dict[str, ShardStatus] = {}
    for st in sorted(statuses, key=lambda s: s.updated_at):
        if st.finished or st.shard in finished or st.server_id is None:
            continue
        in_progress[st.server_id] = st  # the most recently updated shard on that server
    ids = sorted(set(server_by_id) | set(in_progress), key=_slot_key)
    header = (
        "gpu",
        "server",
        "shard",
        "done/total",
        "failed",
        "req/s",
        "out tok/s",
        "running",
        "queued",
        "updated",
    )
    rows: list[tuple[str, ...]] = [header]
    for sid in ids:
        view = server_by_id.get(sid)
        st = in_progress.get(sid)
        age = None if st is None else now - st.updated_at
        rows.append(
            (
                sid,
                "-" if view is None else view.state,
                "-"
                if st is None
                else st.shard + (" (stale)" if age is not None and age > STALE_AFTER_S else ""),
                "-" if st is None else f"{st.done}/{'?' if st.total is None else st.total}",
                "-" if st is None else str(st.failed),
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
    t = run_totals(statuses, planned, finished, now)
    total = "?" if t.total is None else str(t.total)
    pct = f" ({100.0 * t.done / t.total:.1f}%)" if t.total else ""
    lines.append("")
    lines.append(f"shards: {t.finished_shards}/{t.planned_shards} finished")
    eta = fmt_duration(t.eta_s)
    lines.append(f"samples: {t.done}/{total}{pct} done, {t.failed} failed, {t.req_s:.1f} req/s, ETA {eta}")
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


def status_report(workdir: Path, results: Path, now: float | None = None) -> str:
    """Gather every source and render the table."""
    layout = RunLayout(results=Path(results), work=Path(workdir))
    statuses = read_shard_statuses(layout.status_dir)
    servers = read_servers(layout.servers_root)
    planned = shard_names(layout.shards_dir, ".parquet")
    finished = shard_names(layout.generations_dir, ".jsonl")
    t_now = time.time() if now is None else now
    text = render_table(statuses, servers, planned, finished, t_now)
    totals = run_totals(statuses, planned, finished, t_now)
    left = None if totals.total is None or not statuses else totals.total - totals.done
    extra = projection_lines(layout.pilot, left)
    return text + "".join(line + "\n" for line in extra)


def cli(argv: list[str], out: TextIO | None = None) -> int:
    p = argparse.ArgumentParser(prog="regen status", description="progress of a generation run")
    p.add_argument("--workdir", type=Path, default=Path("work"), help="working directory (default: work)")
    p.add_argument(
        "--results", type=Path, default=Path("results"), help="results directory (default: results)"
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
    text = status_report(args.workdir, args.results)
    if args.configfile:
        from regen.replay import preview_lines  # reads the dataset and the journals: only when asked

        config = load_workflow_config(args.configfile)
        journals = sorted(str(j) for j in (args.workdir / "journal").glob("*.jsonl"))
        text += "\n" + "".join(line + "\n" for line in preview_lines(config, journals, str(args.results)))
    (out or sys.stdout).write(text)
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
