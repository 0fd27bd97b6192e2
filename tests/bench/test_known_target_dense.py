"""The dense known-answer target (``model --dense``, issue 36): a tiny instance at Qwen3-8B's head
layout, loaded by transformers' own ``Qwen3ForCausalLM`` (``bench/gpu/known_target/check.py``, trainers'
venv: ``REGEN_TRAINERS_PYTHON``; skipped where torch/transformers are absent), and its short chain's rows
finish far inside the export window."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.known_target import built_chain, checked_model

from bench.gpu.known_target import model as kt

WINDOW = 2048  # SpecForge's default --max-length, the smallest window regen's export reports


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("ktd")
    return out, kt.build(out, kt.TINY_DENSE, kt.DENSE_CHAIN, [1024])


@pytest.fixture(scope="module")
def chain(built: tuple[Path, dict]) -> kt.Chain:
    return built_chain(built[0])


@pytest.fixture(scope="module")
def checked(built: tuple[Path, dict]) -> dict:
    return checked_model(built[0])


def test_dense_config_is_qwen3_8b_layout_without_mtp(built: tuple[Path, dict]) -> None:
    cfg = json.loads((built[0] / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["model_type"] == "qwen3"
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (32, 8, 128)
    assert cfg["tie_word_embeddings"] is False
    assert not any(n.startswith("mtp.") for n, _ in kt.tensor_specs(kt.TINY_DENSE))
    full = dict(kt.tensor_specs(kt.DENSE))
    assert full["model.layers.35.self_attn.q_proj.weight"] == (4096, 4096)
    assert full["model.layers.35.mlp.down_proj.weight"] == (4096, 12288)


def test_dense_rows_finish_inside_the_export_window(built: tuple[Path, dict]) -> None:
    d = built[1]["by_max_tokens"][0]
    assert d["stop_fraction"] > 0.999  # regen leaves truncated rows out: almost none are
    assert d["completion_tokens"]["p99"] < WINDOW / 4  # prompt + answer well inside 2048


def test_qwen3_loads_the_dense_checkpoint_with_every_tensor(checked: dict) -> None:
    assert checked["architecture"] == "Qwen3ForCausalLM"
    assert checked["missing"] == [] and checked["unexpected"] == [] and checked["shape_mismatch"] == []
    assert checked["zero_output_projections"] and checked["mtp_logits_equal"] is None


def test_qwen3_next_token_distribution_is_the_designed_one(checked: dict, chain: kt.Chain) -> None:
    assert checked["prompt_last"] == chain.start_thinking
    for t, st in chain.states.items():
        got = checked["logits"][str(t)]
        assert {int(u): v for u, v in got["succ"].items()} == st.succ  # bf16-exact: equal, not close
        assert got["other_max"] == got["other_min"] == kt.OTHER_LOGIT
        probs = {int(u): p for u, p in checked["probs"][str(t)].items()}
        designed = chain.probs(t)
        assert max(probs, key=probs.__getitem__) == max(designed, key=designed.__getitem__)
        assert probs.keys() == designed.keys()
        assert all(abs(probs[u] - designed[u]) < 1e-9 for u in designed)


def test_qwen3_generate_follows_the_chain(checked: dict, chain: kt.Chain) -> None:
    for ids in checked["generated"]:
        prev = chain.start_thinking
        for t in ids:
            assert t in chain.probs(prev), (prev, t)
            if t == chain.eos:
                break
            prev = t
