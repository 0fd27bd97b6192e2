"""Reconciliation: every input sample id ends in exactly one bucket.

Buckets: ``output`` (the merged dataset), ``quarantine`` (validation, with reason),
``excluded`` (the audit kept it out of generation, with reason) and ``failed`` (generation
gave up, with reason). Input ids come from the audit's ``results/audit/flags.parquet``
(column ``id``: one row per input sample, unreadable rows included under placeholder ids).

With sampling variants (``generate.variants``) a kept row is expected once per completion: its key is
expanded into the record ids of every (variant, k) (:func:`completion_keys`), and each of those ends in
one bucket; a row the audit excluded was judged once, before generation, and stays one key. Which
(variant, n) a dataset was made with is written into its own manifest at merge time
(:class:`ExpectedCompletions`, the manifest's ``completions``), so ``regen reconcile --results X`` is exact
on any dataset, a kept earlier run's included, with no config passed.

The accounting key of a row the audit kept is its id (ids of kept rows are unique: the audit
excludes later copies). A row the audit excluded is accounted by id *and* place
(``excluded_key``), so a later copy of an id, e.g. ``1`` after ``"1"``, is one excluded row and
never collides with the copy that went on to generation.

Memory: ids are held in Python dicts/sets (~100-150 bytes per id), fine up to a few
million ids; beyond that, partition by id hash and reconcile per partition.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq

from regen.io import open_lines, write_json
from regen.layout.run import RUN, RunLayout
from regen.records import record_id
from regen.runconfig import GenerateConfig

#: a kept row's key -> the record ids its completions are expected under
CompletionKeys = Callable[[str], Iterable[str]]

BUCKETS = ("output", "quarantine", "excluded", "failed")
# A quarantined later copy of an id already handled in its shard is not a membership.
EXTRA_COPY_REASONS = frozenset({"duplicate_id"})
MAX_LISTED_IDS = 100


class ReconcileError(RuntimeError):
    """Some input id is lost or in several buckets, or an output id was never an input."""

    def __init__(self, result: Reconciliation) -> None:
        super().__init__(result.problem_summary())
        self.result = result


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """Counts per bucket, reasons per bucket and the ids that break the rule."""

    input_count: int
    counts: dict[str, int]
    reasons: dict[str, dict[str, int]]
    lost: tuple[str, ...]
    duplicated: dict[str, tuple[str, ...]]
    unknown: dict[str, tuple[str, ...]]
    input_duplicates: tuple[str, ...] = ()
    extra_copies: int = 0
    unattributed: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.unknown or self.input_duplicates)

    def problem_summary(self) -> str:
        parts = []
        if self.lost:
            parts.append(f"{len(self.lost)} lost (e.g. {list(self.lost[:5])})")
        if self.duplicated:
            parts.append(f"{len(self.duplicated)} in several buckets (e.g. {_head(self.duplicated)})")
        if self.unknown:
            parts.append(f"{len(self.unknown)} not in the input (e.g. {_head(self.unknown)})")
        if self.input_duplicates:
            parts.append(
                f"{len(self.input_duplicates)} duplicate input ids (e.g. {list(self.input_duplicates[:5])})"
            )
        return "reconcile: " + ("; ".join(parts) if parts else "ok")

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "input": self.input_count,
            "counts": self.counts,
            "reasons": self.reasons,
            "lost_count": len(self.lost),
            "lost": list(self.lost[:MAX_LISTED_IDS]),
            "duplicated_count": len(self.duplicated),
            "duplicated": {k: list(v) for k, v in list(self.duplicated.items())[:MAX_LISTED_IDS]},
            "unknown_count": len(self.unknown),
            "unknown": {k: list(v) for k, v in list(self.unknown.items())[:MAX_LISTED_IDS]},
            "input_duplicates_count": len(self.input_duplicates),
            "input_duplicates": list(self.input_duplicates[:MAX_LISTED_IDS]),
            "extra_copies": self.extra_copies,
            "unattributed": self.unattributed,
        }

    def table(self) -> str:
        """A plain-text table: bucket, count, reasons."""
        lines = [f"{'bucket':<12} {'count':>10}  reasons", f"{'input':<12} {self.input_count:>10}"]
        for b in BUCKETS:
            reasons = ", ".join(f"{r}={n}" for r, n in sorted(self.reasons.get(b, {}).items()))
            lines.append(f"{b:<12} {self.counts.get(b, 0):>10}  {reasons}")
        for label, n in (
            ("lost", len(self.lost)),
            ("duplicated", len(self.duplicated)),
            ("unknown", len(self.unknown)),
            ("input dups", len(self.input_duplicates)),
        ):
            lines.append(f"{label:<12} {n:>10}")
        lines.append("OK" if self.ok else self.problem_summary())
        return "\n".join(lines)


def _head(d: dict[str, Any], n: int = 5) -> dict[str, Any]:
    return dict(list(d.items())[:n])


class MissingAuditError(FileNotFoundError):
    """There is nothing to reconcile against: the audit has not run."""


def excluded_key(rid: str, file: Any, row: Any) -> str:
    """The accounting key of an excluded row: its id and where it was read."""
    return f"{rid} (excluded row {row} of {file})"


def keys_by_place(flags_path: str | os.PathLike[str]) -> bool:
    """True when flags.parquet says which rows were excluded (then they are keyed by place)."""
    return {"excluded", "file", "row"} <= set(pq.ParquetFile(flags_path).schema_arrow.names)


@dataclass(frozen=True, slots=True)
class ExpectedCompletions:
    """The completions each kept sample is expected under: (variant name, n) in config order, as
    ``GenerateConfig.variants`` gives them. Written into the dataset's manifest (``completions``) by the
    merge, read back here: a dataset says itself what reconciling it needs."""

    variants: tuple[tuple[str, int], ...]

    @classmethod
    def of_generate(cls, generate: GenerateConfig) -> ExpectedCompletions:
        return cls(tuple((v.name, v.n) for v in generate.variants()))

    @property
    def plain_ids(self) -> bool:
        """Record ids are the sample ids (one variant of one completion; ``regen.records.record_id``)."""
        return len(self.variants) == 1 and self.variants[0][1] == 1

    def to_json(self) -> dict[str, Any]:
        return {
            "variants": [{"name": name, "n": n} for name, n in self.variants],
            "record_ids": "sample_id" if self.plain_ids else "{sample_id}/{variant}/{k}",
        }

    @classmethod
    def from_json(cls, obj: Any, where: str) -> ExpectedCompletions:
        """From a manifest's ``completions``; ValueError naming ``where`` and the field when malformed."""
        items = obj.get("variants") if isinstance(obj, dict) else None
        if not isinstance(items, list) or not items:
            raise ValueError(f"{where}: completions.variants: not a non-empty list")
        out = []
        for i, item in enumerate(items):
            name, n = (item.get("name"), item.get("n")) if isinstance(item, dict) else (None, None)
            if not isinstance(name, str) or not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"{where}: completions.variants.{i}: needs a name and an n >= 1 ({item!r})")
            out.append((name, n))
        return cls(tuple(out))

    @classmethod
    def of_dataset(cls, manifest: Path) -> ExpectedCompletions | None:
        """What the dataset's manifest says (None: no manifest, or one written before it said)."""
        if not manifest.is_file():
            return None
        obj = orjson.loads(manifest.read_bytes())
        block = obj.get("completions") if isinstance(obj, dict) else None
        return None if block is None else cls.from_json(block, str(manifest))

    def keys(self) -> CompletionKeys:
        """The record ids one kept sample is expected under: one per (variant, k)."""
        if self.plain_ids:
            return lambda sid: (sid,)
        pairs = tuple((name, k) for name, n in self.variants for k in range(n))
        return lambda sid: tuple(record_id(sid, name, k, plain=False) for name, k in pairs)

    def describe(self) -> str:
        return ", ".join(f"{name} n={n}" for name, n in self.variants)


