"""Benchmark: resume and the dry run at the scale regen is for (914,000 samples on 7 GPU slots).

It builds the state of such a run through the project's own parts: a synthetic chat dataset, the
workflow's real audit and shard jobs (Snakemake), then every shard's journal written by
``regen.generate.journal.Journal`` with records shaped as the client writes them (answers of
``--answer-tokens``
tokens with their token ids, fingerprints and settings as a simulated SGLang server reports them).
On the half-finished state, then on the finished one, it times:

* ``open_s``: ``Journal.open`` of one shard's journal (what every generate job does when it resumes);
  beside it ``scan_s``, the same journal read without its index (the linear torn-line scan), and
  ``orjson_s``, a plain ``orjson`` parse of every line of the file: the reference;
* ``plan_s``: ``snakemake -n`` on the run (it prints the replay preview from every journal);
* ``resume_first_request_s``: a generate job for shard 0 (the client as the workflow runs it, in its own
  process) until the server receives its first new request;
* ``disk_gb``: bytes written before the Parquet (journals, generations, valid shards, quarantine)
  once ``--disk-shards`` shards are finalized and validated, and ``parquet_gb``: the merged Parquet
  (both scaled to all shards when fewer are finalized; the line says how many were).

    .venv/bin/python -m bench.scale                       # 914,000 samples, 64-token answers
    .venv/bin/python -m bench.scale --answer-tokens 3000 --disk-shards 1
    .venv/bin/python -m bench.scale --smoke               # CI: 2,000 samples in 2 shards
    .venv/bin/python -m bench.scale --run                 # the held-out run (below)

``--run`` is the held-out kind of run instead (issue 48 item 4; CI: ``tests/workflow/test_scale_run.py``):
200,000 one-turn samples in 2 shards, 32-token answers, generated through the whole workflow on the demo
config's simulated servers (its faults; a tight ``request_timeout_s``) with ``--resources gpu=2``; then
``snakemake -n`` and a rerun with every generate job forced, the servers' request log on. Its line:
``scale_run: samples=… records=… failed=… run_s=… plan_s=… rerun_s=… replayed=… sent=… resent=… lost=…
reconcile_ok=… peak_rss_mb=… longest_request_s=… tail_ratio=… ratio=…`` (``failed``: samples the run
journaled as failed, every attempt a fault the demo injects; ``ratio``: replayed over records; ``resent``:
requests the rerun sent for samples already answered; ``peak_rss_mb``: the largest process of the first run;
``longest_request_s``: its longest answer; ``tail_ratio``: the lowest over shards of the answer rate over the
shard's last 5% against its middle half, by when each answer arrived). The seed's scale (issue 48 item 6):
``--run --samples 914000 --shards 7 --gpus 7 --answer-tokens 64``.

Last line: ``scale: samples=… answer_tokens=… entry_kb=… open_s=… plan_s=… resume_first_request_s=…
disk_gb=… parquet_gb=… disk_shards=… ratio=…`` (plus the half-finished plan time, the scan, read and reference
times, ``scan_vs_orjson`` the index-less scan against the reference, and the disk ratio to the journals);
``ratio`` is ``Journal.open`` of one shard against one plain orjson read of its journal.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

from bench import harness
from bench.audit import synthetic_rows  # the audit bench's synthetic chats
from bench.harness import REPO, add_smoke, parse_args
from bench.merge import TextPool, synthetic_record  # a record as written
from bench.workflow import SNAKEMAKE, copy_workflow, free_port_base, python_path, run_snakemake, write_chats
from regen.check import load_config
from regen.fingerprint import GenerationSettings, RunSettings, server_numerics
from regen.generate.journal import Journal, read_heads, read_journal_entries
from regen.ingest.shards import read_shard, shard_name
from regen.layout.beside import journal_index
from regen.layout.run import RunLayout
from regen.prompts import prompt_for_last, sample_request_fingerprint
from regen.runconfig import RunConfig
from regen.simulated.requestlog import read_request_log

REGEN = str(Path(sys.executable).with_name("regen"))
CONFIGS = ("config/demo.yaml", "config/scale.yaml")


def scale_config(shards: int, answer_tokens: int) -> dict[str, Any]:
    """The demo config at scale: the synthetic dataset, ``shards`` shards, answers of ``answer_tokens``."""
    return {
        "dataset": {"path": "data/scale.jsonl"},
        "audit": {"decontamination": {"benchmarks": []}},
        "shards": {"count": shards},
        "generate": {"sampling": {"max_tokens": answer_tokens}},
        "server": {"gpus": 1, "simulated": {"faults": {}}},
        "export": {"enabled": False},
    }


def snakemake(wd: Path, *args: str) -> float:
    """Run Snakemake in ``wd``; its wall time."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [SNAKEMAKE, *args, "--cores", "2", "--configfile", *CONFIGS],
        cwd=wd,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"snakemake {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - t0


