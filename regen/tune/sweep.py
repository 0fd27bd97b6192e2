"""``regen tune --sweep``: benchmark a few candidate server configs live, keep the fastest, project the run.

For each candidate (a complete SGLang launch-arg list, the tuner's recommendation first) the sweep starts
a server through :func:`regen.serving.lifecycle.acquire_server` (a private slot directory per candidate),
drives it with the real generation client (:func:`regen.generate.client.generate_shard_async`, concurrency
= the
server's effective running cap, a fresh journal) for a bounded time, cancels the client when the time
is up, stops the server and measures, from the journal:

- output tok/s and requests/s: completion tokens (and requests) that *finished* inside the measurement
  window ``[start + warmup, stop]``, divided by the window. In steady state the completion flow equals
  the generation flow; the warmup skips the ramp where no request has finished yet;
- the output-length distribution (p50/p90/p99 completion tokens, truncation rate) of completed requests.
  Requests still running at the stop are *censored* (not counted); their number is reported because
  many of them bias the lengths short;
- the server's own steady-state decode rate (:mod:`regen.serving.metrics`): the median ``gen throughput``
  of the server log's ``Decode batch`` lines at the ``#running-req`` plateau during the pilot (``/metrics``
  samples when the log has none). This is the rate candidates are ranked and the run projected by
  (:attr:`CandidateResult.rate_tok_s`); the client window rate stays as a fallback and a cross-check: with
  long outputs a short window sees few completions, while the server counts every generated token.

Each candidate's server listens on a port the OS reports free (not ``server.port_base + slot``), so a
sweep run while a generation holds its slots' ports cannot collide with them.

The pilot prompts are cycled (repeats get an id suffix ``~r{k}``, so a different seed) so the server
stays saturated for the whole window whatever the pilot size.

The best candidate (highest output tok/s) and the per-sample completion tokens then project the wall
time and GPU-hours of the remaining samples (``results/shards/*.parquet`` minus the ids finished in
``work/journal/*.jsonl``), written to ``results/plan/pilot.json`` and shown by ``regen status`` and the
report's ``server_plan.html``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from regen.generate.client import ProgressOptions, ShardFailedError, ShardJob, generate_shard_async
from regen.io import write_json
from regen.layout.beside import ScratchShardFiles
from regen.layout.slots import SweepCandidateFiles
from regen.pilot_file import PilotFile
from regen.runconfig import GenerateConfig, ServerConfig
from regen.serving.base import ServerError
from regen.serving.lifecycle import acquire_server, build_server_command, mode_of, stop_all_servers
from regen.serving.metrics import (
    log_since,
    log_size,
    server_steady_state,
)
from regen.serving.ports import any_free_port
from regen.serving.simulated_mode import build_simulated_command
from regen.sglang.config import PlanFile
from regen.sglang.flags import parse_flags
from regen.tune.closedloop import DETERMINISTIC_FLAG, StepModel, Truncation, closed_loop_wall_s
from regen.tune.length_fit import CensoredLogNormal, fit_censored_lognormal
from regen.tune.pilot import (
    DEFAULT_WARMUP_FRACTION,
    REPEAT_MARK,
    CandidateResult,
    LengthStats,
    PilotMeasurement,
    SweepCandidate,
    SweepError,
    SweepResult,
    choose,
    drive_pilot,
    mtp_decision,
)  # the pilot's types and driver, re-exported
from regen.tune.projection import PROJECTION_ASSUMPTIONS, Remaining, project
from regen.types import Endpoint, Sample

log = logging.getLogger("regen.tune.sweep")


# -------------------------------------------------------------------------------- sweep --
def sweep_server_cfg(cfg: ServerConfig) -> ServerConfig:
    """The server config each candidate runs with: the candidate's args are complete (user args are
    already in them), the plan is used, and the simulated cap follows the plan."""
    if cfg.simulated.max_running_requests:
        log.warning("sweep: server.simulated.max_running_requests ignored: each cap follows its plan")
    return dataclasses.replace(
        cfg,
        use_tuner=True,
        args=(),
        gpus=cfg.tp,  # one slot: the sweep measures one server at a time
        simulated=dataclasses.replace(cfg.simulated, max_running_requests=None),
    )


WARM_UP_MAX_TOKENS = 8


def warm_up(endpoint: Endpoint, sample: Sample, generate_cfg: GenerateConfig, workdir: Path) -> float:
    """One real request (the first pilot prompt, a few tokens) before the measurement window, so that a
    server's first-request costs stay out of it; its seconds. (SGLang 0.5.17 on a fresh H200 machine
    builds flashinfer's sampling kernels on the first top-k/top-p request, ~110 s with nothing served;
    the readiness probe now pays that, see ``one_token_generation``; this keeps any other first-use
    cost out of the window too.)"""
    sampling = dataclasses.replace(generate_cfg.sampling, max_tokens=WARM_UP_MAX_TOKENS)
    gcfg = dataclasses.replace(generate_cfg, sampling=sampling, concurrency=1)
    workdir.mkdir(parents=True, exist_ok=True)
    scratch = ScratchShardFiles.in_dir(workdir)
    for path in scratch.all():
        path.unlink(missing_ok=True)
    one = dataclasses.replace(sample, id=f"{sample.id}{REPEAT_MARK}warmup")
    t0 = time.monotonic()
    asyncio.run(
        generate_shard_async(ShardJob([one], *scratch.all(), gcfg, endpoint, "warmup",
                                      ProgressOptions(log_every_s=3600.0, status_path=None, bar=False)))
    )  # fmt: skip
    return time.monotonic() - t0


def sweep_command_builder(server_cfg: ServerConfig, plan: PlanFile | None, port: int,
                          model_path: str) -> list[str]:  # fmt: skip
    """The workflow's server command, plus the simulated batch model (``simulated.half_speed_running``)."""
    if server_cfg.mode != "simulated":
        return build_server_command(server_cfg, plan, port, model_path)
    argv = build_simulated_command(server_cfg, port, model_path, plan)
    half = server_cfg.simulated.half_speed_running
    if half and "--half-speed-running" not in argv:
        argv += ["--half-speed-running", str(int(half))]
    return with_speculative_steps(argv, list(plan.launch_args) if plan is not None else [])


