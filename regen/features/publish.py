"""The features' upload to ``features.output_prefix`` (S3), like the dataset's (``regen.output.publish``):
per shard, the row files its manifest names (each checked against the manifest's sha256 first), then the
manifest last, under ``{output_prefix}/{shard}/`` (``regen.storage.publish_manifested``), so a reader that
finds a shard's manifest finds every file it names. A row file already there with the same sha256 is not
sent again: a rerun that recomputed one row of a shard uploads that row and the manifest, not the shard's
gigabytes. The row journal, moved-aside files and temporaries stay local. What went where is recorded beside
the manifest (``regen.layout.RunLayout.features_published``)."""

from __future__ import annotations

import os
from pathlib import Path

from regen.features.store import read_manifest
from regen.io import write_json
from regen.storage import ManifestedFile, StorageError, is_s3_uri, parse_location, publish_manifested


def publish_shard(
    shard_dir: str | os.PathLike[str], s3_prefix: str, record_out: str | os.PathLike[str]
) -> list[str]:
    """Upload one shard's features (row files not already there, manifest last) to ``s3_prefix``/``{shard}``;
    record and return the URIs of every object the manifest names, and the manifest. A row file whose sha256
    differs from its manifest's is not uploaded: the error names it."""
    if not is_s3_uri(s3_prefix):
        raise StorageError(f"features.output_prefix must be an s3:// URI, got {s3_prefix!r}")
    manifest = read_manifest(shard_dir)
    files = [ManifestedFile(row["file"], row["sha256"], f"row {row['id']}") for row in manifest["rows"]]
    base = parse_location(s3_prefix).child(str(manifest["shard"]))
    published = publish_manifested(
        Path(shard_dir), files, base.uri, "rerun the features job, which computes the row again"
    )
    write_json(record_out, published.to_json())
    return list(published.uris)
