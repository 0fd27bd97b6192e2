"""regen.storage against a real S3 server (SeaweedFS started by .ci/s3-up.sh).

The S3 tests need ``REGEN_TEST_S3_ENDPOINT`` (e.g. http://127.0.0.1:8333) and ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` accepted by that server; without them they are skipped.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from support.valid_shards import make_valid_shards

from regen.output.merge import MergeConfig, merge
from regen.output.publish import publish_dataset
from regen.storage import (
    S3JournalSink,
    StorageError,
    download_file,
    is_s3_uri,
    list_keys,
    s3_client,
    split_s3_uri,
)

ENDPOINT = os.environ.get("REGEN_TEST_S3_ENDPOINT")
BUCKET = os.environ.get("REGEN_TEST_S3_BUCKET", "regen-test")
REPO_ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- URIs (no server)


def test_split_s3_uri() -> None:
    assert split_s3_uri("s3://bucket/a/b.parquet") == ("bucket", "a/b.parquet")
    assert split_s3_uri("s3://bucket") == ("bucket", "")
    assert split_s3_uri("s3://bucket/prefix/") == ("bucket", "prefix/")
    assert is_s3_uri("s3://b/k") and not is_s3_uri("/data/x.jsonl") and not is_s3_uri(None)
    with pytest.raises(ValueError, match="not an s3:// URI"):
        split_s3_uri("/local/path")
    with pytest.raises(ValueError, match="without a bucket"):
        split_s3_uri("s3:///key")


# --------------------------------------------------------------------------- fixtures


def record(i: int, shard: str = "00003") -> bytes:
    return orjson.dumps({"id": f"s{i:04d}", "shard": shard, "content": f"answer {i}"}) + b"\n"


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def batch_keys(prefix: str, shard: str) -> list[str]:
    return [k.rsplit("/", 1)[1] for k in list_keys(f"{prefix}/journal/{shard}")]


def read_object(uri: str) -> bytes:
    bucket, key = split_s3_uri(uri)
    return s3_client().get_object(Bucket=bucket, Key=key)["Body"].read()


# --------------------------------------------------------------------------- journal sink


@pytest.mark.s3
def test_batches_are_cut_at_the_record_threshold(s3_prefix: str) -> None:
    sink = S3JournalSink(s3_prefix, "00003", every_records=3, every_seconds=3600)
    lines = [record(i) for i in range(7)]
    for line in lines:
        sink.on_append(line)
    wait_for(lambda: len(sink.uploaded_batches) == 2, "two batches")
    assert batch_keys(s3_prefix, "00003") == ["batch-00000000.jsonl", "batch-00000001.jsonl"]
    sink.close()  # the 7th line goes up on close
    assert batch_keys(s3_prefix, "00003")[-1] == "batch-00000002.jsonl"
    bodies = [read_object(f"{s3_prefix}/journal/00003/batch-{n:08d}.jsonl") for n in range(3)]
    assert bodies == [b"".join(lines[0:3]), b"".join(lines[3:6]), lines[6]]


@pytest.mark.s3
def test_a_batch_is_uploaded_after_every_seconds_without_flush(s3_prefix: str) -> None:
    sink = S3JournalSink(s3_prefix, "00000", every_records=1000, every_seconds=0.3)
    sink.on_append(record(1, "00000"))
    sink.on_append(record(2, "00000").rstrip(b"\n"))  # a missing newline is added
    wait_for(lambda: sink.uploaded_batches == [0], "the timed batch")
    assert read_object(f"{s3_prefix}/journal/00000/batch-00000000.jsonl") == record(1, "00000") + record(
        2, "00000"
    )
    sink.close()
    assert sink.uploaded_batches == [0]  # nothing pending, no empty batch on close


NODE_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from regen.storage import S3JournalSink
    prefix, journal = sys.argv[1], Path(sys.argv[2])
    journal.parent.mkdir(parents=True)
    sink = S3JournalSink(prefix, "00007", every_records=4, every_seconds=3600)
    sink.restore(journal)
    with open(journal, "ab") as fh:
        for i in range(10):
            line = b'{"id":"s%04d","content":"answer %d"}\\n' % (i, i)
            fh.write(line); fh.flush()
            sink.on_append(line)
    while len(sink.uploaded_batches) < 2:
        time.sleep(0.05)
    print("READY", flush=True)
    time.sleep(600)
    """
)