def with_speculative_steps(argv: list[str], launch_args: list[str]) -> list[str]:
    """A simulated server's command with the candidate's speculative steps in its ``--options`` (a real
    SGLang reads them from its flags; the acceptance comes from ``SGLANG_SIMULATE_ACC_LEN``, as SGLang's)."""
    flags = parse_flags(launch_args)
    if not flags.speculative_algorithm:
        return argv
    steps = flags.speculative_num_steps or 3
    out = list(argv)
    if "--options" in out:
        i = out.index("--options")
        options = json.loads(out[i + 1])
        out[i + 1] = json.dumps({**options, "speculative_num_steps": steps}, sort_keys=True)
        return out
    return [*out, "--options", json.dumps({"speculative_num_steps": steps})]


def candidate_plan(candidate: SweepCandidate) -> PlanFile:
    """A plan with the candidate's args; its predicted cap drives the simulated server."""
    cap = int(candidate.predicted_running or 0)
    recommended = {"effective_max_running_requests": cap} if cap else {}
    return PlanFile(tuple(candidate.args), launched="recommended", given={}, recommended=recommended)


def as_candidates(candidates: Iterable[SweepCandidate | Sequence[str]]) -> list[SweepCandidate]:
    """Candidates from SweepCandidate or plain arg lists; duplicates (same args) dropped, order kept."""
    out: list[SweepCandidate] = []
    seen: set[tuple[str, ...]] = set()
    for i, c in enumerate(candidates):
        cand = c if isinstance(c, SweepCandidate) else SweepCandidate(tuple(str(a) for a in c))
        if not cand.label:
            cand = dataclasses.replace(cand, label=f"candidate {i}")
        if cand.args in seen:
            continue
        seen.add(cand.args)
        out.append(cand)
    if not out:
        raise SweepError("no candidate configs to sweep")
    return out


#: what a caller puts between a candidate's server and its pilot: takes the server's endpoint and yields
#: the one the pilot drives (a bench's proxy, ``bench.length_proxy.behind_proxy``); the server by default
EndpointWrapper = Callable[[Endpoint], contextlib.AbstractContextManager[Endpoint]]


@dataclasses.dataclass(frozen=True, slots=True)
class SweepTimes:
    """How long a sweep's steps may take besides each candidate's measured window."""

    #: after each pilot's window, seconds it sends nothing new and lets the batch fall; None:
    #: :data:`regen.tune.pilot.DEFAULT_DRAIN_FRACTION` of the window
    drain_s: float | None = None
    #: no candidate after the first starts once this many seconds have passed since the sweep began
    #: (None: no budget)
    budget_s: float | None = None
    #: how long a candidate's server may take to stop before it is killed
    stop_grace_s: float = 30.0


