"""Exports for drafter trainers, written next to the Parquet (which stays the canonical store).

* ``specforge.jsonl``: ``{"id", "conversations": [{"role", "content", "reasoning_content"?, ...}]}``,
  one line per dataset row, for SpecForge's raw-conversation path (``data.train_data_path``).
  SpecForge renders and tokenizes it itself, with the chat template named in the manifest.
* ``tokenized.jsonl``: ``{"id", "input_ids", "loss_mask"}`` built by ``regen.output.masks`` from the
  server's own token ids: SpecForge's pre-tokenized prompts path (``data.prompts_path``, DFlash)
  and ``speculators prepare-data`` read it as is. Each line also names the answer it came from
  (``fingerprint``, ``regen.fingerprint``): the features' resume (``regen.features``) recomputes a row whose
  answer was regenerated.
* ``specforge.eval.jsonl`` and ``tokenized.eval.jsonl``: the held-out eval split (``regen.output.split``), the
  rows whose opening prompt hashes below ``export.eval_fraction``, in the same two formats; no prompt is
  on both sides, and the split depends on the prompt text alone (stable over reruns and resumes).
* ``thinking.jsonl``: each exported row's thinking mode and split side; the manifest's ``serving`` block
  names the run's mix, ``preserve_thinking``, the system prompt SpecForge adds and to how many rows, the
  template's sha256 and the sampling per thinking mode (``regen.output.serving``).
* ``token_freq.json``: the training split's supervised tokens counted per id, for the draft vocabulary
  (``regen.output.vocab``; ``regen vocab`` writes the trainers' mapping files from it).
* ``manifest.json``: row counts, what was left out and why, the mask policy, the eval split, what survives
  the trainer's window (``regen.output.window``; rows over ``export.max_length`` dropped or kept), and the
  SpecForge chat template and ``train_only_last_turn`` setting that match this data.

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
from typing import Any, BinaryIO

import orjson
import pyarrow.dataset as ds

from regen.chat import THINK_CLOSE, ChatTemplate
from regen.fingerprint import chat_template_hash
from regen.io import atomic_open, read_json, write_json
from regen.layout.beside import eval_split_beside, thinking_beside, token_freq_beside
from regen.layout.names import MANIFEST_NAME
from regen.observe.stage_progress import StageProgress
from regen.output.masks import MaskBuilder, MaskPolicy
from regen.output.serving import serving_contract
from regen.output.split import EVAL, SPLIT_KEY, TRAIN, SplitCounts
from regen.output.vocab import TokenCounts
from regen.output.window import WindowCoverage
from regen.records import message_from_row
from regen.runconfig import validated

#: the columns naming a row's prompt, sampling variant and completion index, carried into every export
#: line (``regen.records``; absent from a dataset merged before variants)
COMPLETION_COLUMNS = ("sample_id", "variant", "k")

READ_COLUMNS = (
    "id",
    *COMPLETION_COLUMNS,
    "messages",
    "finish_reason",
    "truncated",
    "thinking",
    "prompt_token_ids",
    "completion_token_ids",
    "turns",
    "duplicate_of",
    "fingerprint",
)
#: message fields SpecForge's thinking parser keeps (``ThinkingParser.standard_keys``)
SPECFORGE_MESSAGE_KEYS = ("role", "content", "reasoning_content", "tool_calls", "name", "tool_call_id")


@dataclass(frozen=True, slots=True)
class ExportConfig:
    """The ``export`` config section (built by :meth:`from_dict`: the schema's defaults filled in and its
    rules applied)."""

    #: whether the workflow writes the exports at all (the Snakefile's final targets read the config)
    enabled: bool
    specforge_chat_template: str | None
    eval_fraction: float
    max_length: int | None  # the trainer's window (tokens); None: not named
    over_max_length: str  # drop | keep: rows longer than max_length
    policy: MaskPolicy
    #: leave out completions identical to an earlier completion of the same prompt (``duplicate_of``)
    drop_duplicate_completions: bool

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> ExportConfig:
        """Validate ``raw`` against the schema's ``export`` section, fill its defaults, and type it."""
        f = validated("export", raw)
        return cls(
            bool(f["enabled"]),
            f["specforge_chat_template"],
            float(f["eval_fraction"]),
            None if f["max_length"] is None else int(f["max_length"]),
            str(f["over_max_length"]),
            MaskPolicy.from_dict(f),
            bool(f["drop_duplicate_completions"]),
        )

    def drops(self, length: int) -> bool:
        """Whether a token row of ``length`` tokens is left out (over ``max_length``, policy drop)."""
        return self.max_length is not None and length > self.max_length and self.over_max_length == "drop"


