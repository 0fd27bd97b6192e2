"""The features' store and one shard's job, with a stand-in backend (numpy; the transformers backend and the
trainers' readers: ``test_trainers_read_features.py``): files written under a temporary name and renamed, a
manifest with shapes, layers, norm state, checksums and fingerprints; resume skips only files whose checksum
verifies, a regenerated answer is computed again, a crash loses only the row in flight, nothing is padded, and
no finished file is deleted; the job's pace, kept beside the manifest, rates the projection of the rest."""

from __future__ import annotations

import json
import struct
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest

from regen.features.compute import compute_rows, run_shard
from regen.features.config import LAYER_CONVENTION, FeaturesConfig
from regen.features.projection import TokenCounts, project
from regen.features.rows import TokenRow
from regen.features.store import (
    PACE_FILE,
    ROWS_JOURNAL,
    SUPERSEDED_DIR,
    FeatureSettings,
    ShardStore,
    StoredTensor,
    measured_pace,
)
from regen.layout.run import RunLayout
from regen.sglang.models import ModelShape

HIDDEN = 8
LAYERS = (2, 4, 5, 8)


class CountingBackend:
    """States that depend on each token id and layer; counts the rows it prefilled; may fail on one row."""

    name = "stand-in"

    def __init__(self, fail_on: int | None = None) -> None:
        self.calls: list[tuple[int, ...]] = []
        self.batches: list[list[int]] = []  # each capture_many call's row lengths
        self.fail_on = fail_on

    def capture_many(self, rows: Sequence[Sequence[int]]) -> list[np.ndarray]:
        self.batches.append([len(ids) for ids in rows])
        return [self.capture(ids) for ids in rows]

    def capture(self, input_ids: Sequence[int]) -> np.ndarray:
        if self.fail_on is not None and len(self.calls) == self.fail_on:
            raise RuntimeError("killed")
        self.calls.append(tuple(input_ids))
        ids = np.array(input_ids, dtype=np.float32)[:, None, None]
        layers = np.array(LAYERS, dtype=np.float32)[None, :, None]
        return ids * 10 + layers + np.arange(HIDDEN, dtype=np.float32)[None, None, :] / 100


def bf16(states: np.ndarray, input_ids: Sequence[int], dtype: str) -> list[StoredTensor]:
    """The store's tensors from a float32 array: bf16 as float32's upper half (what torch stores)."""
    ids = np.array(input_ids, dtype="<i8")
    upper = (states.astype("<f4").view("<u4") >> 16).astype("<u2")
    return [
        StoredTensor("token_ids", "I64", ids.shape, ids.tobytes()),
        StoredTensor("hidden_states", "BF16", states.shape, upper.tobytes()),
    ]


def read_safetensors(path: Path) -> tuple[dict, bytes]:
    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8 : 8 + n]), blob[8 + n :]


def settings(dtype: str = "bf16") -> FeatureSettings:
    return FeatureSettings("m", LAYERS, LAYER_CONVENTION, "post_norm", dtype, HIDDEN, "stand-in")


DEMO_MODEL = Path(__file__).resolve().parents[2] / "resources/demo-model/config.json"


def token_rows(lengths: Sequence[int] = (3, 7, 5, 2)) -> list[TokenRow]:
    return [
        TokenRow(f"r{i}", f"s{i}", tuple(range(i, i + n)), (0,) * (n - 1) + (1,), fingerprint=f"fp{i}")
        for i, n in enumerate(lengths)
    ]


def run(
    shard_dir: Path,
    rows: list[TokenRow],
    backend: CountingBackend,
    dtype: str = "bf16",
    batch_tokens: int = 1,
) -> dict:
    store = ShardStore.open(shard_dir, settings(dtype))
    compute_rows(rows, store, backend, batch_tokens, encoder=bf16)
    store.set_aside(r.id for r in rows)
    return store.write_manifest("00000", [r.id for r in rows], {})