class Answers:
    """Records for the journals: a sample's prompt, an answer of ``tokens`` tokens and its ids."""

    def __init__(self, tokens: int) -> None:
        rng = random.Random(7)
        self.pool = TextPool(rng)
        words = self.pool(1250).split()
        self.texts = [" ".join(rng.choice(words) for _ in range(tokens)) for _ in range(16)]
        self.ids = [[rng.randrange(151_000) for _ in range(tokens)] for _ in range(16)]
        self.tokens = tokens

    def entry(
        self, i: int, shard: str, sample: Any, settings_fp: str, settings_json: dict[str, Any]
    ) -> dict[str, Any]:
        rec = synthetic_record(i, self.pool, shard)
        rec.pop("tools", None)
        rec.pop("tool_calls", None)
        rec.update(
            id=sample.id,
            messages=prompt_for_last(sample.messages),
            reasoning_content=None,
            content=self.texts[i % 16],
            finish_reason="stop",
            truncated=False,
            completion_token_ids=self.ids[i % 16],
            fingerprint=sample_request_fingerprint(settings_fp, sample, settings_json["regenerate"]),
            settings_fingerprint=settings_fp,
            settings=settings_json,
        )
        rec["usage"] = {"prompt_tokens": len(rec["prompt_token_ids"]), "completion_tokens": self.tokens}
        return {"kind": "record", **rec}


def write_journals(
    layout: RunLayout, shards: list[str], answers: Answers, settings: GenerationSettings, second_half: bool
) -> int:
    """Append the records of the first (or second) half of every shard's samples to its journal, as a
    run killed half-way has them; the entries written."""
    settings_json, settings_fp = settings.to_json(), settings.fingerprint
    n = 0
    for shard in shards:
        samples = list(read_shard(layout.shard(shard)))
        half = len(samples) // 2
        samples = samples[half:] if second_half else samples[:half]
        with Journal.open(layout.journal(shard)) as journal:
            for i, sample in enumerate(samples):
                journal.append(answers.entry(n + i, shard, sample, settings_fp, settings_json), flush=False)
                if i % 2000 == 1999:
                    journal.flush()
        n += len(samples)
    return n


#: ``read_journal_entries`` holds every parsed entry: beyond this journal size it would not fit in memory
#: (a 4.8 GB journal of 3,000-token answers parses to ~25 GB of Python objects)
ENTRIES_MAX_BYTES = 1_500_000_000


