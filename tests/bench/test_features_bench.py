"""The features bench (``bench/gpu/features.py``, issue 59 item 6) in its ``--smoke`` form: a tiny random
Llama and Qwen3-MoE on CPU, regen's features job with the transformers backend standing in for SGLang,
SpecForge's loop over a transformers stand-in for its SGLang capture, the reference check (and the same check
against the neighbouring layers, which must fail), the projection and the last lines. The driver runs in this
venv (regen's dependencies); its torch steps in the trainers' venv: ``make test-trainers`` sets
``REGEN_TRAINERS_PYTHON``, without it these tests skip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from regen.features.store import stalled

ROOT = Path(__file__).resolve().parents[2]
TRAINERS_PYTHON = os.environ.get("REGEN_TRAINERS_PYTHON")

pytestmark = pytest.mark.skipif(
    not TRAINERS_PYTHON, reason="needs the trainers' venv: make test-trainers (REGEN_TRAINERS_PYTHON)"
)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[str]]:
    work = tmp_path_factory.mktemp("features-bench")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.gpu.features",
            "--smoke",
            "--torch-python",
            str(TRAINERS_PYTHON),
            "--out",
            str(work / "out"),
            "--work",
            str(work / "work"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    lines = [line for line in run.stdout.splitlines() if line.startswith("features: ")]
    return json.loads((work / "out" / "features.json").read_text()), lines


def test_the_smoke_ends_with_one_line_a_target_then_the_summary(smoke: tuple[dict, list[str]]) -> None:
    _, lines = smoke
    assert len(lines) == 3
    assert lines[0].startswith("features: target=tiny-dense-8l rows=40 ")
    assert lines[1].startswith("features: target=tiny-moe-8l rows=40 ")
    assert lines[-1].startswith("features: targets=2 checks_passed=2 smoke=True ratio=")
    for line in lines[:2]:
        fields = dict(kv.split("=", 1) for kv in line.split(": ", 1)[1].split())
        assert fields["check"] == "pass" and fields["specforge_check"] == "pass"
        for key in (
            "regen_tps",
            "regen_gbps",
            "specforge_tps",
            "specforge_gbps",
            "ratio",
            "proj_bytes_ratio",
        ):
            assert float(fields[key]) >= 0, key
        assert int(fields["paced_stalled_batches"]) >= 0  # what the first job's pace set aside


@pytest.mark.parametrize("target", [0, 1])
def test_every_arm_ran_and_the_reference_check_passed(smoke: tuple[dict, list[str]], target: int) -> None:
    doc = smoke[0]["targets"][target]
    assert doc["build"]["ok"] and doc["build"]["states_finite"]
    assert doc["regen"]["ok"] and doc["regen"]["tokens"] == doc["tokens"]
    assert (
        doc["regen"]["stored_bytes"] > 0 and doc["regen"]["files"] == doc["rows"] + 6
    )  # 2 shards' journals, paces, manifests
    assert doc["check"]["ok"] and doc["check"]["pass"]
    assert set(doc["check"]["layers"]) == {"2", "4", "5", "8"}  # EAGLE-3's [2, L/2, L-3] and the last
    sf = doc["specforge"]
    assert sf["ok"] and sf["files"] == doc["rows"] and sf["check"]["pass"]
    assert sf["padded_tokens"] >= doc["tokens"]  # its rows padded to each batch's longest


@pytest.mark.parametrize("target", [0, 1])
def test_the_check_fails_on_every_layer_off_by_one(smoke: tuple[dict, list[str]], target: int) -> None:
    """The comparison tells layer i from i-1 and i+1 on a random model: the property the GPU run leans on."""
    off = smoke[0]["targets"][target]["check"]["off_by_one"]
    assert off["compared"] > 0 and off["failed"] == off["compared"]
    assert off["cos_max"] < 0.99 and off["rel_err_min"] > 0.1


@pytest.mark.parametrize("target", [0, 1])
def test_the_projected_bytes_are_what_regen_wrote(smoke: tuple[dict, list[str]], target: int) -> None:
    p = smoke[0]["targets"][target]["projection"]
    assert p["within_10pct"]["bytes"], p  # the safetensors headers are the difference
    assert p["gpu_hours"] > 0 and p["measured_gpu_hours"] > 0  # on CPU their ratio means nothing


@pytest.mark.parametrize("target", [0, 1])
def test_the_second_shard_is_projected_at_the_first_shards_recorded_pace(
    smoke: tuple[dict, list[str]], target: int
) -> None:
    doc = smoke[0]["targets"][target]
    first, second = doc["regen"]["shards"]
    paced = doc["projection"]["paced"]
    assert first["rows"] == doc["rows"] // 4 and first["rows"] + second["rows"] == doc["rows"]
    assert paced["tokens"] == second["tokens"] and paced["measured_s"] == second["seconds"]
    after_first = first["tokens"] - first["first_batch_tokens"]
    assert 0 < after_first < first["tokens"]
    # the first shard's rate after its first batch, any later batch that stalled set aside too (the pace file
    # lists each later batch), carried over to the second's tokens (the same engine, in the same process: no
    # start counted)
    pace = paced["pace"]
    assert pace["steady_tokens"] + pace["first_tokens"] == first["tokens"]
    later = first["later_batches"]
    assert sum(t for t, _ in later) == after_first
    aside = [b for b, is_stalled in zip(later, stalled(later), strict=True) if is_stalled]  # the rule's test:
    assert len(aside) == pace["stalled_batches"]  # tests/features/test_features_store.py
    kept_tokens = after_first - sum(t for t, _ in aside)
    assert pace["steady_tokens"] == kept_tokens
    assert paced["rate_source"].startswith(f"measured: {kept_tokens:,} tokens prefilled and written in")
    rate = kept_tokens / pace["steady_seconds"]
    assert pace["steady_seconds"] == pytest.approx(
        first["seconds"] - first["first_batch_s"] - sum(s for _, s in aside), abs=1e-3
    )
    assert paced["projected_s"] == pytest.approx(second["tokens"] / rate, rel=1e-2)


def in_trainers_venv(code: str) -> Any:
    """What ``code``, run by the trainers' python from the repo root, printed last, as JSON."""
    run = subprocess.run(
        [str(TRAINERS_PYTHON), "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.splitlines()[-1])


def test_compare_passes_bf16_noise_and_fails_a_neighbouring_layer() -> None:
    """:func:`bench.gpu.features.compare` on its own (trainers' torch): a layer with half a bf16 step of noise
    passes, the next layer of a residual stream (the same plus an update of its size) does not."""
    code = (
        "import json, torch\n"
        "from bench.gpu.features import compare\n"
        "g = torch.Generator().manual_seed(0)\n"
        "h = torch.randn(300, 512, generator=g) * 3\n"
        "noisy = (h * (1 + torch.randn(h.shape, generator=g) * 2**-9)).bfloat16()\n"
        "nxt = (h + torch.randn(h.shape, generator=g) * 0.6).bfloat16()\n"
        "print(json.dumps([compare(noisy, h.bfloat16()), compare(nxt, h.bfloat16())]))\n"
    )
    same, neighbour = in_trainers_venv(code)
    assert same["pass"] and not neighbour["pass"]


def test_judge_measures_the_tolerance_from_transformers_own_bf16_distance_to_fp32() -> None:
    """:func:`bench.gpu.features.judge`: states as far from the fp32 truth as the bf16 reference is pass
    where the fixed bounds would fail them (a deep layer's noise: 8% of each element); three times as far
    fail; a neighbouring layer fails; without an fp32 reference the fixed bounds decide."""
    code = (
        "import json, torch\n"
        "from bench.gpu.features import judge\n"
        "g = torch.Generator().manual_seed(0)\n"
        "h = torch.randn(300, 512, generator=g) * 3\n"
        "def off(scale):\n"
        "    return (h * (1 + torch.randn(h.shape, generator=g) * scale)).bfloat16()\n"
        "want = off(0.02)\n"
        "nxt = (h + torch.randn(h.shape, generator=g) * 0.6).bfloat16()\n"
        "print(json.dumps([judge(off(0.02), want, h), judge(off(0.06), want, h), judge(nxt, want, h),\n"
        "                  judge(off(0.02), want, None)]))\n"
    )
    alike, farther, neighbour, fixed = in_trainers_venv(code)
    assert alike["pass"] and not alike["fixed_bounds_pass"], alike  # the fixed 5e-2 fails what bf16 does
    assert not farther["pass"] and not neighbour["pass"]
    assert not fixed["pass"] and fixed["rel_err_q999"] > 5e-2 and "floor" not in fixed
