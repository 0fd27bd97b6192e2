"""Run the drafter trainers' own data preparation on regen's exports; print what they made as JSON.

Runs in the trainers' venv (``make test-trainers``: SpecForge 0.2.0 and speculators 0.9.0 with CPU
torch), never in regen's. ``tests/output/test_trainers.py`` starts it and judges the result.

    python run_trainers.py EXPORT_DIR TOKENIZER_DIR WORK_DIR MODEL_CONFIG
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import torch
from datasets import Dataset, load_from_disk
from specforge.core.compact_teacher import validate_vocab_mapping_consistency
from specforge.data.loss_mask import has_consecutive_supervised_tokens
from specforge.data.preprocessing import preprocess_conversations
from specforge.data.prompt_builder import prepare_prompt_tasks
from specforge.data.template import TEMPLATE_REGISTRY
from specforge.modeling.draft.base import Eagle3DraftModel
from speculators.train.cli import _load_mappings
from speculators.train.vocab_mapping import (
    build_vocab_mappings_from_distribution,
    save_token_frequency_distribution,
)
from transformers import AutoTokenizer

MAX_LENGTH = 32768  # longer than any demo row: no trainer truncation
REPO = Path(__file__).resolve().parents[2]
DRAFT_VOCAB_SIZE = 256


def speculators_prepare(tokenizer_dir: Path, tokenized_jsonl: Path, out: Path) -> list:
    """``speculators prepare-data`` on a token export, through its CLI; its rows (ids, mask)."""
    subprocess.run(
        [
            str(Path(sys.executable).parent / "speculators"),
            "prepare-data",
            "--model",
            str(tokenizer_dir),
            "--data",
            str(tokenized_jsonl),
            "--output",
            str(out),
            "--seq-length",
            str(MAX_LENGTH),
            "--minimum-valid-tokens",
            "1",
            "--num-preprocessing-workers",
            "1",
        ],
        check=True,
    )
    prepared = load_from_disk(str(out)).select_columns(["input_ids", "loss_mask"]).with_format(None)
    return sorted((r["input_ids"], r["loss_mask"]) for r in prepared)


def draft_vocabulary(export_dir: Path, model_config: Path, work: Path) -> dict:
    """``regen vocab`` (run here: it needs torch), then its files loaded by the trainers' own code and its
    counts checked against speculators' own count made from ``tokenized.jsonl``."""
    out = work / "vocab"
    subprocess.run(
        [sys.executable, "-m", "regen.cli", "vocab", "--draft-vocab-size", str(DRAFT_VOCAB_SIZE),
         "--model-config", str(model_config), "--token-freq", str(export_dir / "token_freq.json"),
         "--out", str(out)],
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    n = DRAFT_VOCAB_SIZE
    # speculators: its token-frequency count over the token export (torch tensors, as its prepare-data has)
    rows = [json.loads(x) for x in (export_dir / "tokenized.jsonl").read_text().splitlines()]
    dataset = Dataset.from_list([{"input_ids": r["input_ids"], "loss_mask": r["loss_mask"]} for r in rows])
    theirs_path = work / "speculators_token_freq.pt"
    save_token_frequency_distribution(dataset.with_format("torch"), theirs_path)
    theirs = torch.load(theirs_path, weights_only=True)
    ours = torch.load(out / "token_freq.pt", weights_only=True)
    d2t, t2d, size = _load_mappings(out / f"d2t-{n}.npy", out / f"t2d-{n}.npy", n)
    target = int(t2d.shape[0])
    want_d2t, want_t2d = build_vocab_mappings_from_distribution(theirs, n, target)
    # SpecForge: the draft model's own loader, on buffers of the draft model's shapes, then its check
    buffers = types.SimpleNamespace(
        t2d=torch.zeros(target, dtype=torch.bool), d2t=torch.zeros(n, dtype=torch.int64)
    )
    Eagle3DraftModel.load_vocab_mapping(buffers, str(out / f"vocab_mapping-{n}.pt"))
    validate_vocab_mapping_consistency(buffers.t2d, buffers.d2t)
    return {
        "counts_equal": {int(k): int(v) for k, v in ours.items()}
        == {int(k): int(v) for k, v in theirs.items()},
        "total": int(sum(theirs.values())),
        "speculators_draft_vocab_size": size,
        "speculators_mapping_equal": bool(torch.equal(d2t, want_d2t) and torch.equal(t2d, want_t2d)),
        "specforge_equals_speculators": bool(torch.equal(buffers.d2t, d2t) and torch.equal(buffers.t2d, t2d)),
        "specforge_vocab_loaded": bool(buffers.vocab_mapping_loaded),
        "npy_dtypes": [str(np.load(out / f"d2t-{n}.npy").dtype), str(np.load(out / f"t2d-{n}.npy").dtype)],
    }


def main(export_dir: Path, tokenizer_dir: Path, work: Path, model_config: Path) -> dict:
    manifest = json.loads((export_dir / "manifest.json").read_text())
    specforge_jsonl = export_dir / "specforge.jsonl"
    tokenized_jsonl = export_dir / "tokenized.jsonl"
    template_name = manifest["specforge"]["chat_template"]
    last_only = manifest["specforge"]["train_only_last_turn"]
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    common = {
        "max_length": MAX_LENGTH,
        "is_preformatted": False,
        "train_only_last_turn": last_only,
        "cache_dir": None,
        "cache_key": None,
        "num_proc": 1,
    }
    # SpecForge EAGLE3, raw conversations (data.train_data_path): its template, its tokenization
    eagle3 = prepare_prompt_tasks(
        str(specforge_jsonl), tokenizer, chat_template=template_name, min_loss_tokens=1, **common
    )
    # SpecForge DFlash, pre-tokenized prompts (data.prompts_path): its minimums (2 tokens, 2 in a row)
    dflash = prepare_prompt_tasks(
        str(tokenized_jsonl),
        None,
        chat_template=None,
        min_loss_tokens=2,
        loss_mask_filter=has_consecutive_supervised_tokens,
        **common,
    )
    # the held-out eval split, through the same paths
    eagle3_eval = prepare_prompt_tasks(
        str(export_dir / "specforge.eval.jsonl"),
        tokenizer,
        chat_template=template_name,
        min_loss_tokens=1,
        **common,
    )
    dflash_eval = prepare_prompt_tasks(
        str(export_dir / "tokenized.eval.jsonl"),
        None,
        chat_template=None,
        min_loss_tokens=2,
        loss_mask_filter=has_consecutive_supervised_tokens,
        **common,
    )
    # speculators prepare-data on the token exports, through its CLI
    speculators_rows = speculators_prepare(tokenizer_dir, tokenized_jsonl, work / "speculators")
    speculators_eval = speculators_prepare(
        tokenizer_dir, export_dir / "tokenized.eval.jsonl", work / "speculators_eval"
    )
    # SpecForge's own ids and mask per row, for the rows that have a system turn
    template = TEMPLATE_REGISTRY.get(template_name)
    specforge_rows = {}
    for line in specforge_jsonl.read_text().splitlines():
        row = json.loads(line)
        conv = row["conversations"]
        if conv[0]["role"] != "system":
            continue
        got = preprocess_conversations(
            tokenizer, [conv], template, MAX_LENGTH, train_only_last_turn=last_only, tools=[[]]
        )
        specforge_rows[row["id"]] = {
            "input_ids": got["input_ids"][0][0].tolist(),
            "loss_mask": got["loss_mask"][0][0].tolist(),
        }
    return {
        "eagle3_rows": len(eagle3),
        "dflash_rows": len(dflash),
        "speculators_rows": speculators_rows,
        "specforge_rows": specforge_rows,
        "eval": {
            "eagle3_rows": len(eagle3_eval),
            "dflash_rows": len(dflash_eval),
            "speculators_rows": speculators_eval,
        },
        "vocab": draft_vocabulary(export_dir, model_config, work),
    }


if __name__ == "__main__":
    export_dir, tokenizer_dir, work, model_config = (Path(a) for a in sys.argv[1:5])
    result = main(export_dir, tokenizer_dir, work, model_config)
    (work / "trainers.json").write_text(json.dumps(result))