def run_sweep(
    server_cfg: ServerConfig,
    candidates: Iterable[SweepCandidate | Sequence[str]],
    samples: Sequence[Sample],
    generate_cfg: GenerateConfig,
    seconds_per_candidate: float,
    workdir: str | os.PathLike[str],
    *,
    times: SweepTimes | None = None,
    endpoint_wrapper: EndpointWrapper = contextlib.nullcontext,
) -> SweepResult:
    """Benchmark each candidate for ``seconds_per_candidate`` (plus its server's startup, a warm-up of
    :data:`DEFAULT_WARMUP_FRACTION` of it, and its pilot's drain, ``times.drain_s``) and keep the best;
    ``times`` None: :class:`SweepTimes`' defaults.

    A candidate whose server does not start or fails the pilot is a row with ``ok=False`` (e.g. an
    aggressive config that runs out of memory); the sweep raises :class:`SweepError` only when no
    candidate could be measured. Every candidate's server is stopped before the next one starts.
    With ``times.budget_s``, no candidate after the first starts once that many seconds have passed since
    the sweep began: the rest are rows with ``ok=False`` saying so (order candidates by priority).
    ``endpoint_wrapper`` gives the pilot another endpoint in front of each candidate's server (its
    supervisor, logs and steady-state reading stay the server's own).
    """
    if seconds_per_candidate <= 0:
        raise SweepError(f"seconds per candidate must be > 0, got {seconds_per_candidate}")
    samples = list(samples)
    if not samples:
        raise SweepError("the pilot has no samples")
    cands = as_candidates(candidates)
    cfg = sweep_server_cfg(server_cfg)
    warm = seconds_per_candidate * DEFAULT_WARMUP_FRACTION
    times = times or SweepTimes()
    budget_s = times.budget_s
    root = Path(workdir)
    rows: list[CandidateResult] = []
    began = time.monotonic()
    for i, cand in enumerate(cands):
        if i > 0 and budget_s is not None and time.monotonic() - began > budget_s:
            why = f"not started: the sweep's {budget_s:g} s budget was spent"
            log.warning("sweep: %s %s", cand.label, why)
            rows.append(CandidateResult(cand.label, cand.args, cand.predicted_running, False, why))
            continue
        scratch = SweepCandidateFiles.of(root, i)
        servers = scratch.servers
        log.info("sweep: %s (%s), predicted cap %s", cand.label, " ".join(cand.args), cand.predicted_running)
        # a port the kernel picks from its ephemeral range: never one of the ``server.port_base + slot``
        # ports a running generation holds or is about to take
        cand_cfg = dataclasses.replace(cfg, port_base=any_free_port(cfg.host))
        server_log = scratch.server_log
        try:
            with acquire_server(
                cand_cfg, candidate_plan(cand), servers, scratch.logs,
                owner_pid=os.getpid(), command_builder=sweep_command_builder,
                command_check=mode_of(cand_cfg).launch_check,
            ) as server, endpoint_wrapper(server) as endpoint:  # fmt: skip
                first = warm_up(endpoint, samples[0], generate_cfg, scratch.warmup_dir)
                offset = log_size(server_log)
                m = drive_pilot(endpoint, samples, generate_cfg, seconds_per_candidate,
                                scratch.pilot_journal, warm, drain_s=times.drain_s)  # fmt: skip
                m = dataclasses.replace(
                    m,
                    server=server_steady_state(log_since(server_log, offset), m.polled),
                    first_request_s=first,
                )
            rows.append(CandidateResult(cand.label, cand.args, cand.predicted_running, True, None, m))
            log.info(
                "sweep: %s: steady decode %s tok/s (%s running); client %.1f out tok/s, %.2f req/s at "
                "concurrency %d (%d unfinished at stop)",
                cand.label, f"{m.server.median_tps:.1f}" if m.server else "-",
                m.server.plateau_running if m.server else "-", m.out_tok_s, m.req_s, m.concurrency,
                m.unfinished_at_stop,
            )  # fmt: skip
            if m.server is None and m.window_s < 3 * m.latency_p90_s:
                log.warning(
                    "sweep: %s: the %.0f s window is shorter than 3x the p90 latency (%.1f s): tok/s and "
                    "lengths are biased low; raise --seconds",
                    cand.label, m.window_s, m.latency_p90_s,
                )  # fmt: skip
        except (ServerError, ShardFailedError) as exc:
            log.warning("sweep: %s failed: %s", cand.label, exc)
            rows.append(CandidateResult(cand.label, cand.args, cand.predicted_running, False, str(exc)))
        finally:
            stop_all_servers(servers, grace_s=times.stop_grace_s)
    measured = [i for i, r in enumerate(rows) if r.ok and r.measurement is not None]
    if not measured:
        errors = "; ".join(f"{r.label}: {r.error}" for r in rows)
        raise SweepError(f"no candidate could be measured: {errors}")
    best = measured[choose([rows[i].rate_tok_s for i in measured])]
    return SweepResult(tuple(rows), best, float(seconds_per_candidate), float(warm), len(samples))


