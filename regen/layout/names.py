"""The names every stage shares: the suffixes of shard outputs, journals and verdicts, the manifest and
index names, the shard-name format, the report's assets, the config and record schemas' paths, and the
merged dataset's parts."""

from __future__ import annotations

import os
import re
from pathlib import Path

#: the per-Slurm-job subdirectory of a slot or log directory
SLURM_DIR_PREFIX = "slurm-"

#: the run config's JSON Schema, inside the installed package (``regen/schemas/`` links ``schemas/``, which
#: is where it is edited; a wheel carries the file itself): ``rules/common.smk`` validates against it
CONFIG_SCHEMA = Path(__file__).resolve().parents[1] / "schemas" / "config.schema.yaml"
#: the generation record's JSON shape (regen.records.GenerationRecord), shipped beside the config schema
RECORD_SCHEMA = Path(__file__).resolve().parents[1] / "schemas" / "record.schema.json"

#: a per-shard compressed output (generation records, quarantine): ``{shard}.jsonl.zst``
SHARD_OUTPUT_SUFFIX = ".jsonl.zst"
#: a shard's request journal in ``work/journal/``: ``{shard}.jsonl``
JOURNAL_SUFFIX = ".jsonl"
#: the merged dataset's manifest, written last into its directory (``regen.output.merge``)
MANIFEST_NAME = "_manifest.json"
#: what a slot's server really allocated (``regen.sglang.realized``): ``gpu{k}.realized.json``
REALIZED_SUFFIX = ".realized.json"
#: beside a kept earlier run's ``results/``: its config and every file's content digest
#: (``regen.output.kept_runs``)
KEPT_INDEX = "kept.json"
#: a job's log of an attempt that did not finish, kept beside the rule's log (``regen.runlog``):
#: ``logs/generate/00003.attempt-1.log``
ATTEMPT_LOG_INFIX = ".attempt-"
#: a Slurm job's slot host log, beside its server logs (``regen.serving.slothost``)
SLOT_HOST_LOG = "host.log"


def journal_batch(n: int) -> str:
    """The ``n``-th batch of a shard's journal synced to object storage (``regen.storage``)."""
    return f"batch-{n:08d}{JOURNAL_SUFFIX}"


def dataset_part(dataset_dir: str | os.PathLike[str], index: int) -> Path:
    """The merged dataset's Parquet part ``index``: ``part-00000.parquet`` ..."""
    return Path(dataset_dir) / f"part-{index:05d}.parquet"


def dataset_parts(dataset_dir: str | os.PathLike[str]) -> list[Path]:
    """Every Parquet part of a merged dataset, in order."""
    return sorted(Path(dataset_dir).glob("part-[0-9]*.parquet"))


#: a gate's verdict file ends so (``regen.verdict``)
VERDICT_SUFFIX = ".verdict.json"


#: a shard's name: its index, 5 digits zero-padded (the workflow's ``{shard}`` wildcard)
SHARD_DIGITS = 5
SHARD_PATTERN = f"[0-9]{{{SHARD_DIGITS}}}"
_SHARD_RE = re.compile(rf"^{SHARD_PATTERN}$")


def shard_name(k: int) -> str:
    """The zero-padded shard name: ``shard_name(3) == "00003"``."""
    return f"{k:0{SHARD_DIGITS}d}"


def is_shard_name(name: str) -> bool:
    """Whether ``name`` is a shard's name (``shard_name`` of some index)."""
    return _SHARD_RE.match(name) is not None


# the report's pages and plots (``regen.observe.report`` writes every one, always), in
# ``RunLayout.report_dir``
TOKEN_LENGTHS_SVG = "token_lengths.svg"
FINISH_REASONS_SVG = "finish_reasons.svg"
QUARANTINE_REASONS_SVG = "quarantine_reasons.svg"
THROUGHPUT_SVG = "throughput.svg"
TRAINER_WINDOW_SVG = "trainer_window.svg"
RECONCILE_HTML = "reconcile.html"
SERVER_PLAN_HTML = "server_plan.html"
AUDIT_HTML = "audit.html"
REAUDIT_HTML = "reaudit.html"
LANDING_RST = "landing.rst"
ASSET_NAMES = (
    TOKEN_LENGTHS_SVG,
    FINISH_REASONS_SVG,
    QUARANTINE_REASONS_SVG,
    THROUGHPUT_SVG,
    TRAINER_WINDOW_SVG,
    RECONCILE_HTML,
    SERVER_PLAN_HTML,
    AUDIT_HTML,
    REAUDIT_HTML,
    LANDING_RST,
)
