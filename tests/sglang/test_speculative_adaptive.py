"""``--speculative-adaptive`` as SGLang sizes it (0.5.17 and 0.5.23): the pools for its largest candidate
step (``ServerArgs.max_speculative_num_draft_tokens`` = max(``resolve_candidate_steps_from_config``) + 1),
whatever step it starts at; a config file's steps instead of ``DEFAULT_ADAPTIVE_CONFIG``'s."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from regen.sglang.models import ModelShape
from regen.sglang.plan import PlanError, plan
from regen.sglang.server_args import ADAPTIVE_CANDIDATE_STEPS

MODELS = Path(__file__).parents[2] / "resources" / "models"
H200_MIB = 143771
NEXTN = ["--speculative-algorithm", "NEXTN", "--disable-radix-cache", "--max-running-requests", "16"]


@pytest.fixture(scope="module")
def hybrid() -> ModelShape:
    return ModelShape.from_config(MODELS / "gpu-qwen3.6-27b-text")


def _static(steps: int) -> list[str]:
    return [*NEXTN, "--speculative-num-steps", str(steps), "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(steps + 1)]  # fmt: skip


def _memory(p: object) -> tuple[object, ...]:
    return (p.kv_cache_tokens, p.max_mamba_cache_size, p.spec_scratch_gib, p.kv_cell_bytes)  # type: ignore[attr-defined]


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_adaptive_pools_are_sized_for_its_largest_step(hybrid: ModelShape, version: str) -> None:
    adaptive = plan(hybrid, H200_MIB, 1, [*NEXTN, "--speculative-adaptive"], None, version)
    largest = max(ADAPTIVE_CANDIDATE_STEPS[version])
    assert largest == 7  # DEFAULT_ADAPTIVE_CONFIG's batch-1 slot, both versions
    assert _memory(adaptive) == _memory(plan(hybrid, H200_MIB, 1, _static(largest), None, version))
    assert _memory(adaptive) != _memory(plan(hybrid, H200_MIB, 1, _static(3), None, version))


def test_a_config_files_steps_replace_sglangs(hybrid: ModelShape, tmp_path: Path) -> None:
    cfg = tmp_path / "adaptive.json"
    cfg.write_text(json.dumps({"1": {"candidate_steps": [1, 3]}, "64": {"candidate_steps": [0]}, "x": 1}))
    given = [*NEXTN, "--speculative-adaptive", "--speculative-adaptive-config", str(cfg)]
    assert _memory(plan(hybrid, H200_MIB, 1, given, None, "0.5.17")) == _memory(
        plan(hybrid, H200_MIB, 1, _static(3), None, "0.5.17")
    )


def test_what_sglang_refuses_or_ignores(hybrid: ModelShape, tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="not among --speculative-adaptive's candidate steps"):
        plan(hybrid, H200_MIB, 1, [*NEXTN, "--speculative-adaptive", "--speculative-num-steps", "2"])
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(PlanError, match=r"bad\.json"):
        plan(
            hybrid, H200_MIB, 1, [*NEXTN, "--speculative-adaptive", "--speculative-adaptive-config", str(bad)]
        )
    # topk 2: SGLang turns adaptive off (adaptive_unsupported_reason) and runs the static steps
    topk2 = [*NEXTN, "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
             "--speculative-num-draft-tokens", "6"]  # fmt: skip
    assert _memory(plan(hybrid, H200_MIB, 1, [*topk2, "--speculative-adaptive"])) == _memory(
        plan(hybrid, H200_MIB, 1, topk2)
    )


def test_sglangs_default_steps_leave_a_hybrid_at_64_running_no_kv_and_the_plan_says_why(
    hybrid: ModelShape,
) -> None:
    """Seven draft steps' verify states for 64 requests take the KV's memory: named, not the weights."""
    at_64 = [*NEXTN[:-1], "64", "--speculative-adaptive"]
    with pytest.raises(PlanError, match=r"speculative scratch .* for 8 draft tokens a request") as info:
        plan(hybrid, H200_MIB, 1, at_64, None, "0.5.17")
    assert "smallest tp" not in str(info.value)
