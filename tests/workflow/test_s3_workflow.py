"""The workflow on real S3 (SeaweedFS from .ci/s3-up.sh): dataset read from s3://, journals synced to
S3 in batches, the final Parquet + manifest published to s3://. A run is killed mid-generation; a rerun
in a FRESH working directory (another machine) resumes from the S3 journal without re-sending completed
requests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from regen.simulated.options import REQUEST_LOG_ENV
from regen.simulated.requestlog import read_request_log
from regen.storage import list_keys, s3_client, split_s3_uri, upload_file

ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
PARTS = ("Snakefile", "rules", "scripts", "schemas", "report", "envs", "config", "resources")
BENCHMARK = "data/demo/benchmark.jsonl"  # config/demo.yaml audit.decontamination names it


def fresh_workdir(path: Path, prefix: str) -> Path:
    """A new checkout of the workflow: no results, no journal, no local copy of the dataset."""
    path.mkdir(parents=True)
    for part in PARTS:
        src = ROOT / part
        if src.is_dir():
            subprocess.run(["cp", "-r", str(src), str(path / part)], check=True)
        else:
            subprocess.run(["cp", str(src), str(path / part)], check=True)
    (path / BENCHMARK).parent.mkdir(parents=True)
    subprocess.run(["cp", str(ROOT / BENCHMARK), str(path / BENCHMARK)], check=True)
    (path / "config" / "s3.yaml").write_text(
        f"""
dataset: {{path: "{prefix}/input/dataset.jsonl"}}
generate:
  journal_sync: {{s3_prefix: "{prefix}/run", every_records: 4, every_seconds: 0.5}}
merge: {{output_prefix: "{prefix}/dataset"}}
server:
  simulated: {{token_rate: 150, faults: {{enabled: false}}}}
"""
    )
    return path


def snakemake_cmd() -> list[str]:
    return [SNAKEMAKE, "--cores", "2", "--configfile", "config/demo.yaml", "config/s3.yaml"]


def finished_ids_in_s3(prefix: str) -> set[str]:
    """Sample ids of every journal line the S3 batches hold (keys are bucket-relative)."""
    client = s3_client()
    bucket = split_s3_uri(prefix)[0]
    ids: set[str] = set()
    for key in list_keys(f"{prefix}/run/journal"):
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        for line in body.splitlines():
            try:
                ids.add(orjson.loads(line)["id"])
            except (orjson.JSONDecodeError, KeyError):
                continue
    return ids


def kill_once_synced(cmd: list[str], workdir: Path, env: dict[str, str], prefix: str) -> set[str]:
    """Run ``cmd`` in ``workdir`` and SIGKILL its whole process group once 20 finished ids are in the S3
    journal under ``prefix``; the ids S3 holds after the kill."""
    proc = subprocess.Popen(
        cmd, cwd=workdir, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 240
    synced: set[str] = set()
    while time.monotonic() < deadline and proc.poll() is None and len(synced) < 20:
        time.sleep(0.5)
        synced = finished_ids_in_s3(prefix)
    assert proc.poll() is None, "the run ended before it could be killed mid-generation"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(1.0)  # a batch upload in flight at the kill may still land: count what S3 holds now
    return finished_ids_in_s3(prefix)


@pytest.mark.s3
@pytest.mark.timeout(600)
def test_resume_on_another_machine_from_the_s3_journal(s3_prefix: str, tmp_path: Path) -> None:
    upload_file(ROOT / "data" / "demo" / "dataset.jsonl", f"{s3_prefix}/input/dataset.jsonl")
    request_log = tmp_path / "requests.jsonl"
    env = {**os.environ, REQUEST_LOG_ENV: str(request_log), "PYTHONUNBUFFERED": "1"}

    # machine A: killed (SIGKILL to the whole process group) once some journal batches are in S3
    a = fresh_workdir(tmp_path / "machine-a", s3_prefix)
    synced = kill_once_synced(snakemake_cmd(), a, env, s3_prefix)
    assert len(synced) >= 20
    killed_at = max(e["t"] for e in read_request_log(request_log))

    # machine B: a fresh directory; only the config and S3 are shared
    b = fresh_workdir(tmp_path / "machine-b", s3_prefix)
    done = subprocess.run(snakemake_cmd(), cwd=b, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]

    resent = {
        e["id"] for e in read_request_log(request_log) if e["t"] > killed_at and e["event"] == "received"
    } & synced
    assert not resent, f"{len(resent)} requests completed (journaled in S3) were sent again"
    reconcile = orjson.loads((b / "results" / "reconcile.json").read_bytes())
    assert reconcile["ok"] and reconcile["lost_count"] == 0 and reconcile["duplicated_count"] == 0
    published = {k.rsplit("/", 1)[-1] for k in list_keys(f"{s3_prefix}/dataset")}
    assert "_manifest.json" in published and any(name.endswith(".parquet") for name in published)
