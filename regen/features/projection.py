"""Bytes and GPU-hours of the features before anything runs: one pure formula over token counts.

Bytes: tokens x (stored layers x hidden x bytes per value + an fp8 scale + 8 bytes of token id).
GPU-hours: prefilled tokens / one GPU's prefill rate. The rate is ``features.prefill_tokens_per_s`` when set;
else the pace the finished features jobs recorded beside their manifests (``_pace.json``: tokens over the
jobs' seconds after each job's first batch, their writes included, plus each job's measured start); else
``MEASURED_UTILIZATION`` of an H100's dense bf16 peak / (2 x the model's active parameters), a projection: the
forward's matmuls at the utilization SGLang's prefill reached on an H100 for the family (dense, MoE),
attention's quadratic term left out (it grows with row length: long rows run slower than this). The tokens
come from the audit's counts (prompt plus old answer, a sample's completions each) until answers are
generated; then the generated answers' real lengths (prompt plus answer tokens the server reported, in the
merged dataset or else the validated shards so far, the audit's means for the rows not generated yet); once
the token export exists, its rows' real lengths.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from regen.features.config import FeaturesConfig
from regen.features.store import MeasuredPace, measured_pace
from regen.ingest.shard_count import ShardsConfig, shard_count
from regen.layout.names import dataset_parts
from regen.layout.run import RunLayout
from regen.runconfig import RunConfig, config_section
from regen.sglang.models import ModelShape
from regen.sglang.weights import parameter_count

#: H100 SXM dense bf16 peak (FLOP/s)
H100_BF16_PEAK = 989e12
#: model FLOP utilization of SGLang 0.5.17's prefill in regen's features job on an H100, batches of 16,384
#: tokens (rows of median 192): Llama-3.1-8B's layers 39,700 tokens/s over 2 x 3.49B active parameters (28%),
#: Qwen3-30B-A3B's 89,200 over 2 x 0.68B (12%: 128 small experts, 8 a token)
#: (measurements/features-2026-12-07b-h100: tokens over prefill seconds, warm)
MEASURED_UTILIZATION = {"dense": 0.280, "moe": 0.123}
#: the layers each figure was measured on, named in the projection (a hybrid's linear-attention layers, or
#: another MoE's expert shapes, were not)
MEASURED_ON = {"dense": "Llama-3.1-8B's layers", "moe": "Qwen3-30B-A3B's layers"}
TOKEN_ID_BYTES = 8


@dataclass(frozen=True, slots=True)
class TokenCounts:
    """Rows and tokens the features would cover (before the row choice), and where the numbers come from."""

    rows: int
    tokens: int
    source: str

    @classmethod
    def from_audit(cls, summary: Mapping[str, Any], completions_per_prompt: int) -> TokenCounts:
        """From ``results/audit/summary.json``: the kept samples x completions, each the mean prompt plus the
        mean old answer (the regenerated answers' length is not known yet)."""
        hist = summary.get("histograms") or {}
        per_row = float((hist.get("prompt_tokens") or {}).get("mean") or 0) + float(
            (hist.get("supervised_tokens") or {}).get("mean") or 0
        )
        rows = int(summary.get("kept", summary.get("total", 0))) * completions_per_prompt
        return cls(rows, round(rows * per_row), "the audit's prompt and old-answer means (projection)")

    @classmethod
    def from_answers(cls, parquet_files: Sequence[Path], where: str) -> TokenCounts:
        """From generated rows (the merged dataset's parts or the validated shards): each row's prompt plus
        answer tokens as the server reported them."""
        import pyarrow.compute as pc  # here: the features job (regen.features.job) imports this module too
        import pyarrow.parquet as pq

        rows = tokens = 0
        for path in parquet_files:
            table = pq.read_table(path, columns=["prompt_tokens", "completion_tokens"])
            rows += table.num_rows
            for name in ("prompt_tokens", "completion_tokens"):
                tokens += int(pc.sum(table[name]).as_py() or 0)
        return cls(rows, tokens, f"the generated answers' real lengths ({where})")

    def completed_by(self, audit: TokenCounts | None) -> TokenCounts:
        """These generated rows, plus the audit's rows not generated yet at its mean (``audit`` None, or
        these rows already as many: these alone)."""
        if audit is None or self.rows >= audit.rows or not audit.rows:
            return self
        rest = audit.rows - self.rows
        tokens = self.tokens + round(rest * audit.tokens / audit.rows)
        return TokenCounts(
            audit.rows, tokens, f"{self.source} for {self.rows:,} rows, the audit's means for {rest:,} more"
        )

    @classmethod
    def from_export(cls, manifest: Path, tokenized: str | os.PathLike[str]) -> TokenCounts:
        """The token export's rows and tokens as its manifest counted them while writing (``tokenized``:
        ``rows``, ``tokens``); a manifest from before that count: the export itself, read through."""
        said = orjson.loads(manifest.read_bytes()).get("tokenized", {}) if manifest.is_file() else {}
        if "tokens" in said and "rows" in said:
            where = f"the token export's real lengths ({tokenized}, counted in its manifest)"
            return cls(int(said["rows"]), int(said["tokens"]), where)
        return cls.from_token_export(tokenized)

    @classmethod
    def from_token_export(cls, tokenized: str | os.PathLike[str]) -> TokenCounts:
        """From the token export (``results/export/tokenized.jsonl``): its rows' real lengths."""
        rows = tokens = 0
        with open(tokenized, "rb") as f:
            for line in f:
                if line.strip():
                    rows += 1
                    tokens += len(orjson.loads(line)["input_ids"])
        return cls(rows, tokens, f"the token export's real lengths ({tokenized})")


def active_parameters(model: ModelShape) -> int:
    """The parameters one token's prefill multiplies through (``regen.sglang.weights.parameter_count``:
    SGLang's layout, each layer counted as what it is, Nemotron-H's Mamba2, MoE and attention layers too):
    embeddings and lm_head left out (a lookup; the capture computes no logits), a MoE's routed experts
    counted at ``num_experts_per_tok`` of ``num_experts``."""
    return max(parameter_count(model).active_per_token, 1)


def prefill_rate(
    cfg: FeaturesConfig, model: ModelShape, measured: MeasuredPace | None = None
) -> tuple[float, str]:
    """One GPU's prefill tokens/s, and where it comes from: the setting; else the pace the finished features
    jobs recorded (prefill and writes together: a job that waited on its disk counts that wait); else the
    model FLOP utilization measured for its family."""
    if cfg.prefill_tokens_per_s:
        return cfg.prefill_tokens_per_s, "features.prefill_tokens_per_s"
    if measured is not None:
        jobs = f"{measured.jobs} features job{'s' if measured.jobs != 1 else ''} so far"
        if measured.steady_jobs:
            stalls = measured.stalled_batches
            aside = f" and {stalls} batch{'es' if stalls != 1 else ''} that stalled" if stalls else ""
            return measured.tokens_per_s, (
                f"measured: {measured.steady_tokens:,} tokens prefilled and written in "
                f"{measured.steady_seconds:,.1f} s after each job's first batch{aside}, by {jobs}"
            )
        return measured.tokens_per_s, (
            f"measured: {measured.tokens:,} tokens prefilled and written in {measured.seconds:,.1f} s "
            f"by {jobs}"
        )
    params = active_parameters(model)
    family = "moe" if model.is_moe and model.num_experts else "dense"
    utilization = MEASURED_UTILIZATION[family]
    rate = H100_BF16_PEAK * utilization / (2 * params)
    return rate, (
        f"assumed: {utilization:.0%} of an H100's 989 TFLOP/s, as a {family} target's prefill reached it "
        f"({MEASURED_ON[family]}, measured), over 2 x {params / 1e9:.2f}B active parameters (a projection)"
    )


@dataclass(frozen=True, slots=True)
class FeatureProjection:
    """What the features would take: rows, tokens, bytes, GPU-hours, and the sources of each."""

    rows: int
    tokens: int
    layers: tuple[int, ...]
    hidden: int
    dtype: str
    bytes: int
    gpu_hours: float
    tokens_source: str
    rate: float
    rate_source: str
    #: each job's start (engine build, first batch over the pace) as the finished jobs measured it (0: none
    #: measured yet), and the jobs it is counted for (None: the shard count is not known)
    start_s_per_job: float = 0.0
    jobs: int | None = None

    @property
    def bytes_per_token(self) -> int:
        return self.bytes // self.tokens if self.tokens else 0

    def fraction_that_fits(self, budget: int) -> float:
        """The ``features.rows`` fraction whose projection fits ``budget`` bytes (rounded down)."""
        return int(1000 * budget / self.bytes) / 1000 if self.bytes else 1.0

    def lines(self) -> list[str]:
        return [
            f"features: {self.rows:,} rows, {self.tokens:,} tokens ({self.tokens_source})",
            f"features: layers {list(self.layers)} x hidden {self.hidden} x {self.dtype}: "
            f"{self.bytes_per_token:,} B a token, {human_bytes(self.bytes)} in all",
            f"features: {self.gpu_hours:,.2f} GPU-hours of prefill at {self.rate:,.0f} tokens/s "
            f"({self.rate_source}){self.starts_note()}",
            f"features: to keep that pace each GPU's job writes {human_bytes(self.write_rate)}/s (files "
            "synced as they are written, behind the prefill): a disk slower than that for the node's GPUs "
            "together bounds the stage instead",
        ]

    def starts_note(self) -> str:
        """What the GPU-hours count of the jobs' starts."""
        if not self.start_s_per_job:
            return ""
        each = f"{self.start_s_per_job:,.0f} s"
        if self.jobs is None:
            return f"; each job's start ({each}, measured) not counted: the shard count is not known"
        return f", with {self.jobs} job starts of {each} (engine build and first batch, measured)"

    @property
    def write_rate(self) -> float:
        """Bytes a second one GPU's features job writes at the projected prefill rate."""
        return self.rate * self.bytes_per_token


def bytes_per_token(layers: int, hidden: int, value_bytes: int, scale_bytes: int) -> int:
    """Stored bytes of one token: its layers' values (and fp8 scales) and its token id."""
    return layers * hidden * value_bytes + scale_bytes + TOKEN_ID_BYTES


def project(
    counts: TokenCounts,
    cfg: FeaturesConfig,
    model: ModelShape,
    measured: MeasuredPace | None = None,
    jobs: int | None = None,
) -> FeatureProjection:
    """The projection of ``cfg``'s features over ``counts`` for ``model`` (the row choice applied), at the
    pace ``measured`` where the features jobs recorded one, with ``jobs`` starts at the start each job
    measured (none while no job has measured one)."""
    layers = cfg.stored_layers(model.num_layers)
    rows = cfg.rows.rows_of(counts.rows)
    tokens = round(counts.tokens * rows / counts.rows) if counts.rows else 0
    per_token = bytes_per_token(len(layers), model.hidden_size, cfg.value_bytes, cfg.scale_bytes)
    rate, rate_source = prefill_rate(cfg, model, measured)
    start = measured.start_s_per_job if measured is not None and not cfg.prefill_tokens_per_s else 0.0
    return FeatureProjection(
        rows=rows,
        tokens=tokens,
        layers=layers,
        hidden=model.hidden_size,
        dtype=cfg.dtype,
        bytes=tokens * per_token,
        gpu_hours=(tokens / rate + (jobs or 0) * start) / 3600,
        tokens_source=counts.source,
        rate=rate,
        rate_source=rate_source,
        start_s_per_job=start,
        jobs=jobs,
    )


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n:,.1f} TB"  # pragma: no cover


