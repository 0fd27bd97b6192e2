"""The run's headline numbers for the report's first page: generation wall time, GPU-hours, output
tokens/s, and what was left out by reason (input audit, failed requests, validation).

Every number comes from the run's own files (:class:`regen.observe.inputs.ReportInputs`) and says what it
counts; a number that cannot be known says so instead of guessing."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from regen.io import open_lines, read_json
from regen.observe.inputs import ReportInputs


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Dict lines of a JSONL file (plain or zstd); unparsable lines are skipped (reported elsewhere)."""
    with open_lines(path) as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                yield obj


def quarantine_reason_counts(quarantine: Iterable[Path]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for path in quarantine:
        for obj in iter_jsonl(path):
            counts[str(obj.get("reason", "unknown"))] += 1
    return counts


@dataclass(frozen=True, slots=True)
class ServerSpan:
    """One server's generation: its first request sent, its last answer received, tokens it wrote."""

    first: float
    last: float
    completion_tokens: int
    records: int


def server_spans(records: Iterable[Path]) -> dict[str, ServerSpan]:
    """Per server id, from the generation records (``timings.started_at``, ``latency_s``, ``usage``)."""
    found: dict[str, list[float | int]] = {}
    for path in records:
        for rec in iter_jsonl(path):
            try:
                server = str(rec["server"]["id"])
                start = float(rec["timings"]["started_at"])
                end = start + max(float(rec["timings"]["latency_s"]), 0.0)
                tokens = int(rec["usage"]["completion_tokens"])
            except (KeyError, TypeError, ValueError):
                continue
            span = found.setdefault(server, [start, end, 0, 0])
            span[0], span[1] = min(span[0], start), max(span[1], end)
            span[2] += tokens
            span[3] += 1
    return {k: ServerSpan(float(a), float(b), int(t), int(n)) for k, (a, b, t, n) in sorted(found.items())}


#: launch flags that say a server's tensor / data parallel size
TP_FLAGS = ("--tp", "--tp-size", "--tensor-parallel-size")
DP_FLAGS = ("--dp", "--dp-size", "--data-parallel-size")


def gpus_per_server(plan: Mapping[str, Any]) -> int | None:
    """GPUs each server holds (tensor x data parallel), from the plan's launched section or else its
    launch flags; None when the plan says neither (an external server, or no plan)."""
    if not plan or plan.get("external"):
        return None
    section = plan.get(str(plan.get("launched", "recommended"))) or {}
    args = [str(a) for a in plan.get("launch_args") or ()]
    tp = section.get("tp") if isinstance(section.get("tp"), int) else _flag(args, TP_FLAGS)
    if tp is None:
        return None
    dp = section.get("dp") if isinstance(section.get("dp"), int) else _flag(args, DP_FLAGS)
    return int(tp) * (int(dp) if dp else 1)


def _flag(args: list[str], names: tuple[str, ...]) -> int | None:
    for i, arg in enumerate(args):
        name, _, value = arg.partition("=")
        if name in names:
            value = value or (args[i + 1] if i + 1 < len(args) else "")
            return int(value) if value.isdigit() else None
    return None


@dataclass(frozen=True, slots=True)
class RunNumbers:
    """The first page's numbers (``lines`` says them)."""

    spans: Mapping[str, ServerSpan]
    gpus_each: int | None
    mode: str
    #: reason -> rows, by stage: ("input audit", {...}), ("generation", {...}), ("validation", {...})
    left_out: tuple[tuple[str, Mapping[str, int]], ...] = field(default_factory=tuple)

    @classmethod
    def of(cls, inputs: ReportInputs, mode: str = "?") -> RunNumbers:
        plan = read_json(inputs.plan) if inputs.plan.is_file() else {}
        audit = _summary(inputs.audit, inputs.audit_verdict)
        failed: Counter[str] = Counter()
        for path in inputs.failed:
            for obj in iter_jsonl(path):
                failed[str(obj.get("reason") or obj.get("error_kind") or "failed")] += 1
        left_out = (
            ("input audit", dict(audit.get("excluded_reasons") or {})),
            ("generation", dict(failed)),
            ("validation", dict(quarantine_reason_counts(inputs.quarantine))),
        )
        return cls(server_spans(inputs.records), gpus_per_server(plan), mode, left_out)

    @property
    def wall_s(self) -> float | None:
        """First request sent to last answer received, over every server."""
        if not self.spans:
            return None
        return max(s.last for s in self.spans.values()) - min(s.first for s in self.spans.values())

    @property
    def completion_tokens(self) -> int:
        return sum(s.completion_tokens for s in self.spans.values())

    @property
    def gpu_hours(self) -> float | None:
        """Each server's GPUs times its first request to last answer (start-up not counted)."""
        if self.gpus_each is None or not self.spans:
            return None
        return sum(self.gpus_each * (s.last - s.first) for s in self.spans.values()) / 3600.0

    def lines(self) -> list[str]:
        """One line each: wall time, GPU-hours, output tokens/s, and what was left out by reason."""
        wall = self.wall_s
        if wall is None:
            out = ["generation: no generation records, so no wall time, GPU-hours or tokens/s"]
        else:
            n = sum(s.records for s in self.spans.values())
            rate = f"{self.completion_tokens / wall:,.0f}" if wall > 0 else "?"
            out = [
                f"wall time of generation: {duration(wall)} (first request sent to last answer received, "
                f"{n:,} records on {len(self.spans)} server(s))",
                f"output tokens/s: {rate} ({self.completion_tokens:,} completion tokens, reasoning included, "
                "over that wall time)",
                self._gpu_line(),
            ]
        out.append("excluded or left out, by reason: " + self._left_out_words())
        return out

    def _gpu_line(self) -> str:
        hours = self.gpu_hours
        if hours is None:
            return "GPU-hours: not known (no plan gives the GPUs per server: an external server, or no plan)"
        sim = "; simulated servers hold no real GPU" if self.mode == "simulated" else ""
        each = f"{len(self.spans)} server(s) x {self.gpus_each} GPU(s)"
        return (
            f"GPU-hours: {hours:,.3g} ({each}, each from its first request to its last answer; "
            f"server start-up not counted{sim})"
        )

    def _left_out_words(self) -> str:
        parts = []
        for stage, reasons in self.left_out:
            total = sum(reasons.values())
            if total:
                by_count = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))
                each = ", ".join(f"{r} {n:,}" for r, n in by_count)
                parts.append(f"{stage} {total:,} ({each})")
            else:
                parts.append(f"{stage} none")
        return "; ".join(parts)


def _summary(output: Path, kept: Path) -> dict[str, Any]:
    """The audit summary, or its verdict kept beside the log when a failed job's output was deleted."""
    for path in (output, kept):
        if path.is_file():
            return read_json(path)
    return {}


def duration(seconds: float) -> str:
    """``42.3 s``, ``12 min 5 s``, ``3 h 07 min``: a duration in the unit that reads at its size."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"