def test_one_file_a_row_exactly_its_tokens_and_a_manifest(tmp_path: Path) -> None:
    rows = token_rows()
    manifest = run(tmp_path, rows, CountingBackend())
    assert (
        manifest["settings"]["layer_ids"] == list(LAYERS)
        and manifest["settings"]["last_layer"] == "post_norm"
    )
    assert manifest["settings"]["layer_convention"] == "hf_hidden_states_index"
    assert [r["fingerprint"] for r in manifest["rows"]] == ["fp0", "fp1", "fp2", "fp3"]
    assert manifest["tokens"] == 17
    for row, line in zip(rows, manifest["rows"], strict=True):
        header, data = read_safetensors(tmp_path / line["file"])
        assert header["hidden_states"]["shape"] == [len(row.input_ids), len(LAYERS), HIDDEN]  # nothing padded
        assert header["token_ids"]["shape"] == [len(row.input_ids)]
        lo, hi = header["hidden_states"]["data_offsets"]
        first = np.frombuffer(data[lo:hi], dtype="<u2").astype("<u4") << 16
        assert first.view("<f4")[1] == pytest.approx(row.input_ids[0] * 10 + LAYERS[0] + 0.01, rel=1e-2)
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*"))


def test_resume_skips_only_verified_files(tmp_path: Path) -> None:
    rows = token_rows()
    first = run(tmp_path, rows, CountingBackend())
    again = CountingBackend()
    assert run(tmp_path, rows, again) == first and again.calls == []
    victim = tmp_path / first["rows"][1]["file"]
    blob = bytearray(victim.read_bytes())
    blob[-1] ^= 0xFF  # same size, one bit of the states flipped: only a checksum sees it
    victim.write_bytes(bytes(blob))
    fixed = CountingBackend()
    assert run(tmp_path, rows, fixed)["rows"] == first["rows"]
    assert fixed.calls == [rows[1].input_ids]


def test_a_regenerated_answer_gets_new_features(tmp_path: Path) -> None:
    rows = token_rows()
    run(tmp_path, rows, CountingBackend())
    new = TokenRow("r2", "s2", (9, 9, 9, 9), (0, 0, 1, 1), fingerprint="fp2-new")
    backend = CountingBackend()
    manifest = run(tmp_path, [rows[0], rows[1], new, rows[3]], backend)
    assert backend.calls == [new.input_ids]
    assert manifest["rows"][2]["fingerprint"] == "fp2-new" and manifest["rows"][2]["tokens"] == 4


def test_an_answer_regenerated_to_the_same_tokens_is_computed_again(tmp_path: Path) -> None:
    """The tokens alone do not name the answer: a regenerated answer (new fingerprint) whose ids happen to be
    the same recomputes its features, and the manifest and the file name the new answer."""
    rows = token_rows()
    run(tmp_path, rows, CountingBackend())
    same_tokens = TokenRow("r1", "s1", rows[1].input_ids, rows[1].loss_mask, fingerprint="fp1-regenerated")
    backend = CountingBackend()
    manifest = run(tmp_path, [rows[0], same_tokens, rows[2], rows[3]], backend)
    assert backend.calls == [rows[1].input_ids]
    assert [r["fingerprint"] for r in manifest["rows"]] == ["fp0", "fp1-regenerated", "fp2", "fp3"]
    header, _ = read_safetensors(tmp_path / manifest["rows"][1]["file"])
    assert header["__metadata__"]["fingerprint"] == "fp1-regenerated"
    again = CountingBackend()
    run(tmp_path, [rows[0], same_tokens, rows[2], rows[3]], again)
    assert again.calls == []  # and once computed, it is current


def test_a_crash_loses_only_the_row_in_flight(tmp_path: Path) -> None:
    rows = token_rows()
    with pytest.raises(RuntimeError, match="killed"):
        run(tmp_path, rows, CountingBackend(fail_on=2))
    assert not (tmp_path / "_manifest.json").exists()
    with open(tmp_path / ROWS_JOURNAL, "ab") as f:
        f.write(b'{"id": "r2", "torn')  # a line cut by the kill
    backend = CountingBackend()
    run(tmp_path, rows, backend)
    assert backend.calls == [rows[2].input_ids, rows[3].input_ids]


def test_finished_files_are_moved_aside_never_deleted(tmp_path: Path) -> None:
    rows = token_rows()
    first = run(tmp_path, rows, CountingBackend())
    run(tmp_path, rows[:2], CountingBackend())  # fewer rows chosen
    aside = list((tmp_path / SUPERSEDED_DIR).rglob("*.safetensors"))
    assert sorted(p.name for p in aside) == sorted(r["file"] for r in first["rows"][2:])
    backend = CountingBackend()
    run(
        tmp_path, rows[:2], backend, dtype="fp8"
    )  # other settings: everything again, the bf16 files kept aside
    assert len(backend.calls) == 2
    assert len(list((tmp_path / SUPERSEDED_DIR).rglob("*.safetensors"))) == 4


