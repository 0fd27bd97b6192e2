"""One shard's features job: the shard's chosen token rows, prefilled, stored, the manifest last.

A row already stored under the same settings, tokens and answer fingerprint whose checksum verifies is
skipped; a row whose answer was regenerated (its fingerprint or tokens changed) or whose file does not verify
is computed again; files of rows no longer chosen, or of other settings, are moved to ``superseded/``
(``regen.features.store``). The rows are prefilled ``features.batch_tokens`` tokens at a time, whole.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from regen.features.backends import CaptureBackend, encode
from regen.features.rows import TokenRow
from regen.features.store import FeatureSettings, ShardStore, StoredRow, row_file_name, settings_digest

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ShardResult:
    """What one job did."""

    rows: int
    computed: int
    reused: int
    tokens_computed: int
    moved_aside: tuple[str, ...]


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
    time (``features.batch_tokens``); write nothing else. Each row's file is written as its batch returns: a
    crash loses at most the batch in flight."""
    settings = store.settings
    digest = settings_digest(settings)
    todo = [r for r in rows if not store.is_current(r.id, r.token_digest, r.fingerprint)]
    for batch in token_batches(todo, batch_tokens):
        for row, states in zip(batch, backend.capture_many([r.input_ids for r in batch]), strict=True):
            shape = tuple(states.shape)
            if shape != (len(row.input_ids), len(settings.layer_ids), settings.hidden_size):
                raise RuntimeError(
                    f"row {row.id}: {backend.name} returned {list(shape)}, expected "
                    f"[{len(row.input_ids)}, {len(settings.layer_ids)}, {settings.hidden_size}]"
                )
            line = StoredRow(
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
            store.write(line, encoder(states, row.input_ids, settings.dtype))
    tokens = sum(len(r.input_ids) for r in todo)
    return ShardResult(len(rows), len(todo), len(rows) - len(todo), tokens, ())


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
) -> ShardResult:
    """The features of a shard's chosen ``rows`` (``regen.features.rows.shard_rows``) under ``shard_dir``;
    files of rows no longer chosen moved aside, the manifest (with ``about``: where the rows came from)
    last."""
    store = ShardStore.open(shard_dir, settings)
    result = compute_rows(rows, store, backend, batch_tokens, encoder)
    moved = store.set_aside(r.id for r in rows)
    for line in moved:
        log.info("features: moved aside %s", line)
    store.write_manifest(shard, [r.id for r in rows], about)
    log.info(
        "features %s: %d rows, %d computed (%d tokens), %d reused after their checksum verified",
        shard,
        result.rows,
        result.computed,
        result.tokens_computed,
        result.reused,
    )
    return ShardResult(result.rows, result.computed, result.reused, result.tokens_computed, tuple(moved))