def completion_keys(generate: GenerateConfig) -> CompletionKeys:
    """The record ids one kept sample is expected under: one per (variant, k) of the run
    (``regen.records.record_id``; the sample id alone with one variant of one completion)."""
    return ExpectedCompletions.of_generate(generate).keys()


def read_input_ids(flags_path: str | os.PathLike[str]) -> Iterator[str]:
    """The accounting key of every input row in the audit's flags.parquet, streamed: the id, or
    ``excluded_key`` for an excluded row (when the file has the ``excluded``/``file``/``row`` columns)."""
    return (key for key, _ in read_input_rows(flags_path))


def read_input_rows(flags_path: str | os.PathLike[str]) -> Iterator[tuple[str, bool]]:
    """(accounting key, excluded by the audit) of every input row of flags.parquet (see read_input_ids)."""
    pf = pq.ParquetFile(flags_path)
    names = pf.schema_arrow.names
    if "id" not in names:
        raise ValueError(f"{flags_path}: no 'id' column (columns: {names})")
    by_place = keys_by_place(flags_path)
    columns = ["id", "excluded", "file", "row"] if by_place else ["id"]
    for batch in pf.iter_batches(columns=columns, batch_size=65536):
        cols = [batch.column(k).to_pylist() for k in range(len(columns))]
        for i, value in enumerate(cols[0]):
            if value is None:
                raise ValueError(f"{flags_path}: null id in a batch at position {i}")
            if by_place and cols[1][i]:
                yield excluded_key(value, cols[2][i], cols[3][i]), True
            else:
                yield value, False


