"""Re-audit the merged output before calling it training-ready.

The same per-sample audit that ran on the input (``regen.ingest.audit``) runs on the merged Parquet, whose
assistant turns are now the regenerated ones: scaffolding-only answers, supervised-token counts and
duplicate prompts; plus what only the output has: the truncation rate and duplicate answers.
Gates decide whether ``READY.json`` is written; a violated gate raises, so the run fails loudly.
An output whose rows carry more than one settings fingerprint (answers made under different
settings, ``regen.fingerprint``) within one sampling variant is never ready: that raises
``MixedSettingsError``, no override (each variant of ``generate.variants`` has its own fingerprint).

With variants the summary breaks every count down by variant (``variants``: rows, finish reasons, lengths,
truncation, identical completions of one prompt), and a length stop is counted by where it fell
(``truncated_where``: inside the reasoning or inside the answer, ``regen.truncation``).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds

from regen.chat import ChatTemplate
from regen.ingest.audit import EMPTY_RESPONSE, AuditConfig, Auditor, iter_audits
from regen.io import read_json, write_json
from regen.layout.names import MANIFEST_NAME
from regen.observe.variants import VariantCounts
from regen.output.export import ExportConfig, dataset_window_coverage
from regen.output.masks import completion_retokenizes_differently
from regen.output.merge import iter_dataset_samples
from regen.output.split import SplitCounts
from regen.runconfig import DEFAULT_VARIANT, validated
from regen.toolcalls import MISMATCH_KINDS
from regen.truncation import WHERE, truncated_where
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


def settings_fingerprint_counts(dataset_dir: str | Path) -> dict[str, dict[str, int]]:
    """Rows per ``settings_fingerprint`` of each sampling variant over the merged Parquet."""
    dataset = ds.dataset(str(dataset_dir), format="parquet")
    counts: dict[str, dict[str, int]] = {}
    columns = ["variant", "settings_fingerprint"]
    if "variant" not in dataset.schema.names:  # a dataset merged before variants: one implicit variant
        columns = ["settings_fingerprint"]
    for batch in dataset.to_batches(columns=columns):
        table = pa.Table.from_batches([batch])
        if "variant" not in columns:
            table = table.append_column("variant", pa.array([DEFAULT_VARIANT] * len(table), pa.string()))
        grouped = table.group_by(["variant", "settings_fingerprint"]).aggregate([("variant", "count")])
        for variant, fp, n in zip(*(grouped.column(c).to_pylist() for c in (0, 1, 2)), strict=True):
            per = counts.setdefault(variant, {})
            per[fp] = per.get(fp, 0) + int(n)
    return counts


def check_single_settings(dataset_dir: str | Path) -> dict[str, str]:
    """The one settings fingerprint of each sampling variant in the output (empty when the output is);
    ``MixedSettingsError`` when a variant's rows were generated under more than one."""
    counts = settings_fingerprint_counts(dataset_dir)
    for variant, fps in sorted(counts.items()):
        if len(fps) > 1:
            listed = ", ".join(f"{fp}: {n} rows" for fp, n in sorted(fps.items(), key=lambda kv: -kv[1]))
            raise MixedSettingsError(
                f"The merged output {dataset_dir} is NOT training-ready: the rows of variant {variant!r} "
                f"were generated under {len(fps)} different settings ({listed}). Column "
                f"settings_fingerprint tells them apart; {MANIFEST_NAME} provenance.settings_fingerprints "
                f"lists them. Rerun the generate jobs with one config (snakemake -R generate) so every "
                f"sample is answered under the same settings."
            )
    return {variant: next(iter(fps)) for variant, fps in sorted(counts.items())}


def _answer_digest(reasoning: str | None, content: str | None) -> bytes:
    return hashlib.blake2b(f"{reasoning or ''}\x00{content or ''}".encode(), digest_size=16).digest()


