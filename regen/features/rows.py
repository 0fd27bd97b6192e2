"""Which token rows get features, and which shard computes them: decided by the sample id alone.

A row's place in the order is ``blake2b(sample_id)`` read as a fraction of 2**64 (then its row id, for the
rows one sample makes): ``features.rows`` as a fraction takes the rows below it, as a count the first
``count`` in this order. Nothing depends on the run, the file order or the other rows' lengths, so the choice
is the same on every rerun, and a larger choice holds the smaller one. A row's shard is the sample's prompt
shard (``regen.ingest.shards.shard_index``), so the features of a shard's samples are one job's.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:  # the compute job runs in the trainers' or SGLang's venv: no schema validator there
    from regen.features.config import RowChoice


@dataclass(frozen=True, slots=True)
class TokenRow:
    """One row of the token export: what the prefill reads, and what names it."""

    id: str
    sample_id: str
    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    #: the answer's fingerprint when the export names it (``fingerprint``), else None
    fingerprint: str | None = None
    variant: str | None = None
    k: int | None = None

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], where: str) -> TokenRow:
        try:
            ids = tuple(int(i) for i in obj["input_ids"])
            mask = tuple(int(m) for m in obj["loss_mask"])
            row_id = str(obj["id"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: a token row needs id, input_ids and loss_mask ({exc})") from exc
        if len(ids) != len(mask):
            raise ValueError(f"{where}: input_ids has {len(ids)} ids, loss_mask {len(mask)} (row {row_id})")
        return cls(
            id=row_id,
            sample_id=str(obj.get("sample_id") or row_id.split("#", 1)[0]),
            input_ids=ids,
            loss_mask=mask,
            fingerprint=obj.get("fingerprint"),
            variant=obj.get("variant"),
            k=obj.get("k"),
        )

    @property
    def token_digest(self) -> str:
        """sha256 of the row's token ids (int64, little-endian): a regenerated answer changes it."""
        return hashlib.sha256(
            b"".join(i.to_bytes(8, "little", signed=True) for i in self.input_ids)
        ).hexdigest()


def order_key(row: TokenRow) -> tuple[float, str]:
    """The row's place in the choice order: its sample id's hash as a fraction in [0, 1), then its id."""
    digest = hashlib.blake2b(row.sample_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64, row.id


def read_token_rows(path: str | os.PathLike[str]) -> Iterator[TokenRow]:
    """The rows of a token export (``tokenized.jsonl``); a bad line names file and line."""
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    obj = orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{n}: not JSON ({exc})") from exc
                yield TokenRow.from_json(obj, f"{path}:{n}")


def chosen(rows: Iterable[TokenRow], choice: RowChoice) -> list[TokenRow]:
    """The rows ``choice`` takes, in choice order."""
    ordered = sorted(rows, key=order_key)
    if choice.fraction is not None:
        return [r for r in ordered if order_key(r)[0] < choice.fraction]
    return ordered[: choice.count] if choice.count is not None else ordered


def shard_rows(rows: Iterable[TokenRow], choice: RowChoice, shard: int, shards: int) -> list[TokenRow]:
    """The chosen rows whose sample lies in prompt shard ``shard`` of ``shards``."""
    from regen.ingest.shards import shard_index  # pyarrow and the tokenizer: imported where a shard is cut

    return [r for r in chosen(rows, choice) if shard_index(r.sample_id, shards) == shard]
