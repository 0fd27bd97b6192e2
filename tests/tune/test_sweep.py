"""regen tune --sweep: live benchmark of candidate configs against simulated servers, and the projection.

The simulated servers run the batch throughput model (``half_speed_running``): with N running requests
each decodes at ``token_rate / (1 + N / half)``, so total output tok/s is ``N * token_rate / (1 + N / half)``.
The winner of a sweep is therefore known from each candidate's cap, without hard-coding it.
"""

from __future__ import annotations

import io
import json
import os
import socket
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.length_proxy import LengthProxy, behind_proxy
from regen.ingest.shards import write_shards
from regen.observe.report import write_report_assets
from regen.observe.status import status_report
from regen.pilot_file import PilotFile
from regen.runconfig import GenerateConfig, ServerConfig
from regen.serving.lifecycle import live_supervisors
from regen.serving.metrics import METHOD_LOG, SteadyState
from regen.serving.ports import port_is_free
from regen.simulated.launcher import start_simulated_server
from regen.simulated.options import OPTIONS_ENV
from regen.tune.closedloop import StepModel
from regen.tune.pilot import (
    CandidateResult,
    LengthStats,
    PilotMeasurement,
    SweepCandidate,
    SweepError,
    SweepResult,
    choose,
    cycled,
    drive_pilot,
    mtp_decision,
    percentile,
)
from regen.tune.projection import Remaining, count_remaining, project
from regen.tune.sweep import SweepTimes, pilot_report, run_sweep, with_speculative_steps, write_pilot
from regen.tune.tune import cli as tune_cli
from regen.types import Endpoint, Message, Sample

TOKEN_RATE = 1000.0
HALF = 16
GENERATE = {
    "sampling": {"max_tokens": 256},
    "request_timeout_s": 30,
    "max_attempts": 2,
    "backoff_base_s": 0.05,
}
SECONDS = 2.5
MODELS = Path(__file__).parents[2] / "resources" / "models"


def model_tok_s(cap: int) -> float:
    """Total output tok/s of the simulated batch model at ``cap`` running requests."""
    return cap * TOKEN_RATE / (1 + cap / HALF)


def make_samples(n: int, prefix: str = "s") -> list[Sample]:
    return [
        Sample(f"{prefix}{i}", (Message("user", f"question {i} " * 4), Message("assistant", "old answer")))
        for i in range(n)
    ]


def free_base() -> int:
    return next(p for p in range(32100, 32400, 7) if port_is_free("127.0.0.1", p))


def typed_server(port_base: int, **sim: Any) -> ServerConfig:
    return ServerConfig.from_mapping(server_cfg(port_base, **sim))


TYPED_GENERATE = GenerateConfig.from_dict(GENERATE)


def server_cfg(port_base: int, **sim: Any) -> dict[str, Any]:
    return {
        "mode": "simulated",
        "port_base": port_base,
        "idle_timeout_s": 30,
        "startup_timeout_s": 20,
        "max_restarts": 0,
        "args": ["--max-running-requests", "999"],  # user args: must not override the candidates'
        "simulated": {"token_rate": TOKEN_RATE, "half_speed_running": HALF, "startup_delay_s": 0.1, **sim},
    }


# ------------------------------------------------------------------------------ pure parts --
def test_percentile_and_length_stats() -> None:
    ordered = list(range(1, 101))
    assert [percentile(ordered, q) for q in (0.5, 0.9, 0.99, 1.0)] == [50, 90, 99, 100]
    stats = LengthStats.of([30, 10, 20, 40], truncated=1)
    assert (stats.count, stats.mean, stats.p50, stats.max, stats.truncation_rate) == (4, 25.0, 20, 40, 0.25)
    assert LengthStats.of([], 0).count == 0


def test_cycled_pilot_repeats_with_fresh_ids() -> None:
    it = cycled(make_samples(3))
    ids = [next(it).id for _ in range(7)]
    assert ids == ["s0", "s1", "s2", "s0~r1", "s1~r1", "s2~r1", "s0~r2"]


