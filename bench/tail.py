"""A short tail (issue 37 item 3): one shard sent in dataset order and longest expected answer first,
against the simulated server in virtual time, with log-normal answer lengths.

    python -m bench.tail [--requests 512] [--cap 64] [--speed 20]
    python -m bench.tail --smoke    # CI: 64 requests, cap 16, speed 50

Each sample's answer length is the virtual server's (``bench.sim_virtual``: log-normal of mean
``--length-mean`` and shape ``--sigma``, per sample id, capped at ``--length-cap``); its old answer in
the dataset is that length times a log-normal error of shape ``--noise`` (old answers predict new ones,
not exactly). The audit's ``flags.parquet`` is made with those old answers' token counts, and the shard
step's own function (``regen.ingest.shards.shard_audited``) orders the shard from it. Each order then
runs through the generation client (``regen.generate.client``) against a fresh virtual server that logs
a ``Decode batch`` line every 40 decode steps, as SGLang does (``decode_log_interval``).

Measured per order: ``drain_share`` (``bench.gpu.serverlog.drain_token_share`` over the server's own
log: the share of tokens decoded below 90% of the full batch) and ``wall`` (virtual seconds from the
first request received to the last completion, from the server's request log). ``ratio`` is the
dataset order's wall over longest-first's (above 1: longest-first is faster). The last line is
``tail: requests=… drain_share_dataset_order=… drain_share_longest_first=… wall_dataset_order_s=…
wall_longest_first_s=… ratio=…``.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bench.gpu.serverlog import decode_lines, drain_token_share
from bench.harness import add_smoke, parse_args
from bench.sim_virtual import VirtualSimulatedServer, VirtualTime
from regen.generate.client import Endpoint, GenerateConfig, ProgressOptions, ShardJob, generate_shard
from regen.ingest.shards import read_shard, shard_audited, write_shards
from regen.records import FLAGS_SCHEMA
from regen.simulated.faults import unit_hash
from regen.simulated.launcher import start_simulated_server
from regen.simulated.requestlog import read_request_log
from regen.types import Message, Sample

#: SGLang's default ``--decode-log-interval``
DECODE_LOG_STEPS = 40
ORDERS = ("dataset_order", "longest_first")


@dataclass(frozen=True, slots=True)
class TailRun:
    """One order's measurement."""

    drain_share: float
    wall_s: float  # virtual seconds, first request received to last completion
    decode_lines: int


def old_answer_tokens(clock: VirtualTime, sample_id: str, noise: float) -> int:
    """The dataset's old answer length: the modelled new one times exp(noise x a standard normal)."""
    u1 = max(unit_hash(clock.seed, "old1", sample_id), 1e-12)
    u2 = unit_hash(clock.seed, "old2", sample_id)
    normal = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
    return max(1, round(clock.output_tokens(f"{sample_id}#0", 1 << 30) * math.exp(noise * normal)))


def make_inputs(root: Path, requests: int, clock: VirtualTime, noise: float) -> tuple[Path, Path]:
    """The audit's two outputs the shard step reads: the kept samples and their flags."""
    samples = [
        Sample(
            f"tail-{i:05d}",
            (Message("user", f"Explain item {i} in detail."), Message("assistant", f"Item {i} explained.")),
            {"file": "dataset.jsonl", "row": i, "format": "messages"},
        )
        for i in range(requests)
    ]
    kept = root / "audit" / "samples.parquet"
    write_shards(samples, (), [kept])  # one file, in dataset order: the audit's kept samples
    n = len(samples)
    flags = pa.table(
        {
            "id": [s.id for s in samples],
            "file": ["dataset.jsonl"] * n,
            "row": list(range(n)),
            "format": ["messages"] * n,
            "flags": [[] for _ in range(n)],
            "supervised_tokens": [old_answer_tokens(clock, s.id, noise) for s in samples],
            "prompt_tokens": [12] * n,
            "excluded": [False] * n,
            "exclude_reason": [None] * n,
            "detail": [None] * n,
            "id_json": [None] * n,
        },
        schema=FLAGS_SCHEMA,
    )
    pq.write_table(flags, root / "audit" / "flags.parquet")
    return kept, root / "audit" / "flags.parquet"