def last_turns(messages: pa.ListArray) -> pa.StructArray:
    """The last message of every row (the regenerated answer), without converting the rest."""
    offsets = messages.offsets.to_numpy()
    return messages.values.take(pa.array(offsets[1:] - 1))


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
    #: length stops by where they fell (``regen.truncation``: in_answer / in_reasoning)
    truncated_where: dict[str, int] = field(default_factory=lambda: dict.fromkeys(WHERE, 0))
    #: completions identical (reasoning and answer) to an earlier completion of the same prompt
    duplicate_completions: int = 0
    variants: dict[str, VariantCounts] = field(default_factory=dict)
    with_token_ids: int = 0  # records carrying the server's token ids
    retokenize_mismatch: int = 0  # ... whose text re-tokenizes differently from those ids
    #: regenerate all: rows ended early at a turn whose tool calls differ from the dataset's, by kind
    tool_call_mismatch: dict[str, int] = field(default_factory=dict)
    _seen: set[bytes] = field(default_factory=set)

    def add_finish_reasons(self, dataset_dir: str | Path) -> None:
        """Count finish reasons, where length stops fell and identical completions of one prompt, in all
        and per sampling variant."""
        dataset = ds.dataset(str(dataset_dir), format="parquet")
        names = dataset.schema.names
        has_variants = "variant" in names
        columns = ["finish_reason", "messages", "completion_tokens", "thinking"]
        columns += ["variant", "sample_id"] if has_variants else ["id"]
        seen: dict[str, set[bytes]] = {}  # sample id -> digests of its completions so far
        for batch in dataset.to_batches(columns=columns):
            last = last_turns(batch.column("messages")).to_pylist()
            reasons = batch.column("finish_reason").to_pylist()
            tokens = batch.column("completion_tokens").to_pylist()
            thinking = batch.column("thinking").to_pylist()
            variants = batch.column("variant").to_pylist() if has_variants else [DEFAULT_VARIANT] * len(last)
            samples = batch.column("sample_id" if has_variants else "id").to_pylist()
            for answer, reason, n, think, variant, sid in zip(
                last, reasons, tokens, thinking, variants, samples, strict=True
            ):
                v = self.variants.get(variant) or self.variants.setdefault(variant, VariantCounts())
                self.rows += 1
                self.finish_reasons[reason] = self.finish_reasons.get(reason, 0) + 1
                where = truncated_where(
                    reason, answer["content"], answer["reasoning_content"], bool(answer["tool_calls_json"])
                )
                v.add(reason, n, think, where)
                if where is not None:
                    self.truncated += 1
                    self.truncated_where[where] += 1
                digest = _answer_digest(answer["reasoning_content"], answer["content"])
                before = seen.setdefault(sid, set())
                if digest in before:
                    self.duplicate_completions += 1
                    v.duplicate_completions += 1
                before.add(digest)

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
            digest = _answer_digest(answer.reasoning_content, answer.content)
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
            # rows - distinct answers, less rows - distinct (prompt, answer): repeats across prompts only
            frac(counts.duplicate_answers - counts.duplicate_completions),
            "answers identical to an answer of another prompt (a prompt's own identical completions, as a "
            "greedy variant's n make, are counted apart: duplicate_completions)",
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
    fingerprints = check_single_settings(dataset_dir)
    settings_fingerprint = next(iter(fingerprints.values())) if len(fingerprints) == 1 else None
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
        "settings_fingerprints": fingerprints,
        "empty_answers": empty,
        "truncated": counts.truncated,
        # a length stop inside the reasoning (no answer yet) apart from one inside the answer
        "truncated_where": dict(counts.truncated_where),
        "duplicate_answers": counts.duplicate_answers,
        "duplicate_completions": {
            "rows": counts.duplicate_completions,
            "meaning": "completions identical (reasoning and answer) to an earlier completion of the same "
            "prompt: flagged in the dataset's duplicate_of column; export.drop_duplicate_completions leaves "
            "them out of the exports",
        },
        "finish_reasons": dict(counts.finish_reasons),
        "variants": {name: v.to_json() for name, v in sorted(counts.variants.items())},
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
            "settings_fingerprints": fingerprints,
            "dataset": str(dataset_dir),
            "manifest_sha256": {f["path"]: f["sha256"] for f in manifest.get("files", [])},
        },
    )
    log.info("output re-audit passed: %d rows ready", counts.rows)
    return summary
