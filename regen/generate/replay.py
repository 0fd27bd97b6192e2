"""Before anything runs: how many samples a rerun will replay from the journals, and how many it will
generate again, and why (``snakemake -n`` and ``regen status --configfile`` print it), per sampling
variant when the run has several (``generate.variants``): a completion is counted, not a prompt.

A sample is replayed when a journal holds a record under its current fingerprint
(``regen.fingerprint``). Otherwise it is generated: new (never journaled), an earlier failure retried,
its settings changed (which ones are named), its prompt edited (same settings, other content), or
journaled before fingerprints existed.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq

from regen.fingerprint import (
    GenerationSettings,
    RunSettings,
    changed_settings,
    content_digest,
    request_fingerprint,
)
from regen.generate.journal import FAILED, RECORD, EntryHead, read_heads
from regen.io import gc_paused, read_json, write_json
from regen.layout.run import RUN, RunLayout
from regen.prompts import request_content, sample_request_fingerprint
from regen.records import record_id
from regen.runconfig import DEFAULT_VARIANT, GenerateConfig, RunConfig
from regen.types import Sample

if TYPE_CHECKING:  # the dataset reader's module (heavy imports) is imported only when previewing
    from regen.ingest.dataset import DatasetConfig

log = logging.getLogger("regen.generate.replay")
_ABSENT = object()  # a key the journaled settings lack (so None there never equals it)


@dataclass(slots=True)
class JournalIndex:
    """What the journals hold: the outcome per request fingerprint (a record wins over failures), the
    heads of every entry (grouped by sample id when first asked), and the settings of each settings
    fingerprint seen. Built for 914,000 entries in seconds: one dict lookup decides most samples."""

    heads: list[EntryHead] = field(default_factory=list)
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    kind_by_fingerprint: dict[str | None, str] = field(default_factory=dict)
    _by_id: dict[str, list[EntryHead]] | None = None

    @classmethod
    def read(cls, paths: Iterable[str | os.PathLike[str]]) -> JournalIndex:
        """The heads of every journal entry (``regen.generate.journal.read_heads``: the journals' indexes,
        never
        their answers)."""
        index = cls()
        with gc_paused():
            index._read(paths)
        return index

    def _read(self, paths: Iterable[str | os.PathLike[str]]) -> None:
        for path in paths:
            journal = read_heads(path)
            self.heads.extend(journal.heads)
            for sfp, settings in journal.settings.items():
                self.settings.setdefault(sfp, settings)
        kinds = self.kind_by_fingerprint
        for head in self.heads:  # failures first, then records over them: a record wins
            if head.kind != RECORD:
                kinds[head.fingerprint] = head.kind
        kinds.update((h.fingerprint, RECORD) for h in self.heads if h.kind == RECORD)
        kinds.pop(None, None)  # entries written before fingerprints are never replayed

    @property
    def by_id(self) -> dict[str, list[EntryHead]]:
        """The heads of each sample id (built on first use)."""
        if self._by_id is None:
            self._by_id = {}
            for head in self.heads:
                self._by_id.setdefault(head.id, []).append(head)
        return self._by_id


@dataclass(slots=True)
class ReplayPlan:
    """Counts over the samples of a run (see the module docstring)."""

    samples: int = 0
    replay: int = 0
    new: int = 0
    retry_failed: int = 0
    keep_failed: int = 0
    settings_changed: int = 0
    prompt_changed: int = 0
    before_fingerprints: int = 0
    #: per earlier settings fingerprint: the settings that differ from now ("temperature 0.6→0.9")
    changes: dict[str, list[str]] = field(default_factory=dict)

    @property
    def to_generate(self) -> int:
        return (
            self.new
            + self.retry_failed
            + self.settings_changed
            + self.prompt_changed
            + self.before_fingerprints
        )

    def distinct_changes(self) -> list[str]:
        """Each setting that differs from an earlier one, once (``temperature 0.6→0.9``), however many
        earlier fingerprints share it; ``settings unknown`` once when some journaled settings are not."""
        seen = {change: None for diff in self.changes.values() for change in diff}
        unknown = any(not diff for diff in self.changes.values())
        return [*seen, *(["settings unknown (journaled without them)"] if unknown else [])]

    def lines(self) -> list[str]:
        out = [
            f"regen: {self.samples} samples: {self.replay} replayed from the journals, "
            f"{self.to_generate} to generate"
            + (
                f", {self.keep_failed} earlier failures kept (generate.retry_failed: false)"
                if self.keep_failed
                else ""
            )
        ]
        if self.new:
            out.append(f"  {self.new} new (never generated)")
        if self.settings_changed:
            out.append(f"  {self.settings_changed} regenerated because settings changed:")
            out += [f"    {change}" for change in self.distinct_changes()]
        if self.prompt_changed:
            out.append(f"  {self.prompt_changed} regenerated because their prompt changed")
        if self.retry_failed:
            out.append(f"  {self.retry_failed} earlier failures retried")
        if self.before_fingerprints:
            out.append(f"  {self.before_fingerprints} regenerated: journaled before generation fingerprints")
        return out


def plan_replay(
    samples: Iterable[Sample], index: JournalIndex, settings: GenerationSettings, retry_failed: bool
) -> ReplayPlan:
    """Classify every sample the way ``regen.generate.client`` will decide on it."""
    now, mode = settings.fingerprint, settings.regenerate
    return plan_replay_fingerprints(
        ((s.id, sample_request_fingerprint(now, s, mode)) for s in samples), index, settings, retry_failed
    )


def plan_replay_fingerprints(
    fingerprints: Iterable[tuple[str, str]],
    index: JournalIndex,
    settings: GenerationSettings,
    retry_failed: bool,
) -> ReplayPlan:
    """Classify every sample, given as ``(id, request fingerprint under settings)``."""
    plan = ReplayPlan()
    now = settings.fingerprint
    now_json = settings.to_json()
    seen_ids: set[str] = set()
    kind_by_fingerprint = index.kind_by_fingerprint
    journaled_ids = {h.id for h in index.heads}
    for sample_id, fingerprint in fingerprints:
        if sample_id in seen_ids:
            continue
        seen_ids.add(sample_id)
        plan.samples += 1
        kind = kind_by_fingerprint.get(fingerprint)
        if kind == RECORD:
            plan.replay += 1
            continue
        if kind == FAILED:
            if retry_failed:
                plan.retry_failed += 1
            else:
                plan.keep_failed += 1
            continue
        if sample_id not in journaled_ids:
            plan.new += 1
            continue
        entries = index.by_id[sample_id]  # journaled, never under the current fingerprint
        if any(e.settings_fingerprint == now for e in entries):
            plan.prompt_changed += 1
        elif all(e.settings_fingerprint is None for e in entries):
            plan.before_fingerprints += 1
        else:
            plan.settings_changed += 1
            for e in entries:
                sfp = e.settings_fingerprint
                if sfp is not None and sfp != now and sfp not in plan.changes:
                    old = index.settings.get(sfp)
                    plan.changes[sfp] = real_changes(old, now_json) if old is not None else []
    return plan


def real_changes(old: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """The settings that differ (``changed_settings``), less the server's numerics when they are not
    known now (no server asked before the run: a dry run that found none to assume)."""
    if not now.get("server_numerics"):
        old = {k: v for k, v in old.items() if k != "server_numerics"}
        now = {k: v for k, v in now.items() if k != "server_numerics"}
    return changed_settings(old, now)


@dataclass(slots=True)
class VariantPlans:
    """The replay plan of each sampling variant (config order), and the variants the journals hold
    answers of that the config no longer names (their records leave the dataset; the journals keep them)."""

    plans: dict[str, ReplayPlan]
    fingerprints: dict[str, str]  # variant -> its settings fingerprint
    #: a run without ``generate.variants``: its lines read as before variants
    implicit: bool
    prompts: int = 0
    removed: dict[str, int] = field(default_factory=dict)  # variant -> its journaled record ids

    @property
    def replay(self) -> int:
        return sum(p.replay for p in self.plans.values())

    @property
    def to_generate(self) -> int:
        return sum(p.to_generate for p in self.plans.values())

    def lines(self) -> list[str]:
        if self.implicit:
            return [*next(iter(self.plans.values())).lines(), *self._removed_lines()]
        completions = sum(p.samples for p in self.plans.values())
        out = [
            f"regen: {self.prompts} samples x {len(self.plans)} variants = {completions} completions: "
            f"{self.replay} replayed from the journals, {self.to_generate} to generate"
        ]
        for name, plan in self.plans.items():
            head, *reasons = plan.lines()
            kept = head.split(" to generate", 1)[1]  # ", N earlier failures kept (...)" when any
            out.append(f"  variant {name}: {plan.replay} replayed, {plan.to_generate} to generate{kept}")
            out += ["  " + line for line in reasons]
        return [*out, *self._removed_lines()]

    def _removed_lines(self) -> list[str]:
        return [
            f"  variant {name}: no longer configured: its {n} journaled records leave the dataset "
            "(the journals keep them; configure it again to bring them back)"
            for name, n in self.removed.items()
        ]

    def shard_parts(self) -> list[dict[str, Any]]:
        """Per variant: name, replayed, to generate, settings fingerprint (``ShardReplay.variants``)."""
        if self.implicit:
            return []
        fps = self.fingerprints
        return [
            {"name": name, "replayed": p.replay, "to_generate": p.to_generate, "fingerprint": fps[name]}
            for name, p in self.plans.items()
        ]


def digests_of(samples: Iterable[Sample], regenerate: str) -> Iterator[tuple[str, str]]:
    """``(sample id, request content digest)`` of every sample, its request content built."""
    for s in samples:
        yield s.id, content_digest(request_content(s, regenerate))


def plan_variants(
    digests: Iterable[tuple[str, str]],
    index: JournalIndex,
    settings: RunSettings,
    cfg: GenerateConfig,
) -> VariantPlans:
    """Classify every completion of every sample (``(id, request content digest)``) per variant, the way
    ``regen.generate.scheduler`` decides on it; ``settings``: the run's (served). Each variant's settings
    (and so its fingerprint) are built once."""
    pairs = list(digests)
    plain = cfg.plain_ids
    plans: dict[str, ReplayPlan] = {}
    fingerprints: dict[str, str] = {}
    for variant in cfg.variants():
        own = settings.for_variant(cfg, variant)
        now = own.fingerprint
        fingerprints[variant.name] = now
        completions = (
            (record_id(sid, variant.name, k, plain=plain), request_fingerprint(now, key, digest))
            for sid, digest in pairs
            for k in range(variant.n)
            for key in (variant.completion_key(sid, k),)
        )
        plans[variant.name] = plan_replay_fingerprints(completions, index, own, cfg.retry_failed)
    implicit = not cfg.configured_variants
    return VariantPlans(
        plans, fingerprints, implicit, len({sid for sid, _ in pairs}), removed_variants(index, cfg)
    )


def removed_variants(index: JournalIndex, cfg: GenerateConfig) -> dict[str, int]:
    """The variants the journals hold records of that ``cfg`` no longer names, with their record ids
    (a variant is named by its settings: ``variant``, absent for the implicit ``default``)."""
    names = {v.name for v in cfg.variants()}
    variant_of = {sfp: s.get("variant") or DEFAULT_VARIANT for sfp, s in index.settings.items()}
    ids: dict[str, set[str]] = {}
    for head in index.heads:
        name = variant_of.get(head.settings_fingerprint or "")
        if head.kind == RECORD and name is not None and name not in names:
            ids.setdefault(name, set()).add(head.id)
    return {name: len(found) for name, found in sorted(ids.items())}


def workflow_samples(
    dataset: DatasetConfig, tokenizer: str, layout: RunLayout = RUN
) -> Iterable[Sample] | None:
    """The samples the shard job will write (the typed ``dataset`` section's rows minus the audit's
    excluded ones); None when the dataset is not a local file."""
    from regen.ingest.dataset import iter_samples  # the dataset reader (heavy imports) only when previewing
    from regen.ingest.shards import read_excluded

    path = dataset.path
    if str(path).startswith("s3://") or not Path(path).is_file():
        return None
    excluded = layout.audit_excluded
    rows = read_excluded(excluded)[1] if excluded.exists() else frozenset()
    # "skip" whatever dataset.on_bad_row says: a bad row is never sharded, and under "stop" the audit fails
    # before any shard is written; the preview counts the samples and must not raise on the first bad row
    samples = iter_samples(path, dataset.format, dataset.id_column, "skip", tokenizer)
    return (s for s in samples if s.source.get("row") not in rows)


def shard_digests(
    shard_paths: list[Path], regenerate: str, upstream: list[Path]
) -> Iterator[tuple[str, str]] | None:
    """``(id, request content digest)`` of every sample of the shard files, from the request digests the
    shard writer stored (two columns read, no prompt rebuilt); None when a shard is missing, older than
    a file it is made from (it will be rewritten), or written before the digests existed."""
    if not shard_paths or not all(p.is_file() for p in shard_paths):
        return None
    newest_upstream = max((p.stat().st_mtime for p in upstream if p.is_file()), default=0.0)
    if min(p.stat().st_mtime for p in shard_paths) < newest_upstream:
        return None
    column = f"request_digest_{regenerate}"
    if any(column not in pq.read_schema(p).names for p in shard_paths):
        return None

    def rows() -> Iterator[tuple[str, str]]:
        for path in shard_paths:
            table = pq.read_table(path, columns=["id", column])
            ids, digests = table.column("id").to_pylist(), table.column(column).to_pylist()
            yield from zip(ids, digests, strict=True)

    return rows()


def preview_lines(
    run: RunConfig, dataset: DatasetConfig, shards: Iterable[str], layout: RunLayout = RUN
) -> list[str]:
    """The dry-run lines for the typed run config (``rules/common.smk`` builds it), the typed
    ``dataset`` section and the run's shards (their journals and prompt shards in ``layout``)."""
    shards = list(shards)
    index = JournalIndex.read([layout.journal(shard) for shard in shards])
    settings, served = assumed_served(run, index)
    assumed = []
    if served is not None:
        shown = ", ".join(f"{k} {v}" for k, v in served.items())
        assumed = [f"regen: assuming the server reports the numerics it reported before ({shown}); "
                   "one that reports others regenerates every sample"]  # fmt: skip
    upstream = [layout.audit_samples, Path(dataset.path)]
    digests = shard_digests([layout.shard(shard) for shard in shards], settings.regenerate, upstream)
    if digests is None:  # before the shards are (re)written: the dataset itself, prompts rebuilt
        samples = workflow_samples(dataset, run.tokenizer, layout)
        if samples is None:
            return [f"regen: dataset {dataset.path} is not a local file: no replay preview"]
        digests = digests_of(samples, settings.regenerate)
    plans = plan_variants(digests, index, settings, run.generate)
    if plans.implicit:
        head = f"regen: generation settings fingerprint {next(iter(plans.fingerprints.values()))}"
    else:
        shown = ", ".join(f"{name} {fp}" for name, fp in plans.fingerprints.items())
        head = f"regen: generation settings fingerprints per variant: {shown}"
    return [head, *assumed, *plans.lines()]


