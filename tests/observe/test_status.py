"""regen status: the table from status files, shard files and a live (simulated) server's /metrics."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import threading
import time
import urllib.request
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from regen.generate.journal import Journal
from regen.generate.run_progress import RunSnapshot, progress_line, run_totals
from regen.io import write_json
from regen.layout.run import RunLayout
from regen.observe.status import METRIC_NAMES, RateWindow, cli, status_report, watch
from regen.records import ShardStatus
from regen.runconfig import ServerConfig
from regen.serving.lifecycle import acquire_server, stop_all_servers
from regen.serving.metrics import sum_prometheus
from regen.serving.ports import port_is_free


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
            "retrying": extra.get("retrying", 0),
            "in_flight": extra.get("in_flight", 0),
            "oldest_in_flight_at": extra.get("oldest_in_flight_at"),
            **({"finished": True} if extra.get("finished") else {}),
        },
    )


SHARD_ROWS = {"00000": 100, "00001": 100, "00002": 50, "00003": 80}


def finish_shard(root: Path, shard: str, records: list[str], failed: list[str]) -> None:
    """A shard's outputs as its generate job writes them: the journal finalized into the layout's
    records (compressed) and failures."""
    layout = RunLayout.under(root)
    with Journal.open(layout.journal(shard)) as journal:
        for sample_id in records:
            journal.append({"kind": "record", "id": sample_id, "fingerprint": "f"})
        for sample_id in failed:
            journal.append({"kind": "failed", "id": sample_id, "fingerprint": "f", "reason": "x"})
        current = dict.fromkeys([*records, *failed], "f")
        journal.finalize(layout.records(shard), layout.failed(shard), current)


def make_run(root: Path) -> None:
    """4 planned shards (exact sizes in their Parquet footers): 00000 finished with 2 failed samples,
    00001 and 00002 in progress, 00003 not started."""
    work, results = root / "work", root / "results"
    (results / "shards").mkdir(parents=True)
    (results / "generations").mkdir(parents=True)
    for shard, rows in SHARD_ROWS.items():
        pq.write_table(
            pa.table({"id": [f"{shard}-{i}" for i in range(rows)]}), results / "shards" / f"{shard}.parquet"
        )
    finish_shard(root, "00000", records=["r"], failed=["a", "b"])
    write_status(work, "00000", "gpu0", 100, 100, 5.0, finished=True, failed=2, updated_at=time.time() - 5)
    write_status(
        work, "00001", "gpu0", 30, 100, 2.0, retrying=3, in_flight=8, oldest_in_flight_at=time.time() - 75
    )
    write_status(work, "00002", "gpu1", 10, 50, 1.0, in_flight=4)


def test_table_from_status_files_without_servers(tmp_path: Path) -> None:
    make_run(tmp_path)
    now = time.time()
    text = status_report(tmp_path / "work", tmp_path / "results", now=now)
    lines = text.splitlines()
    gpu0 = next(line for line in lines if line.startswith("gpu0"))
    gpu1 = next(line for line in lines if line.startswith("gpu1"))
    assert "00001" in gpu0 and "30/100" in gpu0 and "00000" not in gpu0
    assert gpu0.split()[5:8] == ["3", "8", "1m15s"]  # retrying, in flight, oldest request
    assert "00002" in gpu1 and "10/50" in gpu1
    assert "shards: 1/4 finished" in text
    # exact total from the shard files, unstarted shard included; done counts the finished shard whole
    assert "samples: 140/330 (42.4%) done, 2 failed, 3 retrying, 12 in flight, oldest 1m15s" in text
    assert "3.0 req/s" in text
    eta = (330 - 140) / 3.0
    clock = time.strftime("%H:%M", time.localtime(now + eta))
    assert f"ETA {clock} (in {round(eta) // 60}m{round(eta) % 60:02d}s)" in text


def test_totals_do_not_move_as_shards_start(tmp_path: Path) -> None:
    make_run(tmp_path)
    before = RunSnapshot.read(tmp_path / "work", tmp_path / "results").totals(time.time())
    write_status(tmp_path / "work", "00003", "gpu1", 0, 80, 0.0)
    after = RunSnapshot.read(tmp_path / "work", tmp_path / "results").totals(time.time())
    assert before.total == after.total == sum(SHARD_ROWS.values())


def test_eta_between_shards_uses_the_gpu_last_rate(tmp_path: Path) -> None:
    """The GPU just finished a shard and has not reported the next one: the ETA stays known."""
    make_run(tmp_path)
    for shard in ("00001", "00002"):
        (tmp_path / "work" / "status" / f"{shard}.json").unlink()
    t = RunSnapshot.read(tmp_path / "work", tmp_path / "results").totals(time.time())
    assert t.req_s == 5.0 and t.eta_s is not None and abs(t.eta_s - (330 - 100) / 5.0) < 1e-6


def test_watch_rate_falls_when_retries_stall_progress() -> None:
    window = RateWindow(window_s=120)
    assert window.add(1000.0, 100) is None  # not enough span yet
    assert window.add(1030.0, 400) == 10.0
    assert window.add(1090.0, 400) == pytest.approx(300 / 90)  # stalled for a minute: the rate drops
    assert window.add(1200.0, 400) == 0.0  # the window holds only the stall now


def test_progress_line_and_watch(tmp_path: Path) -> None:
    make_run(tmp_path)
    line = progress_line(tmp_path / "work", tmp_path / "results")
    assert line.startswith("regen: shards 1/4; samples: 140/330") and "\n" not in line
    out = io.StringIO()
    assert watch(tmp_path / "work", tmp_path / "results", 0.5, out, max_frames=2) == 0
    assert out.getvalue().count("regen status") == 2 and "samples: 140/330" in out.getvalue()


def test_a_finished_run_counts_every_shard_and_watch_exits(tmp_path: Path) -> None:
    make_run(tmp_path)
    for shard, rows in SHARD_ROWS.items():
        if shard != "00000":
            finish_shard(tmp_path, shard, records=[f"{shard}-{i}" for i in range(rows)], failed=[])
            write_status(tmp_path / "work", shard, "gpu1", rows, rows, 1.0, finished=True)
    text = status_report(tmp_path / "work", tmp_path / "results")
    assert "shards: 4/4 finished" in text and "samples: 330/330 (100.0%) done, 2 failed" in text
    out = io.StringIO()
    assert watch(tmp_path / "work", tmp_path / "results", 0.5, out) == 0  # no frame limit: it ends
    assert out.getvalue().count("regen status") == 1


def test_stale_status_is_marked_and_excluded_from_rate(tmp_path: Path) -> None:
    make_run(tmp_path)
    write_status(tmp_path / "work", "00002", "gpu1", 10, 50, 1.0, updated_at=time.time() - 3600)
    text = status_report(tmp_path / "work", tmp_path / "results")
    assert "00002 (stale)" in text and "2.0 req/s" in text


def test_empty_run_renders(tmp_path: Path) -> None:
    out = io.StringIO()
    assert cli(["--workdir", str(tmp_path / "w"), "--results", str(tmp_path / "r")], out=out) == 0
    assert "no GPU server or shard in progress" in out.getvalue()
    assert "shards: 0/0 finished" in out.getvalue()


def test_sum_prometheus_sums_label_sets() -> None:
    text = (
        "# HELP sglang:num_running_reqs running\n"
        '# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{tp_rank="0"} 3.0\n'
        'sglang:num_running_reqs{tp_rank="1"} 2\nsglang:num_queue_reqs 4\nother 9\n'
    )
    assert sum_prometheus(text, METRIC_NAMES) == {
        "sglang:num_running_reqs": 5.0,
        "sglang:num_queue_reqs": 4.0,
    }


def test_status_record_reads_old_files_and_round_trips(tmp_path: Path) -> None:
    """A status file of an older client (no in-flight fields, no ``finished``) still reads; a record
    written by the client reads back as the same record."""
    old = {"shard": "00003", "server": {"id": "gpu1", "url": "http://h:1"}, "done": 4, "total": 10,
           "failed": 1, "truncated": 0, "req_s": 2.5, "out_tok_s": 30.0, "eta_s": None,
           "updated_at": 5.0}  # fmt: skip
    st = ShardStatus.from_json(old, tmp_path / "00003.json")
    assert (st.done, st.total, st.server_id, st.finished, st.in_flight, st.oldest_in_flight_at) == (
        4, 10, "gpu1", False, 0, None)  # fmt: skip
    assert "finished" not in st.to_json() and st.to_json()["server"] == old["server"]
    done = dataclasses.replace(st, finished=True, in_flight=3, oldest_in_flight_at=4.5)
    assert done.to_json()["finished"] is True
    assert ShardStatus.from_json(done.to_json(), tmp_path / "x.json") == done
    with pytest.raises(ValueError, match=r"00003.json: bad status field"):
        ShardStatus.from_json({**old, "done": "many"}, tmp_path / "00003.json")


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
        with acquire_server(ServerConfig.from_mapping(cfg), None, owner_pid=os.getpid(), poll_s=0.05):
            text = status_report(tmp_workdir / "work", tmp_workdir / "results")
    finally:
        stop_all_servers(tmp_workdir / "work/servers", grace_s=5)
    gpu0 = next(line for line in text.splitlines() if line.startswith("gpu0"))
    cells = gpu0.split()
    assert cells[1] == "ready"
    # running and queued come from /metrics: numbers, not the '-' shown without a server
    assert cells[-4].isdigit() and cells[-3].isdigit(), gpu0  # running, queued (then "Ns ago")
    gpu1 = next(line for line in text.splitlines() if line.startswith("gpu1"))
    assert gpu1.split()[1] == "-"


def test_stalled_server_is_shown_stalled_with_since_when_before_its_restart(tmp_workdir: Path) -> None:
    """A server that takes requests and generates nothing: ``regen status`` says so (and since when)
    while its supervisor waits out server.stall_timeout_s, then the supervisor restarts it."""
    base = next(p for p in range(31800, 31900) if port_is_free("127.0.0.1", p))
    cfg = {
        "mode": "simulated",
        "port_base": base,
        "idle_timeout_s": 30,
        "startup_timeout_s": 20,
        "stall_timeout_s": 6,
        "simulated": {"startup_delay_s": 0.1, "token_rate": 10},
    }
    restarts = tmp_workdir / "work/servers/gpu0.restarts.jsonl"
    try:
        with acquire_server(ServerConfig.from_mapping(cfg), None, owner_pid=os.getpid(), poll_s=0.05) as ep:
            for i in range(3):  # requests in flight (at 10 tok/s they run for seconds), then the stall
                threading.Thread(target=post, args=(ep.url + "/v1/chat/completions", i), daemon=True).start()
            while json.loads(urllib.request.urlopen(ep.url + "/_sim/stats", timeout=5).read())["running"] < 3:
                time.sleep(0.05)
            post(ep.url + "/_sim/stall")
            stalled_at = time.time()
            deadline = time.monotonic() + 6
            text = ""
            while "stalled since" not in text and time.monotonic() < deadline:
                text = status_report(tmp_workdir / "work", tmp_workdir / "results")
                time.sleep(0.2)
            assert not restarts.exists(), "shown stalled before the restart"
            gpu0 = next(line for line in text.splitlines() if line.startswith("gpu0 "))
            since = time.strftime("%H:%M:%S", time.localtime(stalled_at))
            assert (
                "stalled since" in gpu0 and abs(_seconds(gpu0.split("since ")[1][:8]) - _seconds(since)) <= 2
            )
            assert re.search(
                r"gpu0: no tokens generated for \d+ s with 3 requests in flight; mamba usage", text
            )
            deadline = time.monotonic() + 10
            while not restarts.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert "no tokens generated" in restarts.read_text()
    finally:
        stop_all_servers(tmp_workdir / "work/servers", grace_s=5)


def post(url: str, i: int = 0) -> None:
    body = json.dumps({"messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 50}).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    with contextlib.suppress(OSError):
        urllib.request.urlopen(req, timeout=30).read()


def _seconds(hms: str) -> int:
    h, m, s = (int(x) for x in hms.split(":"))
    return h * 3600 + m * 60 + s


if __name__ == "__main__":
    pytest.main([__file__])
