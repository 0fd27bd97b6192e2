"""The features' upload to ``features.output_prefix`` (S3), like the dataset's (``regen.output.publish``):
per shard, the row files its manifest names (each checked against the manifest's sha256 first), then the
manifest last, under ``{output_prefix}/{shard}/``, so a reader that finds a shard's manifest finds every file
it names. The row journal, moved-aside files and temporaries stay local. What went where is recorded beside
the manifest (``regen.layout.RunLayout.features_published``)."""

from __future__ import annotations

import os
from pathlib import Path

from regen.features.store import file_sha256, read_manifest
from regen.io import write_json
from regen.layout.names import MANIFEST_NAME
from regen.storage import StorageError, is_s3_uri, parse_location, upload_files


def publish_shard(
    shard_dir: str | os.PathLike[str], s3_prefix: str, record_out: str | os.PathLike[str]
) -> list[str]:
    """Upload one shard's features (row files, manifest last) to ``s3_prefix``/``{shard}``; record and return
    the URIs. A row file whose sha256 differs from its manifest's is not uploaded: the error names it."""
    if not is_s3_uri(s3_prefix):
        raise StorageError(f"features.output_prefix must be an s3:// URI, got {s3_prefix!r}")
    root = Path(shard_dir)
    manifest = read_manifest(root)
    files = []
    for row in manifest["rows"]:
        path = root / row["file"]
        if file_sha256(path) != row["sha256"]:
            raise StorageError(
                f"{path}: sha256 differs from {root / MANIFEST_NAME} (row {row['id']}); not uploaded: rerun "
                "the features job, which computes the row again"
            )
        files.append(path)
    base = parse_location(s3_prefix).child(str(manifest["shard"])).uri
    uris = upload_files(root, [*files, root / MANIFEST_NAME], base)
    write_json(record_out, {"prefix": base, "objects": uris})
    return uris
