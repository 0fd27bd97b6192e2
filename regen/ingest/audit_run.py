"""``run_audit``: audit one dataset file and write the audit's files (flags, excluded rows, kept samples,
summary, plots)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from itertools import islice
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
from regen.layout import AuditFiles
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
) -> Iterator[Sample]:
    """The dataset's samples as ``dataset`` says to read them (unreadable rows appended to ``bad_rows``)."""
    return iter_samples(
        input_path,
        dataset.format,
        dataset.id_column,
        dataset.on_bad_row,
        tokenizer_dir,
        bad_rows,
        developer_role=chat.developer_role,
        ids=ids,
    )


def run_audit(
    input_path: str | Path,
    out_dir: str | Path,
    config: AuditConfig,
    tokenizer_dir: str | Path,
    dataset: DatasetConfig,
    verdict_out: str | Path | None = None,
    progress: RowCounter | None = None,
) -> AuditSummary:
    """Audit one dataset file; write summary.json, flags.parquet, excluded.jsonl, the kept samples
    (samples.parquet, the shard step's input) and the plots.

    ``input_path`` is the local file (the workflow's copy of ``dataset.path``); ``dataset`` says how to
    read it. ``config.regenerate`` is ``generate.regenerate``: which old answers this run replaces, so
    which empty ones the gate ``max_empty_response_fraction`` judges (None: the schema's default,
    assumed and said so).

    Raises ``AuditGateError`` (after writing every output) when a gate fails and gates are not
    overridden, and ``NothingToGenerateError`` when no sample is left for generation; the summary is
    also kept at ``verdict_out`` (beside the log), which survives the failed job.

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
    if summary.kept == 0:
        raise NothingToGenerateError(
            nothing_to_generate_message(summary, input_path, verdict_out or paths.summary)
        )
    if not summary.passed:
        message = gate_failure_message(summary, verdict_out or paths.summary)
        if not config.override_gates:
            raise AuditGateError(message)
        log.warning("gates overridden (audit.override_gates: true):\n%s", message)
    return summary


def first_pass_summary(
    input_path: str | Path, config: AuditConfig, tokenizer_dir: str | Path, dataset: DatasetConfig, rows: int
) -> dict[str, Any]:
    """The audit's summary (``summary.json``'s object) over the first ``rows`` samples of the dataset,
    judged by the audit's own code and written nowhere: what ``regen.tune.prestart`` plans a
    provisional server from while the audit reads the rest. A dataset of at most ``rows`` samples
    gives the audit's own numbers."""
    chat = ChatTemplate.from_dir(tokenizer_dir)
    auditor = Auditor(config, chat)
    bad_rows: list[BadRow] = []
    samples = dataset_samples(
        input_path, dataset, tokenizer_dir, chat, bad_rows, IdAccount(dataset.id_column)
    )
    for _ in iter_audits(auditor, islice(samples, rows), bad_rows):
        pass
    return auditor.summary({"input": str(input_path), "first_rows": rows}).to_json()