def read_reason_jsonl(
    path: str | os.PathLike[str], by_place: bool = False
) -> Iterator[tuple[str | None, str]]:
    """``(id, reason)`` per line of an excluded/failed/quarantine JSONL file (``excluded_key`` as the id
    with ``by_place``)."""
    with open_lines(path) as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise ValueError(f"{path}: line {lineno}: not JSON: {exc}") from exc
            if not isinstance(obj, dict) or "reason" not in obj:
                raise ValueError(f"{path}: line {lineno}: field 'reason' missing")
            rid = obj.get("id")
            if not isinstance(rid, str):
                yield None, str(obj["reason"])
            elif by_place:
                yield excluded_key(rid, obj.get("file"), obj.get("row")), str(obj["reason"])
            else:
                yield rid, str(obj["reason"])


def read_output_ids(dataset_dir: str | os.PathLike[str]) -> Iterator[str]:
    """Ids of the merged dataset (part-*.parquet)."""
    for part in sorted(Path(dataset_dir).glob("part-*.parquet")):
        for batch in pq.ParquetFile(part).iter_batches(columns=["id"], batch_size=65536):
            yield from batch.column(0).to_pylist()


def reconcile(
    input_ids_source: str | os.PathLike[str] | Iterable[str],
    excluded_jsonl: str | os.PathLike[str] | None,
    failed_paths: Sequence[str | os.PathLike[str]],
    quarantine_paths: Sequence[str | os.PathLike[str]],
    dataset_dir: str | os.PathLike[str],
    strict: bool = True,
    completions: CompletionKeys | None = None,
) -> Reconciliation:
    """Put every id in its bucket(s) and report; ``completions`` expands a kept row's key into the
    record ids of its completions (:func:`completion_keys`; None: one record per row, under its id).

    With ``strict`` (default) raises ``ReconcileError`` (carrying the result) when any id is
    lost, duplicated or unknown; ``strict=False`` only returns the result.
    """
    by_place = False
    if isinstance(input_ids_source, str | os.PathLike):
        input_iter: Iterable[tuple[str, bool]] = read_input_rows(input_ids_source)
        by_place = keys_by_place(input_ids_source)
    else:
        input_iter = ((i, False) for i in input_ids_source)
    input_ids: set[str] = set()
    input_dups: list[str] = []
    for row_key, excluded in input_iter:
        keys = (row_key,) if completions is None or excluded else completions(row_key)
        for i in keys:
            if i in input_ids:
                input_dups.append(i)
            input_ids.add(i)

    where: dict[str, list[str]] = defaultdict(list)
    counts: Counter[str] = Counter()
    reasons: dict[str, Counter[str]] = {b: Counter() for b in BUCKETS}
    extra_copies = 0
    unattributed: Counter[str] = Counter()

    def put(bucket: str, rid: str | None, reason: str | None) -> None:
        counts[bucket] += 1
        if reason is not None:
            reasons[bucket][reason] += 1
        if rid is None:
            unattributed[bucket] += 1
        else:
            where[rid].append(bucket)

    for rid in read_output_ids(dataset_dir):
        put("output", rid, None)
    for path in quarantine_paths:
        for rid, reason in read_reason_jsonl(path):
            if reason in EXTRA_COPY_REASONS:
                extra_copies += 1
                reasons["quarantine"][reason] += 1
                continue
            put("quarantine", rid, reason)
    if excluded_jsonl is not None:
        for rid, reason in read_reason_jsonl(excluded_jsonl, by_place):
            put("excluded", rid, reason)
    for path in failed_paths:
        for rid, reason in read_reason_jsonl(path):
            put("failed", rid, reason)

    lost = tuple(sorted(i for i in input_ids if i not in where))
    duplicated = {i: tuple(b) for i, b in sorted(where.items()) if len(b) > 1}
    unknown = {i: tuple(b) for i, b in sorted(where.items()) if i not in input_ids}
    result = Reconciliation(
        input_count=len(input_ids) + len(input_dups),
        counts={b: counts.get(b, 0) for b in BUCKETS},
        reasons={b: dict(sorted(reasons[b].items())) for b in BUCKETS},
        lost=lost,
        duplicated=duplicated,
        unknown=unknown,
        input_duplicates=tuple(sorted(set(input_dups))),
        extra_copies=extra_copies,
        unattributed={k: v for k, v in unattributed.items() if v},
    )
    return check(result) if strict else result