def specforge_template_name(configured: str | None, template: ChatTemplate) -> str | None:
    """The SpecForge chat template for this data: as configured; ``auto`` knows the Qwen3 template."""
    if configured != "auto":
        return configured
    return "qwen3-thinking" if template.uses_fast_renderer else None


#: the SpecForge note's clause for thinking-off rows (measured: SpecForge 0.2.0's qwen3-thinking template
#: supervises the four tokens of the empty think block; tests/output/test_trainers.py)
THINKING_OFF_NOTE = (
    "; on its {rows} thinking-off rows SpecForge's template also supervises the empty think block, which the "
    "server's chat template put in the prompt (the model did not generate it; tokenized.jsonl leaves it out)"
)


def completion_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """The row's sample id, variant and completion index (the export lines carry them; trainers read the
    fields they know and pass the rest by)."""
    return {k: row[k] for k in COMPLETION_COLUMNS if k in row}


def answer_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """The fingerprint of the answer a token row came from (what decided it: ``regen.fingerprint``); empty for
    a dataset merged before the column."""
    return {"fingerprint": row["fingerprint"]} if row.get("fingerprint") else {}


def specforge_line(row: Mapping[str, Any]) -> dict[str, Any]:
    """One ``specforge.jsonl`` object: the conversation with the regenerated turns, reasoning kept."""
    conversations = []
    for m in row["messages"]:
        fields = message_from_row(m).to_json()
        conversations.append({k: fields[k] for k in SPECFORGE_MESSAGE_KEYS if fields.get(k) is not None})
    out: dict[str, Any] = {"id": row["id"], **completion_of(row), "conversations": conversations}
    if row.get("tools_json"):
        out["tools"] = orjson.loads(row["tools_json"])  # SpecForge reads a list (or its JSON text)
    return out


def iter_rows(dataset_dir: str | os.PathLike[str], batch_rows: int = 2000) -> Iterator[dict[str, Any]]:
    """The dataset's rows (only the columns the exports need), part file by part file."""
    dataset = ds.dataset(str(dataset_dir), format="parquet")
    columns = [c for c in READ_COLUMNS if c in dataset.schema.names]
    for batch in dataset.to_batches(columns=columns, batch_size=batch_rows):
        yield from batch.to_pylist()


def generation_settings(dataset_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The settings the dataset's answers were generated under (its manifest's provenance, taken from the
    records); empty when the manifest does not name one set."""
    path = Path(dataset_dir) / MANIFEST_NAME
    return dict(((read_json(path) if path.is_file() else {}).get("provenance") or {}).get("settings") or {})


def dataset_window_coverage(
    dataset_dir: str | os.PathLike[str], template: ChatTemplate, cfg: ExportConfig
) -> WindowCoverage:
    """What survives the trainer's window (``regen.output.window``) over the token rows the export writes
    (before any ``max_length`` drop)."""
    builder = MaskBuilder(template, cfg.policy)
    coverage = WindowCoverage.for_config(cfg.max_length)
    think_close = template.tokenizer.token_to_id(THINK_CLOSE)
    for row in iter_rows(dataset_dir):
        coverage.add_all(((out.input_ids, out.loss_mask) for out in builder.rows(row)), think_close)
    return coverage


@dataclass(frozen=True, slots=True)
class ExportPaths:
    """Where one export writes: the two training files, their eval splits (``eval_split_beside``), each
    exported row's thinking mode and the training split's token counts (beside the token export)."""

    specforge: str
    tokenized: str
    specforge_eval: str
    tokenized_eval: str
    thinking: str
    token_freq: str

    @classmethod
    def beside(cls, specforge_out: str, tokenized_out: str) -> ExportPaths:
        return cls(
            specforge=str(specforge_out),
            tokenized=str(tokenized_out),
            specforge_eval=str(eval_split_beside(specforge_out)),
            tokenized_eval=str(eval_split_beside(tokenized_out)),
            thinking=str(thinking_beside(tokenized_out)),
            token_freq=str(token_freq_beside(tokenized_out)),
        )

    @property
    def eval_files(self) -> dict[str, str]:
        return {"specforge": self.specforge_eval, "tokenized": self.tokenized_eval}


@dataclass(slots=True)
class ExportTally:
    """What an export counts while it writes: the manifest's numbers."""

    split: SplitCounts
    coverage: WindowCoverage
    think_close: int | None
    rows_in: int = 0
    specforge_rows: Counter[str] = field(default_factory=Counter)
    left_out: Counter[str] = field(default_factory=Counter)
    sources: Counter[str] = field(default_factory=Counter)
    token_rows: Counter[str] = field(default_factory=Counter)
    #: the token rows' input ids (prompt and answer), per side: what the features stage prefills
    token_ids: Counter[str] = field(default_factory=Counter)
    supervised: Counter[str] = field(default_factory=Counter)
    #: the training split's supervised tokens: the draft vocabulary's input
    token_counts: TokenCounts = field(default_factory=TokenCounts)
    by_thinking: Counter[str] = field(default_factory=Counter)
    #: rows per variant: in, specforge, tokenized
    by_variant: dict[str, Counter[str]] = field(default_factory=dict)
    #: rows SpecForge will give its template's default system prompt
    without_system: int = 0


