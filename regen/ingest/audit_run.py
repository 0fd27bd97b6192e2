"""``run_audit``: audit one dataset file and write the audit's files (flags, excluded rows, kept samples,
summary, plots)."""

from __future__ import annotations

import logging
import shutil
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from regen.chat import ChatTemplate
from regen.ingest.audit_config import AuditConfig
from regen.ingest.audit_plot import plot_histogram
from regen.ingest.audit_summary import (
    AuditGateError,
    AuditSummary,
    NothingToGenerateError,
    gate_failure_message,
    nothing_to_generate_message,
)
from regen.ingest.auditor import (
    Auditor,
    iter_audits,
)
from regen.ingest.dataset import DatasetConfig, IdAccount, iter_samples
from regen.ingest.flags import (
    SampleAudit,
)
from regen.ingest.progress import RowCounter, RowProgress, console_log
from regen.ingest.readers import check_dataset_path, known_row_count
from regen.io import atomic_open, atomic_path, write_json
from regen.layout.beside import AuditFiles
from regen.records import FLAGS_SCHEMA, SHARD_SCHEMA, SampleRows
from regen.types import BadRow, Sample
from regen.verdict import keep_verdict

log = logging.getLogger(__name__)


PARQUET_BATCH_ROWS = 65536

# --------------------------------------------------------------------------------------
# Outputs
# --------------------------------------------------------------------------------------


class FlagsWriter:
    """Buffers verdicts into columns and writes ``flags.parquet`` row-group by row-group."""

    def __init__(self, writer: pq.ParquetWriter, rows_per_batch: int = PARQUET_BATCH_ROWS) -> None:
        self._writer = writer
        self._rows = rows_per_batch
        self._cols: dict[str, list[Any]] = {name: [] for name in FLAGS_SCHEMA.names}

    def add(self, a: SampleAudit) -> None:
        c = self._cols
        c["id"].append(a.id)
        c["file"].append(a.file)
        c["row"].append(a.row)
        c["format"].append(a.format)
        c["flags"].append(list(a.flags))
        c["supervised_tokens"].append(a.supervised_tokens)
        c["prompt_tokens"].append(a.prompt_tokens)
        c["excluded"].append(a.excluded)
        c["exclude_reason"].append(a.exclude_reason)
        c["detail"].append(a.detail)
        c["id_json"].append(a.id_json)
        if len(c["id"]) >= self._rows:
            self.flush()

    def flush(self) -> None:
        if not self._cols["id"]:
            return
        self._writer.write_table(pa.table(self._cols, schema=FLAGS_SCHEMA))
        for col in self._cols.values():
            col.clear()


def dataset_samples(
    input_path: str | Path,
    dataset: DatasetConfig,
    tokenizer_dir: str | Path,
    chat: ChatTemplate,
    bad_rows: list[BadRow],
    ids: IdAccount,
    max_rows: int | None = None,
) -> Iterator[Sample]:
    """The dataset's samples as ``dataset`` says to read them (unreadable rows appended to ``bad_rows``;
    ``max_rows``: only that many rows, readable or not)."""
    return iter_samples(
        input_path,
        dataset.format,
        dataset.id_column,
        dataset.on_bad_row,
        tokenizer_dir,
        bad_rows,
        developer_role=chat.developer_role,
        ids=ids,
        max_rows=max_rows,
    )


def run_audit(
    input_path: str | Path,
    out_dir: str | Path,
    config: AuditConfig,
    tokenizer_dir: str | Path,
    dataset: DatasetConfig,
    verdict_out: str | Path | None = None,
    progress: RowCounter | None = None,
    excluded_out: str | Path | None = None,
) -> AuditSummary:
    """Audit one dataset file; write summary.json, flags.parquet, excluded.jsonl, the kept samples
    (samples.parquet, the shard step's input) and the plots.

    ``input_path`` is the local file (the workflow's copy of ``dataset.path``); ``dataset`` says how to
    read it. ``config.regenerate`` is ``generate.regenerate``: which old answers this run replaces, so
    which empty ones the gate ``max_empty_response_fraction`` judges (None: the schema's default,
    assumed and said so).

    Raises ``AuditGateError`` (after writing every output) when a gate fails and gates are not
    overridden, and ``NothingToGenerateError`` when no sample is left for generation; the summary is
    also kept at ``verdict_out`` (beside the log), which survives the failed job, as does the copy of the
    excluded rows with their reasons at ``excluded_out`` (also beside the log).

    ``progress`` counts every row judged and is finished once all are (the workflow's job passes the
    stage progress ``regen status`` reads); None: a line on the console every few seconds.
    """
    chat = ChatTemplate.from_dir(tokenizer_dir)
    paths = AuditFiles(Path(out_dir))
    auditor = Auditor(config, chat)
    bad_rows: list[BadRow] = []
    ids = IdAccount(dataset.id_column)
    if progress is None:
        progress = RowProgress("audit", known_row_count(check_dataset_path(input_path)))
    samples = dataset_samples(input_path, dataset, tokenizer_dir, chat, bad_rows, ids)
    awaiting_verdict: dict[tuple[Any, Any], Sample] = {}  # the shard step gets the kept ones: one parse

    def remembered(stream: Iterable[Sample]) -> Iterator[Sample]:
        for sample in stream:
            awaiting_verdict[(sample.source.get("file"), sample.source.get("row"))] = sample
            yield sample

    with (
        atomic_path(paths.flags) as flags_tmp,
        pq.ParquetWriter(flags_tmp, FLAGS_SCHEMA, compression="zstd") as pw,
        atomic_open(paths.excluded, "wb") as excluded_fh,
        atomic_path(paths.samples) as samples_tmp,
        pq.ParquetWriter(samples_tmp, SHARD_SCHEMA, compression="zstd") as samples_pw,
    ):
        flags_writer = FlagsWriter(pw)
        kept = SampleRows(samples_pw)
        for audit in iter_audits(auditor, remembered(samples), bad_rows):
            flags_writer.add(audit)
            progress.advance(1)
            sample = awaiting_verdict.pop((audit.file, audit.row), None)
            if audit.excluded:
                excluded_fh.write(orjson.dumps(audit.excluded_json()) + b"\n")
            elif sample is not None:
                kept.add(sample)
        flags_writer.flush()
        kept.flush()
    progress.finish()
    summary = auditor.summary(
        {
            "input": str(input_path),
            "tokenizer": str(tokenizer_dir),
            "format": dataset.format,
            "fast_renderer": chat.uses_fast_renderer,
            "ids": ids.to_json(),
        }
    )
    plot_histogram(
        summary.histograms["supervised_tokens"], "supervised tokens per sample", paths.supervised_plot
    )
    plot_histogram(summary.histograms["prompt_tokens"], "prompt tokens per sample", paths.prompt_plot)
    write_json(paths.summary, summary.to_json())
    keep_verdict(summary.to_json(), verdict_out)
    log.info("empty old answers: %s", summary.empty_answers.in_words())
    if ids.field is not None:  # a dataset's own ids left unused: said where the user is looking
        console_log().warning("%s", ids.in_words())
    else:
        log.info("%s", ids.in_words())
    rows_path = keep_excluded(paths.excluded, excluded_out) or paths.excluded
    if summary.kept == 0:
        message = nothing_to_generate_message(summary, input_path, verdict_out or paths.summary, rows_path)
        raise NothingToGenerateError(said_on_console(message))
    if not summary.passed:
        message = gate_failure_message(summary, verdict_out or paths.summary, rows_path)
        if not config.override_gates:
            raise AuditGateError(said_on_console(message))
        log.warning("gates overridden (audit.override_gates: true):\n%s", message)
    return summary