def time_open(journal: Path) -> dict[str, float]:
    """``Journal.open`` (index), the scan without the index, every entry read
    (``read_journal_entries``, on journals that fit in memory as objects), and the reference: a plain
    orjson parse of every line of the file."""
    t0 = time.perf_counter()
    Journal.open(journal).close()
    open_s = time.perf_counter() - t0
    index = journal_index(journal)
    saved = index.with_name(index.name + ".saved")
    index.rename(saved)
    t0 = time.perf_counter()
    read_heads(journal)
    scan_s = time.perf_counter() - t0
    saved.rename(index)
    entries_s = float("nan")
    if journal.stat().st_size <= ENTRIES_MAX_BYTES:
        t0 = time.perf_counter()
        read_journal_entries(journal)
        entries_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with open(journal, "rb") as fh:
        for line in fh:
            orjson.loads(line)
    orjson_s = time.perf_counter() - t0
    return {"open_s": open_s, "scan_s": scan_s, "entries_s": entries_s, "orjson_s": orjson_s}


def start_server(wd: Path, request_log: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            REGEN,
            "serve-simulated",
            "--port",
            "0",
            "--print-url",
            "--request-log",
            str(request_log),
            "--model-path",
            "demo-model",
            "--inline",
        ],
        cwd=wd,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    for _ in range(100):
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    return proc, url


def served_settings(config: dict[str, Any], url: str) -> GenerationSettings:
    with urllib.request.urlopen(url + "/server_info", timeout=5) as resp:
        info = orjson.loads(resp.read())
    return GenerationSettings.for_run(RunConfig.from_config(config)).served_by(server_numerics(info))


