"""One shard's features job: the shard's chosen token rows, prefilled, stored, the manifest last.

A row already stored under the same settings, tokens and answer fingerprint whose checksum verifies is
skipped; a row whose answer was regenerated (its fingerprint or tokens changed) or whose file does not verify
is computed again; files of rows no longer chosen, or of other settings, are moved to ``superseded/``
(``regen.features.store``). The rows are prefilled ``features.batch_tokens`` tokens at a time, whole.

The files are written (hashed, fsynced, renamed, journalled) by one writer thread, in order, while the GPU
prefills the next batch: at 32 KB a token (an 8B's four layers in bf16) the disk, not the prefill, is often
the bound, and a GPU waiting on ``fsync`` is the idle time users pay for. At most ``WRITE_AHEAD`` batches
wait on the writer (their states already on the host), so memory stays bounded and a crash loses at most
those batches, whose rows are computed again on resume.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any

from regen.features.backends import CaptureBackend, encode
from regen.features.rows import TokenRow
from regen.features.store import (
    FeatureSettings,
    ShardStore,
    StoredRow,
    record_pace,
    row_file_name,
    settings_digest,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ShardResult:
    """What one job did."""

    rows: int
    computed: int
    reused: int
    tokens_computed: int
    moved_aside: tuple[str, ...]
    #: seconds in the engine's prefill (and the copy of its states to the host), and seconds the prefill
    #: waited for the writer: what bounds the job, the GPU or the disk
    capture_s: float = 0.0
    write_wait_s: float = 0.0
    #: seconds from the first batch's prefill to the last batch's files written: the job's own pace
    wall_s: float = 0.0
    #: the first batch's tokens and the seconds until its files were written: it also pays the kernels the
    #: engine builds on first use (seconds on a MoE), so the pace after it is the one the rest of a run keeps
    first_batch_tokens: int = 0
    first_batch_s: float = 0.0
    #: seconds the job spent building its engine before the first batch (0: not measured here)
    engine_s: float = 0.0
    #: each later batch's tokens and the seconds from the previous batch's files written to its own: a batch
    #: that met a shape the engine had not built kernels for stands out (``MeasuredPace`` sets it aside)
    later_batches: tuple[tuple[int, float], ...] = ()

    def pace(self) -> dict[str, Any] | None:
        """What the shard keeps of this job's pace (None: it computed nothing): the tokens it prefilled and
        wrote, in how many seconds, of those the prefill's and the wait on the writer; the first batch's
        tokens and seconds, and the engine's build (``regen.features.store.MeasuredPace`` reads them)."""
        if not self.tokens_computed:
            return None
        return {
            "tokens": self.tokens_computed,
            "seconds": round(self.wall_s, 3),
            "prefill_s": round(self.capture_s, 3),
            "waited_on_writer_s": round(self.write_wait_s, 3),
            "first_batch_tokens": self.first_batch_tokens,
            "first_batch_s": round(self.first_batch_s, 3),
            "engine_s": round(self.engine_s, 3),
            "later_batches": [[tokens, round(seconds, 4)] for tokens, seconds in self.later_batches],
        }


#: batches whose files may wait on the writer thread while the next batch is prefilled
WRITE_AHEAD = 2
#: threads that write one batch's files at once: one thread hashing, writing and syncing file after file
#: wrote 0.27-0.46 GB/s on an H100 host whose disk took 1.2 GB/s synced, and held the prefill back for 11 of
#: a dense job's 17 s (measurements/features-2026-12-07-h100)
FILE_WRITERS = 8


def token_batches(rows: Sequence[TokenRow], batch_tokens: int) -> Iterator[list[TokenRow]]:
    """``rows`` in order, whole, in batches of at most ``batch_tokens`` tokens (a longer row alone)."""
    batch: list[TokenRow] = []
    size = 0
    for row in rows:
        if batch and size + len(row.input_ids) > batch_tokens:
            yield batch
            batch, size = [], 0
        batch.append(row)
        size += len(row.input_ids)
    if batch:
        yield batch


