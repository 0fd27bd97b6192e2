"""Re-audit the merged output before calling it training-ready.

The same per-sample audit that ran on the input (``regen.ingest.audit``) runs on the merged Parquet, whose
assistant turns are now the regenerated ones: scaffolding-only answers, supervised-token counts and
duplicate prompts; plus what only the output has: the truncation rate and duplicate answers.
Gates decide whether ``READY.json`` is written; a violated gate raises, so the run fails loudly.
An output whose rows carry more than one settings fingerprint (answers made under different
settings, ``regen.fingerprint``) is never ready: that raises ``MixedSettingsError``, no override.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

from regen.chat import ChatTemplate
from regen.ingest.audit import EMPTY_RESPONSE, AuditConfig, Auditor, iter_audits
from regen.io import read_json, write_json
from regen.layout import MANIFEST_NAME
from regen.output.export import ExportConfig, dataset_window_coverage
from regen.output.masks import completion_retokenizes_differently
from regen.output.merge import iter_dataset_samples
from regen.output.split import SplitCounts
from regen.runconfig import validated
from regen.toolcalls import MISMATCH_KINDS
from regen.types import Sample
from regen.verdict import keep_verdict

log = logging.getLogger("regen.output.reaudit")

# The input gates do not apply to the output: their limits are lifted here, the output gates below rule.
_NO_INPUT_GATES = {
    "max_empty_response_fraction": 1.0,
    "max_structure_error_fraction": 1.0,
    "max_over_length_fraction": 1.0,
}


@dataclass(frozen=True, slots=True)
class ReauditGates:
    """The ``reaudit`` config section: the output gates' limits (built by :meth:`from_dict`: the schema's
    defaults filled in and its rules applied)."""

    max_empty_answer_fraction: float
    max_truncated_fraction: float
    max_duplicate_fraction: float
    min_rows: int
    override_gates: bool

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> ReauditGates:
        """Validate ``raw`` against the schema's ``reaudit`` section, fill its defaults, and type it."""
        r = validated("reaudit", raw)
        return cls(
            max_empty_answer_fraction=float(r["max_empty_answer_fraction"]),
            max_truncated_fraction=float(r["max_truncated_fraction"]),
            max_duplicate_fraction=float(r["max_duplicate_fraction"]),
            min_rows=int(r["min_rows"]),
            override_gates=bool(r["override_gates"]),
        )


class OutputGateError(RuntimeError):
    """The merged output failed a re-audit gate: it is not training-ready."""


class MixedSettingsError(OutputGateError):
    """The merged output mixes answers generated under different settings."""


def settings_fingerprint_counts(dataset_dir: str | Path) -> dict[str, int]:
    """Rows per ``settings_fingerprint`` over the merged Parquet."""
    dataset = ds.dataset(str(dataset_dir), format="parquet")
    counts: dict[str, int] = {}
    for batch in dataset.to_batches(columns=["settings_fingerprint"]):
        for item in batch.column(0).value_counts().to_pylist():
            counts[item["values"]] = counts.get(item["values"], 0) + int(item["counts"])
    return counts