def free_bytes_at(path: str | os.PathLike[str]) -> int:
    """Free space of the filesystem ``path`` will be on (its nearest existing parent)."""
    probe = Path(path).absolute()
    while not probe.exists():
        probe = probe.parent
    return shutil.disk_usage(probe).free


def refusal(projection: FeatureProjection, max_storage: int | None, free: int, where: str) -> str | None:
    """Why the run must not start (the projection over ``features.max_storage`` or the free space), naming
    both numbers and the settings that fit; None when it fits."""
    limits = [(max_storage, "features.max_storage")] if max_storage is not None else []
    limits.append((free, f"the free space under {where}"))
    budget, name = min(limits, key=lambda item: item[0])
    if projection.bytes <= budget:
        return None
    fits = [f"features.rows: {projection.fraction_that_fits(budget)}"]
    if projection.dtype == "bf16":
        fp8 = projection.tokens * bytes_per_token(len(projection.layers), projection.hidden, 1, 4)
        if fp8 <= budget:
            fits.append("features.dtype: fp8 (about half)")
    return (
        f"the features need {human_bytes(projection.bytes)} ({projection.bytes:,} B), over {name} "
        f"{human_bytes(budget)} ({budget:,} B); what fits: {' or '.join(fits)}"
    )


def token_counts_for_run(layout: RunLayout, completions_per_prompt: int) -> TokenCounts | None:
    """The best counts the run's files give: the token export; else the merged dataset; else the validated
    shards so far completed by the audit; else the audit alone; None before the audit."""
    if layout.export_tokenized.is_file():
        return TokenCounts.from_export(layout.export_manifest, layout.export_tokenized)
    if layout.dataset_manifest.is_file():
        return TokenCounts.from_answers(dataset_parts(layout.dataset_dir), str(layout.dataset_dir))
    audit = None
    if layout.audit_summary.is_file():
        summary = orjson.loads(layout.audit_summary.read_bytes())
        audit = TokenCounts.from_audit(summary, completions_per_prompt)
    valid = sorted(layout.valid_dir.glob("*.parquet")) if layout.valid_dir.is_dir() else []
    if valid:
        return TokenCounts.from_answers(valid, f"{len(valid)} validated shards").completed_by(audit)
    return audit