def assumed_served(run: RunConfig, index: JournalIndex) -> tuple[RunSettings, dict[str, Any] | None]:
    """The run's settings as the preview assumes its server answers: no server to ask before the run, so
    one that reports the numerics it did last time (:func:`numerics_last_reported`, also returned; None:
    the journals hold none, and the settings have no numerics)."""
    settings = RunSettings.for_run(run)
    served = numerics_last_reported(index, settings)
    return (settings if served is None else settings.served_by(served)), served


def numerics_last_reported(index: JournalIndex, settings: RunSettings) -> dict[str, Any] | None:
    """The server numerics of the journaled settings whose run part equals ``settings`` in everything
    else (the most recently first-seen such settings, of whichever variant); None when the journals hold
    none."""
    others = {k: v for k, v in settings.to_json().items() if k != "server_numerics"}
    for seen in reversed(list(index.settings.values())):
        if all(seen.get(k, _ABSENT) == v for k, v in others.items()):
            return dict(seen.get("server_numerics") or {})
    # other settings (a sampling change): the same model and server report what they reported last
    server = ("model_path", "model_revision", "server_mode")
    for seen in reversed(list(index.settings.values())):
        if seen.get("server_numerics") and all(seen.get(k) == others.get(k) for k in server):
            return dict(seen["server_numerics"])
    return None


