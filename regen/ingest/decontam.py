"""Decontamination: find training samples whose prompts overlap public benchmark prompts.

A drafter is judged on public benchmarks (HumanEval, MBPP, GSM8K, MT-Bench ...); a benchmark
prompt in its training data inflates its measured acceptance. The audit flags such samples
``contaminated`` (see ``regen.ingest.audit``) against the benchmark prompt sets the user names
(``audit.decontamination`` in the config, ``--benchmark NAME=PATH[:FIELD]`` on the command line).

Rule: text is lower-cased and split into words at every run of whitespace, punctuation or
underscores (``[^\\W_]+``), so case, spacing and punctuation changes do not hide a copy. A sample
is contaminated when any of its prompt turns (``user`` and ``system`` content) shares one run of
``ngram`` consecutive words (default 13) with a benchmark prompt. Benchmark prompts shorter than
``ngram`` words cannot match and are counted as ``too_short`` in the summary.

Cost: each benchmark n-gram is hashed once into a sorted ``uint64`` array (8 bytes per n-gram,
a few MB for thousands of prompts) with a parallel array naming its item; checking is vectorized
per batch of samples (word hashes, then n-gram hashes as a weighted sum of word hashes, then a
binary search). Hashes are 64-bit: a false match needs a 64-bit collision.
"""

from __future__ import annotations

import gzip
import logging
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow.parquet as pq

from regen.runconfig import section_schema
from regen.types import Message

_DECONTAMINATION = section_schema("audit")["properties"]["decontamination"]["properties"]
#: the schema's defaults (``audit.decontamination``), for the CLI and for a spec without a field
DEFAULT_NGRAM: int = _DECONTAMINATION["ngram"]["default"]
DEFAULT_FIELD: str = _DECONTAMINATION["benchmarks"]["items"]["properties"]["field"]["default"]
PROMPT_ROLES: frozenset[str] = frozenset({"user", "system"})
# a benchmark row's item name: the first of these fields it has, else its row number
ITEM_ID_FIELDS: tuple[str, ...] = ("task_id", "id", "question_id", "problem_id", "unique_id", "idx")
PARQUET_BATCH_ROWS = 4096

log = logging.getLogger(__name__)

_WORD = re.compile(r"[^\W_]+")
_HASH_SEED = 0x5EED_DEC0
_UINT64 = np.uint64


class BenchmarkError(ValueError):
    """A benchmark file or its spec cannot be used; the message names the file, row and field."""


# --------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BenchmarkSpec:
    """One benchmark prompt set: its name, file and the prompt field of each row."""

    name: str
    path: str
    field: str = DEFAULT_FIELD

    @classmethod
    def parse(cls, text: str) -> BenchmarkSpec:
        """``NAME=PATH[:FIELD]`` (a ``:`` followed by a path separator stays part of the path)."""
        name, sep, rest = text.partition("=")
        if not sep or not name.strip() or not rest:
            raise BenchmarkError(f"--benchmark {text!r}: expected NAME=PATH[:FIELD]")
        path, sep, field = rest.rpartition(":")
        if not sep or not path or not field or "/" in field or "\\" in field:
            path, field = rest, DEFAULT_FIELD
        return cls(name.strip(), path, field)

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any]) -> BenchmarkSpec:
        return cls(str(cfg["name"]), str(cfg["path"]), str(cfg.get("field", DEFAULT_FIELD)))

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "path": self.path, "field": self.field}


@dataclass(frozen=True, slots=True)
class DecontaminationConfig:
    """The ``audit.decontamination`` config section with the schema's defaults applied."""

    benchmarks: tuple[BenchmarkSpec, ...] = ()
    ngram: int = DEFAULT_NGRAM

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any] | None) -> DecontaminationConfig:
        cfg = cfg or {}
        listed = cfg.get("benchmarks") or ()
        specs = tuple(s if isinstance(s, BenchmarkSpec) else BenchmarkSpec.from_dict(s) for s in listed)
        names = [s.name for s in specs]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise BenchmarkError(f"audit.decontamination.benchmarks: names used twice: {repeated}")
        ngram = int(cfg.get("ngram", DEFAULT_NGRAM))
        if ngram < 1:
            raise BenchmarkError(f"audit.decontamination.ngram: must be at least 1, got {ngram}")
        return cls(specs, ngram)

    @property
    def enabled(self) -> bool:
        return bool(self.benchmarks)


# --------------------------------------------------------------------------------------
# Normalisation and hashing
# --------------------------------------------------------------------------------------


def normalized_words(text: str) -> list[str]:
    """Lower-cased words; whitespace, punctuation and underscores only separate them."""
    return _WORD.findall(text.lower())


