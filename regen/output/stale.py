"""Every output belongs to the config that made it: what a run does with the files of other runs.

A checkout is reused: the demo, then a config of one's own, then the demo again. Snakemake remakes
the outputs of the jobs it plans, but it leaves alone what the current plan does not name (shards
beyond the current count, the trainer exports of a run whose ``export.enabled`` is now false, an
upload record) and, until their jobs run, the outputs it is about to remake. Both would be read,
counted, exported or declared READY as if they were the current run's (issue 34 item 1, item 2).

So when a run starts (the workflow's ``onstart``, never on a dry run):

- **orphans**, files the current plan does not name, are moved aside under
  ``RunLayout.stale_dir`` (``work/stale/{stamp}/``, their paths kept) with a message naming them:
  they may be another config's finished work, so nothing is deleted;
- **outputs about to be remade** (those of every job Snakemake will run, their gates' kept verdicts,
  and the status files of the shards they regenerate) are removed now rather than when their job
  starts, so a run that fails before their job leaves no earlier READY, export or verdict standing
  as if it were current. The journals (``work/journal``) are never touched: they are the finished work
  a rerun replays.
- the HTML report ``snakemake --report`` wrote last (``RunLayout.report_html``) is moved aside when
  the report's pages are remade: it describes a run that is no longer the current one.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from regen.layout import RunLayout, is_shard_name


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
    statuses = [layout.status(shard) for shard in sorted(remade.generated_shards)]
    return [*remade.outputs, *verdicts, *statuses, layout.failed_run_landing]


def settle_outputs(
    layout: RunLayout, plan: PlannedOutputs, remade: RemadeOutputs, report_rule: str, now: float | None = None
) -> list[str]:
    """At the start of a run: move the orphans of other configs and plans aside, and remove what the
    run will remake (see the module's docstring); the messages saying what moved."""
    lines = move_aside(
        orphan_outputs(layout, plan), layout, "belong to another config or plan (not in this one)", now
    )
    if report_rule in remade.rules:
        lines += move_aside([layout.report_html], layout, "describe an earlier run (remade by this one)", now)
    remove_outputs(remade_by_run(layout, remade))
    return lines