@pytest.mark.s3
def test_lost_node_restore_in_a_fresh_workdir(s3_prefix: str, tmp_path: Path) -> None:
    node_a = tmp_path / "node-a"
    node_a.mkdir()
    journal_a = node_a / "work" / "journal" / "00007.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", NODE_SCRIPT, s3_prefix, str(journal_a)],
        cwd=node_a,
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "READY"
        assert len(journal_a.read_bytes().splitlines()) == 10
    finally:
        proc.send_signal(signal.SIGKILL)  # the node is lost: no flush, no close
        proc.wait(timeout=10)
    subprocess.run(["rm", "-rf", str(node_a)], check=True)  # and its disk with it

    node_b = tmp_path / "node-b"  # a fresh working directory on another node
    journal_b = node_b / "work" / "journal" / "00007.jsonl"
    sink = S3JournalSink(s3_prefix, "00007", every_records=4, every_seconds=3600)
    result = sink.restore(journal_b)
    restored = journal_b.read_bytes().splitlines()
    # 10 lines were written; 2 full batches (8 lines) had been uploaded; the 2 pending ones are lost.
    assert [orjson.loads(ln)["id"] for ln in restored] == [f"s{i:04d}" for i in range(8)]
    assert (result.batches, result.added_lines, result.queued_lines, result.next_batch) == (2, 8, 0, 2)

    sink.on_append(b'{"id":"s0008","content":"again"}\n')
    sink.close()
    assert batch_keys(s3_prefix, "00007") == [f"batch-{n:08d}.jsonl" for n in range(3)]
    assert (
        read_object(f"{s3_prefix}/journal/00007/batch-00000002.jsonl")
        == b'{"id":"s0008","content":"again"}\n'
    )


@pytest.mark.s3
def test_restore_merges_overlap_and_queues_unsynced_local_lines(s3_prefix: str, tmp_workdir: Path) -> None:
    journal = tmp_workdir / "work" / "journal" / "00001.jsonl"
    journal.parent.mkdir(parents=True)
    first = S3JournalSink(s3_prefix, "00001", every_records=4, every_seconds=3600)
    for i in range(6):
        first.on_append(record(i, "00001"))
    first.close()  # batches 0 (s0000-s0003) and 1 (s0004-s0005)
    # The local journal has all of that, one line rewritten for s0002, and two lines S3 never saw,
    # followed by a torn line from a kill in mid-write.
    local = [record(i, "00001") for i in range(8)]
    local[2] = orjson.dumps({"id": "s0002", "content": "local version"}) + b"\n"
    journal.write_bytes(b"".join(local) + b'{"id":"s00')

    second = S3JournalSink(s3_prefix, "00001", every_records=4, every_seconds=3600)
    result = second.restore(journal)
    assert (result.batches, result.added_lines, result.next_batch) == (2, 0, 2)
    assert journal.read_bytes() == b"".join(local)  # remote s0002 not added twice; torn tail dropped
    assert result.queued_lines == 3  # rewritten s0002, s0006, s0007
    second.close()
    assert read_object(f"{s3_prefix}/journal/00001/batch-00000002.jsonl") == local[2] + local[6] + local[7]


