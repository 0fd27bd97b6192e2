"""Snakemake itself, as a user reruns the demo after changing things: an operational key plans nothing,
an edited prompt regenerates that sample alone, a sampling change regenerates every sample, and the
dry run says which and why before anything runs. The output never mixes settings."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import orjson
import pyarrow.dataset as ds
import pytest
from support.workflow import copy_workflow, dataset_records, free_port_base, job_counts, snakemake

DEMO = ("--configfile", "config/demo.yaml", "config/local.yaml")


def rows(wd: Path, *columns: str) -> list[dict[str, Any]]:
    """Output rows; ``answer`` is the regenerated assistant turn (the last message)."""
    return dataset_records(wd / "results" / "dataset", *columns)


def generate_logs(wd: Path) -> str:
    return "".join(p.read_text() for p in sorted((wd / "logs" / "generate").glob("*.log")))


@pytest.fixture
def wd(tmp_path: Path) -> Path:
    wd = copy_workflow(tmp_path / "wf")
    (wd / "config" / "local.yaml").write_text(f"server: {{port_base: {free_port_base()}}}\n")
    return wd


@pytest.mark.timeout(900)
def test_rerun_after_operational_prompt_and_sampling_changes(wd: Path) -> None:
    first = snakemake(wd, "--cores", "2", *DEMO)
    assert first.returncode == 0, first.stderr[-3000:]
    before = {r["id"]: r for r in rows(wd, "id", "fingerprint", "settings_fingerprint", "temperature")}
    assert len({r["settings_fingerprint"] for r in before.values()}) == 1

    # 1. operational keys (timeouts, ports, idle time, restarts, concurrency, retries): nothing to do
    (wd / "config" / "ops.yaml").write_text(
        "server: {idle_timeout_s: 7, port_base: 31900, startup_timeout_s: 99, max_restarts: 5,"
        " simulated: {token_rate: 9000}}\n"
        "generate: {request_timeout_s: 12, concurrency: 3, max_attempts: 2, backoff_base_s: 0.5}\n"
    )
    dry = snakemake(wd, "-n", *DEMO, "config/ops.yaml")
    assert "Nothing to be done" in dry.stdout + dry.stderr, (dry.stdout + dry.stderr)[-3000:]

    # 2. one prompt edited, its id kept: the dry run names it; the rerun regenerates it alone
    dataset = wd / "data" / "demo" / "dataset.jsonl"
    lines = dataset.read_bytes().splitlines(keepends=True)
    row = orjson.loads(lines[0])
    assert row["id"] == "demo-0000" and row["messages"][0]["role"] == "user"
    row["messages"][0]["content"] += " Answer for a child."
    lines[0] = orjson.dumps(row) + b"\n"
    dataset.write_bytes(b"".join(lines))
    dry = snakemake(wd, "-n", *DEMO)
    out = dry.stdout + dry.stderr
    assert "1 regenerated because their prompt changed" in out, out[-3000:]
    edited = snakemake(wd, "--cores", "2", *DEMO)
    assert edited.returncode == 0, edited.stderr[-3000:]
    logs = generate_logs(wd)
    assert logs.count("1 regenerated (changed since journaled)") == 1
    after = {r["id"]: r for r in rows(wd, "id", "fingerprint", "settings_fingerprint")}
    assert after["demo-0000"]["messages"][0]["content"].endswith("Answer for a child.")
    assert after["demo-0000"]["fingerprint"] != before["demo-0000"]["fingerprint"]
    unchanged = [i for i in before if i != "demo-0000" and i in after]
    assert unchanged and all(after[i]["answer"] == before[i]["answer"] for i in unchanged)

    # 3. a sampling change: the dry run says all of them and why; every row then carries it
    (wd / "config" / "hot.yaml").write_text("generate: {sampling: {temperature: 0.9}}\n")
    dry = snakemake(wd, "-n", *DEMO, "config/hot.yaml")
    out = dry.stdout + dry.stderr
    assert "0 replayed from the journals" in out and "temperature 0.6→0.9" in out, out[-3000:]
    # only the real difference, once, and the fingerprint the run then uses (issue 47 item 9)
    assert "server_numerics" not in out and out.count("→") == 1, out[-3000:]
    previewed = re.search(r"generation settings fingerprint (\w+)", out)
    assert job_counts(out)["generate"] == 4 and "tune" not in job_counts(out)
    hot = snakemake(wd, "--cores", "2", *DEMO, "config/hot.yaml")
    assert hot.returncode == 0, hot.stderr[-3000:]
    table = rows(wd, "temperature", "settings_fingerprint")
    assert {r["temperature"] for r in table} == {0.9} and len({r["settings_fingerprint"] for r in table}) == 1
    assert previewed is not None and previewed[1] == table[0]["settings_fingerprint"], out[-3000:]
    manifest = json.loads((wd / "results" / "dataset" / "_manifest.json").read_text())
    provenance = manifest["provenance"]
    assert provenance["sampling"]["temperature"] == 0.9 and not provenance["mixed_settings"]
    ready = json.loads((wd / "results" / "READY.json").read_text())
    assert ready["ready"] and ready["settings_fingerprint"] == table[0]["settings_fingerprint"]
    assert ready["settings_fingerprint"] == provenance["settings_fingerprint"]


@pytest.mark.s3
@pytest.mark.timeout(900)
def test_killed_run_resumed_on_another_machine_with_another_config(s3_prefix: str, tmp_path: Path) -> None:
    """Machine A (temperature 0.6) is SIGKILLed mid-generation with journal batches in S3; machine B, a
    fresh directory with temperature 0.9, restores them, replays none and publishes only 0.9 answers."""
    import os
    import subprocess

    from test_s3_workflow import fresh_workdir, kill_once_synced, snakemake_cmd

    from regen.simulated.options import REQUEST_LOG_ENV
    from regen.simulated.requestlog import read_request_log
    from regen.storage import download_file, upload_file

    upload_file(
        Path(__file__).resolve().parents[2] / "data" / "demo" / "dataset.jsonl",
        f"{s3_prefix}/input/dataset.jsonl",
    )
    request_log = tmp_path / "requests.jsonl"
    env = {**os.environ, REQUEST_LOG_ENV: str(request_log), "PYTHONUNBUFFERED": "1"}
    port = free_port_base(4)

    a = fresh_workdir(tmp_path / "machine-a", s3_prefix)
    (a / "config" / "local.yaml").write_text(f"server: {{port_base: {port}}}\n")
    synced = kill_once_synced([*snakemake_cmd(), "config/local.yaml"], a, env, s3_prefix)
    killed_at = max(e["t"] for e in read_request_log(request_log))

    b = fresh_workdir(tmp_path / "machine-b", s3_prefix)
    (b / "config" / "local.yaml").write_text(
        f"server: {{port_base: {port + 2}}}\ngenerate: {{sampling: {{temperature: 0.9}}}}\n"
    )
    done = subprocess.run(
        [*snakemake_cmd(), "config/local.yaml"], cwd=b, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    resent = {
        e["id"] for e in read_request_log(request_log) if e["t"] > killed_at and e["event"] == "received"
    }
    assert synced <= resent, "an answer journaled under temperature 0.6 was replayed into a 0.9 run"
    logs = "".join(p.read_text() for p in sorted((b / "logs" / "generate").glob("*.log")))
    assert logs.count(": 0 replayed from the journal,") == 4, logs[-3000:]
    table = ds.dataset(str(b / "results" / "dataset"), format="parquet").to_table(
        columns=["temperature", "settings_fingerprint"]
    )
    assert set(table.column("temperature").to_pylist()) == {0.9}
    assert len(set(table.column("settings_fingerprint").to_pylist())) == 1
    manifest = download_file(f"{s3_prefix}/dataset/_manifest.json", tmp_path / "manifest.json")
    provenance = json.loads(manifest.read_text())["provenance"]
    assert provenance["sampling"]["temperature"] == 0.9 and not provenance["mixed_settings"]