def test_projection_arithmetic() -> None:
    p = project(remaining_samples=1000, tokens_per_sample=150.0, out_tok_s_per_server=500.0, gpus=8, tp=2)
    # 4 servers: 150,000 tokens / (500 x 4) = 75 s; 75 s x 8 GPUs = 600 GPU-seconds
    assert p.servers == 4 and p.wall_s == pytest.approx(75.0) and p.gpu_hours == pytest.approx(600 / 3600)


# --------------------------------------------------------------------- bounded client run --
def test_pilot_stops_at_its_time_and_the_client_stops_sending(tmp_path: Path) -> None:
    cap = 8
    url, stop = start_simulated_server(
        max_running_requests=cap, token_rate=TOKEN_RATE, half_speed_running=HALF
    )
    try:
        t0 = time.monotonic()
        m = drive_pilot(
            Endpoint(url, "sim", cap),
            make_samples(10),
            TYPED_GENERATE,
            1.5,
            tmp_path / "j.jsonl",
        )
        elapsed = time.monotonic() - t0
        received = [json.load(urllib.request.urlopen(url + "/_sim/stats"))["received"]]
        time.sleep(0.5)
        received.append(json.load(urllib.request.urlopen(url + "/_sim/stats"))["received"])
    finally:
        stop()
    assert 1.5 <= m.stopped_at - m.started_at < 1.8 and elapsed < 2.5
    assert received[0] == received[1], "the client kept sending after its time was up"
    assert m.concurrency == cap and m.unfinished_at_stop <= cap
    assert received[0] == m.completed + m.failed + m.unfinished_at_stop == m.sent
    assert m.completed > 10  # the 10 pilot prompts were cycled to keep the server busy
    assert m.out_tok_s == pytest.approx(m.window_output_tokens / m.window_s)
    assert m.out_tok_s == pytest.approx(model_tok_s(cap), rel=0.25)


# ----------------------------------------------------------------------------- the sweep --
@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[SweepResult, list[SweepCandidate], float, Path]:
    root = tmp_path_factory.mktemp("sweep")
    # the tuner's first choice is not the fastest here: a small cap first, a bigger one second
    candidates = [
        SweepCandidate(("--max-running-requests", "4"), 4, "recommended"),
        SweepCandidate(("--max-running-requests", "24", "--mem-fraction-static", "0.9"), 24, "tuner #2"),
    ]
    t0 = time.monotonic()
    result = run_sweep(
        typed_server(free_base(), max_running_requests=2), candidates, make_samples(30), TYPED_GENERATE,
        SECONDS,
        root / "work" / "sweep", times=SweepTimes(stop_grace_s=5),
    )  # fmt: skip
    return result, candidates, time.monotonic() - t0, root


def test_sweep_keeps_the_candidate_with_the_higher_measured_throughput(sweep: Any) -> None:
    result, candidates, _, _ = sweep
    assert [r.ok for r in result.rows] == [True, True]
    for row, cand in zip(result.rows, candidates, strict=True):
        assert row.measurement is not None
        # the simulated cap (and so the client's concurrency) follows the candidate's predicted cap
        assert row.measurement.concurrency == cand.predicted_running
        # one warm-up request answered before the window opened (first-request costs stay out of it)
        assert row.measurement.first_request_s is not None and row.measurement.first_request_s < SECONDS
        assert row.out_tok_s == pytest.approx(model_tok_s(cand.predicted_running), rel=0.25)
    expected = max(range(len(candidates)), key=lambda i: model_tok_s(candidates[i].predicted_running or 0))
    assert result.best_index == expected
    assert result.best_args == candidates[expected].args
    assert result.rows[expected].out_tok_s == max(r.out_tok_s for r in result.rows)


def test_sweep_respects_time_and_leaves_no_server(sweep: Any) -> None:
    result, candidates, wall, root = sweep
    for row in result.rows:
        m = row.measurement
        assert SECONDS <= m.stopped_at - m.started_at < SECONDS + 0.5
    assert wall < len(candidates) * (SECONDS + 8)  # startup + stop overhead per candidate is bounded
    for cand_dir in sorted((root / "work" / "sweep").glob("cand*")):
        assert live_supervisors(cand_dir / "servers") == []
        url_files = list((cand_dir / "servers").glob("gpu*.url"))
        for url_file in url_files:
            text = url_file.read_text().split()
            if text and text[0].startswith("http"):
                assert port_is_free("127.0.0.1", int(text[0].rsplit(":", 1)[1]))


