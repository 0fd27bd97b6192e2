"""The publish stage: upload the ready, re-audited dataset to ``merge.output_prefix`` (S3).

The Parquet files its ``_manifest.json`` names go first, each checked against the manifest's sha256, and the
manifest last (``regen.storage.publish_manifested``), so a reader that finds the manifest finds every file it
names. A file already there with the same sha256 is not sent again: a publish that failed halfway, rerun,
sends what is missing. ``results/published.json`` records what went where and what was sent.
"""

from __future__ import annotations

import os
from pathlib import Path

from regen.io import read_json, write_json
from regen.layout.names import MANIFEST_NAME
from regen.storage import ManifestedFile, StorageError, is_s3_uri, publish_manifested


def publish_dataset(
    dataset_dir: str | os.PathLike[str], s3_prefix: str, record_out: str | os.PathLike[str]
) -> list[str]:
    """Upload the training-ready Parquet (manifest last) to ``s3_prefix``; record and return the URIs of
    every file the manifest names, and the manifest."""
    if not is_s3_uri(s3_prefix):
        raise StorageError(f"merge.output_prefix must be an s3:// URI, got {s3_prefix!r}")
    manifest = read_json(Path(dataset_dir) / MANIFEST_NAME)
    files = [ManifestedFile(f["path"], f["sha256"], f["path"]) for f in manifest["files"]]
    remedy = "the dataset changed after merge; rerun the merge (snakemake --forcerun merge)"
    published = publish_manifested(dataset_dir, files, s3_prefix, remedy)
    write_json(record_out, published.to_json())
    return list(published.uris)
