"""regen status: the table from status files, shard files and a live (simulated) server's /metrics."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import pytest

from regen.io import write_json
from regen.sglang.server import acquire_server, port_is_free, stop_all_servers
from regen.status import cli, parse_prometheus, run_totals, status_report


def write_status(
    work: Path, shard: str, server: str, done: int, total: int, req_s: float, **extra: object
) -> None:
    write_json(
        work / "status" / f"{shard}.json",
        {
            "shard": shard,
            "server": {"id": server, "url": "http://127.0.0.1:1"},
            "done": done,
            "total": total,
            "failed": extra.get("failed", 0),
            "truncated": 0,
            "req_s": req_s,
            "out_tok_s": req_s * 100,
            "eta_s": None,
            "updated_at": extra.get("updated_at", time.time()),
            **({"finished": True} if extra.get("finished") else {}),
        },
    )


def make_run(root: Path) -> None:
    work, results = root / "work", root / "results"
    (results / "shards").mkdir(parents=True)
    (results / "generations").mkdir(parents=True)
    for shard in ("00000", "00001", "00002", "00003"):
        (results / "shards" / f"{shard}.parquet").write_bytes(b"")
    (results / "generations" / "00000.jsonl").write_text("{}\n")
    (results / "generations" / "00000.failed.jsonl").write_text("")
    write_status(work, "00000", "gpu0", 100, 100, 5.0, finished=True, failed=2)
    write_status(work, "00001", "gpu0", 30, 100, 2.0)
    write_status(work, "00002", "gpu1", 10, 50, 1.0)


def test_table_from_status_files_without_servers(tmp_path: Path) -> None:
    make_run(tmp_path)
    text = status_report(tmp_path / "work", tmp_path / "results")
    lines = text.splitlines()
    gpu0 = next(line for line in lines if line.startswith("gpu0"))
    gpu1 = next(line for line in lines if line.startswith("gpu1"))
    assert "00001" in gpu0 and "30/100" in gpu0 and "00000" not in gpu0
    assert "00002" in gpu1 and "10/50" in gpu1
    assert "shards: 1/4 finished" in text
    # 3 known shard sizes (100, 100, 50); the unstarted 4th counts at their mean
    expected_total = round(100 + 100 + 50 + 250 / 3)
    assert f"samples: 140/{expected_total}" in text and "2 failed" in text and "3.0 req/s" in text
    eta = (100 + 100 + 50 + 250 / 3 - 140) / 3.0
    secs = round(eta)
    assert f"ETA {secs // 60}m{secs % 60:02d}s" in text


def test_stale_status_is_marked_and_excluded_from_rate(tmp_path: Path) -> None:
    make_run(tmp_path)
    write_status(tmp_path / "work", "00002", "gpu1", 10, 50, 1.0, updated_at=time.time() - 3600)
    text = status_report(tmp_path / "work", tmp_path / "results")
    assert "00002 (stale)" in text and "2.0 req/s" in text


def test_empty_run_renders(tmp_path: Path) -> None:
    out = io.StringIO()
    assert cli(["--workdir", str(tmp_path / "w"), "--results", str(tmp_path / "r")], out=out) == 0
    assert "no GPU server or shard in progress" in out.getvalue()
    assert "shards: 0/0 finished" in out.getvalue() and "ETA ?" in out.getvalue()


def test_parse_prometheus_sums_label_sets() -> None:
    text = (
        "# HELP sglang:num_running_reqs running\n"
        '# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{tp_rank="0"} 3.0\n'
        'sglang:num_running_reqs{tp_rank="1"} 2\nsglang:num_queue_reqs 4\nother 9\n'
    )
    assert parse_prometheus(text) == {"sglang:num_running_reqs": 5.0, "sglang:num_queue_reqs": 4.0}


def test_run_totals_unknown_without_any_total() -> None:
    t = run_totals([], planned={"00000"}, finished=set(), now=time.time())
    assert t.total is None and t.eta_s is None


def test_live_server_metrics_in_table(tmp_workdir: Path) -> None:
    make_run(tmp_workdir)
    base = next(p for p in range(31700, 31800) if port_is_free("127.0.0.1", p))
    cfg = {
        "mode": "simulated",
        "port_base": base,
        "idle_timeout_s": 30,
        "startup_timeout_s": 20,
        "simulated": {"startup_delay_s": 0.1, "token_rate": 0},
    }
    try:
        with acquire_server(cfg, None, owner_pid=os.getpid(), poll_s=0.05):
            text = status_report(tmp_workdir / "work", tmp_workdir / "results")
    finally:
        stop_all_servers(tmp_workdir / "work/servers", grace_s=5)
    gpu0 = next(line for line in text.splitlines() if line.startswith("gpu0"))
    cells = gpu0.split()
    assert cells[1] == "ready"
    # running and queued come from /metrics: numbers, not the '-' shown without a server
    assert cells[-4].isdigit() and cells[-3].isdigit(), gpu0
    gpu1 = next(line for line in text.splitlines() if line.startswith("gpu1"))
    assert gpu1.split()[1] == "-"


if __name__ == "__main__":
    pytest.main([__file__])