def make_run(root: Path, n_samples: int, finished: int) -> Remaining:
    """Two prompt shards and a journal with ``finished`` of the first shard's ids done."""
    samples = make_samples(n_samples, prefix="p")
    results, work = root / "results", root / "work"
    counts = write_shards(
        samples, (), [results / "shards" / "00000.parquet", results / "shards" / "00001.parquet"]
    )
    assert sum(counts) == n_samples
    from regen.ingest.shards import read_shard

    first = [s.id for s in read_shard(results / "shards" / "00000.parquet")][:finished]
    journal = work / "journal" / "00000.jsonl"
    journal.parent.mkdir(parents=True)
    with open(journal, "w") as fh:
        for sid in first:
            fh.write(json.dumps({"kind": "record", "id": sid, "usage": {"completion_tokens": 5}}) + "\n")
        fh.write('{"kind": "record", "id": "torn')  # a kill tore the last line
    return count_remaining(results, work)


def test_projection_from_the_measured_pilot_and_status_shows_it(sweep: Any, tmp_path: Path) -> None:
    result, _, _, _ = sweep
    remaining = make_run(tmp_path, n_samples=50, finished=7)
    assert (remaining.samples, remaining.finished, remaining.remaining) == (50, 7, 43)
    report = pilot_report(result, remaining, gpus=4, tp=2)
    best = result.best.measurement
    tokens = [t for r in result.rows for t in r.measurement.completion_tokens]
    mean_tokens = sum(tokens) / len(tokens)
    wall = 43 * mean_tokens / (best.window_output_tokens / best.window_s * 2)  # 2 servers of tp 2
    proj = report["projection"]
    assert proj["tokens_per_sample"] == pytest.approx(mean_tokens)
    assert proj["wall_s"] == pytest.approx(wall) and proj["gpu_hours"] == pytest.approx(wall * 4 / 3600)
    assert report["best_args"] == list(result.best_args)
    written = write_pilot(tmp_path / "results" / "plan" / "pilot.json", report)
    read = PilotFile.read(tmp_path / "results" / "plan" / "pilot.json")
    assert read is not None and read.projection is not None and read.projection.fields == proj
    assert read.projection.projection.tokens_per_sample == pytest.approx(mean_tokens)
    assert read.best_args == result.best_args
    assert written.candidates == read.candidates

    text = status_report(tmp_path / "work", tmp_path / "results")
    line = next(x for x in text.splitlines() if x.startswith("projection"))
    assert "43 samples left" in line and f"{wall * 4 / 3600:.2f} GPU-hours" in line
    assert f"{best.out_tok_s:.0f} out tok/s per server" in line

    assets = write_report_assets(tmp_path / "results", tmp_path / "report", tmp_path / "work")
    page = assets["server_plan.html"].read_text()
    assert "projection for the remaining samples" in page and " ".join(result.best_args) in page


def test_status_without_pilot_has_no_projection(tmp_path: Path) -> None:
    make_run(tmp_path, n_samples=10, finished=0)
    assert "projection" not in status_report(tmp_path / "work", tmp_path / "results")