@pytest.mark.s3
def test_reuploading_the_same_batch_is_harmless(s3_prefix: str, tmp_workdir: Path) -> None:
    lines = [record(i, "00002") for i in range(3)]
    for _ in range(2):  # e.g. a retried job that appends the same lines before any restore
        sink = S3JournalSink(s3_prefix, "00002", every_records=3, every_seconds=3600)
        for line in lines:
            sink.on_append(line)
        sink.close()
    assert batch_keys(s3_prefix, "00002") == ["batch-00000000.jsonl"]
    journal = tmp_workdir / "j.jsonl"
    S3JournalSink(s3_prefix, "00002", every_records=500, every_seconds=3600).restore(journal)
    assert journal.read_bytes() == b"".join(lines)


# --------------------------------------------------------------------------- auth errors


@pytest.mark.s3
def test_wrong_secret_gives_a_clear_error_without_the_secret(
    s3_prefix: str, tmp_workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    wrong = "wrong-secret-" + uuid.uuid4().hex
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong)
    sink = S3JournalSink(s3_prefix, "00004", every_records=1, every_seconds=3600)
    with pytest.raises(StorageError) as info:
        sink.restore(tmp_workdir / "j.jsonl")
    msg = str(info.value)
    assert "SignatureDoesNotMatch" in msg and s3_prefix.split("//")[1] in msg
    assert "AWS_SECRET_ACCESS_KEY" in msg  # says what to check
    assert wrong not in msg and real_secret not in msg

    sink.on_append(record(1))  # the upload fails in the worker thread ...
    with pytest.raises(StorageError, match="SignatureDoesNotMatch") as info:
        sink.flush()  # ... and is raised here, not swallowed
    assert wrong not in str(info.value)
    with pytest.raises(StorageError):
        sink.close()


@pytest.mark.s3
def test_unknown_key_and_missing_credentials(s3_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "no-such-key")
    with pytest.raises(StorageError, match=r"InvalidAccessKeyId.*AWS_ACCESS_KEY_ID"):
        list_keys(s3_prefix)

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    with pytest.raises(StorageError, match="no usable S3 credentials") as info:
        list_keys(s3_prefix)
    assert s3_prefix in str(info.value)


# --------------------------------------------------------------------------- dataset publish


