"""The demo equivalence check (tests/support/demo_equivalence.py) on two small hand-made runs: what varies
between two runs of one revision (volatile fields, row order, the clone's path) compares equal; a changed
answer, count or plan line does not, and the report names it."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard
from support.demo_equivalence import compare, digest_run

DRY_RUN = """\
SNAKEMAKE
=========
  Date: {date}
  Working directory: {root}
Building DAG of jobs...
regen: generation settings fingerprint 7754a2be2e99cb0b
regen: {n} samples: 0 replayed from the journals, {n} to generate
  {n} new (never generated)
Job stats:
job         count
--------  -------
generate        2
all             1
total           3

[{date}] Group job gpu (jobs in lexicogr. order):

    [{date}]
    rule generate:
        input: results/shards/00000.parquet{extra_input}
        output: results/generations/00000.jsonl.zst
        reason: Missing output files: results/generations/00000.jsonl.zst
        wildcards: shard=00000
        resources: tmpdir={root}/tmp, gpu=1

    [{date}]
    rule generate:
        input: results/shards/00001.parquet
        output: results/generations/00001.jsonl.zst
        reason: Missing output files: results/generations/00001.jsonl.zst
        wildcards: shard=00001
        resources: tmpdir={root}/tmp, gpu=1

[{date}]
rule all:
    input: results/generations/00000.jsonl.zst, results/generations/00001.jsonl.zst
    reason: Input files updated by another job: {unordered}
    resources: tmpdir={root}/tmp
Reasons:
    (check individual jobs above for details)
    output files have to be generated:
        generate
This was a dry-run (flag -n). The order of jobs does not reflect the order of execution.
"""


def make_run(
    root: Path,
    started: float,
    answers: dict[str, str],
    order: list[str],
    lost: int = 0,
    n: int = 2,
    extra_input: str = "",
) -> dict[str, str]:
    """A run directory with a valid shard, a generations file, reconcile.json; returns the command outputs."""
    (root / "results/valid").mkdir(parents=True)
    (root / "results/generations").mkdir(parents=True)
    rows = [
        {"id": i, "content": answers[i], "started_at": started + k, "latency_s": 0.1 * k}
        for k, i in enumerate(order)
    ]
    pq.write_table(pa.Table.from_pylist(rows), root / "results/valid/00000.parquet")
    url = f"http://127.0.0.1:{31000 + int(started) % 7}"  # another port when 31000 is taken
    server = {"id": f"gpu{int(started) % 2}", "url": url}  # the first free GPU slot took the shard
    lines = [
        {"id": r["id"], "content": r["content"], "server": server}
        | {"timings": {"started_at": r["started_at"], "latency_s": r["latency_s"]}}
        for r in rows
    ]
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    (root / "results/generations/00000.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    (root / "results/reconcile.json").write_text(
        json.dumps({"ok": lost == 0, "lost_count": lost, "path": str(root)})
    )
    unordered = "results/generations/00001.jsonl.zst, results/generations/00000.jsonl.zst"
    fresh = DRY_RUN.format(
        unordered=unordered,
        date=f"2026-12-01 08:{int(started) % 60:02d}",
        root=root,
        n=n,
        extra_input=extra_input,
    )
    return {"dryrun/fresh": fresh, "cli/reconcile": f"OK\nresults: {root}/results\n"}


def digest(root: Path, **kw) -> dict:
    outputs = make_run(root, **kw)
    entries, informational = digest_run(root, Path("/venv"), outputs)
    return {
        "format": "regen-demo-digest/1",
        "revision": root.name,
        "volatile": [],
        "substitutions": [],
        "entries": entries,
        "informational": informational,
    }


ANSWERS = {"a": "four", "b": "a cat", "c": "blue"}


def test_two_runs_that_differ_only_in_volatile_fields_order_and_path_are_equivalent(tmp_path: Path) -> None:
    a = digest(tmp_path / "one", started=1000.0, answers=ANSWERS, order=["a", "b", "c"])
    b = digest(tmp_path / "two", started=2003.0, answers=ANSWERS, order=["c", "a", "b"])
    out: list[str] = []
    assert compare(a, b, out.append) == 0
    assert out[-1] == "equivalence: files=5 identical=5 differ=0"


def test_a_changed_answer_count_or_plan_line_is_named(tmp_path: Path) -> None:
    a = digest(tmp_path / "one", started=1000.0, answers=ANSWERS, order=["a", "b", "c"])
    b = digest(
        tmp_path / "two", started=1000.0, answers=ANSWERS | {"b": "a dog"}, order=["a", "b", "c"], lost=1, n=3
    )
    out: list[str] = []
    assert compare(a, b, out.append) == 4
    text = "\n".join(out)
    assert "! results/valid/00000.parquet:\n    column content: differs\n    1 rows changed: b" in text
    assert (
        "! results/generations/00000.jsonl.zst:\n    column content: differs\n    1 rows changed: b" in text
    )
    assert "lost_count: 0 -> 1" in text
    assert "-> '3 samples: 0 replayed from the journals, 3 to generate'" in text
    assert out[-1] == "equivalence: files=5 identical=1 differ=4"


def test_a_newly_declared_input_is_informational_not_a_difference(tmp_path: Path) -> None:
    a = digest(tmp_path / "one", started=1000.0, answers=ANSWERS, order=["a", "b", "c"])
    b = digest(
        tmp_path / "two", started=1000.0, answers=ANSWERS, order=["a", "b", "c"], extra_input=", logs/x.json"
    )
    out: list[str] = []
    assert compare(a, b, out.append) == 0
    assert "informational (not counted):" in out
    assert any("dryrun/fresh/job_files" in line for line in out)