# ---------------------------------------------------------------------------------- the CLI --
def test_tune_sweep_cli_on_simulated_servers(tmp_workdir: Path) -> None:
    make_run(tmp_workdir, n_samples=40, finished=0)
    config = {
        "server": {
            **server_cfg(free_base()),
            "args": [],
            "gpus": 2,
            "model_config": str(MODELS / "qwen3-8b"),
        },
        "generate": GENERATE,
    }
    (tmp_workdir / "config.yaml").write_text(yaml.safe_dump(config))
    argv = [
        "--sweep", "--server-config", "config.yaml", "--gpu-memory-mib", "24576", "--prompt-p50", "50",
        "--prompt-p99", "200", "--seconds", "1.5", "--candidates", "1", "--plan-out", "server.json",
    ]  # fmt: skip
    out = io.StringIO()
    from contextlib import redirect_stdout

    with redirect_stdout(out):
        assert tune_cli(argv) == 0
    pilot = PilotFile.read("results/plan/pilot.json")
    assert pilot is not None and pilot.candidates[0].label == "recommended" and pilot.projection is not None
    assert pilot.projection.projection.remaining_samples == 40 and pilot.projection.projection.servers == 2
    assert all(c.ok for c in pilot.candidates)
    best = pilot.best
    assert best is not None and best.out_tok_s == max(c.out_tok_s or 0.0 for c in pilot.candidates)
    plan = json.loads(Path("server.json").read_text())
    assert plan["launch_args"] == list(best.args)
    assert "wrote results/plan/pilot.json" in out.getvalue()
    for cand_dir in Path("work/sweep").glob("cand*"):
        assert live_supervisors(cand_dir / "servers") == []
    assert not list(Path("work/status").glob("*.json")) if Path("work/status").exists() else True
    assert os.path.isdir("work/sweep")


def test_a_sweep_beside_a_generation_takes_another_port_and_honours_per_sample_lengths(
    tmp_path: Path,
) -> None:
    base = free_base()
    generation = socket.socket()  # a generation's slot-0 server listening on server.port_base
    generation.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    generation.bind(("127.0.0.1", base))
    generation.listen()
    lengths = {f"s{i}": 3 + i % 5 for i in range(40)}
    gcfg = GenerateConfig.from_dict({**GENERATE, "extra_body": {"ignore_eos": True}})
    try:
        # the bench's spread: set between regen's client and the server
        result = run_sweep(
            typed_server(base), [SweepCandidate(("--max-running-requests", "4"), 4, "only")],
            make_samples(40), gcfg, 2.0, tmp_path / "sweep", times=SweepTimes(stop_grace_s=5),
            endpoint_wrapper=behind_proxy(lengths),
        )  # fmt: skip
    finally:
        generation.close()
    assert result.rows[0].ok, result.rows[0].error
    supervisor_log = (tmp_path / "sweep" / "cand00" / "logs" / "gpu0.log").read_text()
    port = int(supervisor_log.split(" url=http://127.0.0.1:", 1)[1].split()[0])
    assert port != base
    records = [
        json.loads(x) for x in (tmp_path / "sweep" / "cand00" / "journal.jsonl").read_text().splitlines()
    ]
    done = [r for r in records if r.get("kind") == "record" and r["id"] in lengths]
    assert done and all(r["usage"]["completion_tokens"] == lengths[r["id"]] for r in done)


def test_the_length_proxy_sets_only_listed_samples_max_tokens() -> None:
    proxy = LengthProxy("http://127.0.0.1:1", {"a b/1": 7})
    try:
        body = json.dumps({"messages": [], "max_tokens": 256}).encode()
        assert json.loads(proxy.rewrite(body, "a%20b%2F1"))["max_tokens"] == 7
        assert proxy.rewrite(body, "other") == body and proxy.rewrite(body, None) == body
        assert proxy.rewritten == 1
    finally:
        proxy._sock.close()


def test_candidates_are_ranked_by_the_servers_steady_rate_when_it_gave_one() -> None:
    def row(label: str, client: float, server: float | None) -> CandidateResult:
        lengths = LengthStats.of([10], 0)
        steady = None if server is None else SteadyState(8, 5, server, server, 100.0, 1.0, METHOD_LOG)
        m = PilotMeasurement(8, 0.0, 10.0, 8.0, 20, 10, 0, 8, 10, 100, client, 1.0, lengths, 1.0, 1.0,
                             server=steady)  # fmt: skip
        return CandidateResult(label, (label,), 8, True, None, m)

    assert row("a", 50.0, None).rate_tok_s == 50.0
    assert row("b", 50.0, 400.0).rate_tok_s == 400.0 and row("b", 50.0, 400.0).decode_tok_s == 400.0
    result = SweepResult((row("a", 90.0, 300.0), row("b", 50.0, 400.0)), 1, 10.0, 2.0, 20)
    assert result.to_json()["best_rate_tok_s"] == 400.0 and result.rate_method == METHOD_LOG


