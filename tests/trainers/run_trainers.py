"""Run the drafter trainers' own data preparation on regen's exports; print what they made as JSON.

Runs in the trainers' venv (``make test-trainers``: SpecForge 0.2.0 and speculators 0.9.0 with CPU
torch), never in regen's. ``tests/test_trainers.py`` starts it and judges the result.

    python run_trainers.py EXPORT_DIR TOKENIZER_DIR WORK_DIR
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from datasets import load_from_disk
from specforge.data.loss_mask import has_consecutive_supervised_tokens
from specforge.data.preprocessing import preprocess_conversations
from specforge.data.prompt_builder import prepare_prompt_tasks
from specforge.data.template import TEMPLATE_REGISTRY
from transformers import AutoTokenizer

MAX_LENGTH = 32768  # longer than any demo row: no trainer truncation


def main(export_dir: Path, tokenizer_dir: Path, work: Path) -> dict:
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
    # speculators prepare-data on the token export, through its CLI
    out = work / "speculators"
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
    speculators_rows = sorted((r["input_ids"], r["loss_mask"]) for r in prepared)
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
    }


if __name__ == "__main__":
    export_dir, tokenizer_dir, work = (Path(a) for a in sys.argv[1:4])
    result = main(export_dir, tokenizer_dir, work)
    (work / "trainers.json").write_text(json.dumps(result))