@pytest.mark.s3
def test_publish_sends_the_manifests_parts_then_the_manifest_and_only_what_is_missing_again(
    s3_prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dataset = tmp_path / "dataset"
    merge(make_valid_shards(tmp_path, [9, 8]), dataset, MergeConfig.from_dict({"max_rows_per_file": 6}), {})
    (dataset / ".part-00009.parquet.123.tmp").write_bytes(b"half-written")
    names = [f["path"] for f in json.loads((dataset / "_manifest.json").read_text())["files"]]
    assert names == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    prefix = s3_prefix + "/dataset/"
    record = tmp_path / "published.json"

    uris = publish_dataset(dataset, prefix, record)
    expected = [f"{s3_prefix}/dataset/{n}" for n in [*names, "_manifest.json"]]
    assert uris == expected  # the manifest last
    assert json.loads(record.read_text())["uploaded"] == expected
    for name in [*names, "_manifest.json"]:
        back = download_file(f"{s3_prefix}/dataset/{name}", tmp_path / "back" / name)
        assert back.read_bytes() == (dataset / name).read_bytes()
    assert [k.rsplit("/", 1)[-1] for k in list_keys(prefix)] == sorted([*names, "_manifest.json"])

    # a publish that stopped halfway (one part never arrived), rerun: that part and the manifest go, no more;
    # an earlier publish's part the manifest no longer names is left there and counted
    bucket, key = split_s3_uri(expected[1])
    s3_client().delete_object(Bucket=bucket, Key=key)
    s3_client().put_object(Bucket=bucket, Key=key.replace("00001", "00007"), Body=b"an earlier publish's")
    caplog.set_level(logging.INFO, logger="regen.storage")
    assert publish_dataset(dataset, prefix, record) == expected
    assert json.loads(record.read_text())["uploaded"] == [expected[1], expected[-1]]
    assert "1 objects there that the manifest does not name are left in place" in caplog.text

    # a part changed after merge: nothing goes, and the error names it and the manifest
    (dataset / names[2]).write_bytes(b"not the merged part")
    s3_client().delete_object(Bucket=bucket, Key=key)
    changed = rf"{names[2]}: sha256 differs from .*_manifest.json .*rerun the merge"
    with pytest.raises(StorageError, match=changed):
        publish_dataset(dataset, prefix, record)
    assert f"{key}" not in list_keys(prefix)

    with pytest.raises(StorageError, match=r"NoSuchKey|404"):
        download_file(f"{s3_prefix}/dataset/missing.parquet", tmp_path / "back" / "missing.parquet")
    assert not (tmp_path / "back" / "missing.parquet").exists()


@pytest.mark.s3
def test_journal_with_s3_sink_resumes_on_another_node(s3_prefix: str, tmp_path: Path) -> None:
    journal_mod = pytest.importorskip("regen.generate.journal")
    node_a = tmp_path / "a" / "work" / "journal" / "00005.jsonl"
    journal = journal_mod.Journal.open(
        node_a, S3JournalSink(s3_prefix, "00005", every_records=2, every_seconds=3600)
    )
    for i in range(5):
        journal.append({"kind": "record", "id": f"s{i}", "content": str(i)})
    journal.append({"kind": "failed", "id": "s5", "reason": "http", "attempts": 3, "error": "500"})
    journal.close()  # uploads the last batch
    subprocess.run(["rm", "-rf", str(tmp_path / "a")], check=True)

    node_b = tmp_path / "b" / "work" / "journal" / "00005.jsonl"
    resumed = journal_mod.Journal.open(
        node_b, S3JournalSink(s3_prefix, "00005", every_records=2, every_seconds=3600)
    )
    assert resumed.finished_ids == {f"s{i}" for i in range(6)}
    assert (resumed.n_records, resumed.n_failed) == (5, 1)
    resumed.close()


# --------------------------------------------------------------------------- Snakemake S3 input

# The lines the workflow uses for an s3:// dataset (rules/common.smk): the endpoint comes from the same
# AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL variables boto3 reads, the credentials from boto3's chain.
S3_SNAKEFILE = textwrap.dedent(
    """
    import os

    storage s3:
        provider="s3",
        endpoint_url=os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"),
        retries=10,

    def dataset_input(path):
        return storage.s3(path) if str(path).startswith("s3://") else path

    rule all:
        input: "results/count.txt"

    rule audit:
        input: dataset=dataset_input(config["dataset"]["path"])
        output: "results/count.txt"
        shell: "wc -l < {input.dataset} > {output}"
    """
)


@pytest.mark.s3
def test_snakemake_reads_an_s3_dataset_and_sees_it_change(s3_prefix: str, tmp_workdir: Path) -> None:
    uri = f"{s3_prefix}/inputs/data.jsonl"
    bucket, key = split_s3_uri(uri)
    client = s3_client()
    client.put_object(Bucket=bucket, Key=key, Body=b'{"id": "a"}\n{"id": "b"}\n')
    (tmp_workdir / "Snakefile").write_text(S3_SNAKEFILE)
    (tmp_workdir / "config.yaml").write_text(f"dataset:\n  path: {uri}\n")
    snakemake = [
        "timeout", "-s", "KILL", "120",
        str(Path(sys.executable).parent / "snakemake"), "--cores", "1", "--configfile", "config.yaml",
    ]  # fmt: skip

    def run() -> str:
        proc = subprocess.run(snakemake, capture_output=True, text=True, env=os.environ.copy())
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stderr

    run()
    assert (tmp_workdir / "results" / "count.txt").read_text().strip() == "2"
    time.sleep(1.1)  # S3 mtimes have 1 s resolution
    client.put_object(Bucket=bucket, Key=key, Body=b'{"id": "a"}\n{"id": "b"}\n{"id": "c"}\n')
    log = run()
    assert f"Updated input files: {uri} (in storage)" in log
    assert (tmp_workdir / "results" / "count.txt").read_text().strip() == "3"