def test_the_closed_loop_says_which_step_line_it_used(tmp_path: Path) -> None:
    """pilot.json names the decode-step line its closed loop played: the best pilot's plateau and falling
    batch when the drain was seen, else the candidates' plateaus, and says so when a fit fell back."""
    line = StepModel(0.014, 0.00015)

    def row(label: str, cap: int, falling: tuple[int, ...] = (), slower: float = 1.0) -> CandidateResult:
        fall = tuple((b, line.tokens_per_s(b)) for b in falling)
        tps = line.tokens_per_s(cap) * slower
        steady = SteadyState(cap, 5, tps, tps, 100.0, 1.0, METHOD_LOG, falling=fall)
        m = PilotMeasurement(cap, 0.0, 10.0, 8.0, 20, 10, 0, 8, 10, 100, 50.0, 1.0, LengthStats.of([10], 0),
                             1.0, 1.0, server=steady, completion_tokens=(300, 500, 800))  # fmt: skip
        return CandidateResult(label, (label,), cap, True, None, m)

    remaining = Remaining(shards=1, samples=100, finished=0)

    def step_of(*rows: CandidateResult) -> dict[str, Any]:
        report = pilot_report(SweepResult(rows, 0, 10.0, 2.0, 20), remaining, gpus=1, tp=1)  # the first best
        return report["projection_closed_loop"]["step_model"]

    drained = step_of(row("a", 265, falling=(200, 60, 5, 1)), row("b", 128))
    assert drained["basis"].startswith("the best pilot's plateau and falling batch: least squares")
    assert drained["fixed_s"] == pytest.approx(0.014, rel=1e-6)
    plateaus = step_of(row("a", 265), row("b", 128))
    assert plateaus["basis"].startswith("the plateaus of 2 candidates")
    assert "least squares" in plateaus["basis"]
    # the smaller batch slower per request than the larger: no line with a positive fixed part through them
    fell = step_of(row("a", 265), row("b", 64, slower=0.2))
    assert "one plateau (265 running)" in fell["basis"] and "negative part" in fell["basis"]
    assert fell["fixed_s"] == 0.0
    # a drain that stopped just under the plateau says so, and the candidates' plateaus draw the line
    near = step_of(row("a", 265, falling=(250, 240, 230)), row("b", 128))
    assert near["basis"].startswith("the plateaus of 2 candidates of the best one's state dtype; the pilot")
    assert "batch fell to 230 of 265 running in 3 decode lines, too little" in near["basis"]
    one = step_of(row("a", 265, falling=(20,)), row("b", 128))  # far enough, but one line alone
    assert "fell to 20 of 265 running in 1 decode lines, too little" in one["basis"]


