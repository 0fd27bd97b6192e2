"""The known-answer targets' model side (``bench.gpu.known_target.model``, hybrid and ``--dense``): the built
checkpoint loaded by transformers' own code through ``bench/gpu/known_target/check.py``, in the trainers'
venv (``REGEN_TRAINERS_PYTHON``, set by ``make test-trainers``; this interpreter if it has torch and
transformers). ``tests/bench/test_known_target*.py`` share it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu.known_target import model as kt

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
TORCH_PYTHON = os.environ.get("REGEN_TRAINERS_PYTHON") or (
    sys.executable if importlib.util.find_spec("torch") and importlib.util.find_spec("transformers") else None
)


def built_chain(model_dir: Path) -> kt.Chain:
    """The chain the builder wrote beside the checkpoint."""
    return kt.Chain.from_json(json.loads((model_dir / "chain.json").read_text()))


def checked_model(model_dir: Path, generate: int = 3) -> dict:
    """``known_target check``'s report on ``model_dir`` (skips where no torch + transformers is at hand)."""
    if not TORCH_PYTHON:
        pytest.skip("needs torch + transformers: make test-trainers (REGEN_TRAINERS_PYTHON)")
    cmd = [TORCH_PYTHON, "-m", "bench.gpu.known_target", "check", str(model_dir), "--generate", str(generate)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)
