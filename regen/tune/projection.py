"""The run projection: how long the remaining completions take at a measured rate, and on how many GPUs.

The plan counts completions, not prompts: a run of sampling variants (``generate.variants``) asks each
prompt for the variants' ``n`` together (``GenerateConfig.completions_per_prompt``), and the pilot's
tokens per request are tokens per completion, so the remaining work is prompts x completions per prompt,
less the completions the journals hold.

One formula (:func:`project`), used by ``regen tune --sweep`` (``results/plan/pilot.json``), by
``regen status`` (re-projected for the samples left now) and by the report.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from regen.generate.journal import read_heads
from regen.layout.run import RunLayout
from regen.pilot_file import PilotFile, Projection
from regen.records import record_id
from regen.runconfig import GenerateConfig


class ProjectionError(RuntimeError):
    """A projection that cannot be made (no rate, no server fits)."""


@dataclass(frozen=True, slots=True)
class Remaining:
    """The run's work in completions: ``samples`` prompts x ``completions_per_sample`` (the variants' n
    together), ``finished`` of them in the journals."""

    shards: int
    samples: int
    finished: int
    completions_per_sample: int = 1

    @property
    def completions(self) -> int:
        """Every completion the run asks for."""
        return self.samples * self.completions_per_sample

    @property
    def remaining(self) -> int:
        """Completions not yet in the journals."""
        return self.completions - self.finished


def shard_ids(path: str | os.PathLike[str]) -> list[str]:
    import pyarrow.parquet as pq

    return [str(x) for x in pq.read_table(path, columns=["id"]).column("id").to_pylist()]


def completion_ids(sample_ids: list[str], generate: GenerateConfig | None) -> set[str]:
    """The record ids the run asks for of ``sample_ids``: one per (variant, k) (``regen.records.record_id``;
    the sample ids themselves with one variant of one completion, or no ``generate`` given)."""
    if generate is None or generate.plain_ids:
        return set(sample_ids)
    pairs = [(v.name, k) for v in generate.variants() for k in range(v.n)]
    return {record_id(sid, name, k, plain=False) for sid in sample_ids for name, k in pairs}


def count_remaining(
    results_dir: str | os.PathLike[str],
    work_dir: str | os.PathLike[str],
    generate: GenerateConfig | None = None,
) -> Remaining:
    """Completions of the samples in ``results/shards/*.parquet`` (each one per variant and k of
    ``generate``; one per sample when None) less those finished in ``work/journal/{shard}.jsonl``."""
    layout = RunLayout(results=Path(results_dir), work=Path(work_dir))
    shards = layout.shard_files()
    total = finished = 0
    for shard in shards:
        sample_ids = shard_ids(shard)
        total += len(set(sample_ids))
        wanted = completion_ids(sample_ids, generate)
        done = {head.id for head in read_heads(layout.journal(shard.stem)).heads}
        finished += len(wanted & done)
    per = generate.completions_per_prompt if generate is not None else 1
    return Remaining(shards=len(shards), samples=total, finished=finished, completions_per_sample=per)


def project(
    remaining_samples: int, tokens_per_sample: float, out_tok_s_per_server: float, gpus: int, tp: int
) -> Projection:
    """wall = remaining x tokens/sample / (tok/s per server x servers); GPU-hours = wall x servers x tp."""
    if out_tok_s_per_server <= 0:
        raise ProjectionError("cannot project from a measured rate of 0 tok/s")
    servers = gpus // tp
    if servers < 1:
        raise ProjectionError(f"{gpus} GPU(s) cannot hold one server of tp={tp}")
    tokens = remaining_samples * tokens_per_sample
    wall = tokens / (out_tok_s_per_server * servers)
    return Projection(
        remaining_samples=remaining_samples,
        tokens_per_sample=tokens_per_sample,
        out_tok_s_per_server=out_tok_s_per_server,
        gpus=gpus,
        tp=tp,
        servers=servers,
        remaining_output_tokens=tokens,
        wall_s=wall,
        gpu_hours=wall * servers * tp / 3600,
    )


PROJECTION_ASSUMPTIONS = (
    "every server sustains the best candidate's measured output tok/s (same model, flags, GPU kind)",
    "remaining completions (prompts x the variants' n) produce the pilot's mean completion tokens each "
    "(same sampling and thinking)",
    "servers scale linearly; server startup, retries and stragglers at the end of shards are not counted",
    "GPU-hours count every GPU of every server for the whole wall time",
)


def completion_words(generate: GenerateConfig) -> str:
    """``4 completions per prompt (hot 2, plain 2)``: what the run asks of each prompt."""
    per = generate.completions_per_prompt
    each = ", ".join(f"{v.name} {v.n}" for v in generate.variants())
    return f"{per} completion{'s' if per != 1 else ''} per prompt ({each})"


def completion_notes(generate: GenerateConfig, pilot_path: str | os.PathLike[str]) -> list[str]:
    """``regen check``'s notes on a run of more than one completion per prompt: the work is prompts x
    completions, and a pilot projection (``pilot_path``) made for another count is stale. Nothing for a
    run of one completion per prompt whose pilot (if any) counted one too."""
    per = generate.completions_per_prompt
    out = []
    if per != 1:
        out.append(
            f"generate.variants: {completion_words(generate)}: the plan's projection, its GPU-hours and "
            f"the disk check count {per} x the prompts"
        )
    try:
        pilot = PilotFile.read(pilot_path)
    except (OSError, ValueError):
        return out
    if pilot is None:
        return out
    was = pilot.completions_per_sample
    if was != per:
        out.append(
            f"{pilot_path}: its projection counted {was} completion(s) per prompt, the config asks for "
            f"{per}: rerun regen tune --sweep for a projection of this run"
        )
    return out