def compute_rows(
    rows: Sequence[TokenRow],
    store: ShardStore,
    backend: CaptureBackend,
    batch_tokens: int,
    encoder: Callable[[Any, Sequence[int], str], list] = encode,
) -> ShardResult:
    """Store every row of ``rows`` not already current in ``store``, prefilled ``batch_tokens`` tokens at a
    time (``features.batch_tokens``); write nothing else. Each batch's files are written (``FILE_WRITERS`` at
    once, their journal lines after them, batch after batch) while the next batch is prefilled; a crash loses
    at most the batches not yet written."""
    settings = store.settings
    digest = settings_digest(settings)
    todo = [r for r in rows if not store.is_current(r.id, r.token_digest, r.fingerprint)]
    tokens = sum(len(r.input_ids) for r in todo)
    capture_s = wait_s = 0.0
    done_rows = done_tokens = 0
    started = last_note = time.monotonic()
    pending: list[tuple[int, Future[float]]] = []  # each batch's tokens, and when its files are written
    landed: list[tuple[int, float]] = []
    with (  # the file threads outlive the writer's last batch: it is shut down (and waited for) first
        ThreadPoolExecutor(max_workers=FILE_WRITERS, thread_name_prefix="features-file") as files,
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="features-writer") as writer,
    ):
        try:
            for batch in token_batches(todo, batch_tokens):
                t0 = time.monotonic()
                states = backend.capture_many([r.input_ids for r in batch])
                encoded = [
                    (row, encoder(check_shape(row, s, settings, backend.name), row.input_ids, settings.dtype))
                    for row, s in zip(batch, states, strict=True)
                ]
                del states
                t1 = time.monotonic()
                capture_s += t1 - t0
                while len(pending) >= WRITE_AHEAD:
                    landed.append(land(pending.pop(0)))
                wait_s += time.monotonic() - t1
                tokens_in_batch = sum(len(r.input_ids) for r in batch)
                pending.append((tokens_in_batch, writer.submit(write_batch, store, digest, encoded, files)))
                done_rows += len(batch)
                done_tokens += tokens_in_batch
                if time.monotonic() - last_note >= 30:
                    last_note = time.monotonic()
                    log.info(
                        "features: %d/%d rows (%d/%d tokens) in %.0f s: prefill %.0f s, waiting on the "
                        "writer %.0f s",
                        done_rows,
                        len(todo),
                        done_tokens,
                        tokens,
                        last_note - started,
                        capture_s,
                        wait_s,
                    )
        finally:
            t1 = time.monotonic()
            for batch_pending in pending:  # every finished batch is written, also when a later one failed
                landed.append(land(batch_pending))
            wait_s += time.monotonic() - t1
    wall_s = time.monotonic() - started
    first_tokens, first_at = landed[0] if landed else (0, started)
    return ShardResult(
        rows=len(rows),
        computed=len(todo),
        reused=len(rows) - len(todo),
        tokens_computed=tokens,
        moved_aside=(),
        capture_s=capture_s,
        write_wait_s=wait_s,
        wall_s=wall_s,
        first_batch_tokens=first_tokens,
        first_batch_s=first_at - started,
        later_batches=tuple((tokens, at - before) for (_, before), (tokens, at) in pairwise(landed)),
    )


def land(batch: tuple[int, Future[float]]) -> tuple[int, float]:
    """A written batch's tokens and when its files were written (raises what its writing raised)."""
    tokens, future = batch
    return tokens, future.result()


def check_shape(row: TokenRow, states: Any, settings: FeatureSettings, engine: str) -> Any:
    """``states`` when they are ``[tokens, layers, hidden]`` of ``row``; else why not, naming the row."""
    shape = tuple(states.shape)
    if shape != (len(row.input_ids), len(settings.layer_ids), settings.hidden_size):
        raise RuntimeError(
            f"row {row.id}: {engine} returned {list(shape)}, expected "
            f"[{len(row.input_ids)}, {len(settings.layer_ids)}, {settings.hidden_size}]"
        )
    return states


def write_batch(
    store: ShardStore, digest: str, encoded: Sequence[tuple[TokenRow, list]], files: Executor
) -> float:
    """The writer thread's work: the batch's files on ``files``' threads, then their journal lines
    (``ShardStore.write_rows``); when they were written (``time.monotonic``)."""
    store.write_rows([(stored_row(row, digest), tensors) for row, tensors in encoded], files)
    return time.monotonic()


def stored_row(row: TokenRow, digest: str) -> StoredRow:
    """``row``'s journal line before its file is written (no checksum yet)."""
    return StoredRow(
        id=row.id,
        sample_id=row.sample_id,
        file=row_file_name(row.id),
        sha256="",
        tokens=len(row.input_ids),
        token_digest=row.token_digest,
        settings=digest,
        fingerprint=row.fingerprint,
        variant=row.variant,
        k=row.k,
    )


def run_shard(
    *,
    rows: Sequence[TokenRow],
    shard_dir: str | os.PathLike[str],
    shard: str,
    settings: FeatureSettings,
    backend: CaptureBackend,
    about: Mapping[str, Any],
    batch_tokens: int,
    encoder: Callable[[Any, Sequence[int], str], list] = encode,
    engine_s: float = 0.0,
) -> ShardResult:
    """The features of a shard's chosen ``rows`` (``regen.features.rows.shard_rows``) under ``shard_dir``;
    files of rows no longer chosen moved aside, the manifest (with ``about``: where the rows came from)
    last; ``engine_s``: the seconds the job took to build ``backend``, kept with its pace."""
    store = ShardStore.open(shard_dir, settings)
    result = replace(compute_rows(rows, store, backend, batch_tokens, encoder), engine_s=engine_s)
    moved = store.set_aside(r.id for r in rows)
    for line in moved:
        log.info("features: moved aside %s", line)
    record_pace(store.directory, result.pace())
    store.write_manifest(shard, [r.id for r in rows], about)
    log.info(
        "features %s: %d rows, %d computed (%d tokens), %d reused after their checksum verified; prefill "
        "%.1f s, prefill waiting on the writer %.1f s",
        shard,
        result.rows,
        result.computed,
        result.tokens_computed,
        result.reused,
        result.capture_s,
        result.write_wait_s,
    )
    return replace(result, moved_aside=tuple(moved))