@dataclass(frozen=True, slots=True)
class _Sinks:
    """The open files of one export: per split side for the two formats, and the thinking modes."""

    specforge: dict[str, BinaryIO]
    tokenized: dict[str, BinaryIO]
    thinking: BinaryIO


def _export_row(
    row: dict[str, Any], builder: MaskBuilder, config: ExportConfig, tally: ExportTally, sinks: _Sinks
) -> None:
    """One dataset row into the SpecForge and token exports (its split side's), counted in ``tally``."""
    tally.rows_in += 1
    per_variant = tally.by_variant.setdefault(str(row.get("variant") or "default"), Counter())
    per_variant["rows_in"] += 1
    side = tally.split.add(row["messages"])
    left_out = tally.left_out
    if row.get("duplicate_of") and config.drop_duplicate_completions:
        left_out["duplicate_completion"] += 1  # of the same prompt: an earlier one is exported
        return
    made = builder.rows(row)
    lengths = [tally.coverage.add(out.input_ids, out.loss_mask, tally.think_close).length for out in made]
    if row["truncated"] and not config.policy.include_truncated:
        left_out["truncated"] += 1
    elif config.drops(max(lengths, default=0)):
        left_out["over_max_length"] += 1  # SpecForge renders the whole conversation: its longest row
    else:
        line = specforge_line(row)
        sinks.specforge[side].write(orjson.dumps(line) + b"\n")
        tally.specforge_rows[side] += 1
        per_variant[f"specforge_{side}"] += 1
        tally.without_system += line["conversations"][0]["role"] != "system"
    kept = [out for out, length in zip(made, lengths, strict=True) if not config.drops(length)]
    if len(kept) < len(made):
        left_out["token_rows_over_max_length"] += len(made) - len(kept)
    for out in kept:
        sinks.tokenized[side].write(orjson.dumps(out.to_json() | completion_of(row) | answer_of(row)) + b"\n")
        if side == TRAIN:
            tally.token_counts.add(out.input_ids, out.loss_mask)
        tally.sources[out.source] += 1
        tally.token_rows[side] += 1
        tally.token_ids[side] += len(out.input_ids)
        per_variant[f"tokenized_{side}"] += 1
        tally.supervised[side] += sum(out.loss_mask)
    if kept:  # the row is in the token export: its thinking mode, for serving to match
        mode = "on" if row["thinking"] else "off"
        tally.by_thinking[mode] += 1
        said = {"id": row["id"], **completion_of(row), "thinking": mode == "on", "split": side}
        sinks.thinking.write(orjson.dumps(said) + b"\n")


def _write_exports(
    dataset_dir: str, paths: ExportPaths, builder: MaskBuilder, config: ExportConfig, tally: ExportTally,
    progress: StageProgress,
) -> None:  # fmt: skip
    """Every row of ``dataset_dir`` into the export files at ``paths`` (each written atomically)."""
    for path in (paths.specforge, paths.tokenized):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    with (
        atomic_open(paths.specforge, "wb") as sf_train,
        atomic_open(paths.tokenized, "wb") as tk_train,
        atomic_open(paths.specforge_eval, "wb") as sf_eval,
        atomic_open(paths.tokenized_eval, "wb") as tk_eval,
        atomic_open(paths.thinking, "wb") as modes,
    ):
        sinks = _Sinks({TRAIN: sf_train, EVAL: sf_eval}, {TRAIN: tk_train, EVAL: tk_eval}, modes)
        for row in iter_rows(dataset_dir):
            progress.advance()
            _export_row(row, builder, config, tally, sinks)


