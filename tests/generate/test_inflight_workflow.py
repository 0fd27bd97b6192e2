"""Under its own load the client never times out its own requests (issue 48 item 1), through the real
workflow: the demo config on simulated servers, a short request timeout, thousands planned in flight
(``generate.concurrency``, as a GPU plan's client count would be) and more one-turn samples than two
stand-ins answer within the timeout if all were sent at once. The client must send no more than the
servers finish within the timeout, and every shard completes with exactly one record per sample. Before
the fix the requests timed out, retries piled up and the shards failed (``ShardFailedError … samples in a
row failed at server level``)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import zstandard
from support.workflow import copy_workflow, free_port_base, snakemake

SAMPLES = 4000
TIMEOUT_S = 3
PLANNED = 5000  # generate.concurrency: what the client would keep in flight on each server


def one_turn_rows(path: Path, n: int) -> None:
    rng = random.Random(48)
    with path.open("wb") as fh:
        for i in range(n):
            question = f"Question {i}: why does topic {rng.randrange(1000)} matter?"
            turns = [{"role": "user", "content": question}, {"role": "assistant", "content": "An answer."}]
            row = {"id": f"s{i:06d}", "messages": turns}
            fh.write(orjson.dumps(row) + b"\n")


def records(path: Path) -> list[dict]:
    with path.open("rb") as fh:
        text = zstandard.ZstdDecompressor().stream_reader(fh).read()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_a_short_timeout_and_a_large_plan_complete_every_shard_without_timing_out(tmp_path: Path) -> None:
    wd = copy_workflow(tmp_path / "wd")
    one_turn_rows(wd / "data" / "one_turn.jsonl", SAMPLES)
    (wd / "config" / "load.yaml").write_text(
        "dataset: {path: data/one_turn.jsonl}\n"
        "audit: {decontamination: {benchmarks: []}}\n"
        "shards: {count: 2}\n"
        f"generate: {{sampling: {{max_tokens: 32}}, request_timeout_s: {TIMEOUT_S}, "
        f"concurrency: {PLANNED}}}\n"
        f"server: {{port_base: {free_port_base(2)}}}\n"
        "export: {enabled: false}\n"
    )
    outputs = ["results/generations/00000.jsonl.zst", "results/generations/00001.jsonl.zst"]
    run = snakemake(
        wd, *outputs, "--cores", "2", "--resources", "gpu=2", "--configfile", "config/demo.yaml",
        "config/load.yaml", timeout=240,
    )  # fmt: skip
    logs = "\n".join(p.read_text() for p in sorted((wd / "logs" / "generate").glob("*.log")))
    assert run.returncode == 0, run.stderr[-3000:] + logs[-3000:]
    assert "ShardFailedError" not in logs
    # the client planned thousands, and started within what the stand-ins finish in the timeout
    for planned, within in re.findall(r"planned (\d+); within the timeout (\d+)", logs):
        assert int(planned) == PLANNED > 2 * int(within), logs[-2000:]
    # exactly one record per sample, none failed
    ids: list[str] = []
    for shard, out in enumerate(outputs):
        ids += [r["id"] for r in records(wd / out)]
        assert (wd / out).with_name(f"0000{shard}.failed.jsonl").read_text() == ""
    expected = [
        r["id"]
        for s in sorted((wd / "results" / "shards").glob("*.parquet"))
        for r in pq.read_table(s).to_pylist()
    ]
    assert sorted(ids) == sorted(expected) and len(ids) == SAMPLES
