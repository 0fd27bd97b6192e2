"""Shared pytest fixtures."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
DEMO_TOKENIZER_DIR = REPO_ROOT / "resources" / "demo-tokenizer"
TEST_DATA_DIR = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def demo_tokenizer_dir() -> Path:
    """The shipped demo tokenizer (tokenizer.json + tokenizer_config.json with Qwen3's template)."""
    assert (DEMO_TOKENIZER_DIR / "tokenizer.json").is_file(), (
        "run: python tests/support/demo_assets.py tokenizer"
    )
    return DEMO_TOKENIZER_DIR


@pytest.fixture(scope="session")
def formats_dir() -> Path:
    """Small fixture files, one per input format, under tests/data/formats."""
    return TEST_DATA_DIR / "formats"


@pytest.fixture
def tmp_workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh working directory that is also the current directory for the test."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


S3_ENDPOINT = os.environ.get("REGEN_TEST_S3_ENDPOINT")
S3_BUCKET = os.environ.get("REGEN_TEST_S3_BUCKET", "regen-test")


@pytest.fixture
def s3_prefix(monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh ``s3://bucket/test-<uuid>`` prefix on the test server; boto3 pointed at it."""
    if not S3_ENDPOINT:
        pytest.skip("no S3 test server: set REGEN_TEST_S3_ENDPOINT (start one with .ci/s3-up.sh)")
    if not (os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY")):
        pytest.skip("REGEN_TEST_S3_ENDPOINT is set but AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY are not")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", S3_ENDPOINT)
    monkeypatch.setenv("AWS_DEFAULT_REGION", os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never probe a metadata address
    from regen.storage import s3_client

    client = s3_client()
    if S3_BUCKET not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
        client.create_bucket(Bucket=S3_BUCKET)
    return f"s3://{S3_BUCKET}/test-{uuid.uuid4().hex[:12]}"
