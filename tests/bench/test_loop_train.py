"""The drafter loop's trainer half (issue 36: ``bench.loop.prepare``, ``capture``, ``train``) end to end on
CPU on the tiny dense known-answer target, in the trainers' venv (``REGEN_TRAINERS_PYTHON``: SpecForge
0.2.0, CPU torch; skipped without it): a run dir whose token export holds rows sampled from the target's
own chain, the original answers beside them; the features read by SpecForge's own offline reader and
normalizer; the real ``specforge train`` (reference loss) and ``specforge export --to sglang``."""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from bench.gpu.known_target import model as kt

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
TRAINERS_PYTHON = os.environ.get("REGEN_TRAINERS_PYTHON")
pytestmark = pytest.mark.skipif(
    not TRAINERS_PYTHON, reason="needs the trainers' venv: make test-trainers (REGEN_TRAINERS_PYTHON)"
)
TRAIN_ROWS, EVAL_ROWS, STEPS = 10, 2, 3

# SpecForge's own reader and EAGLE3 normalizer over the captured files, and the target's logits from the
# stored hidden_state through the lm_head alone (SpecForge's TargetHead): equal only after the final norm
READ_FEATURES = """
import json, sys, torch
from specforge.algorithms.eagle3.data import normalize_offline_sample
from specforge.runtime.data_plane.feature_store import load_feature_file
from specforge.runtime.data_plane.offline_reader import OfflineManifestReader
from transformers import AutoModelForCausalLM
feat, model_dir = sys.argv[1], sys.argv[2]
refs = OfflineManifestReader(feat, validate_files=True).read()
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
out = []
for ref in refs:
    raw = load_feature_file(ref.feature_store_uri[len("file://"):])
    norm = normalize_offline_sample(raw, max_len=4096)
    with torch.no_grad():
        logits = model(input_ids=raw["input_ids"][None]).logits[0]
    head = raw["hidden_state"][0].float() @ model.lm_head.weight.T
    out.append({"tokens": ref.num_tokens, "specs": {k: list(s.shape) for k, s in ref.feature_specs.items()},
                "target": list(norm["target"].shape), "hidden_state": list(norm["hidden_state"].shape),
                "logits_close": bool(torch.allclose(head, logits, rtol=0.05, atol=0.5))})
print(json.dumps(out))
"""


def chain_completion(chain: kt.Chain, rng: random.Random) -> list[int]:
    """A completion sampled from the target's chain (as SGLang samples it), ending at its eos."""
    tok, out = chain.start_thinking, []
    while tok != chain.eos and len(out) < 400:
        probs = chain.probs(tok)
        tok = rng.choices(list(probs), weights=list(probs.values()))[0]
        out.append(tok)
    return out


def write_run(root: Path, model: Path) -> tuple[Path, Path]:
    """A regen run dir with the export ``prepare`` reads (chain-sampled rows) and a dataset of originals."""
    chain = kt.Chain.from_json(json.loads((model / "chain.json").read_text()))
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    newline = tok.token_to_id("\n") if tok.token_to_id("\n") is not None else chain.start_thinking
    rng = random.Random(0)
    export = root / "run" / "results" / "export"
    export.mkdir(parents=True)
    rows, dataset = [], []
    for i in range(TRAIN_ROWS + EVAL_ROWS):
        question = f"Question {i}: what should I wear today?"
        prompt = tok.encode(
            f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
        ).ids
        answer = [*chain_completion(chain, rng), newline]
        rows.append(
            {"id": f"r{i}", "input_ids": prompt + answer, "loss_mask": [0] * len(prompt) + [1] * len(answer)}
        )
        original = "<think>\nThe user asks what to wear.\n</think>\n\nA coat, and bring an umbrella."
        dataset.append({"id": f"r{i}", "messages": [{"role": "user", "content": question},
                                                   {"role": "assistant", "content": original}]})  # fmt: skip
    for name, part in (("tokenized.jsonl", rows[:TRAIN_ROWS]), ("tokenized.eval.jsonl", rows[TRAIN_ROWS:])):
        (export / name).write_text("".join(json.dumps(r) + "\n" for r in part))
    manifest = {"specforge": {"chat_template": "qwen3-thinking", "train_only_last_turn": True}}
    (export / "manifest.json").write_text(json.dumps(manifest))
    (root / "dataset.jsonl").write_text("".join(json.dumps(r) + "\n" for r in dataset))
    return root / "run", root / "dataset.jsonl"