def test_run_shard_writes_the_manifest_last_with_where_rows_came_from(tmp_path: Path) -> None:
    rows = token_rows()
    result = run_shard(
        rows=rows,
        shard_dir=tmp_path,
        shard="00000",
        settings=settings(),
        backend=CountingBackend(),
        about={"tokenized": "t"},
        batch_tokens=16384,
        encoder=bf16,
    )
    assert result.computed == 4 and result.reused == 0
    assert json.loads((tmp_path / "_manifest.json").read_text())["tokenized"] == "t"


def test_batch_tokens_packs_whole_rows_and_changes_no_byte(tmp_path: Path) -> None:
    """``features.batch_tokens``: the rows still to compute go to the engine in order, whole (never split or
    padded), as many as fit the limit, a longer row alone; the files are those of one row at a time."""
    rows = token_rows((3, 7, 5, 2, 12, 1))
    one_by_one = run(tmp_path / "one", rows, CountingBackend())
    batched = CountingBackend()
    packed = run(tmp_path / "packed", rows, batched, batch_tokens=10)
    assert batched.batches == [[3, 7], [5, 2], [12], [1]]
    assert [r["sha256"] for r in packed["rows"]] == [r["sha256"] for r in one_by_one["rows"]]
    (tmp_path / "packed" / packed["rows"][1]["file"]).unlink()  # resume: only what is missing is batched
    again = CountingBackend()
    run(tmp_path / "packed", rows, again, batch_tokens=10)
    assert again.batches == [[7]]


class GatedStore(ShardStore):
    """A store whose first file waits until the backend has begun the next batch (a slow disk), then may
    fail on a given row (a full disk)."""

    next_batch_started: threading.Event
    fail_row: str | None = None

    def write_rows(self, rows, files=None):  # type: ignore[no-untyped-def]
        if not self.done:
            assert self.next_batch_started.wait(10), "the prefill waited for the disk"
        if any(row.id == self.fail_row for row, _ in rows):
            raise OSError(28, "No space left on device")
        return super().write_rows(rows, files)


class SignallingBackend(CountingBackend):
    def __init__(self, event: threading.Event) -> None:
        super().__init__()
        self.event = event

    def capture_many(self, rows: Sequence[Sequence[int]]) -> list[np.ndarray]:
        if self.batches:
            self.event.set()
        return super().capture_many(rows)


def gated_store(shard_dir: Path, fail_row: str | None = None) -> GatedStore:
    store = GatedStore(shard_dir, settings())
    store.directory.mkdir(parents=True, exist_ok=True)
    store.next_batch_started = threading.Event()
    store.fail_row = fail_row
    return store


def test_the_next_batch_is_prefilled_while_the_last_one_is_written(tmp_path: Path) -> None:
    rows = token_rows()
    store = gated_store(tmp_path)
    result = compute_rows(rows, store, SignallingBackend(store.next_batch_started), 1, encoder=bf16)
    assert result.computed == 4 and sorted(store.done) == [r.id for r in rows]
    journal = [json.loads(line)["id"] for line in (tmp_path / ROWS_JOURNAL).read_text().splitlines()]
    assert journal == [r.id for r in rows]  # one writer: the journal keeps the rows' order


class MeetingStore(ShardStore):
    """A store each of whose files waits until ``meet`` files are being written at once (a disk whose syncs
    take a while): a writer that writes a batch's files one after another never gets past the first."""

    meeting: threading.Barrier

    def _write_file(self, row, tensors):  # type: ignore[no-untyped-def]
        self.meeting.wait()
        return super()._write_file(row, tensors)


