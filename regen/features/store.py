"""Features on disk, per shard: one safetensors file per token row, a row journal, a manifest written last.

One file per row because both trainers' loaders read one file per sample: speculators'
``FileTransfer`` opens ``hidden_states/hs_{i}.safetensors`` with ``hidden_states [tokens, layers, hidden]``
and ``token_ids [tokens]`` (``speculators/train/data.py``), SpecForge's ``OfflineEagle3Dataset`` one ``.ckpt``
per sample (``specforge/data/preprocessing.py``). A row's file is exactly its tokens (nothing padded), a
regenerated answer rewrites one file, and speculators reads the file as it is. SpecForge's ``.ckpt`` is a
pickle: ``regen.features.export`` writes it from these files.

Every file is written under a temporary name and renamed (``regen.io.atomic_path``), its sha256 appended to
the shard's row journal (``_rows.jsonl``) once it is in place; the manifest (``_manifest.json``) is written
last from the journal. Resume reuses a row only when its journal line names the same settings, token digest
and answer fingerprint (the export's ``fingerprint``: a regenerated answer has a new one even when its tokens
are the same) and the file's sha256 still verifies; everything else is computed again.

The safetensors format is written here (8-byte header length, JSON header, raw little-endian bytes), so this
module needs neither torch nor the safetensors package.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from regen.io import atomic_path, file_sha256, read_json, write_json
from regen.layout.names import MANIFEST_NAME

FORMAT = "regen-features/1"
ROWS_JOURNAL = "_rows.jsonl"
SUPERSEDED_DIR = "superseded"
#: the last job's own pace (``ShardResult.pace``), beside the manifest: what later projections rate from. Its
#: own small file: the dry run reads every shard's, and a manifest of 130,000 rows is ~60 MB of JSON
PACE_FILE = "_pace.json"
#: safetensors dtype names and their bytes per element
DTYPE_BYTES = {"BF16": 2, "F8_E4M3": 1, "F32": 4, "I64": 8}


@dataclass(frozen=True, slots=True)
class StoredTensor:
    """One tensor of a row's file, as raw little-endian bytes."""

    name: str
    dtype: str  # a key of DTYPE_BYTES
    shape: tuple[int, ...]
    data: bytes

    def __post_init__(self) -> None:
        n = DTYPE_BYTES[self.dtype]
        for d in self.shape:
            n *= d
        if n != len(self.data):
            raise ValueError(
                f"{self.name}: {self.dtype}{list(self.shape)} needs {n} bytes, got {len(self.data)}"
            )


def safetensors_pieces(tensors: Sequence[StoredTensor], metadata: Mapping[str, str]) -> list[bytes]:
    """A safetensors file of ``tensors`` (in order) with string ``metadata``, as the pieces to write one after
    another: the header, then each tensor's bytes (not copied into one buffer)."""
    header: dict[str, Any] = {"__metadata__": dict(metadata)}
    offset = 0
    for t in tensors:
        header[t.name] = {
            "dtype": t.dtype,
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(t.data)],
        }
        offset += len(t.data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the format aligns the data to 8 bytes
    return [len(head).to_bytes(8, "little") + head, *(t.data for t in tensors)]


def row_file_name(row_id: str) -> str:
    """A row's file name: its id hashed (ids may hold any character)."""
    return hashlib.blake2b(row_id.encode(), digest_size=12).hexdigest() + ".safetensors"


@dataclass(frozen=True, slots=True)
class FeatureSettings:
    """What decides a row's features besides its tokens; a change recomputes every row."""

    model: str
    layer_ids: tuple[int, ...]
    layer_convention: str
    last_layer: str  # post_norm | pre_norm | none
    dtype: str  # bf16 | fp8
    hidden_size: int
    backend: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"layer_ids": list(self.layer_ids)}


@dataclass(frozen=True, slots=True)
class StoredRow:
    """One row's journal line: its file, checksum, shape and what it came from."""

    id: str
    sample_id: str
    file: str
    sha256: str
    tokens: int
    token_digest: str
    settings: str  # sha256 of the settings' JSON
    fingerprint: str | None = None
    variant: str | None = None
    k: int | None = None


def settings_digest(settings: FeatureSettings) -> str:
    return hashlib.sha256(orjson.dumps(settings.to_json(), option=orjson.OPT_SORT_KEYS)).hexdigest()