def said_on_console(message: str) -> str:
    """``message`` printed on the console as well, when this process's stderr is a job's log (a workflow
    job: ``regen.runlog.log_to``), where the traceback alone would leave it unseen; returned as given."""
    if sys.__stderr__ is not None and sys.stderr is not sys.__stderr__:
        print(f"regen: audit: {message}", file=sys.__stderr__, flush=True)
    return message


def keep_excluded(excluded: Path, kept: str | Path | None) -> Path | None:
    """The excluded rows copied to ``kept`` (beside the rule's log, which Snakemake keeps when it deletes a
    failed job's ``excluded.jsonl``), the path returned; None without one."""
    if kept is None:
        return None
    with atomic_path(kept) as tmp:
        shutil.copyfile(excluded, tmp)
    return Path(kept)


@dataclass(frozen=True, slots=True)
class FirstRows:
    """The audit's verdicts on a dataset's first rows (``first_rows``), written nowhere."""

    #: rows judged (readable or not); fewer than ``asked``: the dataset has no more
    rows: int
    asked: int
    summary: AuditSummary
    #: each excluded row as ``excluded.jsonl`` holds it (id, reason, file, row, detail)
    excluded: tuple[dict[str, Any], ...]

    def excludes_all(self) -> bool:
        return self.rows > 0 and self.summary.kept == 0

    @property
    def whole(self) -> bool:
        """These rows are the whole dataset."""
        return self.rows < self.asked

    def in_words(self) -> str:
        """Why none of these rows would be generated: the reasons counted and the first row's detail."""
        reasons = ", ".join(f"{r}={n}" for r, n in self.summary.excluded_reasons.items())
        first = self.excluded[0] if self.excluded else {}
        detail = first.get("detail") or first.get("reason")
        where = f"{first.get('file')}: row {first.get('row')}"
        which = f"all {self.rows} rows" if self.whole else f"all of the first {self.rows} rows"
        return f"{which} are excluded ({reasons}); e.g. {where}: {detail}"


def first_rows(
    input_path: str | Path, config: AuditConfig, tokenizer_dir: str | Path, dataset: DatasetConfig, rows: int
) -> FirstRows:
    """The audit's own reading and verdicts over the dataset's first ``rows`` rows (readable or not)."""
    chat = ChatTemplate.from_dir(tokenizer_dir)
    auditor = Auditor(config, chat)
    bad_rows: list[BadRow] = []
    samples = dataset_samples(
        input_path, dataset, tokenizer_dir, chat, bad_rows, IdAccount(dataset.id_column), max_rows=rows
    )
    excluded = [a.excluded_json() for a in iter_audits(auditor, samples, bad_rows) if a.excluded]
    summary = auditor.summary({"input": str(input_path), "first_rows": rows})
    return FirstRows(summary.total, rows, summary, tuple(excluded))


def first_pass_summary(
    input_path: str | Path, config: AuditConfig, tokenizer_dir: str | Path, dataset: DatasetConfig, rows: int
) -> dict[str, Any]:
    """The audit's summary (``summary.json``'s object) over the first ``rows`` rows of the dataset,
    judged by the audit's own code and written nowhere: what ``regen.tune.prestart`` plans a
    provisional server from while the audit reads the rest. A dataset of at most ``rows`` rows
    gives the audit's own numbers."""
    return first_rows(input_path, config, tokenizer_dir, dataset, rows).summary.to_json()