def test_a_batchs_files_are_written_at_once_and_journalled_in_order(tmp_path: Path) -> None:
    rows = token_rows((3, 7, 5, 2, 4, 6, 1, 8))
    store = MeetingStore(tmp_path, settings())
    store.directory.mkdir(parents=True, exist_ok=True)
    store.meeting = threading.Barrier(4, timeout=10)
    result = compute_rows(rows, store, CountingBackend(), batch_tokens=1000, encoder=bf16)
    assert result.computed == 8
    journal = [json.loads(line)["id"] for line in (tmp_path / ROWS_JOURNAL).read_text().splitlines()]
    assert journal == [r.id for r in rows]
    reopened = ShardStore.open(tmp_path, settings())  # every file verifies against its journalled sha256
    assert sorted(reopened.done) == sorted(r.id for r in rows)
    one_by_one = run(tmp_path / "one", rows, CountingBackend())  # the same bytes as one file at a time
    assert [reopened.done[r.id].sha256 for r in rows] == [r["sha256"] for r in one_by_one["rows"]]


def test_a_failed_write_fails_the_job_and_keeps_what_was_written(tmp_path: Path) -> None:
    rows = token_rows()
    store = gated_store(tmp_path, fail_row="r2")
    with pytest.raises(OSError, match="No space left"):
        compute_rows(rows, store, SignallingBackend(store.next_batch_started), 1, encoder=bf16)
    again = CountingBackend()
    run(tmp_path, rows, again)  # resume: only the row whose file was never written (r3's batch was queued
    assert again.calls == [rows[2].input_ids]  # behind it and is kept: a valid file, journalled)


class SlowBackend(CountingBackend):
    """Each batch's prefill takes ``seconds`` (a GPU's time, stood in for), the first ``first_s``: the kernels
    an engine builds on its first use."""

    def __init__(
        self, seconds: float, first_s: float | None = None, stall: Mapping[int, float] | None = None
    ) -> None:
        super().__init__()
        self.seconds = seconds
        self.first_s = seconds if first_s is None else first_s
        self.stall = stall or {}  # batch index -> its seconds: a shape first met, its kernels built

    def capture_many(self, rows: Sequence[Sequence[int]]) -> list[np.ndarray]:
        n = len(self.batches)
        time.sleep(self.stall.get(n, self.seconds if n else self.first_s))
        return super().capture_many(rows)


def test_the_projection_rates_the_rest_from_the_pace_the_jobs_recorded(tmp_path: Path) -> None:
    layout = RunLayout(results=tmp_path / "results")

    def job(shard: str, rows: list[TokenRow], backend: CountingBackend) -> dict:
        run_shard(rows=rows, shard_dir=layout.features_shard_dir(shard), shard=shard, settings=settings(),
                  backend=backend, about={}, batch_tokens=1, encoder=bf16, engine_s=0.3)  # fmt: skip
        return json.loads((layout.features_shard_dir(shard) / PACE_FILE).read_text())

    # 17 tokens in 4 rows, one batch each: the first 0.6 s (first-use kernels), the rest 0.05 s
    rows = token_rows()
    pace = job("00000", rows, SlowBackend(0.05, first_s=0.6))
    assert pace["tokens"] == 17 and pace["first_batch_tokens"] == 3 and pace["engine_s"] == 0.3, pace
    assert 0.6 <= pace["first_batch_s"] < pace["seconds"], pace
    assert 0.75 <= pace["prefill_s"] <= pace["seconds"], pace
    rerun = job("00000", rows, CountingBackend())
    assert rerun == pace  # a rerun that computed nothing keeps the pace it measured

    counts = TokenCounts(rows=1000, tokens=1_000_000, source="the audit's")
    model = ModelShape.from_config(DEMO_MODEL)
    measured = measured_pace(layout.features_dir)
    assert measured is not None and (measured.tokens, measured.jobs, measured.steady_jobs) == (17, 1, 1)
    steady_rate = 14 / (pace["seconds"] - pace["first_batch_s"])  # the 3 batches after the first
    p = project(counts, FeaturesConfig.from_dict({"enabled": True}), model, measured, jobs=7)
    assert p.rate == pytest.approx(steady_rate) and p.rate > 17 / pace["seconds"]
    start = 0.3 + pace["first_batch_s"] - 3 / steady_rate  # engine build, first batch over the pace
    assert p.start_s_per_job == pytest.approx(start) and start > 0.5
    assert p.gpu_hours == pytest.approx((1_000_000 / p.rate + 7 * start) / 3600)
    line = p.lines()[2]
    steady_s = pace["seconds"] - pace["first_batch_s"]
    assert f"measured: 14 tokens prefilled and written in {steady_s:,.1f} s after each job's first" in line
    assert f"with 7 job starts of {start:,.0f} s" in line, line

    # the next job, 12 rows (42 tokens), its engine new too: projected from the first job's pace and start
    more = token_rows((3, 7, 5, 2) * 3)
    next_shard = TokenCounts(12, 42, "the next shard")
    ahead = project(next_shard, FeaturesConfig.from_dict({"enabled": True}), model, measured, jobs=1)
    second = job("00001", more, SlowBackend(0.05, first_s=0.6))
    took = second["engine_s"] + second["seconds"]
    assert ahead.gpu_hours * 3600 == pytest.approx(took, rel=0.25), (ahead, second)
    whole_pace = 42 / (17 / pace["seconds"]) + 0.3  # the pace of the whole first job, first batch inside it
    assert abs(ahead.gpu_hours * 3600 - took) < abs(whole_pace - took), (whole_pace, took)

    old_file = {k: pace[k] for k in ("tokens", "seconds", "prefill_s", "waited_on_writer_s")}
    (layout.features_shard_dir("00001") / PACE_FILE).write_text(json.dumps(old_file))  # before first batches
    mixed = measured_pace(layout.features_dir)
    assert mixed is not None and (mixed.jobs, mixed.steady_jobs, mixed.steady_tokens) == (2, 1, 14)
    assumed = project(counts, FeaturesConfig.from_dict({"enabled": True}), model)
    assert "assumed" in assumed.rate_source and assumed.rate > 1000 * p.rate  # the stand-in is that slow
    chosen_rate = project(counts, FeaturesConfig.from_dict({"prefill_tokens_per_s": 5.0}), model, measured)
    assert (chosen_rate.rate, chosen_rate.rate_source) == (5.0, "features.prefill_tokens_per_s")