@dataclass(slots=True)
class ShardStore:
    """One shard's feature folder: what is done and verifies, writes, and the manifest."""

    directory: Path
    settings: FeatureSettings
    done: dict[str, StoredRow] = field(default_factory=dict)
    moved_aside: list[str] = field(default_factory=list)

    @classmethod
    def open(cls, directory: str | os.PathLike[str], settings: FeatureSettings) -> ShardStore:
        """Read the row journal; keep the rows whose settings match and whose file verifies."""
        store = cls(Path(directory), settings)
        store.directory.mkdir(parents=True, exist_ok=True)
        journal = store.directory / ROWS_JOURNAL
        other_settings: set[str] = set()
        if journal.is_file():
            want = settings_digest(settings)
            for line in journal.read_bytes().splitlines():
                if not line.strip():
                    continue
                try:
                    row = StoredRow(**orjson.loads(line))
                except (orjson.JSONDecodeError, TypeError):
                    continue  # a torn last line of a killed job: its row is computed again
                path = store.directory / row.file
                store.done.pop(row.id, None)
                if row.settings != want:
                    other_settings.add(row.file)
                elif path.is_file() and file_sha256(path) == row.sha256:
                    store.done[row.id] = row
                    other_settings.discard(row.file)
        store.moved_aside = store._move_aside(
            other_settings
        )  # finished under other settings: kept, not rewritten
        return store

    def is_current(self, row_id: str, token_digest: str, fingerprint: str | None) -> bool:
        """Whether ``row_id``'s stored features are of these tokens, this answer and these settings (checksum
        verified)."""
        row = self.done.get(row_id)
        return row is not None and row.token_digest == token_digest and row.fingerprint == fingerprint

    def write_rows(
        self,
        rows: Sequence[tuple[StoredRow, Sequence[StoredTensor]]],
        files: Executor | None = None,
    ) -> list[StoredRow]:
        """Write each row's file (temporary name, synced, renamed; on ``files``' threads when given: each
        file's hashing, writing and sync overlap the others'), then their journal lines in one synced append,
        in ``rows``' order: a line is never on disk before its file, and a batch costs one journal sync."""
        if files is None:
            done = [self._write_file(row, tensors) for row, tensors in rows]
        else:
            done = list(files.map(lambda job: self._write_file(*job), rows))
        with open(self.directory / ROWS_JOURNAL, "ab") as f:
            f.write(b"".join(orjson.dumps(asdict(line)) + b"\n" for line in done))
            f.flush()
            os.fsync(f.fileno())
        for line in done:
            self.done[line.id] = line
        return done

    def _write_file(self, row: StoredRow, tensors: Sequence[StoredTensor]) -> StoredRow:
        meta = {"format": FORMAT, "id": row.id, "token_digest": row.token_digest, "settings": row.settings}
        if row.fingerprint:
            meta["fingerprint"] = row.fingerprint
        digest = hashlib.sha256()
        with atomic_path(self.directory / row.file) as tmp, open(tmp, "wb") as f:
            for piece in safetensors_pieces(tensors, meta):
                digest.update(piece)
                f.write(piece)
        return StoredRow(**(asdict(row) | {"sha256": digest.hexdigest()}))

    def set_aside(self, keep: Iterable[str]) -> list[str]:
        """Move the files of rows not in ``keep`` (no longer chosen, or of other settings) to ``superseded/``,
        never deleting one; return what moved where."""
        keep_files = {self.done[i].file for i in keep if i in self.done}
        names = {p.name for p in self.directory.glob("*.safetensors")} - keep_files
        self.done = {i: r for i, r in self.done.items() if r.file in keep_files}
        self.moved_aside += self._move_aside(names)
        return self.moved_aside

    def _move_aside(self, names: Iterable[str]) -> list[str]:
        aside = self.directory / SUPERSEDED_DIR / time.strftime("%Y%m%dT%H%M%S")
        moved = []
        for name in sorted(names):
            path = self.directory / name
            if path.is_file():
                aside.mkdir(parents=True, exist_ok=True)
                path.rename(aside / name)
                moved.append(f"{path} -> {aside / name}")
        return moved

    def write_manifest(self, shard: str, order: Sequence[str], extra: Mapping[str, Any]) -> dict[str, Any]:
        """The shard's manifest (written last): settings, tensor layout and every row in ``order``;
        the row journal is rewritten to hold exactly these rows."""
        rows = [self.done[i] for i in order]
        manifest = {
            "format": FORMAT,
            "shard": shard,
            "settings": self.settings.to_json(),
            "settings_sha256": settings_digest(self.settings),
            "tensors": tensor_layout(self.settings),
            "rows": [asdict(r) for r in rows],
            "row_count": len(rows),
            "tokens": sum(r.tokens for r in rows),
            "bytes": sum((self.directory / r.file).stat().st_size for r in rows),
            **dict(extra),
        }
        with atomic_path(self.directory / ROWS_JOURNAL) as tmp:
            tmp.write_bytes(b"".join(orjson.dumps(asdict(r)) + b"\n" for r in rows))
        write_json(self.directory / MANIFEST_NAME, manifest)
        return manifest


def tensor_layout(settings: FeatureSettings) -> dict[str, str]:
    """What each row file holds (the manifest says it)."""
    layout = {
        "token_ids": "I64 [tokens]: the row's input_ids",
        "hidden_states": f"{'F8_E4M3' if settings.dtype == 'fp8' else 'BF16'} [tokens, layers, hidden]: "
        f"layers in layer_ids order ({settings.layer_convention}); the last "
        + (
            "is the last decoder layer " + settings.last_layer.replace("_", " ")
            if settings.last_layer != "none"
            else "is an auxiliary layer"
        ),
    }
    if settings.dtype == "fp8":
        layout["hidden_states_scales"] = (
            "F32 [tokens, 1, 1]: value = fp8 x scale (scale = the token's amax / 448)"
        )
    return layout