def _ngram_weights(n: int) -> np.ndarray:
    """Odd random 64-bit multipliers, one per position in the n-gram (fixed seed)."""
    rng = np.random.default_rng(_HASH_SEED)
    return rng.integers(0, 2**63, size=n, dtype=np.uint64) * _UINT64(2) + _UINT64(1)


def _word_hashes(words: Sequence[str]) -> np.ndarray:
    """64-bit hashes of words (Python's string hash, cached on each str; consistent within a process)."""
    return np.fromiter(map(hash, words), dtype=np.int64, count=len(words)).view(np.uint64)


def _ngram_hashes(word_hashes: np.ndarray, starts: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The hash of the n-gram starting at each of ``starts`` in ``word_hashes`` (wrapping uint64 sums)."""
    out = np.zeros(len(starts), dtype=np.uint64)
    for j, w in enumerate(weights):
        out += word_hashes[starts + j] * w
    return out


def _window_starts(lengths: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """For texts of ``lengths`` words laid end to end: every n-gram start and the text it lies in."""
    counts = np.maximum(lengths - n + 1, 0)
    total = int(counts.sum())
    text_of = np.repeat(np.arange(len(lengths)), counts)
    text_start = np.concatenate(([0], np.cumsum(lengths)[:-1])) if len(lengths) else lengths
    window_begin = np.concatenate(([0], np.cumsum(counts)[:-1])) if len(counts) else counts
    starts = np.arange(total) - window_begin[text_of] + text_start[text_of]
    return starts.astype(np.int64), text_of


# --------------------------------------------------------------------------------------
# Benchmark files
# --------------------------------------------------------------------------------------


def _json_rows(path: Path) -> Iterator[Any]:
    data = orjson.loads(path.read_bytes())
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise BenchmarkError(f"{path}: expected an array of rows or an object holding one array")
        data = lists[0]
    if not isinstance(data, list):
        raise BenchmarkError(f"{path}: a JSON benchmark is an array of rows, not {type(data).__name__}")
    yield from data


def _jsonl_rows(path: Path) -> Iterator[Any]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as fh:
        for row, line in enumerate(fh):
            if not line.strip():
                yield None
                continue
            try:
                yield orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise BenchmarkError(f"{path}: row {row}: not JSON ({exc})") from exc


def _parquet_rows(path: Path, field: str) -> Iterator[Any]:
    pf = pq.ParquetFile(path)
    names = set(pf.schema_arrow.names)
    if field not in names:
        raise BenchmarkError(f"{path}: field {field!r} missing (columns: {sorted(names)})")
    columns = [field, *(f for f in ITEM_ID_FIELDS if f in names and f != field)]
    for batch in pf.iter_batches(columns=columns, batch_size=PARQUET_BATCH_ROWS):
        yield from batch.to_pylist()


def _rows(path: Path, field: str) -> Iterator[Any]:
    name = path.name.lower()
    if name.endswith(".parquet"):
        return _parquet_rows(path, field)
    if name.endswith(".json"):
        return _json_rows(path)
    if name.endswith((".jsonl", ".jsonl.gz", ".json.gz", ".ndjson")):
        return _jsonl_rows(path)
    raise BenchmarkError(f"{path}: unknown benchmark format (use .jsonl, .jsonl.gz, .json or .parquet)")


def _item_id(row: Mapping[str, Any], index: int) -> str:
    for key in ITEM_ID_FIELDS:
        value = row.get(key)
        if value is not None and not isinstance(value, dict | list):
            return str(value)
    return f"row {index}"


def read_benchmark(spec: BenchmarkSpec) -> Iterator[tuple[str, str]]:
    """``(item, prompt)`` for each prompt of a benchmark file; a list-valued field gives one per element.

    Raises ``BenchmarkError`` naming the file, row and field for a missing file, a row that is not
    an object, a missing field or a prompt that is not text.
    """
    path = Path(spec.path)
    if not path.is_file():
        raise BenchmarkError(f"benchmark {spec.name!r}: file {spec.path} not found")
    for index, row in enumerate(_rows(path, spec.field)):
        if row is None:
            continue
        where = f"{path}: row {index}: field {spec.field!r}"
        if not isinstance(row, dict):
            raise BenchmarkError(f"{path}: row {index}: expected an object, got {type(row).__name__}")
        if spec.field not in row:
            raise BenchmarkError(f"{where} missing (fields: {sorted(row)})")
        value = row[spec.field]
        prompts = value if isinstance(value, list) else [value]
        if not all(isinstance(p, str) for p in prompts):
            raise BenchmarkError(f"{where}: expected text or a list of texts, got {type(value).__name__}")
        item = _item_id(row, index)
        for p in prompts:
            yield item, p


# --------------------------------------------------------------------------------------
# The index
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Contamination:
    """Why one sample is contaminated: the benchmark, its item, and the shared words."""

    benchmark: str
    item: str
    ngram: str

    def detail(self) -> str:
        return f"contaminated: benchmark {self.benchmark!r} item {self.item!r} shares {self.ngram!r}"


@dataclass(frozen=True, slots=True)
class BenchmarkStats:
    """What was indexed from one benchmark."""

    name: str
    path: str
    field: str
    items: int
    prompts: int
    too_short: int

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "field": self.field,
            "items": self.items,
            "prompts": self.prompts,
            "too_short": self.too_short,
        }


class BenchmarkIndex:
    """Every benchmark n-gram hashed once: a sorted ``uint64`` array and the item each came from."""

    def __init__(
        self,
        ngram: int,
        hashes: np.ndarray,
        refs: np.ndarray,
        items: list[tuple[str, str]],
        stats: list[BenchmarkStats],
    ) -> None:
        self.ngram = ngram
        self._weights = _ngram_weights(ngram)
        self._hashes = hashes
        self._refs = refs
        self._items = items
        self.stats = stats

    @classmethod
    def build(cls, cfg: DecontaminationConfig) -> BenchmarkIndex:
        """Read every benchmark in ``cfg`` and hash its n-grams (the first item wins a shared n-gram)."""
        n = cfg.ngram
        weights = _ngram_weights(n)
        items: list[tuple[str, str]] = []
        chunks: list[np.ndarray] = []
        ref_chunks: list[np.ndarray] = []
        stats: list[BenchmarkStats] = []
        for spec in cfg.benchmarks:
            names: set[str] = set()
            prompts = too_short = 0
            for item, prompt in read_benchmark(spec):
                names.add(item)
                prompts += 1
                words = normalized_words(prompt)
                if len(words) < n:
                    too_short += 1
                    continue
                hashes = _ngram_hashes(_word_hashes(words), np.arange(len(words) - n + 1), weights)
                chunks.append(hashes)
                ref_chunks.append(np.full(len(hashes), len(items), dtype=np.int32))
                items.append((spec.name, item))
            stats.append(BenchmarkStats(spec.name, spec.path, spec.field, len(names), prompts, too_short))
            if too_short:
                log.warning(
                    "benchmark %r: %d of %d prompts have fewer than %d words and cannot be matched "
                    "(lower audit.decontamination.ngram to catch them)",
                    spec.name,
                    too_short,
                    prompts,
                    n,
                )
        hashes = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.uint64)
        refs = np.concatenate(ref_chunks) if ref_chunks else np.zeros(0, dtype=np.int32)
        hashes, first = np.unique(hashes, return_index=True)  # sorted; first occurrence keeps its item
        return cls(n, hashes, refs[first], items, stats)

    @property
    def size(self) -> int:
        """Distinct benchmark n-grams held."""
        return len(self._hashes)

    @property
    def nbytes(self) -> int:
        return self._hashes.nbytes + self._refs.nbytes

    def summary_json(self) -> dict[str, Any]:
        return {
            "ngram": self.ngram,
            "ngrams_indexed": self.size,
            "benchmarks": {s.name: s.to_json() for s in self.stats},
        }

    def check(self, samples: Iterable[Sequence[Message]]) -> list[Contamination | None]:
        """For each sample (its messages), the first benchmark n-gram its prompt turns share, or None."""
        texts_words: list[list[str]] = []
        owner: list[int] = []
        count = 0
        for i, messages in enumerate(samples):
            count += 1
            for m in messages:
                if m.role in PROMPT_ROLES and isinstance(m.content, str):
                    words = normalized_words(m.content)
                    if len(words) >= self.ngram:
                        texts_words.append(words)
                        owner.append(i)
        found: list[Contamination | None] = [None] * count
        if not texts_words or not self.size:
            return found
        lengths = np.fromiter(map(len, texts_words), dtype=np.int64, count=len(texts_words))
        flat = [w for words in texts_words for w in words]
        starts, text_of = _window_starts(lengths, self.ngram)
        hashes = _ngram_hashes(_word_hashes(flat), starts, self._weights)
        pos = np.searchsorted(self._hashes, hashes)
        pos[pos == len(self._hashes)] = 0
        hit = np.flatnonzero(self._hashes[pos] == hashes)
        for k in hit:  # in text order: the first hit of each sample names it
            sample = owner[text_of[k]]
            if found[sample] is None:
                benchmark, item = self._items[int(self._refs[pos[k]])]
                start = int(starts[k])
                found[sample] = Contamination(benchmark, item, " ".join(flat[start : start + self.ngram]))
        return found