def test_a_later_batch_that_stalled_is_a_jobs_start_not_its_pace(tmp_path: Path) -> None:
    """A MoE's first job on the H100 met a batch shape its fused kernels were not built for after its first
    batch: 34k tok/s over its later batches, its second job 62k (measurements/features-2026-12-07c-h100). A
    later batch far slower than the median is set aside with the first batch: the pace is what the other
    batches kept, the job's start what it cost."""
    layout = RunLayout(results=tmp_path / "results")

    def job(shard: str, backend: CountingBackend) -> dict:
        rows = token_rows((4,) * 12)  # 12 batches of 4 tokens, 0.02 s each
        run_shard(rows=rows, shard_dir=layout.features_shard_dir(shard), shard=shard, settings=settings(),
                  backend=backend, about={}, batch_tokens=4, encoder=bf16, engine_s=0.3)  # fmt: skip
        return json.loads((layout.features_shard_dir(shard) / PACE_FILE).read_text())

    pace = job("00000", SlowBackend(0.02, first_s=0.3, stall={4: 0.3}))  # the fifth batch builds kernels
    later = pace["later_batches"]
    assert len(later) == 11 and all(t == 4 for t, _ in later) and later[3][1] >= 0.3, later
    measured = measured_pace(layout.features_dir)
    assert measured is not None and measured.stalled_batches == 1
    assert (measured.steady_tokens, measured.first_tokens) == (40, 8)
    assert measured.tokens_per_s > 1.5 * 44 / (pace["seconds"] - pace["first_batch_s"])  # what it was before
    assert measured.start_s_per_job > 0.3 + 0.3 + 0.3 - 0.1  # build, first batch, stalled batch
    p = project(
        TokenCounts(1, 1, "x"),
        FeaturesConfig.from_dict({"enabled": True}),
        ModelShape.from_config(DEMO_MODEL),
        measured,
    )
    assert "after each job's first batch and 1 batch that stalled, by 1 features job" in p.rate_source
    # the next job on the same engine builds nothing: projected at the kept pace, not the stalled one's
    ahead = project(TokenCounts(12, 48, "the next shard"), FeaturesConfig.from_dict({"enabled": True}),
                    ModelShape.from_config(DEMO_MODEL), measured)  # fmt: skip
    second = job("00001", SlowBackend(0.02))
    assert ahead.gpu_hours * 3600 == pytest.approx(second["seconds"], rel=0.3), (ahead, second)
    assert measured_pace(layout.features_dir).stalled_batches == 1  # the second job's batches kept the pace