def test_the_pilot_drains_its_batch_and_the_step_line_gets_its_fixed_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After its window the pilot sends nothing new and lets the batch fall: the server's decode lines at
    the falling batch give the step line the batch-independent part the plateau alone cannot show. The
    simulated batch model decodes a step in 1/rate + running/(rate*half): 4 ms + 0.25 ms a request here."""
    monkeypatch.setenv(OPTIONS_ENV, json.dumps({"log_interval_s": 0.2}))  # SGLang logs every 40 steps
    cand = SweepCandidate(("--max-running-requests", "32"), 32, "recommended")
    server = typed_server(free_base(), token_rate=250.0, half_speed_running=16, max_running_requests=32)
    result = run_sweep(server, [cand], make_samples(64), TYPED_GENERATE, 4.0, tmp_path / "sweep",
                       times=SweepTimes(stop_grace_s=5, drain_s=4.0))  # fmt: skip
    m = result.best.measurement
    assert m is not None and m.server is not None and m.server.plateau_running == 32
    assert len(m.server.falling) >= 3 and min(b for b, _ in m.server.falling) < 16
    report = pilot_report(result, Remaining(shards=1, samples=500, finished=0), gpus=1, tp=1)
    step = report["projection_closed_loop"]["step_model"]
    assert step["basis"].startswith("the best pilot's plateau and falling batch: least squares")
    assert step["fixed_s"] == pytest.approx(0.004, rel=0.1)
    assert m.stopped_at - m.started_at < 4.5  # the window's throughput is the window's, drain apart


def test_sweep_budget_stops_starting_candidates_and_says_so(tmp_path: Path) -> None:
    """With a budget, candidates after it are rows saying they were not started; the measured ones rank."""
    candidates = [
        SweepCandidate(("--max-running-requests", "4"), 4, "recommended"),
        SweepCandidate(("--max-running-requests", "8"), 8, "second"),
    ]
    result = run_sweep(
        typed_server(free_base(), max_running_requests=2), candidates, make_samples(10), TYPED_GENERATE, 0.5,
        tmp_path / "sweep", times=SweepTimes(stop_grace_s=5, budget_s=0.0),
    )  # fmt: skip
    assert [r.ok for r in result.rows] == [True, False]
    assert "budget" in (result.rows[1].error or "")
    assert result.best_index == 0
    assert not (tmp_path / "sweep" / "cand01").exists()


# ------------------------------------------------------------------------- speculative (MTP) --
MTP3 = ("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4")  # fmt: skip


def test_choose_keeps_the_highest_rate_and_the_earlier_on_ties() -> None:
    assert choose([10.0, 30.0, 30.0, 5.0]) == 1
    assert choose([7.0]) == 0
    with pytest.raises(SweepError):
        choose([])


def test_a_simulated_candidates_speculative_steps_go_into_its_options() -> None:
    argv = ["python", "-m", "regen.simulated", "--options", json.dumps({"weights_gib": 50.0})]
    merged = with_speculative_steps(argv, ["--max-running-requests", "8", *MTP3])
    assert json.loads(merged[merged.index("--options") + 1]) == {
        "weights_gib": 50.0,
        "speculative_num_steps": 3,
    }
    assert with_speculative_steps(argv, ["--max-running-requests", "8"]) == argv
    bare = with_speculative_steps(["python"], ["--speculative-algorithm", "EAGLE"])
    assert json.loads(bare[-1]) == {"speculative_num_steps": 3}  # SGLang's auto steps: 3


@pytest.mark.parametrize(("acceptance", "on"), [("2.5", True), ("1", False)])
def test_the_sweep_ranks_mtp_by_accepted_tokens_and_says_why(
    acceptance: str, on: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An MTP candidate next to the same cap without it, on simulated servers that accept ``acceptance``
    tokens per verify step (SGLang's SGLANG_SIMULATE_ACC_LEN): the sweep reads the accept length from the
    decode lines and keeps MTP only when it yields more accepted tokens per second."""
    monkeypatch.setenv("SGLANG_SIMULATE_ACC_LEN", acceptance)
    monkeypatch.setenv("REGEN_SIM_OPTIONS", json.dumps({"log_interval_s": 0.2}))
    candidates = [
        SweepCandidate(("--max-running-requests", "8"), 8, "recommended"),
        SweepCandidate(("--max-running-requests", "8", *MTP3), 8, "mtp 3 steps"),
    ]
    result = run_sweep(
        typed_server(free_base()),
        candidates,
        make_samples(40),
        TYPED_GENERATE,
        2.0,
        tmp_path / "sweep",
        times=SweepTimes(stop_grace_s=5),
    )
    plain, mtp = result.rows
    assert plain.ok and mtp.ok, (plain.error, mtp.error)
    assert plain.accept_len is None and mtp.accept_len == float(acceptance)
    assert (mtp.speculative, plain.speculative) == ("NEXTN 3 steps", None)
    assert (result.best_index == 1) is on
    assert (mtp.rate_tok_s > plain.rate_tok_s) is on
    decision = mtp_decision(result)
    assert decision is not None and decision["on"] is on
    ratio = mtp.rate_tok_s / plain.rate_tok_s
    assert decision["on_over_off"] == pytest.approx(ratio, abs=0.001)
    assert decision["why"].startswith(f"MTP {'on' if on else 'off'}: ")
    assert f"{ratio:.2f}x" in decision["why"] and f"accept length {float(acceptance):.2f}" in decision["why"]
    report = result.to_json()
    assert report["mtp"] == decision and report["candidates"][1]["accept_len"] == float(acceptance)