# --------------------------------------------------------------------------- projection --
#: the pilot's falling batch fits the step line's fixed part only once it fell to this share of the plateau,
#: in at least FALLING_LINES decode lines (lines just under the plateau, or one line alone, leave the
#: intercept to the noise of one 40-step decode line)
FALLING_SPAN = 0.5
FALLING_LINES = 3


def step_model_of(result: SweepResult, fixed_step_s: float = 0.0) -> StepModel | None:
    """The decode-step cost line: through the best candidate's plateau with ``fixed_step_s`` as its
    batch-independent part (e.g. the weights over the memory bandwidth) when given; else fitted to its
    plateau and its pilot's falling batch after it (the drain's small batches show the batch-independent
    part: on the H200, 2026-12-03, a plateau-only line put the 800-prompt race's drain at 23 s against 69
    measured, and the projection 29% short); else to the plateaus of the candidates that share the best one's
    state dtype. None without a server reading."""
    best = result.best
    m = best.measurement
    if m is None or m.server is None:
        return None
    if fixed_step_s > 0:
        step = StepModel.from_plateau(m.server.plateau_running, m.server.median_tps, fixed_step_s)
        return based_on(step, "the best pilot's plateau and the given fixed part")
    plateau, falling = m.server.plateau_running, m.server.falling
    lowest = min((b for b, _ in falling), default=plateau)
    if lowest <= plateau * FALLING_SPAN and len(falling) >= FALLING_LINES:
        return based_on(StepModel.fit(m.server.step_points()), "the best pilot's plateau and falling batch")
    short = (
        f"; the pilot's batch fell to {lowest} of {plateau} running in {len(falling)} decode lines, too "
        f"little to fit (below {FALLING_SPAN:.0%} in {FALLING_LINES} lines)"
        if falling else ""
    )  # fmt: skip

    def dtype(args: Sequence[str]) -> str | None:
        a = list(args)
        return a[a.index("--mamba-ssm-dtype") + 1] if "--mamba-ssm-dtype" in a[:-1] else None

    points = [
        (r.measurement.server.plateau_running, r.measurement.server.median_tps)
        for r in result.rows
        if r.ok and r.measurement is not None and r.measurement.server is not None
        and dtype(r.args) == dtype(best.args)
    ]  # fmt: skip
    source = f"the plateaus of {len(points)} candidates of the best one's state dtype{short}"
    return based_on(StepModel.fit(points), source)


def based_on(step: StepModel, source: str) -> StepModel:
    """``step`` with the measurements it was drawn from in front of how it was drawn."""
    return dataclasses.replace(step, basis=f"{source}: {step.basis}")


