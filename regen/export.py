"""Exports for drafter trainers, written next to the Parquet (which stays the canonical store).

* ``specforge.jsonl``: ``{"id", "conversations": [{"role", "content", "reasoning_content"?, ...}]}``,
  one line per dataset row, for SpecForge's raw-conversation path (``data.train_data_path``).
  SpecForge renders and tokenizes it itself, with the chat template named in the manifest.
* ``tokenized.jsonl``: ``{"id", "input_ids", "loss_mask"}`` built by ``regen.masks`` from the
  server's own token ids: SpecForge's pre-tokenized prompts path (``data.prompts_path``, DFlash)
  and ``speculators prepare-data`` read it as is.
* ``manifest.json``: row counts, what was left out and why, the mask policy, and the SpecForge
  chat template and ``train_only_last_turn`` setting that match this data.

Truncated rows (``finish_reason == "length"``) are left out of both by default: SpecForge's template
would close them with an end-of-turn token the model never produced (``export.include_truncated``).
Files are written atomically and readable under the usual umask.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow.dataset as ds

from regen.chat import ChatTemplate
from regen.io import atomic_open, write_json
from regen.masks import MaskBuilder, MaskPolicy
from regen.records import message_from_row

READ_COLUMNS = (
    "id",
    "messages",
    "finish_reason",
    "truncated",
    "prompt_token_ids",
    "completion_token_ids",
    "turns",
)
#: message fields SpecForge's thinking parser keeps (``ThinkingParser.standard_keys``)
SPECFORGE_MESSAGE_KEYS = ("role", "content", "reasoning_content", "tool_calls", "name", "tool_call_id")


@dataclass(frozen=True, slots=True)
class ExportConfig:
    """The ``export`` config section."""

    specforge_chat_template: str | None = "auto"
    policy: MaskPolicy = field(default_factory=MaskPolicy)

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any]) -> ExportConfig:
        return cls(cfg.get("specforge_chat_template", "auto"), MaskPolicy.from_dict(cfg))


def specforge_template_name(configured: str | None, template: ChatTemplate) -> str | None:
    """The SpecForge chat template for this data: as configured; ``auto`` knows the Qwen3 template."""
    if configured != "auto":
        return configured
    return "qwen3-thinking" if template.uses_fast_renderer else None


def specforge_line(row: Mapping[str, Any]) -> dict[str, Any]:
    """One ``specforge.jsonl`` object: the conversation with the regenerated turns, reasoning kept."""
    conversations = []
    for m in row["messages"]:
        fields = message_from_row(m).to_json()
        conversations.append({k: fields[k] for k in SPECFORGE_MESSAGE_KEYS if fields.get(k) is not None})
    out: dict[str, Any] = {"id": row["id"], "conversations": conversations}
    if row.get("tools_json"):
        out["tools"] = orjson.loads(row["tools_json"])  # SpecForge reads a list (or its JSON text)
    return out


def iter_rows(dataset_dir: str | os.PathLike[str], batch_rows: int = 2000) -> Iterator[dict[str, Any]]:
    """The dataset's rows (only the columns the exports need), part file by part file."""
    dataset = ds.dataset(str(dataset_dir), format="parquet")
    columns = [c for c in READ_COLUMNS if c in dataset.schema.names]
    for batch in dataset.to_batches(columns=columns, batch_size=batch_rows):
        yield from batch.to_pylist()


def export_dataset(
    *,
    dataset_dir: str,
    specforge_out: str,
    tokenized_out: str,
    manifest_out: str,
    export_cfg: Mapping[str, Any],
    tokenizer_dir: str,
    regenerate: str,
) -> dict[str, Any]:
    """Write the SpecForge and token exports of ``dataset_dir`` and their manifest; return the manifest."""
    cfg = ExportConfig.from_dict(export_cfg)
    template = ChatTemplate.from_dir(tokenizer_dir)
    builder = MaskBuilder(template, cfg.policy)
    rows_in = specforge_rows = 0
    left_out: Counter[str] = Counter()
    sources: Counter[str] = Counter()
    token_rows = supervised = 0
    for path in (specforge_out, tokenized_out):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(specforge_out, "wb") as sf, atomic_open(tokenized_out, "wb") as tk:
        for row in iter_rows(dataset_dir):
            rows_in += 1
            if row["truncated"] and not cfg.policy.include_truncated:
                left_out["truncated"] += 1
            else:
                sf.write(orjson.dumps(specforge_line(row)) + b"\n")
                specforge_rows += 1
            for out in builder.rows(row):
                tk.write(orjson.dumps(out.to_json()) + b"\n")
                sources[out.source] += 1
                token_rows += 1
                supervised += sum(out.loss_mask)
    manifest = {
        "format": "regen-export/1",
        "dataset": str(dataset_dir),
        "rows_in": rows_in,
        "regenerate": regenerate,
        "left_out": dict(left_out),
        "policy": {
            "supervised": "tokens this run's target model generated (regenerated assistant turns)",
            "supervise_context_turns": cfg.policy.supervise_context_turns,
            "include_truncated": cfg.policy.include_truncated,
            "after_end_of_turn": builder.after_end_of_turn,
        },
        "specforge": {
            "path": str(specforge_out),
            "rows": specforge_rows,
            "chat_template": specforge_template_name(cfg.specforge_chat_template, template),
            # regenerate last: earlier assistant turns are the old dataset's answers, context only
            "train_only_last_turn": regenerate == "last",
            "note": (
                "SpecForge adds its template's default system prompt to rows without a system turn, "
                "and renders earlier turns without their thinking; tokenized.jsonl has the exact ids"
            ),
        },
        "tokenized": {
            "path": str(tokenized_out),
            "rows": token_rows,
            "supervised_tokens": supervised,
            "ids": dict(sources),
            "one_row_per": "regenerated assistant turn" if regenerate == "all" else "record",
        },
    }
    write_json(manifest_out, manifest)
    return manifest
