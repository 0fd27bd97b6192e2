"""Issue 47 item 8: the report's first page gives wall time, GPU-hours, output tokens/s and what was
left out by reason; the throughput plot draws lines, not isolated points, for a run of any length."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import orjson
import pytest
import zstandard
from test_report import build_results, make_record

from regen.observe import report as R
from regen.observe.plots import bucket_for, throughput_series
from regen.observe.run_numbers import duration, gpus_per_server

SVG = "{http://www.w3.org/2000/svg}"


def _records(path: Path, recs: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(zstandard.compress(b"".join(orjson.dumps(r) + b"\n" for r in recs)))
    return path


def _busy_servers(span_s: float, latency_s: float, servers: int = 2, in_flight: int = 3) -> list[dict]:
    """Each server busy from 0 to ``span_s`` with ``in_flight`` requests of ``latency_s`` back to back."""
    recs, i = [], 0
    for s in range(servers):
        for lane in range(in_flight):
            t = lane * latency_s / in_flight
            while t + latency_s <= span_s:
                recs.append(make_record(i, f"gpu{s}", 1_000_000.0 + t, latency_s, 100))
                t += latency_s
                i += 1
    return recs


def _longest_run(values: np.ndarray) -> int:
    """The longest stretch of consecutive finite, non-zero buckets (a drawn line needs two)."""
    best = run = 0
    for v in values:
        run = run + 1 if v > 0 else 0
        best = max(best, run)
    return best


@pytest.mark.parametrize(
    ("span_s", "latency_s"),
    [(8.0, 0.1), (20.0, 0.6), (50.0, 2.0), (1200.0, 30.0), (36_000.0, 200.0)],
    ids=["8s", "20s-demo", "50s", "20min", "10h"],
)
def test_throughput_draws_lines_for_a_run_of_any_length(
    tmp_path: Path, span_s: float, latency_s: float
) -> None:
    path = _records(tmp_path / "generations" / "00000.jsonl.zst", _busy_servers(span_s, latency_s))
    bucket_s, series = throughput_series([path])
    assert span_s / 60 * 0.9 <= bucket_s <= span_s / 60  # a sixtieth of the records' span
    for server, values in series.items():
        # a server busy throughout is in flight in every bucket but perhaps the ragged last one
        assert _longest_run(values) >= len(values) - 1 >= 10, (server, bucket_s, values)
    out = tmp_path / "throughput.svg"
    R.plot_throughput([path], out)
    root = ET.parse(out).getroot()
    lines = [g for g in root.iter(f"{SVG}g") if (g.get("id") or "").startswith("line2d")]
    drawn = [p.get("d", "") for g in lines for p in g.iter(f"{SVG}path")]
    assert sum(1 for d in drawn if d.count(" L ") >= 10) >= 2, "each server's line has its segments"
    unit = "seconds" if span_s < 180 else ("minutes" if span_s < 3 * 3600 else "hours")
    assert f"{unit} since first request" in out.read_text()


def test_a_run_of_seconds_gets_more_than_two_buckets(tmp_path: Path) -> None:
    """What issue 47 saw on the demo: a generation of about two seconds in one-second buckets (the old
    floor) is two points per server, which no line joins; the bucket now follows the run's length."""
    path = _records(tmp_path / "g" / "00000.jsonl.zst", _busy_servers(2.0, 0.1))
    _, old = throughput_series([path], bucket_s=1.0)
    assert max(len(v) for v in old.values()) <= 2
    bucket_s, new = throughput_series([path])
    assert bucket_s <= bucket_for(2.0) and min(len(v) for v in new.values()) >= 50


def test_first_page_gives_wall_time_gpu_hours_tok_s_and_reasons(tmp_path: Path) -> None:
    results = build_results(tmp_path / "results")  # 12 records of 10 s from 1000 s, one quarantined
    reasons = {"duplicate_prompt": 2, "bad_row": 4}
    summary = {
        "total": 20,
        "kept": 14,
        "excluded": 6,
        "excluded_reasons": reasons,
        "passed": True,
        "gates": {},
    }
    (results / "audit" / "summary.json").write_bytes(orjson.dumps(summary))
    plan = orjson.loads((results / "plan" / "server.json").read_bytes())
    plan["recommended"]["tp"] = 2
    (results / "plan" / "server.json").write_bytes(orjson.dumps(plan))
    (results / "generations" / "00000.failed.jsonl").write_bytes(b'{"id": "x", "reason": "timeout"}\n')
    paths = R.write_report_assets(results, tmp_path / "assets", tmp_path / "work")
    landing = paths[R.LANDING_RST].read_text()
    # records start at 1000..1012 (i), last ends 1011 + 10 = 1021: 21 s; gpu0 1000-1020, gpu1 1001-1021
    assert "wall time of generation: 21.0 s" in landing, landing
    tokens = 6 * 100 + 6 * 200 + 10  # gpu0 rows 100, gpu1 rows 200, the quarantined one 10
    assert f"output tokens/s: {tokens / 21:,.0f} ({tokens:,} completion tokens" in landing
    assert f"GPU-hours: {2 * 2 * 20 / 3600:,.3g} (2 server(s) x 2 GPU(s)" in landing
    reasons = re.search(r"excluded or left out, by reason: (.*)", landing)
    assert reasons is not None
    assert reasons[1].startswith(
        "input audit 6 (bad\\_row 4, duplicate\\_prompt 2); generation 1 (timeout 1)"
    )
    assert reasons[1].endswith("; validation 2 (truncated\\_in\\_reasoning 1, unparsable\\_json 1)")
    # the numbers come before the stage lines
    assert landing.index("wall time") < landing.index("1. Input audit")


def test_numbers_that_cannot_be_known_say_so(tmp_path: Path) -> None:
    paths = R.write_report_assets(tmp_path / "nothing", tmp_path / "assets", tmp_path / "work")
    landing = paths[R.LANDING_RST].read_text()
    assert "no generation records, so no wall time, GPU-hours or tokens/s" in landing
    assert "input audit none; generation none; validation none" in landing
    assert gpus_per_server({"external": True, "launch_args": ["--tp", "2"]}) is None
    assert (
        gpus_per_server({"launched": "given", "given": {}, "launch_args": ["--tp-size=4", "--dp", "2"]}) == 8
    )
    assert [duration(s) for s in (42.34, 725, 11_220)] == ["42.3 s", "12 min 5 s", "3 h 07 min"]


def test_a_failed_runs_first_page_counts_exclusions_from_the_kept_verdict(tmp_path: Path) -> None:
    """A failed audit's outputs are deleted; its verdict beside the log still gives the reasons."""
    from regen.layout.run import RunLayout
    from regen.observe.landing import RunFacts

    layout = RunLayout.under(tmp_path)
    layout.verdict("audit").parent.mkdir(parents=True)
    verdict = {"total": 60, "kept": 0, "excluded": 60, "excluded_reasons": {"bad_row": 60}, "passed": True}
    layout.verdict("audit").write_bytes(orjson.dumps(verdict))
    page = R.write_failed_run_landing(layout, RunFacts(mode="simulated"), "x.log").read_text()
    assert page.startswith("**NOT READY**")
    assert "excluded or left out, by reason: input audit 60 (bad\\_row 60)" in page, page