def test_no_mtp_statement_without_a_speculative_candidate(sweep: Any) -> None:
    result, _, _, _ = sweep
    assert mtp_decision(result) is None and result.to_json()["mtp"] is None


def _issue_report(remaining: int) -> dict:
    """A pilot.json as the sweep writes it (the numbers of issue 34: the client window ranks tuner #2
    first, the server's steady decode rate ranks the recommendation first)."""

    def row(label: str, client: float, rate: float) -> dict:
        return {
            "label": label,
            "ok": True,
            "concurrency": 64,
            "out_tok_s": client,
            "rate_tok_s": rate,
            "req_s": 1.5,
            "lengths": {"p50": 700, "p99": 2900},
            "args": ["--max-running-requests", "64"],
        }

    def projection(samples: int) -> dict:
        return {
            "remaining_samples": samples,
            "tokens_per_sample": 800.0,
            "servers": 2,
            "tp": 1,
            "wall_s": samples * 800.0 / (2 * 298295.7),
            "gpu_hours": samples * 800.0 / 298295.7 / 3600,
        }

    return {
        "candidates": [
            row("recommended", 138869.0, 298295.7),
            row("tuner #2", 143883.0, 143883.0),
            {"label": "given", "ok": False, "error": "out of memory"},
        ],
        "best_index": 0,
        "best_label": "recommended",
        "rate_method": "server: median gen throughput",
        "projection": projection(remaining),
        "projection_whole_run": projection(50_000),
    }


def test_the_sweep_says_one_best_consistent_with_its_table_and_projects_the_whole_run() -> None:
    from regen.tune.sweep_report import render_result

    text = render_result(PilotFile.from_json(_issue_report(remaining=20_000)))
    rows = {line.split()[0]: line for line in text.splitlines() if line[:1] in "* " and line.strip()}
    assert rows["*recommended"].split()[2] == "298,296"  # the column the best is chosen by, starred
    assert rows["tuner"].split()[3] == "143,883"
    assert "best: recommended (*), 298,296 tok/s per server, the highest rate tok/s" in text
    assert "by the client's window tuner #2 finished more (143,883 vs 138,869 tok/s)" in text
    assert text.count("best:") == 1
    assert "whole run: 50,000 samples x 800.0 tokens on 2 server(s) of tp=1" in text
    assert "remaining: 20,000 samples" in text


def test_after_the_run_the_sweep_says_it_is_done_and_what_it_took(tmp_path: Path) -> None:
    from regen.layout.run import RunLayout
    from regen.tune.sweep_report import generate_job_seconds, render_result

    layout = RunLayout.under(tmp_path)
    layout.shards_dir.mkdir(parents=True)
    for shard, seconds in (("00000", 3000.5), ("00001", 1800.0)):
        layout.shard(shard).write_bytes(b"")
        bench = layout.benchmark("generate", shard)
        bench.parent.mkdir(parents=True, exist_ok=True)
        bench.write_text(f"s\th:m:s\tmax_rss\n{seconds}\t0:50:00\t100\n")
    took = generate_job_seconds(layout)
    assert took == pytest.approx(4800.5)
    text = render_result(PilotFile.from_json(_issue_report(remaining=0)), took)
    assert "the run is done: all 50,000 samples are finished; its generate jobs ran 1h20m in all" in text
    assert "remaining: 0 samples" not in text


