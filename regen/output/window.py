"""What survives the trainer's sequence window.

Drafter trainers cut every training row to a fixed window (SpecForge ``--max-length``, speculators
``--max-len``): tokens past it are never seen. For each window in ``WINDOWS`` (and the one the config
names, ``export.max_length``) this counts, over the token rows of the one mask policy
(``regen.output.masks``):

* ``rows_fit``: the share of rows whose ``input_ids`` fit whole;
* ``supervised_kept``: the share of supervised tokens (loss-mask 1) inside the window;
* ``cut_in_think``: rows cut inside their think block: the window ends after the supervised answer
  starts but before its ``</think>``, so what is kept of the answer is thinking only;
* ``cut_in_prompt``: rows cut before any supervised token: nothing of the answer is kept.

``export.max_length`` also decides what the export does with rows longer than it (``export.over_max_length``):
``drop`` leaves them out (counted), ``keep`` writes them whole for the trainer to cut.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: the windows every summary reports (tokens)
WINDOWS: tuple[int, ...] = (2048, 4096, 8192, 16384, 32768)
#: the window a summary leads with when the config names none (``headline`` in ``to_json``)
HEADLINE_WINDOW = 4096


@dataclass(frozen=True, slots=True)
class RowShape:
    """What of one token row the window counts need."""

    length: int
    supervised: int
    first_supervised: int | None  # index of the first loss-mask 1 token
    think_end: int | None  # index just past the answer's </think>, when it has one
    kept_before: np.ndarray  # kept_before[i]: supervised tokens among the first i + 1


def row_shape(input_ids: Sequence[int], loss_mask: Sequence[int], think_close_id: int | None) -> RowShape:
    """The length, supervised count, where supervision starts and where its think block ends."""
    mask = np.asarray(loss_mask, dtype=np.int64)
    kept_before = np.cumsum(mask)
    supervised = int(kept_before[-1]) if len(mask) else 0
    first = int(np.argmax(mask)) if supervised else None
    think_end = None
    if first is not None and think_close_id is not None:
        ids = np.asarray(input_ids[first:], dtype=np.int64)
        hits = np.flatnonzero(ids == think_close_id)
        think_end = first + int(hits[0]) + 1 if len(hits) else None
    return RowShape(len(mask), supervised, first, think_end, kept_before)


@dataclass(slots=True)
class WindowCounts:
    """Counts for one window."""

    window: int
    rows_fit: int = 0
    supervised_kept: int = 0
    cut_in_think: int = 0
    cut_in_prompt: int = 0


@dataclass(slots=True)
class WindowCoverage:
    """Coverage of every window over a stream of token rows."""

    windows: tuple[int, ...]
    configured: int | None = None
    rows: int = 0
    supervised: int = 0
    counts: dict[int, WindowCounts] = field(default_factory=dict)

    @classmethod
    def for_config(cls, max_length: int | None) -> WindowCoverage:
        windows = tuple(sorted(set(WINDOWS) | ({max_length} if max_length else set())))
        return cls(windows, max_length, counts={w: WindowCounts(w) for w in windows})

    def add(self, input_ids: Sequence[int], loss_mask: Sequence[int], think_close_id: int | None) -> RowShape:
        """Count one token row; return its shape."""
        shape = row_shape(input_ids, loss_mask, think_close_id)
        self.rows += 1
        self.supervised += shape.supervised
        for w, c in self.counts.items():
            if shape.length <= w:
                c.rows_fit += 1
                c.supervised_kept += shape.supervised
                continue
            c.supervised_kept += int(shape.kept_before[w - 1])
            if shape.first_supervised is None or w <= shape.first_supervised:
                c.cut_in_prompt += 1
            elif shape.think_end is not None and w < shape.think_end:
                c.cut_in_think += 1
        return shape

    def add_all(
        self, rows: Iterable[tuple[Sequence[int], Sequence[int]]], think_close_id: int | None
    ) -> None:
        for ids, mask in rows:
            self.add(ids, mask, think_close_id)

    def to_json(self) -> dict[str, Any]:
        def frac(n: int, d: int) -> float:
            return n / d if d else 1.0

        return {
            "rows": self.rows,
            "supervised_tokens": self.supervised,
            "configured": self.configured,
            "headline": self.configured or HEADLINE_WINDOW,
            "windows": {
                str(w): {
                    "rows_fit": frac(c.rows_fit, self.rows),
                    "supervised_kept": frac(c.supervised_kept, self.supervised),
                    "cut_in_think": c.cut_in_think,
                    "cut_in_prompt": c.cut_in_prompt,
                    "rows_over": self.rows - c.rows_fit,
                }
                for w, c in sorted(self.counts.items())
            },
            "meaning": "per trainer window (tokens): share of token rows that fit whole, share of supervised "
            "tokens inside the window, rows cut inside the answer's think block (only thinking kept), "
            "rows cut before any supervised token",
        }