def check_single_settings(dataset_dir: str | Path) -> str | None:
    """The one settings fingerprint of the output (None when empty); ``MixedSettingsError`` if mixed."""
    counts = settings_fingerprint_counts(dataset_dir)
    if len(counts) > 1:
        listed = ", ".join(f"{fp}: {n} rows" for fp, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        raise MixedSettingsError(
            f"The merged output {dataset_dir} is NOT training-ready: its rows were generated under "
            f"{len(counts)} different settings ({listed}). Column settings_fingerprint tells them apart; "
            f"{MANIFEST_NAME} provenance.settings_fingerprints lists them. Rerun the generate jobs with one "
            f"config (snakemake -R generate) so every sample is answered under the same settings."
        )
    return next(iter(counts), None)


@dataclass(frozen=True, slots=True)
class OutputGate:
    name: str
    limit: float
    value: float
    passed: bool
    meaning: str

    def to_json(self) -> dict[str, Any]:
        return {"limit": self.limit, "value": self.value, "passed": self.passed, "meaning": self.meaning}


@dataclass(slots=True)
class OutputCounts:
    """What only the output has: finish reasons and duplicate answers (digests only in memory)."""

    rows: int = 0
    truncated: int = 0
    duplicate_answers: int = 0
    finish_reasons: dict[str, int] = field(default_factory=dict)
    with_token_ids: int = 0  # records carrying the server's token ids
    retokenize_mismatch: int = 0  # ... whose text re-tokenizes differently from those ids
    #: regenerate all: rows ended early at a turn whose tool calls differ from the dataset's, by kind
    tool_call_mismatch: dict[str, int] = field(default_factory=dict)
    _seen: set[bytes] = field(default_factory=set)

    def add_finish_reasons(self, dataset_dir: str | Path) -> None:
        dataset = ds.dataset(str(dataset_dir), format="parquet")
        for batch in dataset.to_batches(columns=["finish_reason"]):
            for reason in batch.column(0).to_pylist():
                self.rows += 1
                self.finish_reasons[reason] = self.finish_reasons.get(reason, 0) + 1
                self.truncated += reason == "length"

    def add_tool_call_mismatches(self, dataset_dir: str | Path) -> None:
        """Count the rows ended at a regenerated turn whose tool calls differ (``regen.toolcalls``)."""
        dataset = ds.dataset(str(dataset_dir), format="parquet")
        if "tool_call_mismatch" not in dataset.schema.names:
            return
        for batch in dataset.to_batches(columns=["tool_call_mismatch"]):
            for item in batch.column(0).drop_null().value_counts().to_pylist():
                kind = item["values"]
                self.tool_call_mismatch[kind] = self.tool_call_mismatch.get(kind, 0) + int(item["counts"])

    def add_token_id_checks(self, dataset_dir: str | Path, template: ChatTemplate) -> None:
        """Count records whose generated text re-tokenizes differently from the ids the model produced."""
        dataset = ds.dataset(str(dataset_dir), format="parquet")
        if "completion_token_ids" not in dataset.schema.names:
            return
        for batch in dataset.to_batches(columns=["completion_token_ids", "turns"]):
            for ids, turns in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True):
                completions = [t.get("completion_token_ids") for t in turns] if turns else [ids]
                if any(c is None for c in completions):
                    continue
                self.with_token_ids += 1
                self.retokenize_mismatch += any(
                    completion_retokenizes_differently(template, c) for c in completions
                )

    def counting_answers(self, samples: Iterable[Sample]) -> Iterator[Sample]:
        """Pass samples through, counting answers (reasoning + content) identical to an earlier one."""
        for sample in samples:
            answer = sample.messages[-1]
            digest = hashlib.blake2b(
                f"{answer.reasoning_content or ''}\x00{answer.content or ''}".encode(), digest_size=16
            ).digest()
            if digest in self._seen:
                self.duplicate_answers += 1
            else:
                self._seen.add(digest)
            yield sample


def eval_split_counts(dataset_dir: str | Path, eval_fraction: float) -> SplitCounts:
    """The export's eval split over the merged rows (``regen.output.split``): rows per side, prompts on
    both."""
    split = SplitCounts(eval_fraction)
    dataset = ds.dataset(str(dataset_dir), format="parquet")
    for batch in dataset.to_batches(columns=["messages"]):
        split.add_all(batch.column(0).to_pylist())
    return split


def output_gates(rows: int, empty: int, counts: OutputCounts, limits: ReauditGates) -> list[OutputGate]:
    """Each output gate's value against its configured limit (equal to the limit passes)."""

    def frac(n: int) -> float:
        return n / rows if rows else 0.0

    checks = [
        (
            "max_empty_answer_fraction",
            limits.max_empty_answer_fraction,
            frac(empty),
            "answers that are only template scaffolding",
        ),
        (
            "max_truncated_fraction",
            limits.max_truncated_fraction,
            frac(counts.truncated),
            "answers cut at max_tokens (finish_reason length)",
        ),
        (
            "max_duplicate_fraction",
            limits.max_duplicate_fraction,
            frac(counts.duplicate_answers),
            "answers identical to an earlier one",
        ),
    ]
    gates = [
        OutputGate(name, limit, value, value <= limit, meaning) for name, limit, value, meaning in checks
    ]
    min_rows = limits.min_rows
    gates.append(OutputGate("min_rows", min_rows, rows, rows >= min_rows, "rows in the merged output"))
    return gates


def gate_failure_message(gates: list[OutputGate], summary_path: str) -> str:
    lines = ["The merged output is NOT training-ready: re-audit gates failed."]
    for g in gates:
        if not g.passed:
            relation = "<" if g.name == "min_rows" else ">"
            lines.append(f"  - {g.name}: {g.value:.4g} {relation} {g.limit:.4g} ({g.meaning})")
    lines.append(f"Details: {summary_path}. To accept it anyway set reaudit.override_gates: true.")
    return "\n".join(lines)


