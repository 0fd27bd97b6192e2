"""Shared pytest fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
DEMO_TOKENIZER_DIR = REPO_ROOT / "resources" / "demo-tokenizer"
TEST_DATA_DIR = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def demo_tokenizer_dir() -> Path:
    """The shipped demo tokenizer (tokenizer.json + tokenizer_config.json with Qwen3's template)."""
    assert (DEMO_TOKENIZER_DIR / "tokenizer.json").is_file(), "run: python -m regen.demo tokenizer"
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
