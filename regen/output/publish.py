"""The publish stage: upload the ready, re-audited dataset to ``merge.output_prefix`` (S3).

The Parquet files go first and ``_manifest.json`` last (``regen.storage.upload_dir``), so a reader that
finds the manifest finds every file it names; ``results/published.json`` records what went where.
"""

from __future__ import annotations

from regen.io import write_json
from regen.storage import StorageError, is_s3_uri, upload_dir


def publish_dataset(dataset_dir: str, s3_prefix: str, record_out: str) -> list[str]:
    """Upload the training-ready Parquet (manifest last) to ``s3_prefix`` and record what went where."""
    if not is_s3_uri(s3_prefix):
        raise StorageError(f"merge.output_prefix must be an s3:// URI, got {s3_prefix!r}")
    keys = upload_dir(dataset_dir, s3_prefix)
    write_json(record_out, {"prefix": s3_prefix, "objects": keys})
    return keys
