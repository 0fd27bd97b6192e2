"""Counts per sampling variant (``generate.variants``): completions, finish reasons, completion lengths,
and length stops by where they fell (inside the reasoning or inside the answer, ``regen.truncation``).

The re-audit (``regen.output.reaudit``) fills them over the merged dataset and writes them in its summary's
``variants`` block; ``regen status`` says them from that summary once it exists, and before that from the
validated shards written so far (:func:`valid_breakdown`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from regen.runconfig import DEFAULT_VARIANT
from regen.truncation import IN_ANSWER, IN_REASONING, WHERE, truncated_where


@dataclass(slots=True)
class VariantCounts:
    """One sampling variant's rows: finish reasons, where length stops fell, completion lengths, and
    completions identical to an earlier completion of the same prompt."""

    rows: int = 0
    finish_reasons: dict[str, int] = field(default_factory=dict)
    truncated_where: dict[str, int] = field(default_factory=lambda: dict.fromkeys(WHERE, 0))
    duplicate_completions: int = 0
    thinking: int = 0
    completion_tokens: list[int] = field(default_factory=list)

    def add(self, reason: str, tokens: int, thinking: bool, where: str | None) -> None:
        self.rows += 1
        self.finish_reasons[reason] = self.finish_reasons.get(reason, 0) + 1
        self.completion_tokens.append(int(tokens))
        self.thinking += bool(thinking)
        if where is not None:
            self.truncated_where[where] += 1

    def to_json(self) -> dict[str, Any]:
        lengths = np.asarray(self.completion_tokens or [0], dtype=np.int64)
        known = bool(self.completion_tokens)
        truncated = sum(self.truncated_where.values())
        return {
            "rows": self.rows,
            "finish_reasons": dict(sorted(self.finish_reasons.items())),
            "truncated": truncated,
            "truncated_where": dict(self.truncated_where),
            "truncated_fraction": truncated / self.rows if self.rows else 0.0,
            "duplicate_completions": self.duplicate_completions,
            "thinking": self.thinking,
            "completion_tokens": {
                "mean": round(float(lengths.mean()), 1) if known else None,
                "p50": int(np.percentile(lengths, 50)) if known else None,
                "p90": int(np.percentile(lengths, 90)) if known else None,
                "max": int(lengths.max()) if known else None,
            },
        }


#: the validated shard columns :func:`valid_breakdown` reads (``regen.records.VALID_SCHEMA``)
VALID_COLUMNS = (
    "variant",
    "finish_reason",
    "completion_tokens",
    "thinking",
    "content",
    "reasoning_content",
    "tool_calls_json",
)


def valid_breakdown(valid_paths: Iterable[Path]) -> dict[str, dict[str, Any]]:
    """:class:`VariantCounts` per variant over validated shards (their ``to_json``), by variant name."""
    counts: dict[str, VariantCounts] = {}
    for path in valid_paths:
        pf = pq.ParquetFile(path)
        names = set(pf.schema_arrow.names)
        columns = [c for c in VALID_COLUMNS if c in names]
        for batch in pf.iter_batches(columns=columns, batch_size=8192):
            cols = {c: batch.column(c).to_pylist() for c in columns}
            n = batch.num_rows
            for i in range(n):
                variant = cols["variant"][i] if "variant" in cols else DEFAULT_VARIANT
                reason = cols["finish_reason"][i]
                where = truncated_where(
                    reason, cols["content"][i], cols["reasoning_content"][i], bool(cols["tool_calls_json"][i])
                )
                v = counts.get(variant) or counts.setdefault(variant, VariantCounts())
                v.add(reason, cols["completion_tokens"][i], cols["thinking"][i], where)
    return {name: v.to_json() for name, v in sorted(counts.items())}


def variant_lines(variants: Mapping[str, Mapping[str, Any]], source: str) -> list[str]:
    """One line per variant (``source`` says what was counted), or none when there is nothing to say."""
    if not variants:
        return []
    out = [f"by sampling variant ({source}):"]
    for name, v in variants.items():
        lengths = v.get("completion_tokens") or {}
        where = v.get("truncated_where") or {}
        reasons = ", ".join(f"{k} {n:,}" for k, n in sorted((v.get("finish_reasons") or {}).items()))
        out.append(
            f"  {name}: {v.get('rows', 0):,} completions ({v.get('thinking', 0):,} thinking); completion "
            f"tokens p50 {lengths.get('p50')}, p90 {lengths.get('p90')}; finish {reasons or 'none'}; "
            f"cut at max_tokens {v.get('truncated', 0):,}: in the reasoning {where.get(IN_REASONING, 0):,}, "
            f"in the answer {where.get(IN_ANSWER, 0):,}"
        )
    return out