def projection_for_run(config: Mapping[str, Any], layout: RunLayout) -> FeatureProjection | None:
    """The features' projection for a loaded config (None: ``features.enabled`` is off, or there is nothing
    to count yet: :func:`token_counts_for_run`). The one call ``regen check``, the dry-run preview and the
    report's first page make."""
    cfg = FeaturesConfig.from_dict(config_section(config, "features"))
    if not cfg.enabled:
        return None
    run = RunConfig.from_config(config)
    counts = token_counts_for_run(layout, run.generate.completions_per_prompt)
    if counts is None:
        return None
    model = ModelShape.from_config(run.server.planned_model)
    shards = ShardsConfig.from_dict(config_section(config, "shards"))
    jobs = shard_count(shards.count, run.gpu_slots, layout.shard_count_file)
    return project(counts, cfg, model, measured_pace(layout.features_dir), jobs)


def preview_lines(config: Mapping[str, Any], layout: RunLayout) -> list[str]:
    """The projection's lines, and the refusal when it does not fit (empty: features off; one line saying so
    when there is nothing to project from yet); for ``regen check``, ``snakemake -n`` and the report's first
    page. A bad setting or an unreadable file raises (``regen check`` names it as a problem)."""
    if not FeaturesConfig.from_dict(config_section(config, "features")).enabled:
        return []
    projection = projection_for_run(config, layout)
    if projection is None:
        return [
            f"features: no projection yet: it needs the audit's token counts ({layout.audit_summary}) or "
            f"the generated answers; the features job checks again before it starts"
        ]
    cfg = FeaturesConfig.from_dict(config_section(config, "features"))
    why = refusal(projection, cfg.max_storage, free_bytes_at(layout.features_dir), str(layout.features_dir))
    return projection.lines() + ([f"features: REFUSED: {why}"] if why else [])


def preview_lines_naming_errors(config: Mapping[str, Any], layout: RunLayout) -> list[str]:
    """:func:`preview_lines`, a bad setting or unreadable file said in one line instead of raised (the dry
    run and the report show it; ``regen check`` refuses the run for it)."""
    try:
        return preview_lines(config, layout)
    except (OSError, ValueError) as exc:  # FeaturesConfigError, ModelConfigError, pyarrow's ArrowInvalid
        return [f"features: no projection: {exc}"]