def _manifest(
    tally: ExportTally, paths: ExportPaths, config: ExportConfig, builder: MaskBuilder, regenerate: str,
    dataset_dir: str, template: ChatTemplate,
) -> dict[str, Any]:  # fmt: skip
    """The export's manifest from what it counted (the ``serving`` block aside)."""
    left_out, by_thinking = tally.left_out, tally.by_thinking
    specforge_rows, token_rows, supervised = tally.specforge_rows, tally.token_rows, tally.supervised
    return {
        "format": "regen-export/1",
        "dataset": str(dataset_dir),
        "rows_in": tally.rows_in,
        "regenerate": regenerate,
        "left_out": dict(left_out),
        # rows per sampling variant (generate.variants): in the dataset, and written per file and side
        "variants": {name: dict(sorted(c.items())) for name, c in sorted(tally.by_variant.items())},
        "policy": {
            "supervised": "tokens this run's target model generated (regenerated assistant turns)",
            "supervise_context_turns": config.policy.supervise_context_turns,
            "include_truncated": config.policy.include_truncated,
            "after_end_of_turn": builder.after_end_of_turn,
        },
        "trainer_window": {
            **tally.coverage.to_json(),
            "max_length": config.max_length,
            "over_max_length": config.over_max_length,
            "dropped": {
                "specforge_rows": left_out["over_max_length"],
                "token_rows": left_out["token_rows_over_max_length"],
            },
        },
        "token_freq": {
            "path": paths.token_freq,
            "total": sum(tally.token_counts.counts.values()),
            "distinct": len(tally.token_counts.counts),
            "draft_vocabulary": "regen vocab --draft-vocab-size N --model-config <target config.json>",
        },
        "eval_split": {
            "eval_fraction": config.eval_fraction,
            "key": SPLIT_KEY,
            "dataset_rows": dict(tally.split.rows),
            "prompts_on_both_sides": tally.split.prompts_on_both_sides,
            "files": paths.eval_files,
            "specforge_rows": specforge_rows[EVAL],
            "tokenized_rows": token_rows[EVAL],
            "supervised_tokens": supervised[EVAL],
            "stable": "decided by the prompt text alone: the same on every rerun and resume",
        },
        "specforge": {
            "path": paths.specforge,
            "rows": specforge_rows[TRAIN],
            "chat_template": specforge_template_name(config.specforge_chat_template, template),
            # regenerate last: earlier assistant turns are the old dataset's answers, context only
            "train_only_last_turn": regenerate == "last",
            "note": (
                "SpecForge adds its template's default system prompt to rows without a system turn, "
                "and renders earlier turns without their thinking; tokenized.jsonl has the exact ids"
                + THINKING_OFF_NOTE.format(rows=by_thinking["off"])
                * bool(by_thinking["off"])
            ),
        },
        "tokenized": {
            "path": paths.tokenized,
            "rows": token_rows[TRAIN],
            "tokens": tally.token_ids[TRAIN],
            "supervised_tokens": supervised[TRAIN],
            "ids": dict(tally.sources),
            "one_row_per": "regenerated assistant turn" if regenerate == "all" else "record",
        },
    }


def export_dataset(
    *,
    dataset_dir: str,
    specforge_out: str,
    tokenized_out: str,
    manifest_out: str,
    config: ExportConfig,
    tokenizer_dir: str,
    regenerate: str,
    progress: StageProgress | None = None,
) -> dict[str, Any]:
    """Write the SpecForge and token exports of ``dataset_dir`` (training and eval split,
    ``regen.layout.beside.eval_split_beside`` each) and their manifest; return the manifest. ``progress``
    counts the dataset's rows."""
    progress = progress or StageProgress.silent("export")
    template = ChatTemplate.from_dir(tokenizer_dir)
    builder = MaskBuilder(template, config.policy)
    paths = ExportPaths.beside(specforge_out, tokenized_out)
    tally = ExportTally(
        split=SplitCounts(config.eval_fraction),
        coverage=WindowCoverage.for_config(config.max_length),
        think_close=template.tokenizer.token_to_id(THINK_CLOSE),
    )
    _write_exports(dataset_dir, paths, builder, config, tally, progress)
    manifest = _manifest(tally, paths, config, builder, regenerate, dataset_dir, template)
    manifest["serving"] = serving_contract(
        settings=generation_settings(dataset_dir),
        rows_by_thinking=tally.by_thinking,
        thinking_file=paths.thinking,
        export_template_sha256=chat_template_hash(tokenizer_dir),
        specforge_template=specforge_template_name(config.specforge_chat_template, template),
        specforge_rows_without_system=tally.without_system,
    )
    write_json(paths.token_freq, tally.token_counts.to_json())
    write_json(manifest_out, manifest)
    progress.finish()
    return manifest
