"""The features uploaded to S3 like the dataset (``regen.features.publish``, on the SeaweedFS server that
``.ci/run`` starts, as ``tests/test_storage.py``'s dataset upload): each shard's row files, then its manifest
last, the bytes the manifest's checksums name; the row journal and moved-aside files stay local; a file that
no longer matches its manifest is not uploaded."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from regen.features.config import LAYER_CONVENTION
from regen.features.publish import publish_shard
from regen.features.store import (
    ROWS_JOURNAL,
    SUPERSEDED_DIR,
    FeatureSettings,
    ShardStore,
    StoredRow,
    StoredTensor,
    row_file_name,
    settings_digest,
)
from regen.layout.names import MANIFEST_NAME
from regen.layout.run import RunLayout
from regen.storage import StorageError, download_file, list_keys, split_s3_uri, upload_file

pytestmark = pytest.mark.s3

SETTINGS = FeatureSettings("m", (2, 4), LAYER_CONVENTION, "post_norm", "bf16", 4, "stand-in")


def stored_shard(layout: RunLayout, shard: str, lengths: tuple[int, ...]) -> Path:
    """A shard's features as the features job leaves them: row files, the row journal, the manifest, and
    one file moved aside by an earlier run."""
    shard_dir = layout.features_shard_dir(shard)
    store = ShardStore.open(shard_dir, SETTINGS)
    for i, n in enumerate(lengths):
        row_id = f"s{i}/default/0"
        ids = bytes(range(i, i + n)).ljust(8 * n, b"\0")
        line = StoredRow(
            row_id, f"s{i}", row_file_name(row_id), "", n, f"d{i}", settings_digest(SETTINGS), f"fp{i}"
        )
        states = bytes([i + 1]) * (n * 2 * 4 * 2)
        tensors = [
            StoredTensor("token_ids", "I64", (n,), ids),
            StoredTensor("hidden_states", "BF16", (n, 2, 4), states),
        ]
        store.write_rows([(line, tensors)])
    store.write_manifest(shard, [f"s{i}/default/0" for i in range(len(lengths))], {})
    (shard_dir / SUPERSEDED_DIR / "earlier").mkdir(parents=True)
    (shard_dir / SUPERSEDED_DIR / "earlier" / "old.safetensors").write_bytes(b"an earlier run's")
    return shard_dir


def test_a_shards_features_go_up_manifest_last_and_round_trip(s3_prefix: str, tmp_path: Path) -> None:
    layout = RunLayout(results=tmp_path / "results")
    shard_dir = stored_shard(layout, "00001", (3, 5))
    manifest = json.loads((shard_dir / MANIFEST_NAME).read_text())
    prefix = f"{s3_prefix}/features"
    uris = publish_shard(shard_dir, prefix, layout.features_published("00001"))
    assert uris[-1] == f"{prefix}/00001/{MANIFEST_NAME}"  # a reader that finds the manifest finds every row
    bucket = split_s3_uri(s3_prefix)[0]
    keys = {f"s3://{bucket}/{k}" for k in list_keys(prefix)}
    assert keys == set(uris) == {f"{prefix}/00001/{r['file']}" for r in manifest["rows"]} | {uris[-1]}
    assert not any(ROWS_JOURNAL in k or SUPERSEDED_DIR in k or "_published" in k for k in keys)
    for row in manifest["rows"]:
        back = download_file(f"{prefix}/00001/{row['file']}", tmp_path / "back" / row["file"])
        assert hashlib.sha256(back.read_bytes()).hexdigest() == row["sha256"]
    record = json.loads(layout.features_published("00001").read_text())
    assert record == {"prefix": f"{prefix}/00001", "objects": uris, "uploaded": uris}


def test_a_rerun_uploads_only_the_rows_that_changed_and_the_manifest(s3_prefix: str, tmp_path: Path) -> None:
    layout = RunLayout(results=tmp_path / "results")
    shard_dir = stored_shard(layout, "00002", (3, 5, 4))
    prefix = f"{s3_prefix}/features"
    record = layout.features_published("00002")
    first = publish_shard(shard_dir, prefix, record)
    manifest_uri = first[-1]
    again = publish_shard(shard_dir, prefix, record)
    assert again == first and json.loads(record.read_text())["uploaded"] == [manifest_uri]

    # the features job computed row 1 again (its answer was regenerated): new bytes, a new manifest
    store = ShardStore.open(shard_dir, SETTINGS)
    row_id = "s1/default/0"
    line = StoredRow(row_id, "s1", row_file_name(row_id), "", 2, "d1b", settings_digest(SETTINGS), "fp1b")
    tensors = [
        StoredTensor("token_ids", "I64", (2,), bytes(16)),
        StoredTensor("hidden_states", "BF16", (2, 2, 4), bytes([9]) * 32),
    ]
    store.write_rows([(line, tensors)])
    manifest = store.write_manifest("00002", [f"s{i}/default/0" for i in range(3)], {})
    # and an object at row 2's key was overwritten outside regen (no sha256 recorded with it)
    row2 = f"{prefix}/00002/{row_file_name('s2/default/0')}"
    upload_file(shard_dir / MANIFEST_NAME, row2)
    publish_shard(shard_dir, prefix, record)
    changed = f"{prefix}/00002/{row_file_name(row_id)}"
    assert json.loads(record.read_text())["uploaded"] == [changed, row2, manifest_uri]
    for row in manifest["rows"]:
        back = download_file(f"{prefix}/00002/{row['file']}", tmp_path / "back2" / row["file"])
        assert hashlib.sha256(back.read_bytes()).hexdigest() == row["sha256"]


def test_a_file_that_no_longer_matches_its_manifest_is_not_uploaded(s3_prefix: str, tmp_path: Path) -> None:
    layout = RunLayout(results=tmp_path / "results")
    shard_dir = stored_shard(layout, "00000", (2, 4))
    manifest = json.loads((shard_dir / MANIFEST_NAME).read_text())
    victim = shard_dir / manifest["rows"][1]["file"]
    blob = bytearray(victim.read_bytes())
    blob[-1] ^= 0xFF
    victim.write_bytes(bytes(blob))
    with pytest.raises(StorageError, match=rf"{victim.name}: sha256 differs .*rerun the features job"):
        publish_shard(shard_dir, f"{s3_prefix}/features", layout.features_published("00000"))
    assert list_keys(f"{s3_prefix}/features") == [] and not layout.features_published("00000").exists()
    with pytest.raises(StorageError, match="must be an s3:// URI"):
        publish_shard(shard_dir, str(tmp_path / "local"), layout.features_published("00000"))
