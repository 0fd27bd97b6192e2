"""What ``regen tune --sweep`` prints from its pilot file (:class:`regen.pilot_file.PilotFile`): the
candidates ranked by the rate the sweep chose by (:attr:`regen.tune.sweep.CandidateResult.rate_tok_s`), one
best (the starred row, the table's highest), the whole run's projection and what is left; once every
sample is finished, that the run is done and what its generate jobs took (their Snakemake benchmarks).
"""

from __future__ import annotations

from regen.generate.run_progress import fmt_duration
from regen.layout.run import RunLayout
from regen.pilot_file import PilotFile, PilotProjection


def generate_job_seconds(layout: RunLayout) -> float | None:
    """Seconds the planned shards' generate jobs ran, summed from their Snakemake benchmarks
    (``benchmarks/generate/{shard}.tsv``, column ``s``); None when none was written."""
    total, seen = 0.0, False
    for shard in layout.shard_files():
        try:
            header, row, *_ = layout.benchmark("generate", shard.stem).read_text().splitlines()
            total += float(row.split("\t")[header.split("\t").index("s")])
        except (OSError, ValueError):
            continue
        seen = True
    return total if seen else None


def _projection_line(what: str, section: PilotProjection) -> str:
    p, at_least = section.projection, "at least " if section.lower_bound else ""
    return (
        f"{what}: {p.remaining_samples:,} samples x {at_least}{p.tokens_per_sample:.1f} tokens on "
        f"{p.servers} server(s) of tp={p.tp}: wall {at_least}{fmt_duration(p.wall_s)}, "
        f"{p.gpu_hours:.2f} GPU-hours"
    )


def best_lines(pilot: PilotFile) -> list[str]:
    """The one best (the starred row: the table's highest rate tok/s), how that rate was measured, and
    where the client's window ranks another candidate first."""
    best = pilot.best
    if best is None:
        return [f"best: {pilot.best_label}"]
    lines = [
        f"best: {best.label} (*), {best.rate:,.0f} tok/s per server, the highest rate tok/s",
        f"  rate tok/s: {pilot.rate_method}; client tok/s: completions finished in the pilot's window",
    ]
    by_client = max((r for r in pilot.candidates if r.ok), key=lambda r: r.out_tok_s or 0.0)
    if (by_client.out_tok_s or 0.0) > (best.out_tok_s or 0.0):
        lines.append(
            f"  by the client's window {by_client.label} finished more ({by_client.out_tok_s:,.0f} vs "
            f"{best.out_tok_s:,.0f} tok/s): short windows count few completions; the rate decides"
        )
    return lines


def render_result(pilot: PilotFile, job_seconds: float | None = None) -> str:
    """The sweep's table and verdict. ``job_seconds``: what the generate jobs took (shown once done)."""
    head = (
        f"{'candidate':<14}{'cap':>6}{'rate tok/s':>12}{'client tok/s':>14}{'req/s':>9}{'p50':>7}{'p99':>7}"
    )
    lines = [head + "  args"]
    for i, row in enumerate(pilot.candidates):
        mark = "*" if i == pilot.best_index else " "
        if not row.ok:
            lines.append(f"{mark}{row.label:<13}{'':>6}{'failed':>12}  {row.error}")
            continue
        lines.append(
            f"{mark}{row.label:<13}{row.concurrency:>6}{row.rate:>12,.0f}{row.out_tok_s:>14,.0f}"
            f"{row.req_s:>9.2f}{row.lengths['p50']:>7}{row.lengths['p99']:>7}  " + " ".join(row.args)
        )
    lines += ["", *best_lines(pilot)]
    whole, left = pilot.projection_whole_run, pilot.projection
    whole_samples = whole.projection.remaining_samples if whole else 0
    if whole and whole_samples:
        lines.append(_projection_line("whole run", whole))
    if left is None:
        lines.append("remaining: no projection in the pilot file")
    elif left.projection.remaining_samples == 0 and whole_samples:
        took = "" if job_seconds is None else f"; its generate jobs ran {fmt_duration(job_seconds)} in all"
        lines.append(f"the run is done: all {whole_samples:,} samples are finished{took}")
    else:
        lines.append(_projection_line("remaining", left))
    lines += modelled_lengths_line(pilot)
    if pilot.mtp:
        lines.append(str(pilot.mtp["why"]))
    return "\n".join(lines)


def modelled_lengths_line(pilot: PilotFile) -> list[str]:
    """A line when the pilot's unfinished answers were modelled (:mod:`regen.tune.length_fit`)."""
    censored = pilot.censored_lengths
    model = censored.get("model")
    if not model:
        return []
    return [
        f"lengths: {censored['unfinished']} of the pilot's {censored['first_attempts']} samples were "
        f"unfinished, modelled as longer than {model['censored_at']} tokens (a log-normal fitted with "
        f"right-censoring): {model['mean_tokens']:.0f} tokens a sample"
    ]
