"""Every output belongs to the config that made it: what a run does with the files of other runs.

A checkout is reused: the demo, then a config of one's own, then the demo again. Snakemake remakes
the outputs of the jobs it plans, but it leaves alone what the current plan does not name (shards
beyond the current count, the trainer exports of a run whose ``export.enabled`` is now false, an
upload record) and, until their jobs run, the outputs it is about to remake. Both would be read,
counted, exported or declared READY as if they were the current run's (issue 34 item 1, item 2). And
nothing a user finished may be deleted (issue 47 item 1).

So when a run starts (the workflow's ``onstart``, never on a dry run), it compares the config whose
outputs lie in ``results/`` (the run marker's ``results_of``, ``regen.run_marker``) with its own:

- **another config's run** (or an unknown one) whose finished outputs (READY, the dataset, the
  exports, the generations, the reconciliation) this run would remake or leave standing as if current
  is **kept whole** in ``RunLayout.earlier_run`` (``work/earlier-runs/{stamp}-{config}/results/``, its
  paths kept, its files shared with the other kept runs and never kept twice, the last
  ``keep.earlier_runs`` of them: ``regen.output.kept_runs``), with one console line naming the
  folder and how to read it (``regen reconcile --results {folder}/results``, exact with no config: the
  dataset's manifest says what it was made with). Then ``results/`` keeps only what the current DAG
  reuses as up to date; everything else of the earlier run leaves it;
- **the same config**: a READY run it remakes is kept whole the same way; otherwise its own partial
  work stays (a rerun after a failure resumes), the **orphans** (files the current plan does not
  name) are moved aside under ``RunLayout.stale_dir`` (``work/stale/{stamp}/``), and the **outputs
  about to be remade** (those of every job Snakemake will run, their gates' kept verdicts, and the
  status files of the shards they regenerate) are removed now rather than when their job starts, so a
  run that fails before their job leaves no earlier READY, export or verdict standing as if current.

The journals (``work/journal``) are never touched: they are the finished work a rerun replays. The
HTML report ``snakemake --report`` wrote last (``RunLayout.report_html``) leaves ``results/`` when the
report's pages are remade: it describes a run that is no longer the current one.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from regen.layout.names import is_shard_name
from regen.layout.run import RunLayout
from regen.output.kept_runs import KeepConfig, keep_run, kept_line, prune_kept_runs
from regen.run_marker import ResultsOf


@dataclass(frozen=True, slots=True)
class PlannedOutputs:
    """What the current config and plan produce, as far as the files of other plans can differ."""

    shards: frozenset[str]
    export: bool
    publish: bool


def _shard_of(path: Path) -> str:
    """The shard a per-shard file belongs to (its name up to the first dot)."""
    return path.name.split(".", 1)[0]


def orphan_outputs(layout: RunLayout, plan: PlannedOutputs) -> list[Path]:
    """Files of the run's layout that the current plan does not name: per-shard files of shards it
    does not have, the trainer exports when it exports nothing, the upload record when it uploads
    nothing."""
    per_shard_dirs = (
        layout.shards_dir,
        layout.generations_dir,
        layout.valid_dir,
        layout.quarantine_dir,
        layout.status_dir,
    )
    orphans = [
        p
        for d in per_shard_dirs
        if d.is_dir()
        for p in sorted(d.iterdir())
        if is_shard_name(_shard_of(p)) and _shard_of(p) not in plan.shards
    ]
    if not plan.export and layout.export_dir.exists():
        orphans.append(layout.export_dir)
    if not plan.publish and layout.published.exists():
        orphans.append(layout.published)
    return orphans


def move_aside(paths: Iterable[Path], layout: RunLayout, why: str, now: float | None = None) -> list[str]:
    """Move ``paths`` (files or directories of the layout) under ``layout.stale_dir/{stamp}/``, their
    paths relative to the run kept; the message naming each (none: nothing moved)."""
    moving = [p for p in paths if p.exists()]
    if not moving:
        return []
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    dest_root = layout.stale_dir / stamp
    root = layout.results.parent
    for path in moving:
        dest = dest_root / (path.relative_to(root) if path.is_relative_to(root) else path.name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(path), str(dest))
    return [f"regen: {len(moving)} file(s) {why}; moved aside to {dest_root}:", *(f"  {p}" for p in moving)]


def remove_outputs(paths: Iterable[Path]) -> list[Path]:
    """Remove the files and directories given (those that exist); the ones removed."""
    removed = []
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(path)
    return removed


@dataclass(frozen=True, slots=True)
class RemadeOutputs:
    """What the run about to start will make again: the outputs of the jobs Snakemake plans, the rules
    those jobs belong to and the shards they regenerate."""

    outputs: tuple[Path, ...]
    rules: frozenset[str]
    generated_shards: frozenset[str]


def remade_by_run(layout: RunLayout, remade: RemadeOutputs) -> list[Path]:
    """The outputs to remove now: the jobs' outputs, their gates' kept verdicts and the status files of
    the shards they regenerate, and the landing page an earlier failed run left (this run writes its
    own if it fails: ``regen.observe.landing``)."""
    verdicts = [layout.verdict(rule) for rule in sorted(remade.rules)]
    statuses = [
        f
        for shard in sorted(remade.generated_shards)
        for f in (layout.status(shard), layout.replay_note(shard))
    ]
    return [*remade.outputs, *verdicts, *statuses, layout.failed_run_landing]


@dataclass(frozen=True, slots=True)
class KeptOutputs:
    """What the current DAG reuses as up to date (the files of its jobs that it does not rerun) and the
    rules of those jobs: left in ``results/`` when an earlier config's run is kept aside."""

    paths: frozenset[Path] = frozenset()
    rules: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Identities:
    """The config whose outputs lie in ``results/`` (None: unknown) and the starting run's."""

    results_of: ResultsOf | None
    current: ResultsOf
    kept: KeptOutputs = field(default_factory=KeptOutputs)

    @property
    def same(self) -> bool:
        return self.results_of is not None and self.results_of.config_id == self.current.config_id


