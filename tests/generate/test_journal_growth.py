"""What opening a journal costs as it grows: linear in its size, and with its index independent of how
long the answers are (bench/scale.py measures the full 914,000-sample case; this is what CI affords)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from regen.generate.journal import Journal, read_heads
from regen.layout.beside import journal_index


def _write(path: Path, n: int, answer_chars: int) -> None:
    answer = "word " * (answer_chars // 5)
    with Journal.open(path) as j:
        for i in range(n):
            j.append(
                {"kind": "record", "id": f"s{i:07d}", "content": answer, "fingerprint": f"{i:016x}",
                 "settings_fingerprint": "0123456789abcdef", "settings": {"temperature": 0.6}},
                flush=i % 500 == 499,
            )  # fmt: skip


def _best_of(runs: int, fn: Callable[[], object]) -> float:
    """The least CPU time of ``runs`` calls (CPU time: other load on a shared machine disturbs it less)."""
    best = float("inf")
    for _ in range(runs):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def _scan_without_index(path: Path) -> None:
    saved = journal_index(path).read_bytes()
    journal_index(path).unlink()
    try:
        read_heads(path)
    finally:
        journal_index(path).write_bytes(saved)


def test_reading_a_journal_grows_linearly(tmp_path: Path) -> None:
    """4x the entries costs about 4x (quadratic reading, as it once was, costs 16x). The bound is 8x,
    the geometric middle of the two: CI measured 6.6x once for a linear reader (allocator and cache
    effects at 20 MB on a busy 2-core machine), which a bound of 6.5x failed."""
    n = 2500
    small, large = tmp_path / "small.jsonl", tmp_path / "large.jsonl"
    _write(small, n, 1900)
    _write(large, 4 * n, 1900)
    for name, fn in (("scan", _scan_without_index), ("open", lambda p: Journal.open(p).close())):
        t_small = _best_of(5, lambda fn=fn: fn(small))
        t_large = _best_of(5, lambda fn=fn: fn(large))
        assert t_large / t_small < 8, f"{name}: {t_small:.4f}s at {n}, {t_large:.4f}s at {4 * n} entries"


def test_opening_with_the_index_does_not_grow_with_answer_length(tmp_path: Path) -> None:
    short, long = tmp_path / "short.jsonl", tmp_path / "long.jsonl"
    _write(short, 3000, 200)
    _write(long, 3000, 20000)  # 100x the answer: 60 MB of journal
    t_short = _best_of(5, lambda: Journal.open(short).close())
    t_long = _best_of(5, lambda: Journal.open(long).close())
    assert long.stat().st_size > 50 * short.stat().st_size
    assert t_long < 3 * t_short + 0.02, f"{t_short:.4f}s with short answers, {t_long:.4f}s with long ones"
