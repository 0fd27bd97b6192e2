"""regen's features, computed with its transformers backend on a tiny random-weight target, read by
SpecForge's ``OfflineEagle3Dataset`` and speculators' ``ArrowDataset``/``CollateFn`` and trained on for a few
steps (``tests/features/run_features.py`` in the trainers' venv); every sample the trainers' loaders hand back
is compared with transformers' own states of its ids. Run with ``make test-trainers``'s venv:
``REGEN_TRAINERS_PYTHON=.venv-trainers/bin/python``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRAINERS_PYTHON = os.environ.get("REGEN_TRAINERS_PYTHON")

pytestmark = pytest.mark.skipif(
    not TRAINERS_PYTHON, reason="needs the trainers' venv: make test-trainers (REGEN_TRAINERS_PYTHON)"
)


def run_features(work: Path, arch: str, shift: int = 0) -> dict[str, Any]:
    run = subprocess.run(
        [TRAINERS_PYTHON, str(ROOT / "tests/features/run_features.py"), str(work), arch, str(shift)],  # type: ignore[list-item]
        # SpecForge's loss is Triton's; on CPU bench/loop/reference_loss answers its import with the formula
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'bench/loop/reference_loss'}{os.pathsep}{ROOT}"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads((work / "features.json").read_text())


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_the_trainers_loaders_read_the_reference_states(tmp_path: Path, arch: str) -> None:
    out = run_features(tmp_path, arch)
    rows = out["rows"]
    sf, sp = out["specforge"], out["speculators"]
    assert sf["rows"] == sp["rows"] == rows
    # SpecForge: aux layers [2, 4, 5] and its target after the final norm, as its TargetHead needs
    assert (
        sf["aux_equal"] == rows and sf["target_equal_post_norm"] == rows and sf["target_equal_pre_norm"] == 0
    )
    # speculators: the same aux layers and the last before the norm, which its verifier_norm applies
    assert sp["aux_equal"] == rows and sp["last_equal_pre_norm"] == rows and sp["last_equal_post_norm"] == 0
    assert sp["batch_hidden_shape"] == [1, 256, 3 * 64]
    assert len(sf["train_losses"]) == 6 and sf["train_losses"][-1] < sf["train_losses"][0]
    losses = sp["train_losses"]
    assert len(losses) == 5 and losses[-1] < losses[0]
    # the wrong norm state is refused by name, never exported
    assert "features.last_layer: post_norm" in out["refused"]["specforge"]
    assert "features.last_layer: pre_norm" in out["refused"]["speculators"]
    # fp8 with per-token scales: read through speculators' own FP8 transfer, within e4m3's precision
    assert out["fp8"]["rows"] == rows and out["fp8"]["close"] == rows
    assert out["fp8"]["bytes_vs_bf16"] < 0.6
    # the SGLang adapter's glue: SpecForge-convention ids to SGLang's setter, unpacked as the reference
    assert out["sglang_adapter"] == {
        "setter_ids": [4, 1, 3],
        "equal": rows,
        "equal_batched": rows,  # the rows in one extend, split back per row (features.batch_tokens)
        "pre_norm_refused": True,
    }
    manifest = out["manifest"]
    assert manifest["settings"]["layer_ids"] == [2, 4, 5, 8]
    assert manifest["settings"]["layer_convention"] == "hf_hidden_states_index"
    assert manifest["tokens"] == sum(r["tokens"] for r in manifest["rows"])


def test_features_one_layer_off_fail_the_reference_check(tmp_path: Path) -> None:
    out = run_features(tmp_path, "llama", shift=1)
    assert out["specforge"]["aux_equal"] == 0 and out["speculators"]["aux_equal"] == 0