def output_audit_config(audit: AuditConfig) -> AuditConfig:
    """The input audit's per-sample checks for the output: the input gates lifted (``_NO_INPUT_GATES``;
    ``max_unread_tail_files`` at the schema's default: the output has no unread tail), nothing excluded."""
    lifted = AuditConfig.from_dict({"gates": _NO_INPUT_GATES}, audit.regenerate)
    return replace(audit, gates=lifted.gates, exclude=frozenset())


def reaudit_dataset(
    *,
    dataset_dir: str,
    summary_out: str,
    ready_out: str,
    gates: ReauditGates,
    audit: AuditConfig,
    tokenizer_dir: str,
    export: ExportConfig,
    verdict_out: str | Path | None = None,
) -> dict[str, Any]:
    """Audit the merged output, write its summary, and write READY.json only if every gate passes.

    ``audit`` is the run's ``audit`` section: its per-sample checks run on the output, without the input
    gates and exclusions (:func:`output_audit_config`); ``export`` decides the eval split and the
    trainer window reported. The summary is also kept at ``verdict_out`` (beside the log): Snakemake
    deletes a failed job's outputs, so that copy is where a failed gate's details stay."""
    settings_fingerprint = check_single_settings(dataset_dir)
    template = ChatTemplate.from_dir(tokenizer_dir)
    auditor = Auditor(output_audit_config(audit), template)
    counts = OutputCounts()
    counts.add_finish_reasons(dataset_dir)
    counts.add_token_id_checks(dataset_dir, template)
    counts.add_tool_call_mismatches(dataset_dir)
    split = eval_split_counts(dataset_dir, export.eval_fraction)
    window = dataset_window_coverage(dataset_dir, template, export)
    for _ in iter_audits(auditor, counts.counting_answers(iter_dataset_samples(dataset_dir))):
        pass
    audit = auditor.summary().to_json()
    empty = int(audit["flag_counts"].get(EMPTY_RESPONSE, 0))
    results = output_gates(counts.rows, empty, counts, gates)
    leaks = split.prompts_on_both_sides
    results.append(
        OutputGate("eval_split_leaks", 0, leaks, leaks == 0, "prompts on both sides of the eval split")
    )
    passed = all(g.passed for g in results)
    overridden = not passed and gates.override_gates
    manifest_path = Path(dataset_dir) / MANIFEST_NAME
    summary = {
        "rows": counts.rows,
        "settings_fingerprint": settings_fingerprint,
        "empty_answers": empty,
        "truncated": counts.truncated,
        "duplicate_answers": counts.duplicate_answers,
        "finish_reasons": dict(counts.finish_reasons),
        "token_ids": {
            "records_with_server_ids": counts.with_token_ids,
            "text_retokenizes_differently": counts.retokenize_mismatch,
            "meaning": "records whose generated text does not tokenize back to the ids the model produced "
            "(a text-based trainer would train on a sequence the target never emitted)",
        },
        "tool_call_mismatch": {
            "rows": sum(counts.tool_call_mismatch.values()),
            "by_kind": {k: counts.tool_call_mismatch.get(k, 0) for k in MISMATCH_KINDS},
            "meaning": "regenerate all: rows ended at a regenerated turn whose tool calls differ from those "
            "the dataset's next tool turns answer (count, function name, or arguments compared as JSON), "
            "so no tool result answers a call the model did not make",
        },
        # the split the export writes; "written" false: export.enabled is off and no eval file exists
        "eval_split": split.to_json() | {"written": export.enabled},
        "trainer_window": window.to_json(),
        "gates": {g.name: g.to_json() for g in results},
        "passed": passed,
        "overridden": overridden,
        "audit": audit,
    }
    write_json(summary_out, summary)
    keep_verdict(summary, verdict_out)
    details = str(verdict_out or summary_out)
    if not passed and not overridden:
        raise OutputGateError(gate_failure_message(results, details))
    if overridden:
        log.warning("%s", gate_failure_message(results, details))
    manifest = read_json(manifest_path) if manifest_path.exists() else {}
    write_json(
        ready_out,
        {
            "ready": True,
            "overridden": overridden,
            "rows": counts.rows,
            "settings_fingerprint": settings_fingerprint,
            "dataset": str(dataset_dir),
            "manifest_sha256": {f["path"]: f["sha256"] for f in manifest.get("files", [])},
        },
    )
    log.info("output re-audit passed: %d rows ready", counts.rows)
    return summary