@dataclass(frozen=True, slots=True)
class ShardReplay:
    """What one generate job finds at its start: its shard's samples replayed from the journal and to
    generate (under the fingerprint the preview assumes: the numerics its server reported last)."""

    shard: str
    replayed: int
    to_generate: int
    fingerprint: str
    #: per sampling variant (a run with ``generate.variants``): ``{name, replayed, to_generate,
    #: fingerprint}``; empty for a run without
    variants: list[dict[str, Any]] = field(default_factory=list)
    #: variants the journal holds records of that the config no longer names -> their record ids
    removed: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        head = (
            f"regen: shard {self.shard}: {self.replayed} replayed from the journal, "
            f"{self.to_generate} to generate"
        )
        if not self.variants:
            line = f"{head} (settings fingerprint {self.fingerprint})"
        else:
            line = head + "".join(
                f"; variant {v['name']}: {v['replayed']} replayed, {v['to_generate']} to generate "
                f"(settings fingerprint {v['fingerprint']})"
                for v in self.variants
            )
        return line + "".join(
            f"; variant {name} is no longer configured: its {n} records leave the dataset"
            for name, n in self.removed.items()
        )

    def write(self, layout: RunLayout) -> None:
        write_json(layout.replay_note(self.shard), asdict(self))

    @classmethod
    def read_all(cls, layout: RunLayout) -> list[ShardReplay]:
        notes = []
        for path in layout.replay_notes():
            try:
                notes.append(cls(**read_json(path)))
            except (OSError, ValueError, TypeError):
                continue
        return notes