def _kept(path: Path, kept: frozenset[Path]) -> bool:
    return any(path == k or k in path.parents for k in kept)


def not_reused(layout: RunLayout, kept: KeptOutputs) -> list[Path]:
    """Everything under ``results/`` the current DAG does not reuse as up to date (directories whole
    where nothing below them is reused), the verdicts of rules it does not reuse, and the status files
    of shards whose records it does not reuse."""
    norm = frozenset(Path(os.path.normpath(p)) for p in kept.paths)

    def walk(d: Path) -> list[Path]:
        out: list[Path] = []
        for p in sorted(d.iterdir()):
            if _kept(p, norm):
                continue
            if p.is_dir() and not p.is_symlink() and any(k.is_relative_to(p) for k in norm):
                out += walk(p)
            else:
                out.append(p)
        return out

    gone = walk(layout.results) if layout.results.is_dir() else []
    gone += [v for rule, v in layout.verdicts().items() if rule not in kept.rules]
    if layout.status_dir.is_dir():
        gone += [
            p
            for p in [*sorted(layout.status_dir.glob("*.json")), *layout.replay_notes()]
            if not _kept(layout.records(p.stem), norm)
        ]
    return [*gone, layout.failed_run_landing]


def finished_work(layout: RunLayout, paths: Iterable[Path], same_config: bool) -> list[Path]:
    """Of ``paths`` about to leave ``results/``, the ones that are finished work worth keeping whole:
    READY always; for another config's run also its dataset, exports, generations, re-audit,
    reconciliation and upload record."""
    worth = [layout.ready]
    if not same_config:
        worth += [
            layout.dataset_dir,
            layout.export_dir,
            layout.generations_dir,
            layout.reaudit_summary.parent,
            layout.reconcile,
            layout.published,
        ]
    norm = [Path(os.path.normpath(w)) for w in worth]

    def touches(p: Path) -> bool:
        q = Path(os.path.normpath(p))
        return any(q == w or w in q.parents or q in w.parents for w in norm)

    return [p for p in paths if p.exists() and touches(p)]


def settle_outputs(
    layout: RunLayout,
    plan: PlannedOutputs,
    remade: RemadeOutputs,
    report_rule: str,
    now: float | None = None,
    *,
    identities: Identities | None = None,
    keep_last: int | None = None,
) -> list[str]:
    """At the start of a run: keep an earlier run whole when this one would remake or drop its finished
    work (then only the last ``keep_last`` kept runs stay; None: ``keep.earlier_runs``'s default), move
    the orphans of other plans aside, and remove what the run will remake (see the module's docstring);
    the messages saying what was kept, moved or pruned, and where."""
    same = identities is None or identities.same
    of = identities.results_of if identities is not None else None
    if same:
        leaving = [*orphan_outputs(layout, plan), *remade_by_run(layout, remade)]
        if report_rule in remade.rules:
            leaving.append(layout.report_html)
    else:
        leaving = not_reused(layout, identities.kept if identities is not None else KeptOutputs())
    if finished_work(layout, leaving, same) and layout.results.is_dir():
        kept = keep_run(layout, of, now)
        remove_outputs(leaving)
        last = KeepConfig.from_dict(None).earlier_runs if keep_last is None else keep_last
        return [kept_line(kept, of, layout), *prune_kept_runs(layout, last, kept.results)]
    if not same:
        results_files = [p for p in leaving if p.is_relative_to(layout.results)]
        lines = move_aside(results_files, layout, "belong to another config (not reused by this one)", now)
        remove_outputs(leaving)
        return lines
    lines = move_aside(
        orphan_outputs(layout, plan), layout, "belong to another config or plan (not in this one)", now
    )
    if report_rule in remade.rules:
        lines += move_aside([layout.report_html], layout, "describe an earlier run (remade by this one)", now)
    remove_outputs(remade_by_run(layout, remade))
    return lines