def test_the_sweep_plans_the_runs_own_audit_and_sglang_as_the_tune_rule_does(tmp_workdir: Path) -> None:
    """Without --audit-summary the sweep reads the run's audit summary the tune rule's way, plans for the
    version the tune rule plans for (server.sglang_version, else the installed SGLang), and with
    --no-given measures only the tuner's candidates."""
    from regen.layout.run import RunLayout
    from regen.sglang.models import ModelShape
    from regen.sglang.recommend import recommend
    from regen.sglang.workload import default_workload
    from regen.tune.tune import candidates_from_recommendation, sweep_workload
    from regen.tune.workload_plan import planned_sglang_version, workload_from_audit_histogram

    layout = RunLayout(results=tmp_workdir / "results", work=tmp_workdir / "work")
    assert sweep_workload(None, layout, 2048) == default_workload(2048)
    summary = {"prompt_tokens_p50": 120, "prompt_tokens_p99": 700, "context_limit": 4096}
    layout.audit_summary.parent.mkdir(parents=True, exist_ok=True)
    layout.audit_summary.write_text(json.dumps(summary))
    assert sweep_workload(None, layout, 2048) == workload_from_audit_histogram(summary, 2048)
    assert sweep_workload(None, layout, 2048).prompt_p99 == 700
    with pytest.raises(SweepError, match="no such file"):
        sweep_workload(str(tmp_workdir / "missing.json"), layout, 2048)
    pinned = ServerConfig.from_mapping({**server_cfg(free_base()), "sglang_version": "0.5.17"})
    assert planned_sglang_version(pinned) == "0.5.17"
    workload = sweep_workload(None, layout, 2048)
    qwen3_8b = ModelShape.from_config(MODELS / "qwen3-8b")
    rec = recommend(qwen3_8b, 24576, 1, [], workload, allow_fp8_kv=False, allow_bf16_state=False)
    labels = [c.label for c, _ in candidates_from_recommendation(rec, 1, mtp=False)]
    assert labels[-1] == "given" and "given" not in {
        c.label for c, _ in candidates_from_recommendation(rec, 1, mtp=False, given=False)
    }


def test_lengths_come_from_first_attempts_and_a_short_window_is_a_lower_bound(tmp_path: Path) -> None:
    """The H200 pilot of 2026-12-02: 20 s at 265 running finished 42 of 300 samples, the short ones, and
    the cycled repeats of those (short again) were in the pool too: 159 tokens a sample against 635."""
    from regen.tune.pilot import measure_journal
    from regen.tune.sweep import censored_share

    journal = tmp_path / "j.jsonl"
    now = time.time()
    # "x~rare" is a user's id that merely contains the repeat mark: a first attempt all the same
    lines = [("a", 10), ("x~rare", 20), ("a~r1", 10), ("a~r2", 10), ("x~rare~r1", 20)]  # c, d, e unfinished
    journal.write_text("".join(
        json.dumps({"kind": "record", "id": i, "usage": {"completion_tokens": n},
                    "timings": {"started_at": now, "latency_s": 1.0}}) + "\n" for i, n in lines
    ))  # fmt: skip
    first_ids = {"a", "x~rare", "c", "d", "e"}
    m = measure_journal(journal, now - 1, now + 5, 0.0, concurrency=4, sent=8, first_ids=first_ids)
    assert m.completion_tokens == (10, 20) and m.lengths.mean == 15  # not the repeats' (14)
    assert (m.first_attempts, m.first_attempts_unfinished) == (5, 3)
    assert m.window_output_tokens == 70  # the rate still counts every answer in the window
    row = CandidateResult("recommended", (), 4, True, measurement=m)
    result = SweepResult((row,), 0, 6.0, 0.0, 5)
    censored = censored_share(result)
    assert censored.share == pytest.approx(0.6) and censored.lower_bound
    report = pilot_report(result, Remaining(shards=1, samples=10, finished=0), gpus=1, tp=1)
    assert report["projection"]["lower_bound"] and report["projection_whole_run"]["lower_bound"]
    assert any("LOWER BOUND" in a and "3 of the pilot's 5 samples" in a for a in report["assumptions"])
    censored_json = {"first_attempts": 5, "unfinished": 3, "share": 0.6, "lower_bound": True, "model": None,
                     "finished_lengths": [10, 20]}  # fmt: skip
    assert report["censored_lengths"] == censored_json