def check(result: Reconciliation) -> Reconciliation:
    """Raise ``ReconcileError`` unless the result is consistent."""
    if not result.ok:
        raise ReconcileError(result)
    return result


def reconcile_results(
    results: str | os.PathLike[str] = RUN.results,
    strict: bool = True,
    completions: CompletionKeys | None = None,
) -> Reconciliation:
    """Reconcile the standard layout under ``results`` and write its ``reconcile.json``.

    The JSON is written in every case (it explains a failure); then, with ``strict``,
    ``ReconcileError`` is raised if the result is inconsistent.
    """
    run = RunLayout(results=Path(results))
    flags = run.audit_flags
    if not flags.is_file():
        raise MissingAuditError(
            f"{flags}: not found, so there is nothing to reconcile against; the audit writes it "
            f"(run the workflow, or `regen audit DATASET --out {run.audit_dir}`), then reconcile"
        )
    result = reconcile(
        flags,
        run.audit_excluded if run.audit_excluded.exists() else None,
        run.failed_files(),
        run.quarantine_files(),
        run.dataset_dir,
        strict=False,
        completions=completions,
    )
    write_json(run.reconcile, result.to_json())
    return check(result) if strict else result


def expected_completions(
    results: str | os.PathLike[str], configfiles: Sequence[str] = ()
) -> tuple[ExpectedCompletions | None, list[str]]:
    """What each kept sample of the dataset under ``results`` is expected under, and notes for the user:
    the config files' ``generate`` when given (they win), else the dataset's own manifest (None: neither
    says, one record per sample)."""
    manifest = RunLayout(results=Path(results)).dataset_manifest
    made_with = ExpectedCompletions.of_dataset(manifest)
    if not configfiles:
        return made_with, []
    from regen.configfile import load_config

    given = ExpectedCompletions.of_generate(
        GenerateConfig.from_dict(load_config(configfiles).get("generate"))
    )
    notes = []
    if made_with is not None and made_with != given:
        notes.append(
            f"regen reconcile: {manifest} says the dataset was made with {made_with.describe()}; the config "
            f"given says {given.describe()}: reconciling as the config says (leave out --configfile to "
            "reconcile as the dataset was made)"
        )
    return given, notes


def cli(argv: list[str]) -> int:
    """``regen reconcile [--results results] [--json]``: exit 1 if any id is lost/duplicated/unknown."""
    ap = argparse.ArgumentParser(prog="regen reconcile", description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(RUN.results), help="results directory (default: %(default)s)")
    ap.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    ap.add_argument(
        "--configfile",
        nargs="+",
        default=(),
        help="config files whose generate.variants (or sampling.n) to expect each kept sample under; "
        "default: what the dataset's own manifest says it was made with",
    )
    args = ap.parse_args(argv)
    try:
        expected, notes = expected_completions(args.results, args.configfile)
        completions = expected.keys() if expected is not None else None
        result = reconcile_results(args.results, strict=False, completions=completions)
    except (MissingAuditError, ValueError) as exc:
        print(f"regen reconcile: {exc}", file=sys.stderr)
        return 2
    for note in notes:
        print(note, file=sys.stderr)
    if args.json:
        sys.stdout.write(orjson.dumps(result.to_json(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(result.table())
    if not result.ok:
        print(result.problem_summary(), file=sys.stderr)
        if expected is None and any("/" in i for i in result.unknown):
            print(
                "regen reconcile: the output holds ids {sample_id}/{variant}/{k} (sampling variants) and "
                f"no manifest under {args.results} says which (no dataset, or one merged before manifests "
                "said): pass the run's config, --configfile ..., so each sample is expected once per "
                "completion",
                file=sys.stderr,
            )
        return 1
    return 0