def shard_replay(
    shard: str, shard_path: str | os.PathLike[str], journal: str | os.PathLike[str], run: RunConfig
) -> ShardReplay | None:
    """How many samples of one shard its journal replays and how many the job generates; None when the
    shard was written before request digests existed."""
    index = JournalIndex.read([journal])
    settings, _ = assumed_served(run, index)
    digests = shard_digests([Path(shard_path)], settings.regenerate, [])
    if digests is None:
        return None
    plans = plan_variants(digests, index, settings, run.generate)
    first = next(iter(plans.fingerprints.values()))
    return ShardReplay(shard, plans.replay, plans.to_generate, first, plans.shard_parts(), plans.removed)


def announce_replay(
    shard: str, shard_path: str, journal: str, run: RunConfig, layout: RunLayout = RUN
) -> ShardReplay | None:
    """A generate job's first console line (and ``regen status``'s note): how many samples of its shard
    it replays from the journal and how many it generates. Never fails the job."""
    try:
        replay = shard_replay(shard, shard_path, journal, run)
        if replay is not None:
            replay.write(layout)
    except (OSError, ValueError, KeyError) as exc:
        logging.getLogger("regen.generate.replay").warning(
            "shard %s: replay count unavailable (%s)", shard, exc
        )
        return None
    if replay is not None:
        log.info(
            "shard %s at its start: %d samples to replay from the journal, %d to generate (fingerprint %s)",
            shard, replay.replayed, replay.to_generate, replay.fingerprint,
        )  # fmt: skip
        if sys.__stderr__ is not None:
            print(replay.line(), file=sys.__stderr__, flush=True)
    return replay