def closed_loop_projection(
    result: SweepResult, remaining: int, gpus: int, tp: int, *, lengths: Sequence[int] | None = None,
    fixed_step_s: float = 0.0, seed: int = 0, pool: Sequence[int] | None = None,
) -> dict[str, Any] | None:  # fmt: skip
    """Wall time and GPU-hours with the start burst and the drain (:mod:`regen.tune.closedloop`): each server
    takes an equal share of ``remaining`` samples whose output lengths are ``lengths`` (default: drawn from
    ``pool``, else the pilot's completed lengths) at the best candidate's concurrency, after the ramp its
    pilot measured. None without a server reading."""
    step = step_model_of(result, fixed_step_s)
    best = result.best.measurement
    if step is None or best is None or remaining <= 0:
        return None
    servers = max(1, gpus // tp)
    if lengths is None:
        pool = (
            list(pool or ())
            or list(best.completion_tokens)
            or [t for r in result.rows if r.measurement is not None for t in r.measurement.completion_tokens]
        )
        if not pool:
            return None
        rng = random.Random(seed)
        lengths = [rng.choice(pool) for _ in range(remaining)]
    per_server = list(lengths)[::servers] if servers > 1 else list(lengths)
    est = closed_loop_wall_s(per_server, best.concurrency, step, result.best.ramp_s or 0.0)
    return {
        **est.to_json(),
        "servers": servers,
        "gpu_hours": est.wall_s * servers * tp / 3600,
        "step_model": {"fixed_s": step.fixed_s, "per_request_s": step.per_request_s, "basis": step.basis},
    }


#: above this share of the pilot's samples unfinished at the end of its window, and with no length model
#: fitted (:mod:`regen.tune.length_fit`), the completed lengths are the short answers only: the
#: length-derived projections are lower bounds, and say so
CENSORED_SHARE_LIMIT = 0.10


@dataclasses.dataclass(frozen=True, slots=True)
class CensoredLengths:
    """How many of the pilot's distinct samples never finished in its windows (their lengths unseen), and
    the lengths the projections use: the finished first attempts, plus one modelled length per unfinished
    one when a censored log-normal could be fitted (``modelled``), each as the tokens its request slot
    decodes under the truncation policy (``retried``: modelled answers past ``max_tokens``, counted with
    their retry; :class:`regen.tune.closedloop.Truncation`)."""

    first_attempts: int
    unfinished: int
    finished_lengths: tuple[int, ...] = ()
    lengths: tuple[int, ...] = ()
    fit: CensoredLogNormal | None = None
    truncation: Truncation | None = None
    retried: int = 0

    @classmethod
    def of(
        cls, finished: Sequence[int], unfinished: int, first_attempts: int, truncation: Truncation | None
    ) -> CensoredLengths:
        """The pilot's ``finished`` first-attempt lengths with its ``unfinished`` ones modelled
        (:func:`regen.tune.length_fit.fit_censored_lognormal`), as their slots decode them under
        ``truncation`` (None: as long as modelled)."""
        fit = fit_censored_lognormal(finished, unfinished)
        modelled = (*finished, *(fit.tail_lengths(None) if fit is not None else ()))
        if truncation is None:
            return cls(first_attempts, unfinished, tuple(finished), modelled, fit)
        slots = tuple(truncation.slot_tokens(modelled))
        retried = truncation.retried(modelled)
        return cls(first_attempts, unfinished, tuple(finished), slots, fit, truncation, retried)

    @property
    def share(self) -> float:
        return self.unfinished / self.first_attempts if self.first_attempts else 0.0

    @property
    def modelled(self) -> bool:
        return self.fit is not None

    @property
    def lower_bound(self) -> bool:
        return self.share > CENSORED_SHARE_LIMIT and not self.modelled

    @property
    def mean_tokens(self) -> float | None:
        return sum(self.lengths) / len(self.lengths) if self.lengths else None

    def sentence(self, result: SweepResult) -> str:
        head = (
            f"{self.unfinished} of the pilot's {self.first_attempts} samples ({self.share:.0%}) were still "
            "running when their time was up"
        )
        finished = sum(self.finished_lengths) / len(self.finished_lengths) if self.finished_lengths else 0.0
        if self.fit is not None:
            fit = self.fit
            return (
                f"{head}: each is put back as longer than the longest finished answer ({fit.censored_at} "
                "tokens), at a quantile of the log-normal fitted to both by maximum likelihood with "
                f"right-censoring (mu {fit.mu:.2f}, sigma {fit.sigma:.2f}; regen.tune.length_fit): "
                f"{self.mean_tokens:.0f} tokens a sample against {finished:.0f} for the finished answers "
                f"alone{self.retry_clause()}. A length law that is not log-normal moves this; a longer "
                "--seconds measures more"
            )
        if not self.lower_bound:
            return f"{head} and are not in the length distribution (long outputs slightly under-represented)"
        best = result.best.measurement
        seen = max(best.completion_tokens, default=0) if best is not None else 0
        return (
            f"{head} and are not in the length distribution: the mean length is that of the answers up "
            f"to ~{seen} tokens only, so every projection here is a LOWER BOUND (over "
            f"{CENSORED_SHARE_LIMIT:.0%} unfinished); a longer --seconds (or fewer --pilot-samples than the "
            "running cap) lets the long answers finish"
        )

    def retry_clause(self) -> str:
        """What the truncation policy added to the modelled lengths, as a clause ('' when nothing)."""
        t = self.truncation
        if t is None or not self.retried:
            return ""
        if t.policy != "retry":
            return f" ({self.retried} of them cut at max_tokens {t.limit}: truncation {t.policy})"
        again = "the same answer again" if t.replays else "a fresh answer"
        return (
            f"; {self.retried} of them run past max_tokens {t.limit} and are counted as {t.limit} tokens "
            f"plus their retry's ({again}, at most {t.retry_limit}), as the client sends it in the same slot"
        )

    def to_json(self) -> dict[str, Any]:
        fit, t = self.fit, self.truncation
        return {"first_attempts": self.first_attempts, "unfinished": self.unfinished,
                "share": round(self.share, 4), "lower_bound": self.lower_bound,
                "model": None if fit is None else {
                    "law": "log-normal, right-censored at the longest finished (regen.tune.length_fit)",
                    "mu": round(fit.mu, 4), "sigma": round(fit.sigma, 4), "censored_at": fit.censored_at,
                    "mean_tokens": round(self.mean_tokens or 0.0, 1), "retried": self.retried,
                    "truncation": None if t is None else {"max_tokens": t.limit, "policy": t.policy,
                                                          "retry_max_tokens": t.retry_limit,
                                                          "replays": t.replays}},
                "finished_lengths": list(self.finished_lengths)}  # fmt: skip


def run_truncation(generate_cfg: GenerateConfig, server_args: Sequence[str]) -> Truncation:
    """The run's truncation policy (``generate.truncation``, ``sampling.max_tokens``,
    ``retry_max_tokens_factor``) on a server launched with ``server_args``."""
    return Truncation(
        generate_cfg.sampling.max_tokens, generate_cfg.truncation.modelled,
        generate_cfg.retry_max_tokens_factor, replays=DETERMINISTIC_FLAG in server_args,
    )  # fmt: skip


def censored_share(result: SweepResult, truncation: Truncation | None = None) -> CensoredLengths:
    """The censored share over every measured candidate's pilot, and the lengths with the unfinished
    ones modelled (:func:`regen.tune.length_fit.fit_censored_lognormal`), as their slots decode them under
    ``truncation`` (None: as long as modelled). A finished answer that was itself a truncation retry counts
    as its retry's length: a first attempt cut at ``max_tokens`` outlasts most pilot windows."""
    ms = [r.measurement for r in result.rows if r.measurement is not None]
    finished = [t for m in ms for t in m.completion_tokens]
    unfinished = sum(m.first_attempts_unfinished for m in ms)
    return CensoredLengths.of(finished, unfinished, sum(m.first_attempts for m in ms), truncation)


def pilot_report(
    result: SweepResult, remaining: Remaining, gpus: int, tp: int, *, extra: Mapping[str, Any] | None = None,
    truncation: Truncation | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The content of ``results/plan/pilot.json``: projections from the pilot's lengths with its
    unfinished answers modelled under the run's ``truncation`` policy (:func:`censored_share`)."""
    lengths = result.pooled_lengths()
    censored = censored_share(result, truncation)
    per_sample = censored.mean_tokens if censored.modelled else lengths.mean
    proj = project(remaining.remaining, per_sample, result.best.rate_tok_s, gpus, tp)
    assumptions = list(PROJECTION_ASSUMPTIONS)
    if censored.unfinished:
        assumptions.append(censored.sentence(result))
    pool = list(censored.lengths) if censored.modelled else None
    closed = closed_loop_projection(result, remaining.remaining, gpus, tp, pool=pool)
    whole = project(remaining.completions, per_sample, result.best.rate_tok_s, gpus, tp)
    bound = {"lower_bound": censored.lower_bound}
    return {
        "created_at": time.time(),
        **result.to_json(),
        "remaining": {
            **dataclasses.asdict(remaining),
            "completions": remaining.completions,
            "remaining": remaining.remaining,
        },
        "projection": {**proj.to_json(), **bound},
        "projection_whole_run": {**whole.to_json(), **bound},
        "projection_closed_loop": None if closed is None else {**closed, **bound},
        "censored_lengths": censored.to_json(),
        "assumptions": assumptions,
        **dict(extra or {}),
    }


def write_pilot(path: str | os.PathLike[str], report: Mapping[str, Any]) -> PilotFile:
    """The one writer of ``results/plan/pilot.json``: ``report`` (:func:`pilot_report`), parsed by the
    reader's own rules first (a report the reader would refuse is never written), then written atomically."""
    pilot = PilotFile.from_json(report, Path(path))
    write_json(path, report)
    return pilot


__all__ = [
    "CandidateResult",
    "LengthStats",
    "PilotMeasurement",
    "SweepCandidate",
    "SweepError",
    "SweepResult",
    "censored_share",
    "choose",
    "drive_pilot",
    "mtp_decision",
    "pilot_report",
    "run_sweep",
    "run_truncation",
    "write_pilot",
]
