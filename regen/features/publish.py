"""The features' upload to ``features.output_prefix`` (S3), like the dataset's (``regen.output.publish``):
per shard, the row files its manifest names (each checked against the manifest's sha256 first), then the
manifest last, under ``{output_prefix}/{shard}/``, so a reader that finds a shard's manifest finds every file
it names. A row file already there with the same sha256 (recorded with the object by its upload) is not sent
again: a rerun that recomputed one row of a shard uploads that row and the manifest, not the shard's
gigabytes. The row journal, moved-aside files and temporaries stay local. What went where is recorded beside
the manifest (``regen.layout.RunLayout.features_published``)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from regen.features.store import file_sha256, read_manifest
from regen.io import write_json
from regen.layout.names import MANIFEST_NAME
from regen.storage import StorageError, is_s3_uri, parse_location, s3_client, stored_sha256, upload_file

log = logging.getLogger(__name__)


def publish_shard(
    shard_dir: str | os.PathLike[str], s3_prefix: str, record_out: str | os.PathLike[str]
) -> list[str]:
    """Upload one shard's features (row files not already there, manifest last) to ``s3_prefix``/``{shard}``;
    record and return the URIs of every object the manifest names, and the manifest. A row file whose sha256
    differs from its manifest's is not uploaded: the error names it."""
    if not is_s3_uri(s3_prefix):
        raise StorageError(f"features.output_prefix must be an s3:// URI, got {s3_prefix!r}")
    root = Path(shard_dir)
    manifest = read_manifest(root)
    checked = []
    for row in manifest["rows"]:
        path = root / row["file"]
        if file_sha256(path) != row["sha256"]:
            raise StorageError(
                f"{path}: sha256 differs from {root / MANIFEST_NAME} (row {row['id']}); not uploaded: rerun "
                "the features job, which computes the row again"
            )
        checked.append((path, row["sha256"]))
    base = parse_location(s3_prefix).child(str(manifest["shard"]))
    client = s3_client()
    uris, sent = [], []
    for path, sha in checked:
        uri = base.child(path.relative_to(root).as_posix()).uri
        if stored_sha256(uri, client) != sha:
            upload_file(path, uri, client, sha256=sha)
            sent.append(uri)
        uris.append(uri)
    manifest_uri = base.child(MANIFEST_NAME).uri
    upload_file(root / MANIFEST_NAME, manifest_uri, client)
    uris.append(manifest_uri)
    log.info(
        "features %s: %d row files uploaded, %d already at %s with the same sha256; manifest last",
        manifest["shard"],
        len(sent),
        len(checked) - len(sent),
        base.uri,
    )
    write_json(record_out, {"prefix": base.uri, "objects": uris, "uploaded": [*sent, manifest_uri]})
    return uris