def read_manifest(shard_dir: str | os.PathLike[str]) -> dict[str, Any]:
    return read_json(Path(shard_dir) / MANIFEST_NAME)


def record_pace(shard_dir: str | os.PathLike[str], pace: Mapping[str, Any] | None) -> None:
    """Keep the job's pace beside the shard's manifest; a job that computed nothing (None) keeps the one an
    earlier job measured."""
    if pace is not None:
        write_json(Path(shard_dir) / PACE_FILE, dict(pace))


def read_pace(shard_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The pace the shard's last computing job recorded (None: none yet)."""
    path = Path(shard_dir) / PACE_FILE
    return read_json(path) if path.is_file() else None


#: a later batch that took over this many times the median later batch (per token and whole) paid a one-time
#: cost (kernels SGLang builds for a batch shape it meets first: a MoE's fused kernels, seconds each on the
#: H100), not the pace: measurements/features-2026-12-07c-h100, the MoE's first job 34k tok/s after its
#: first batch, its second 62k
STALL_FACTOR = 2.0


@dataclass(frozen=True, slots=True)
class MeasuredPace:
    """The features jobs' pace so far, summed over the jobs that recorded one: tokens prefilled and written in
    the jobs' seconds; of those, the tokens of the batches that kept the pace and their seconds (each job's
    first batch and any later batch that stalled, :data:`STALL_FACTOR`, left out: they pay kernels an engine
    builds on first use), and what was left out: those batches' tokens and, with each job's engine build,
    their seconds."""

    tokens: int
    seconds: float
    jobs: int
    steady_jobs: int = 0
    steady_tokens: int = 0
    steady_seconds: float = 0.0
    first_tokens: int = 0
    start_seconds: float = 0.0
    #: later batches left out of the pace as stalled (their tokens and seconds are in first_/start_)
    stalled_batches: int = 0

    @property
    def tokens_per_s(self) -> float:
        """The pace after the first batches; a job of one batch only has its whole pace."""
        if self.steady_jobs:
            return self.steady_tokens / self.steady_seconds
        return self.tokens / self.seconds

    @property
    def start_s_per_job(self) -> float:
        """What a job costs beyond its tokens at :attr:`tokens_per_s`: its engine's build and what its first
        (and stalled) batches took over that pace (0 when the pace is a whole job's, which has it inside)."""
        if not self.steady_jobs:
            return 0.0
        return max(0.0, self.start_seconds - self.first_tokens / self.tokens_per_s) / self.steady_jobs


def stalled(batches: Sequence[Sequence[float]]) -> list[bool]:
    """Which of ``batches`` (tokens, seconds) took over :data:`STALL_FACTOR` times both their tokens at the
    median seconds per token and the median batch's seconds (a short batch, a job's last, pays a step's fixed
    cost on fewer tokens: not a stall)."""
    timed = [(t, s) for t, s in batches if t > 0]
    if not timed:
        return [False] * len(batches)
    per_token = sorted(s / t for t, s in timed)[len(timed) // 2]
    per_batch = sorted(s for _, s in timed)[len(timed) // 2]
    return [t > 0 and s > STALL_FACTOR * max(t * per_token, per_batch) for t, s in batches]


def measured_pace(features_dir: str | os.PathLike[str]) -> MeasuredPace | None:
    """The pace the shards under ``features_dir`` recorded, summed (None: none recorded yet). A shard whose
    job prefilled one batch only counts in the whole pace; a pace file from before the first batch was
    recorded counts as one such batch; one from before later batches were recorded keeps all of its
    batches after the first in the pace."""
    paces = [
        pace
        for shard_dir in sorted(p.parent for p in Path(features_dir).glob(f"*/{PACE_FILE}"))
        if (pace := read_pace(shard_dir)) and pace["seconds"] > 0
    ]
    if not paces:
        return None
    steady = [
        p
        for p in paces
        if 0 < p.get("first_batch_tokens", 0) < p["tokens"] and p["first_batch_s"] < p["seconds"]
    ]
    later = [b for p in steady for b in p.get("later_batches", ())]
    aside = [b for b, is_stalled in zip(later, stalled(later), strict=True) if is_stalled]
    aside_tokens, aside_s = sum(int(t) for t, _ in aside), sum(float(s) for _, s in aside)
    return MeasuredPace(
        tokens=sum(p["tokens"] for p in paces),
        seconds=sum(p["seconds"] for p in paces),
        jobs=len(paces),
        steady_jobs=len(steady),
        steady_tokens=sum(p["tokens"] - p["first_batch_tokens"] for p in steady) - aside_tokens,
        steady_seconds=sum(p["seconds"] - p["first_batch_s"] for p in steady) - aside_s,
        first_tokens=sum(p["first_batch_tokens"] for p in steady) + aside_tokens,
        start_seconds=sum(p.get("engine_s", 0.0) + p["first_batch_s"] for p in steady) + aside_s,
        stalled_batches=len(aside),
    )
