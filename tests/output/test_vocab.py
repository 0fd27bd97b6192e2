"""The draft vocabulary (issue 24, item 2): the export counts the supervised tokens it writes, and the
mapping picks them as speculators does (the files themselves are loaded by the trainers' own code in
``make test-trainers``: tests/output/test_trainers.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import orjson
from test_reaudit import merged, record

from regen.layout.beside import token_freq_beside
from regen.output.export import ExportConfig, export_dataset
from regen.output.vocab import read_token_freq, select_draft_tokens, vocab_mapping

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = str(ROOT / "resources" / "demo-tokenizer")


def test_selection_by_count_ties_to_the_lower_id_padded_with_low_ids() -> None:
    counts = {50: 9, 7: 9, 3: 1, 40: 5, 41: 5}
    assert select_draft_tokens(counts, 3) == [7, 40, 50]  # 50 and 7 (9), then 40 before 41 (5)
    assert select_draft_tokens(counts, 7) == [0, 1, 3, 7, 40, 41, 50]  # five seen, padded with 0 and 1
    d2t, t2d = vocab_mapping([0, 1, 3, 7], 10)
    assert d2t.tolist() == [0, 0, 1, 4] and d2t.dtype == np.int64
    assert np.flatnonzero(t2d).tolist() == [0, 1, 3, 7] and t2d.dtype == bool and t2d.shape == (10,)
    assert (np.arange(4) + d2t).tolist() == [0, 1, 3, 7]


def test_export_counts_the_supervised_tokens_of_the_training_split(tmp_path: Path) -> None:
    dataset = merged(tmp_path, [record(i, f"The answer is {i}.", f"thinking about {i}") for i in range(30)])
    out = tmp_path / "export"
    manifest = export_dataset(
        dataset_dir=str(dataset),
        specforge_out=str(out / "specforge.jsonl"),
        tokenized_out=str(out / "tokenized.jsonl"),
        manifest_out=str(out / "manifest.json"),
        config=ExportConfig.from_dict({"eval_fraction": 0.2}),
        tokenizer_dir=TOKENIZER,
        regenerate="last",
    )
    assert token_freq_beside(out / "tokenized.jsonl") == out / "token_freq.json"
    rows = [orjson.loads(x) for x in (out / "tokenized.jsonl").read_bytes().splitlines()]
    want = Counter(t for r in rows for t, m in zip(r["input_ids"], r["loss_mask"], strict=True) if m)
    assert read_token_freq(out / "token_freq.json") == dict(want)
    doc = orjson.loads((out / "token_freq.json").read_bytes())
    assert doc["total"] == sum(want.values()) == manifest["token_freq"]["total"] and doc["rows"] == len(rows)
    # the eval split's tokens are not counted: the trainer builds its vocabulary on the training rows
    held = [orjson.loads(x) for x in (out / "tokenized.eval.jsonl").read_bytes().splitlines()]
    assert held and manifest["tokenized"]["supervised_tokens"] == doc["total"]


def test_vocab_without_torch_says_which_extra_to_install(tmp_path: Path, monkeypatch) -> None:
    import importlib.util

    from regen.output import vocab

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert vocab.cli(["--draft-vocab-size", "8", "--target-vocab-size", "64", "--out", str(tmp_path)]) == 2
    assert not any(tmp_path.iterdir())
