"""The stored features in the layouts the trainers' own loaders read (needs torch and safetensors).

* speculators 0.9.0 (``speculators/train/data.py:ArrowDataset``): a ``datasets`` folder with ``input_ids``,
  ``loss_mask``, ``seq_len``, and ``hidden_states/hs_{i}.safetensors`` holding ``token_ids`` and
  ``hidden_states [tokens, layers, hidden]``, the last layer split off as ``verifier_last_hidden_states``,
  which its EAGLE-3 model normalizes itself (``verifier_norm``): it needs ``last_layer: pre_norm``. regen's
  row files are that format already (fp8 too: hs_connectors' ``hidden_states_scales``): they are hard-linked.
* SpecForge 0.2.0 (``specforge/data/preprocessing.py:OfflineEagle3Dataset``): one ``.ckpt`` (``torch.save``)
  a row with ``input_ids``, ``loss_mask``, ``hidden_state [1, tokens, hidden]`` (the target: its
  ``TargetHead`` applies the lm_head alone, so it needs ``last_layer: post_norm``) and
  ``aux_hidden_state [1, tokens, aux x hidden]``; with ``last_layer: none`` (DFlash) ``hidden_states
  [tokens, layers x hidden]`` (``process_offline_dflash_sample``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from regen.features.rows import TokenRow, read_token_rows
from regen.features.store import read_manifest
from regen.io import atomic_path

#: the last-layer state each trainer's loader expects
EXPECTED_LAST_LAYER = {"speculators": "pre_norm", "specforge": "post_norm"}


class ExportRefused(ValueError):
    """The features' settings do not match what the trainer reads."""


def stored_rows(
    shard_dirs: Sequence[str | os.PathLike[str]],
) -> Iterator[tuple[dict[str, Any], Path, dict[str, Any]]]:
    """(manifest, row file, row line) for every row of the shards, in manifest order."""
    for shard_dir in shard_dirs:
        manifest = read_manifest(shard_dir)
        for row in manifest["rows"]:
            yield manifest, Path(shard_dir) / row["file"], row


def load_states(path: Path) -> Any:
    """A row file's ``hidden_states`` as bf16 (fp8 dequantized with its per-token scales)."""
    import torch
    from safetensors.torch import load_file

    data = load_file(str(path))
    states = data["hidden_states"]
    if "hidden_states_scales" in data:
        return (states.float() * data["hidden_states_scales"]).to(torch.bfloat16)
    return states


def _check(manifest: dict[str, Any], trainer: str, needs_last: bool = True) -> None:
    state = manifest["settings"]["last_layer"]
    want = EXPECTED_LAST_LAYER[trainer]
    if needs_last and state != want:
        raise ExportRefused(
            f"{trainer} reads the last layer {want.replace('_', ' ')} (see regen.features.export); "
            "these features "
            f"(shard {manifest['shard']}) store it {state.replace('_', ' ')}: set features.last_layer: {want}"
        )


def to_speculators(shard_dirs: Sequence[str | os.PathLike[str]], tokenized: str, out_dir: str) -> int:
    """speculators' offline dataset under ``out_dir``; returns the rows written."""
    from datasets import Dataset

    masks = {r.id: r for r in read_token_rows(tokenized)}
    states_dir = Path(out_dir) / "hidden_states"
    states_dir.mkdir(parents=True, exist_ok=True)
    columns: dict[str, list[Any]] = {"input_ids": [], "loss_mask": [], "seq_len": []}
    for i, (manifest, path, row) in enumerate(stored_rows(shard_dirs)):
        _check(manifest, "speculators")
        token_row: TokenRow = masks[row["id"]]
        target = states_dir / f"hs_{i}.safetensors"
        target.unlink(missing_ok=True)
        os.link(path, target)
        columns["input_ids"].append(list(token_row.input_ids))
        columns["loss_mask"].append(list(token_row.loss_mask))
        columns["seq_len"].append(len(token_row.input_ids))
    Dataset.from_dict(columns).with_format("torch").save_to_disk(out_dir)
    return len(columns["seq_len"])


def to_specforge(shard_dirs: Sequence[str | os.PathLike[str]], tokenized: str, out_dir: str) -> int:
    """SpecForge's offline feature files under ``out_dir``; returns the rows written."""
    import torch

    masks = {r.id: r for r in read_token_rows(tokenized)}
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    n = 0
    for n, (manifest, path, row) in enumerate(stored_rows(shard_dirs), 1):
        last = manifest["settings"]["last_layer"]
        _check(manifest, "specforge", needs_last=last != "none")
        token_row = masks[row["id"]]
        states = load_states(path)  # [tokens, layers, hidden]
        sample = {
            "input_ids": torch.tensor(token_row.input_ids, dtype=torch.long),
            "loss_mask": torch.tensor(token_row.loss_mask, dtype=torch.long),
        }
        if last == "none":
            sample["hidden_states"] = states.flatten(1)
        else:
            sample["hidden_state"] = states[:, -1].unsqueeze(0)
            sample["aux_hidden_state"] = states[:, :-1].flatten(1).unsqueeze(0)
        with atomic_path(Path(out_dir) / f"data_{n - 1:08d}.ckpt") as tmp:
            torch.save(sample, tmp)
    return n