def run_order(shard: Path, work: Path, clock: VirtualTime, cap: int, max_tokens: int) -> TailRun:
    """One shard through the client against a fresh virtual server; the server's logs measure it."""
    work.mkdir(parents=True)
    server_log, request_log = work / "server.log", work / "requests.jsonl"
    factory = functools.partial(VirtualSimulatedServer, clock=clock)
    url, stop = start_simulated_server(
        max_running_requests=cap,
        server_factory=factory,
        log_file=str(server_log),
        request_log=str(request_log),
    )
    try:
        cfg = GenerateConfig.from_dict({"sampling": {"max_tokens": max_tokens}, "request_timeout_s": 3600})
        generate_shard(
            ShardJob(
                read_shard(shard),
                work / "journal.jsonl",
                work / "records.jsonl",
                work / "failed.jsonl",
                cfg,
                Endpoint(url, "gpu0"),
                "00000",
                ProgressOptions(status_path=None, log_every_s=1e9),
            )
        )
    finally:
        stop()
    events = read_request_log(request_log)
    first = min(e["vt"] for e in events if e["event"] == "received")
    last = max(e["vt"] for e in events if e["event"] == "completed")
    lines = decode_lines(server_log.read_text())
    return TailRun(drain_token_share(lines), last - first, len(lines))


def measure(
    root: Path,
    requests: int,
    cap: int,
    speed: float,
    length_mean: float,
    sigma: float,
    length_cap: int,
    noise: float,
) -> dict[str, TailRun]:
    """Both orders of the same samples, each against its own virtual server."""
    clock = VirtualTime(
        speed=speed,
        epoch=0.0,
        length_mean=length_mean,
        length_sigma=sigma,
        length_cap=length_cap,
        decode_log_steps=DECODE_LOG_STEPS,
    )
    kept, flags = make_inputs(root, requests, clock, noise)
    sorted_shard = root / "shards" / "00000.parquet"
    shard_audited(kept, [sorted_shard], flags)
    out: dict[str, TailRun] = {}
    for name, shard in zip(ORDERS, (kept, sorted_shard), strict=True):
        clock = VirtualTime(**{**clock_fields(clock), "epoch": time.time()})  # each run from virtual 0
        out[name] = run_order(shard, root / name, clock, cap, max_tokens=4 * length_cap)
    return out


def clock_fields(clock: VirtualTime) -> dict[str, object]:
    return {name: getattr(clock, name) for name in VirtualTime.__dataclass_fields__}


def tail_line(requests: int, runs: dict[str, TailRun]) -> str:
    d, s = runs["dataset_order"], runs["longest_first"]
    return (
        f"tail: requests={requests} drain_share_dataset_order={d.drain_share:.3f} "
        f"drain_share_longest_first={s.drain_share:.3f} wall_dataset_order_s={d.wall_s:.1f} "
        f"wall_longest_first_s={s.wall_s:.1f} ratio={d.wall_s / s.wall_s:.3f}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=512)
    ap.add_argument("--cap", type=int, default=64, help="the server's running cap (default 64)")
    ap.add_argument("--speed", type=float, default=20.0, help="virtual seconds per real second")
    ap.add_argument("--length-mean", type=float, default=3000.0)
    ap.add_argument("--sigma", type=float, default=1.0, help="log-normal shape of the answer lengths")
    ap.add_argument("--length-cap", type=int, default=8192)
    ap.add_argument("--noise", type=float, default=0.5, help="log-normal error of the old answers' lengths")
    add_smoke(ap, requests=64, cap=16, speed=50.0)
    a = parse_args(ap, argv)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="regen-tail-") as tmp:
        runs = measure(Path(tmp), a.requests, a.cap, a.speed, a.length_mean, a.sigma, a.length_cap, a.noise)
    for name, r in runs.items():
        summary = f"{r.decode_lines} decode lines, drain share {r.drain_share:.3f}, wall {r.wall_s:.1f} s"
        print(f"{name}: {summary}", file=sys.stderr)
    print(f"bench took {time.monotonic() - t0:.0f} s", file=sys.stderr)
    print(tail_line(a.requests, runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