def loop(*args: str | Path, timeout: int = 600) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [TRAINERS_PYTHON, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    return run.stdout


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("loop")
    model = root / "model"
    kt.build(model, kt.TINY_DENSE, kt.DENSE_CHAIN, [1024])
    run, dataset = write_run(root, model)
    data, feat = root / "data", root / "feat"
    loop("-m", "bench.loop.prepare", "--run", run, "--dataset", dataset, "--model", model, "--out", data)
    for name in ("regen-train", "regen-eval"):
        loop("-m", "bench.loop.capture", "--model", model, "--data", data / f"{name}.jsonl",
             "--out", feat / name, "--device", "cpu")  # fmt: skip
    return {"root": root, "model": model, "data": data, "feat": feat}


def test_prepare_keeps_regen_ids_and_tokenizes_the_originals_with_the_same_prompt(
    work: dict[str, Path],
) -> None:
    data = work["data"]
    summary = json.loads((data / "prepare.json").read_text())
    assert summary["prompt_equal"] == {"rows": TRAIN_ROWS, "of": TRAIN_ROWS}
    regen = [json.loads(x) for x in (data / "regen-train.jsonl").read_text().splitlines()]
    original = [json.loads(x) for x in (data / "original-train.jsonl").read_text().splitlines()]
    theirs = [
        json.loads(x) for x in (work["root"] / "run/results/export/tokenized.jsonl").read_text().splitlines()
    ]
    assert regen == theirs  # regen's ids and mask as exported
    assert [r["id"] for r in original] == [r["id"] for r in regen]
    assert all(sum(r["loss_mask"]) > 0 for r in original)
    assert (
        summary["files"]["regen-train"]["chain_states_visited"]
        > summary["files"]["original-train"]["chain_states_visited"]
    )
    prompts = [json.loads(x) for x in (data / "eval-prompts.jsonl").read_text().splitlines()]
    evals = [json.loads(x) for x in (data / "regen-eval.jsonl").read_text().splitlines()]
    assert [p["input_ids"] for p in prompts] == [e["input_ids"][: e["loss_mask"].index(1)] for e in evals]


def test_captured_features_pass_specforges_offline_reader(work: dict[str, Path]) -> None:
    feat = work["feat"] / "regen-train"
    got = json.loads(loop("-c", READ_FEATURES, feat, work["model"]))
    cap = json.loads((feat / "capture.json").read_text())
    hidden = cap["hidden_size"]
    assert len(got) == TRAIN_ROWS and cap["aux_hidden_state_layer_ids"] == [1, 0, 0]  # 2 layers: clamped
    for row in got:
        t = row["tokens"]
        assert row["specs"] == {"input_ids": [t], "loss_mask": [t], "hidden_state": [1, t, hidden],
                                "aux_hidden_state": [1, t, 3 * hidden]}  # fmt: skip
        assert row["target"] == [1, t, hidden] and row["hidden_state"] == [1, t, 3 * hidden]
        assert row["logits_close"]  # hidden_state is after the final norm: lm_head alone gives the logits


def test_specforge_train_and_export_write_an_sglang_drafter(work: dict[str, Path]) -> None:
    out = work["root"] / "train" / "regen"
    loop("-m", "bench.loop.train", "--target", work["model"], "--train", work["feat"] / "regen-train",
         "--eval", work["feat"] / "regen-eval", "--out", out, "--steps", STEPS, "--seed", 7,
         "--reference-loss")  # fmt: skip
    cfg = json.loads((out / "sglang" / "config.json").read_text())
    target = json.loads((work["model"] / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["draft_vocab_size"] == cfg["vocab_size"] == target["vocab_size"]  # full vocabulary
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 0, 0]
    weights = list((out / "sglang").glob("*.safetensors"))
    assert weights
    result = json.loads((out / "train.json").read_text())
    assert (result["steps"], result["seed"], result["loss"]) == (STEPS, 7, "reference")
    acc = result["acc_per_position"]
    assert len(acc) == 7 and all(0.0 <= a <= 1.0 for a in acc)
    assert result["specforge_eval"]["eval/per_position_acc"] == acc
    a1, a2, a3 = acc[:3]
    assert result["predicted_accept_length_3steps"] == pytest.approx(1 + a1 + a1 * a2 + a1 * a2 * a3)
    assert not list((out / "specforge").rglob("training_state*.pt"))  # removed once exported
    log = (out / "train.log").read_text()
    assert "--reference-loss" in log and "specforge_loss.py" in log and "eval/per_position_acc" in log