def time_resume(wd: Path, url: str, request_log: Path, shard: str) -> float:
    """Seconds from a generate job's start (a fresh process) to the server's first new request."""
    started = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.scale", "--child-resume", url, "--shard", shard],
        cwd=wd,
        env={**os.environ, "PYTHONPATH": python_path()},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        while proc.poll() is None:
            events = read_request_log(request_log)
            received = [e["t"] for e in events if e.get("event") == "received" and e["t"] >= started]
            if received:
                return min(received) - started
            time.sleep(0.05)
        raise SystemExit(f"the resumed generate job ended before any request:\n{proc.stderr.read()[-3000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def child_resume(url: str, shard: str) -> None:
    """A generate job for ``shard`` in this process (run from the workflow copy): what the generate rule
    runs, against the bench's server."""
    from regen.generate.client import ShardJob, generate_shard
    from regen.types import Endpoint

    config = load_config(list(CONFIGS))
    layout = RunLayout()
    run = RunConfig.from_config(config, 1)
    settings = RunSettings.for_run(run)  # the run's: the job builds each variant's
    path = layout.shard(shard)
    generate_shard(
        ShardJob(
            read_shard(path),
            layout.journal(shard),
            layout.records(shard),
            layout.failed(shard),
            run.generate,
            Endpoint(url=url, server_id="bench"),
            shard,
            settings=settings,
        )
    )


def measure_disk(wd: Path, layout: RunLayout, shards: list[str], settings: GenerationSettings) -> dict:
    """Finalize and validate ``shards`` and merge them: the bytes of each stage's files."""
    from regen.generate.journal import finalize_journal
    from regen.output.merge import MergeConfig, merge
    from regen.output.validate import ValidateConfig, validate_shard

    config = load_config(list(CONFIGS))
    cwd = os.getcwd()
    os.chdir(wd)
    now = settings.fingerprint
    try:
        for shard in shards:
            samples = read_shard(layout.shard(shard))
            current = {s.id: sample_request_fingerprint(now, s, settings.regenerate) for s in samples}
            layout.records(shard).parent.mkdir(parents=True, exist_ok=True)
            finalize_journal(layout.journal(shard), layout.records(shard), layout.failed(shard), current)
            validate_shard(
                layout.records(shard),
                layout.valid(shard),
                layout.quarantine(shard),
                ValidateConfig.from_dict(config["validate"]),
            )
        out = wd / "bench-dataset"
        merge([layout.valid(s) for s in shards], out, MergeConfig.from_dict({}), {"bench": True})
    finally:
        os.chdir(cwd)
    size = {
        "journal": sum(layout.journal(s).stat().st_size for s in shards),
        "index": sum(journal_index(layout.journal(s)).stat().st_size for s in shards),
        "generations": sum(
            layout.records(s).stat().st_size + layout.failed(s).stat().st_size for s in shards
        ),
        "valid": sum(layout.valid(s).stat().st_size for s in shards),
        "quarantine": sum(layout.quarantine(s).stat().st_size for s in shards),
        "parquet": sum(p.stat().st_size for p in out.rglob("*.parquet")),
    }
    return size


#: the seed's scale: what the journals are written for unless told otherwise
SAMPLES, SHARDS, ANSWER_TOKENS = 914_000, 7, 64
#: the held-out kind of run (issue 48 item 4): what ``--run`` does unless told otherwise
RUN_SAMPLES, RUN_SHARDS, RUN_ANSWER_TOKENS = 200_000, 2, 32
RUN_CONFIG = "config/scale-run.yaml"
#: the held-out run's generate.request_timeout_s: tight, yet a few times its longest request. The client runs
#: 160 in flight on each stand-in (128 running: ``STAND_IN_RUNNING_CAP``), where the plan's worst-case
#: request of 32 tokens takes 0.41 s (``regen.generate.server_time.stand_in_time``: 32 x (0.25 + 0.02 x 128)
#: ms + 128 x 2.5 ms); measured on the 2-core machine, 2026-12-06: the longest answer took 0.22 s in 20,000
#: samples and 0.38 s in the 200,000 (tail_ratio 1.00). 2 s is about 5x either and leaves the window at 160
#: (the timeout window is 0.8 x 128 x 2 / 0.41 = 499); the demo's 30 s would hide a tail of requests timed
#: out and sent again
RUN_REQUEST_TIMEOUT_S = 2.0
#: the tail rate: samples/s over the last TAIL_SHARE of a shard's answers (by when each arrived), against the
#: rate over its middle (MIDDLE: from one fraction of its answers to another)
TAIL_SHARE = 0.05
MIDDLE = (0.25, 0.75)


@dataclass(frozen=True)
class ScaleRun:
    """What the held-out run measured: its wall, the dry run's and the forced rerun's, and what the forced
    rerun sent (``resent``: requests for samples the first run had finished; ``sent``: all it sent)."""

    samples: int
    records: int
    #: samples the first run journaled as failed and never answered (the demo's injected 5xx, all attempts)
    failed: int
    run_s: float
    plan_s: float
    plan_says_nothing_to_do: bool
    rerun_s: float
    replayed: int
    sent: int
    resent: int
    #: results/reconcile.json: every input id in exactly one bucket
    reconcile_ok: bool
    lost: int
    #: the largest peak RSS of any process of the run (Snakemake, a job, a server), MB
    peak_rss_mb: float
    #: the first run's longest request (an answer's ``latency_s``), s
    longest_request_s: float
    #: the lowest over shards of the tail rate over the middle rate (``tail_ratio``)
    tail_ratio: float

    def line(self) -> str:
        return (
            f"scale_run: samples={self.samples} records={self.records} failed={self.failed} "
            f"run_s={self.run_s:.1f} plan_s={self.plan_s:.2f} rerun_s={self.rerun_s:.1f} "
            f"replayed={self.replayed} sent={self.sent} "
            f"resent={self.resent} lost={self.lost} reconcile_ok={int(self.reconcile_ok)} "
            f"peak_rss_mb={self.peak_rss_mb:.0f} longest_request_s={self.longest_request_s:.2f} "
            f"tail_ratio={self.tail_ratio:.2f} ratio={self.replayed / max(1, self.records):.4f}"
        )


def timed_snakemake(wd: Path, args: list[str], env: dict[str, str], timeout_s: float) -> tuple[float, str]:
    """Run Snakemake on the demo config and the run's own in ``wd``; (its wall, its output). Fails loudly."""
    took, proc = run_snakemake(wd, [*args, "--configfile", "config/demo.yaml", RUN_CONFIG], env, timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(
            f"snakemake {' '.join(args)} in {wd} failed after {took:.0f} s:\n{proc.stdout[-2000:]}\n"
            f"{proc.stderr[-5000:]}"
        )
    return took, proc.stdout + proc.stderr


def answered_at(record: dict[str, Any]) -> float:
    """When a journaled record's answer arrived (epoch seconds): its request's start plus its latency."""
    timings = record["timings"]
    return float(timings["started_at"]) + float(timings["latency_s"])


def rate_between(arrivals: list[float], start: float, end: float) -> float:
    """Answers/s from the ``start`` to the ``end`` fraction of a shard's answers (``arrivals`` sorted)."""
    first, last = round(start * (len(arrivals) - 1)), round(end * (len(arrivals) - 1))
    return (last - first) / max(arrivals[last] - arrivals[first], 1e-9)


def tail_ratio(arrivals: list[float]) -> float:
    """The rate over a shard's last ``TAIL_SHARE`` of answers against its rate over the ``MIDDLE`` (1: no
    tail; a shard that ends on stragglers, timed out and sent again, is well below)."""
    arrivals = sorted(arrivals)
    return rate_between(arrivals, 1 - TAIL_SHARE, 1.0) / rate_between(arrivals, *MIDDLE)


def held_out_run(
    wd: Path,
    samples: int = RUN_SAMPLES,
    shards: int = RUN_SHARDS,
    answer_tokens: int = RUN_ANSWER_TOKENS,
    run_timeout_s: float = 3600,
    gpus: int = 2,
) -> ScaleRun:
    """The held-out kind of run through the real workflow in ``wd`` (a fresh dir): ``samples`` one-turn
    chats in ``shards`` shards, answers capped at ``answer_tokens``, the demo config as it is otherwise
    (simulated servers with its faults) but a tight ``request_timeout_s`` (``RUN_REQUEST_TIMEOUT_S``),
    ``--resources gpu=G``; then
    ``snakemake -n`` and every generate job forced again, the servers' request log on for that rerun."""
    from regen.simulated.options import REQUEST_LOG_ENV

    copy_workflow(REPO, wd)
    write_chats(
        wd / "data" / "scale-run.jsonl",
        (
            (
                f"run-{i:07d}",
                f"Give a short answer to question {i} of the list.",
                f"Question {i} has this short answer.",
            )
            for i in range(samples)
        ),
    )
    config = {
        "dataset": {"path": "data/scale-run.jsonl"},
        "shards": {"count": shards},
        "generate": {"sampling": {"max_tokens": answer_tokens}, "request_timeout_s": RUN_REQUEST_TIMEOUT_S},
        "server": {"port_base": free_port_base(2 * gpus), "gpus": gpus},
        # answers capped at a few tokens are cut by design here: the run is about the client's load
        "reaudit": {"max_truncated_fraction": 1.0},
    }
    (wd / RUN_CONFIG).write_text(yaml.safe_dump(config, sort_keys=True))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop(REQUEST_LOG_ENV, None)
    run_s, _ = timed_snakemake(wd, ["--cores", "2", "--resources", f"gpu={gpus}"], env, run_timeout_s)
    peak_rss_mb = harness.peak_rss_mb("children")
    reconcile = orjson.loads((wd / "results" / "reconcile.json").read_bytes())
    layout = RunLayout.under(wd)
    finished: set[str] = set()
    failed: set[str] = set()
    latencies: list[float] = []
    tail_ratios: list[float] = []
    for s in range(shards):
        records = []
        for e in read_journal_entries(layout.journal(shard_name(s))):
            if e.get("kind") == "record":
                finished.add(e["id"])
                records.append(e)
            elif e.get("kind") == "failed":
                failed.add(e["id"])
        latencies += [float(r["timings"]["latency_s"]) for r in records]
        tail_ratios.append(tail_ratio([answered_at(r) for r in records]))
    plan_s, plan_out = timed_snakemake(wd, ["-n", "--cores", "2", "--resources", f"gpu={gpus}"], env, 600)
    request_log = wd / "work" / "rerun-requests.jsonl"
    rerun_env = {**env, REQUEST_LOG_ENV: str(request_log)}
    rerun_args = ["--cores", "2", "--resources", f"gpu={gpus}", "--forcerun", "generate"]
    rerun_s, _ = timed_snakemake(wd, rerun_args, rerun_env, 1800)
    received = (
        [e["id"] for e in read_request_log(request_log) if e.get("event") == "received" and e.get("id")]
        if request_log.exists()
        else []
    )
    logs = "".join(p.read_text() for p in sorted((wd / "logs" / "generate").glob("*.log")))
    replayed = sum(int(m) for m in re.findall(r"(\d+) replayed from the journal,", logs))
    return ScaleRun(
        samples=samples,
        records=len(finished),
        failed=len(failed - finished),
        run_s=run_s,
        plan_s=plan_s,
        plan_says_nothing_to_do="Nothing to be done" in plan_out,
        rerun_s=rerun_s,
        replayed=replayed,
        sent=len(received),
        resent=len(finished.intersection(received)),
        reconcile_ok=bool(reconcile["ok"]),
        lost=int(reconcile["lost_count"]),
        peak_rss_mb=peak_rss_mb,
        longest_request_s=max(latencies),
        tail_ratio=min(tail_ratios),
    )


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=None, help=f"default {SAMPLES:,} (--run: {RUN_SAMPLES:,})")
    ap.add_argument("--shards", type=int, default=None, help=f"default {SHARDS} (--run: {RUN_SHARDS})")
    ap.add_argument("--answer-tokens", type=int, help=f"default {ANSWER_TOKENS} (--run: {RUN_ANSWER_TOKENS})")
    ap.add_argument("--disk-shards", type=int, default=None, help="shards finalized for disk (default all)")
    ap.add_argument("--work", type=Path, default=None, help="keep the run here (default: a temporary dir)")
    ap.add_argument("--reuse", action="store_true", help="keep --work's dataset and shards (new journals)")
    ap.add_argument("--child-resume", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--shard", default=None, help=argparse.SUPPRESS)
    ap.add_argument(
        "--run",
        action="store_true",
        help=f"the held-out run instead: generation through the workflow (default {RUN_SAMPLES:,} samples, "
        f"{RUN_SHARDS} shards, {RUN_ANSWER_TOKENS}-token answers), then -n and a forced rerun of generate",
    )
    ap.add_argument("--gpus", type=int, default=2, help="--run: GPU slots (--resources gpu=G)")
    add_smoke(ap, samples=2000, shards=2)
    args = parse_args(ap, argv)
    if args.child_resume:
        child_resume(args.child_resume, args.shard)
        return 0
    tmp = None if args.work else tempfile.TemporaryDirectory(prefix="bench-scale-")
    wd = (args.work or Path(tmp.name)) / "wf"  # type: ignore[union-attr]
    try:
        if args.run:
            result = held_out_run(
                wd,
                args.samples or RUN_SAMPLES,
                args.shards or RUN_SHARDS,
                args.answer_tokens or RUN_ANSWER_TOKENS,
                gpus=args.gpus,
            )
            print(result.line())
            return 0
        args.samples, args.shards = args.samples or SAMPLES, args.shards or SHARDS
        args.answer_tokens = args.answer_tokens or ANSWER_TOKENS
        return run(wd, args)
    finally:
        if tmp is not None:
            tmp.cleanup()


def run(wd: Path, args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    shards = [shard_name(k) for k in range(args.shards)]
    if args.reuse and (wd / "results" / "audit" / "samples.parquet").exists():
        for stale in ("work", "results/shards", "results/generations", "results/valid", "results/quarantine"):
            shutil.rmtree(wd / stale, ignore_errors=True)  # the audit stays, the rest is made anew
        (wd / CONFIGS[1]).write_text(yaml.safe_dump(scale_config(args.shards, args.answer_tokens)))
        shard_s = snakemake(wd, *(f"results/shards/{s}.parquet" for s in shards))
        print(f"reusing the dataset and audit of {wd}; {args.shards} shards in {shard_s:.0f} s", flush=True)
    else:
        copy_workflow(REPO, wd)
        with open(wd / "data" / "scale.jsonl", "wb") as fh:
            for row in synthetic_rows(args.samples):
                fh.write(orjson.dumps(row) + b"\n")
        (wd / CONFIGS[1]).write_text(yaml.safe_dump(scale_config(args.shards, args.answer_tokens)))
        shard_s = snakemake(wd, *(f"results/shards/{s}.parquet" for s in shards))
        print(
            f"dataset, audit and {args.shards} shards in {time.perf_counter() - t0:.0f} s "
            f"(audit + shard jobs {shard_s:.0f} s)",
            flush=True,
        )
    os.chdir(wd)
    config = load_config(list(CONFIGS))
    layout = RunLayout()
    request_log = wd / "work" / "bench-requests.jsonl"
    server, url = start_server(wd, request_log)
    try:
        settings = served_settings(config, url)
        answers = Answers(args.answer_tokens)
        t0 = time.perf_counter()
        n_half = write_journals(layout, shards, answers, settings, second_half=False)
        print(f"half-finished: {n_half} entries journaled in {time.perf_counter() - t0:.0f} s", flush=True)
        half = time_open(layout.journal(shards[0]))
        plan_half_s = snakemake(wd, "-n")
        resume_s = time_resume(wd, url, request_log, shards[0])
        print(
            f"half-finished: {half} plan_s={plan_half_s:.2f} resume_first_request_s={resume_s:.2f}",
            flush=True,
        )
        t0 = time.perf_counter()
        n_rest = write_journals(layout, shards, answers, settings, second_half=True)
        print(f"finished: {n_rest} more entries journaled in {time.perf_counter() - t0:.0f} s", flush=True)
    finally:
        server.terminate()
        server.wait()
    entries = len(read_heads(layout.journal(shards[0])).heads)
    full = time_open(layout.journal(shards[0]))
    plan_s = snakemake(wd, "-n")
    journal_bytes = sum(layout.journal(s).stat().st_size for s in shards)
    entry_kb = journal_bytes / (n_half + n_rest) / 1024
    print(f"finished: {entries} entries in shard {shards[0]}: {full} plan_s={plan_s:.2f}", flush=True)
    disk_shards = shards[: args.disk_shards or len(shards)]
    t0 = time.perf_counter()
    size = measure_disk(wd, layout, disk_shards, settings)
    print(f"disk ({len(disk_shards)} shards, {time.perf_counter() - t0:.0f} s): {size}", flush=True)
    scale = len(shards) / len(disk_shards)
    before = sum(size[k] for k in ("journal", "index", "generations", "valid", "quarantine"))
    print(
        f"scale: samples={n_half + n_rest} answer_tokens={args.answer_tokens} entry_kb={entry_kb:.2f} "
        f"shard_entries={entries} open_s={full['open_s']:.2f} scan_s={full['scan_s']:.2f} "
        f"entries_s={full['entries_s']:.2f} orjson_s={full['orjson_s']:.2f} "
        f"scan_vs_orjson={full['scan_s'] / full['orjson_s']:.2f} "
        f"plan_s={plan_s:.2f} plan_half_s={plan_half_s:.2f} resume_first_request_s={resume_s:.2f} "
        f"disk_gb={before * scale / 1e9:.2f} disk_vs_journal={before / size['journal']:.2f} "
        f"parquet_gb={size['parquet'] * scale / 1e9:.3f} disk_shards={len(disk_shards)} "
        f"ratio={full['open_s'] / full['orjson_s']:.3f}"
    )
    shutil.rmtree(wd / "bench-dataset", ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
