"""The draft vocabulary of an EAGLE3 drafter, from the supervised tokens regen already holds.

EAGLE3 drafters predict over a reduced vocabulary: the ``N`` target tokens most frequent among the
supervised (loss-mask 1) tokens of the training data. Trainers count them by re-tokenizing the whole set;
regen's export counts them from the exact ids it writes (``token_freq.json`` beside ``tokenized.jsonl``:
the training split, after any ``max_length`` drop), and ``regen vocab --draft-vocab-size N`` turns the
counts into the files the trainers load:

* speculators 0.9.0: ``token_freq.pt`` (``torch.save`` of ``{token id: count}``, its ``--token-freq-path``
  or ``<data-path>/token_freq.pt``) and ``d2t-N.npy`` / ``t2d-N.npy`` (``--d2t-path`` / ``--t2d-path``, or
  found in ``<data-path>`` for ``--draft-vocab-size N``);
* SpecForge 0.2.0: ``vocab_mapping-N.pt`` (``torch.save`` of ``{"d2t", "t2d"}``, its ``--vocab-mapping``,
  loaded by the draft model's ``load_vocab_mapping``).

Both mappings hold the same tokens, chosen as speculators' ``build_vocab_mappings_from_distribution``
chooses them: by count, ties to the lower id, padded with the lowest unused ids when fewer than ``N``
tokens were seen; ``d2t[i]`` is the offset ``target_id - i`` of the i-th chosen id (ascending) and ``t2d``
a boolean mask over the target vocabulary. ``torch`` is needed only to write the ``.pt`` files (the
optional extra ``regen[vocab]``).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import os
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from regen.io import atomic_path, read_json, write_json
from regen.layout.run import RUN

TOKEN_FREQ_FORMAT = "regen-token-freq/1"


@dataclass(slots=True)
class TokenCounts:
    """Supervised target tokens (loss-mask 1) over token rows."""

    counts: Counter[int] = field(default_factory=Counter)
    rows: int = 0

    def add(self, input_ids: Sequence[int], loss_mask: Sequence[int]) -> None:
        self.rows += 1
        if len(input_ids) != len(loss_mask):
            raise ValueError(f"input_ids has {len(input_ids)} tokens but loss_mask {len(loss_mask)}")
        self.counts.update(itertools.compress(input_ids, loss_mask))  # C loops: ids where the mask is 1

    def to_json(self) -> dict[str, Any]:
        return {
            "format": TOKEN_FREQ_FORMAT,
            "counted": "supervised tokens (loss_mask 1) of tokenized.jsonl, the training split",
            "rows": self.rows,
            "total": sum(self.counts.values()),
            "distinct": len(self.counts),
            "counts": {str(t): n for t, n in sorted(self.counts.items())},
        }


def read_token_freq(path: str | os.PathLike[str]) -> dict[int, int]:
    """``{token id: count}`` from a ``token_freq.json`` the export wrote."""
    doc = read_json(path)
    if doc.get("format") != TOKEN_FREQ_FORMAT:
        raise ValueError(f"{path}: field 'format': {doc.get('format')!r} is not {TOKEN_FREQ_FORMAT!r}")
    return {int(t): int(n) for t, n in doc["counts"].items()}


def select_draft_tokens(counts: Mapping[int, int], draft_vocab_size: int) -> list[int]:
    """The ``draft_vocab_size`` target ids of the draft vocabulary, ascending (speculators' rule)."""
    ranked = sorted(counts, key=lambda t: (-counts[t], t))[:draft_vocab_size]
    chosen = set(ranked)
    pad = (t for t in range(draft_vocab_size) if t not in chosen)
    while len(ranked) < draft_vocab_size:
        ranked.append(next(pad))
    return sorted(ranked)


def vocab_mapping(selected: Sequence[int], target_vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``d2t`` (int64 offsets: target id = draft index + d2t) and ``t2d`` (bool mask over the target)."""
    ids = np.asarray(selected, dtype=np.int64)
    if len(ids) and ids[-1] >= target_vocab_size:
        raise ValueError(f"token id {int(ids[-1])} is outside the target vocabulary of {target_vocab_size}")
    d2t = ids - np.arange(len(ids), dtype=np.int64)
    t2d = np.zeros(target_vocab_size, dtype=bool)
    t2d[ids] = True
    return d2t, t2d


def target_vocab_size_of(model_config: str | os.PathLike[str]) -> int:
    """The target model's vocabulary size (its ``config.json``; ``text_config`` for multimodal models)."""
    cfg = read_json(model_config)
    return int((cfg.get("text_config") or cfg)["vocab_size"])


def write_vocab_files(
    token_freq: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    draft_vocab_size: int,
    target_vocab_size: int,
) -> dict[str, Any]:
    """Write the speculators and SpecForge vocabulary files for ``draft_vocab_size``; return the summary
    (also written as ``vocab-N.json``)."""
    import torch  # the optional extra regen[vocab]: only this command needs it

    counts = read_token_freq(token_freq)
    selected = select_draft_tokens(counts, draft_vocab_size)
    d2t, t2d = vocab_mapping(selected, target_vocab_size)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n = draft_vocab_size
    files = {
        "token_freq": out / "token_freq.pt",
        "d2t": out / f"d2t-{n}.npy",
        "t2d": out / f"t2d-{n}.npy",
        "specforge_vocab_mapping": out / f"vocab_mapping-{n}.pt",
    }
    with atomic_path(files["token_freq"]) as tmp:
        torch.save(dict(counts), tmp)
    for name, array in (("d2t", d2t), ("t2d", t2d)):
        with atomic_path(files[name]) as tmp, open(tmp, "wb") as fh:
            np.save(fh, array)
    with atomic_path(files["specforge_vocab_mapping"]) as tmp:
        torch.save({"d2t": torch.from_numpy(d2t), "t2d": torch.from_numpy(t2d)}, tmp)
    total = sum(counts.values())
    covered = sum(counts.get(t, 0) for t in selected)
    summary = {
        "draft_vocab_size": n,
        "target_vocab_size": target_vocab_size,
        "supervised_tokens": total,
        "distinct_tokens": len(counts),
        "covered_fraction": covered / total if total else 0.0,
        "files": {k: str(v) for k, v in files.items()},
        "speculators": f"--token-freq-path {files['token_freq']} --d2t-path {files['d2t']} "
        f"--t2d-path {files['t2d']} --draft-vocab-size {n}",
        "specforge": f"--vocab-mapping {files['specforge_vocab_mapping']} (model.vocab_mapping_path)",
    }
    write_json(out / f"vocab-{n}.json", summary)
    return summary


def cli(argv: list[str]) -> int:
    """``regen vocab --draft-vocab-size N (--model-config PATH | --target-vocab-size V) [...]``."""
    ap = argparse.ArgumentParser(
        prog="regen vocab",
        description="an EAGLE3 draft vocabulary (SpecForge, speculators) from the export's token counts",
    )
    ap.add_argument("--draft-vocab-size", type=int, required=True, help="tokens in the draft vocabulary")
    target = ap.add_mutually_exclusive_group(required=True)
    target.add_argument("--model-config", help="the target model's config.json (its vocab_size)")
    target.add_argument("--target-vocab-size", type=int, help="the target model's vocabulary size")
    ap.add_argument(
        "--token-freq",
        default=str(RUN.export_token_freq),
        help="the export's token counts (default: %(default)s)",
    )
    ap.add_argument(
        "--out", default=str(RUN.export_vocab_dir), help="directory for the files (default: %(default)s)"
    )
    args = ap.parse_args(argv)
    if importlib.util.find_spec("torch") is None:
        print("regen vocab: the trainers' .pt files need torch: pip install 'regen[vocab]'", file=sys.stderr)
        return 2
    size = args.target_vocab_size or target_vocab_size_of(args.model_config)
    summary = write_vocab_files(args.token_freq, args.out, args.draft_vocab_size, size)
    covered = summary["covered_fraction"]
    print(f"draft vocabulary of {args.draft_vocab_size} covers {covered:.2%} of supervised tokens")
    print(f"speculators: {summary['speculators']}")
    print(f"SpecForge: {summary['specforge']}")
    return 0
