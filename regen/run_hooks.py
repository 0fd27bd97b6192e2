"""The run's lifecycle: what the Snakefile's ``onstart``/``onsuccess``/``onerror`` and the DAG's first
moment do, each one call on :class:`RunHooks`.

Built once by ``rules/common.smk`` from the validated config, the typed :class:`regen.runconfig.RunConfig`
and a small view of Snakemake's workflow (:class:`WorkflowView`; :class:`SnakemakeWorkflow` adapts the
real one). Only the main Snakemake process acts: a job's own Snakemake process (a Slurm group member, a
``script:`` job) parses the Snakefile too and must neither mark, move, preflight nor stop anything.

* :meth:`RunHooks.at_dag`: while the DAG is built (``final_outputs``), the first moment the executor and
  the dry run are known: the dry run's replay and features previews, a dead controller's lock released
  (and its Slurm jobs waited for), ``shards.count: auto`` refused on a cluster, a local run's GPU counter
  widened.
* :meth:`RunHooks.on_start`: the run marker (``work/run.json``), other configs' outputs set aside
  (``regen.output.stale``), the preflight (``regen.check``), the servers started early
  (``regen.tune.prestart``).
* :meth:`RunHooks.on_success` / :meth:`RunHooks.on_error`: the servers stopped, the marker's outcome; on
  error also how to go on and the report's NOT READY page.

What only some of these need (the preflight, the replay preview, the prestart) is imported where it is
used: every Snakemake start parses the Snakefile, a Slurm group's members included.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from regen.ingest.dataset import DatasetConfig
from regen.ingest.shard_count import settle_auto_count
from regen.layout.run import RUN, RunLayout
from regen.output.kept_runs import KeepConfig
from regen.output.stale import Identities, KeptOutputs, PlannedOutputs, RemadeOutputs, settle_outputs
from regen.run_marker import (
    MarkerWriter,
    ResultsOf,
    RunMarker,
    config_identity,
    config_name,
    lock_refused_line,
    new_marker,
    release_dead_lock,
)
from regen.runconfig import RunConfig
from regen.runlog import RESUME_HINT

#: a local run with ``--resources gpu=N`` may start this many generate jobs per GPU slot: the next
#: shard's job waits for a slot and takes it the moment the job on it has sent its last sample, so no GPU
#: waits for Snakemake to start a job (``regen.serving.lifecycle.acquire_server``'s ``on_slot``)
JOBS_PER_GPU_SLOT = 2


class RunRefused(Exception):
    """The run cannot go on as configured (the workflow says why as a ``WorkflowError``)."""


class Job(Protocol):
    """What the lifecycle reads of one of Snakemake's DAG jobs."""

    @property
    def output(self) -> Iterable[Any]: ...

    @property
    def input(self) -> Iterable[Any]: ...

    @property
    def rule(self) -> Any: ...

    @property
    def wildcards(self) -> Mapping[str, str]: ...


class WorkflowView(Protocol):
    """The little of Snakemake's workflow the lifecycle uses (tests give their own)."""

    @property
    def is_main_process(self) -> bool: ...

    @property
    def dryrun(self) -> bool: ...

    def executor_known(self) -> bool: ...

    def local_exec(self) -> bool: ...

    def all_jobs(self) -> list[Job]: ...

    def needrun_jobs(self) -> list[Job]: ...

    def set_gpu_counter(self, value: int) -> None: ...


class SnakemakeWorkflow:
    """:class:`WorkflowView` over Snakemake's ``workflow`` object (read when asked: the executor and the
    DAG exist only once the DAG is built)."""

    def __init__(self, workflow: Any) -> None:
        self.workflow = workflow

    @property
    def is_main_process(self) -> bool:
        return bool(self.workflow.is_main_process)

    @property
    def dryrun(self) -> bool:
        return bool(self.workflow.dryrun)

    def executor_known(self) -> bool:
        return self.workflow.executor_plugin is not None

    def local_exec(self) -> bool:
        return bool(self.workflow.local_exec)

    def all_jobs(self) -> list[Job]:
        return list(self.workflow.dag.jobs)

    def needrun_jobs(self) -> list[Job]:
        return list(self.workflow.dag.needrun_jobs())

    def set_gpu_counter(self, value: int) -> None:
        self.workflow.global_resources["gpu"] = value


def given_configfiles(workflow: Any) -> list[str]:
    """The config files of this run as given (``--configfile``), else the Snakefile's."""
    given = [str(f) for f in workflow.config_settings.configfiles]
    return given or [str(f) for f in workflow.configfiles]


def requested_gpus(workflow: Any) -> int | None:
    """N of ``--resources gpu=N``, or None when not given."""
    given = workflow.global_resources.get("gpu")
    value = getattr(given, "value", given)
    return None if value is None else int(value)


@dataclass(frozen=True, slots=True)
class RunSetup:
    """What the Snakefile's parse settled: the validated config, its typed forms, the plan's shards."""

    config: Mapping[str, Any]
    run: RunConfig
    dataset: DatasetConfig
    shards: tuple[str, ...]
    #: N of ``--resources gpu=N`` as given (None: not given)
    requested_gpus: int | None
    configfiles: tuple[str, ...]
    export: bool = False
    publish: bool = False


def _say(line: str) -> None:
    print(line, file=sys.stderr)


@dataclass
class RunHooks:
    """The run's start and end (module docstring); one per Snakemake process."""

    setup: RunSetup
    view: WorkflowView
    layout: RunLayout = RUN
    #: the run's working directory (where its Slurm jobs run)
    workdir: Path = field(default_factory=Path.cwd)
    say: Callable[[str], None] = _say
    #: the controller's hold on the run marker, once :meth:`on_start` wrote it
    marker: MarkerWriter | None = None

    @property
    def identity(self) -> ResultsOf:
        """This run's config name and identity: which config's outputs lie in ``results/``."""
        return ResultsOf(
            config=config_name(self.setup.configfiles),
            config_id=config_identity(self.setup.config, self.setup.run.gpu_slots),
        )

    def local_run(self) -> bool:
        """Snakemake runs the jobs on this node (known once the DAG is built)."""
        return self.view.executor_known() and self.view.local_exec()

    def missing_input_report(self) -> str:
        """When the workflow cannot even build its jobs (the local dataset or the chat template is
        missing): every preflight problem, not only that one."""
        from regen.check import report_for_missing_dataset

        return report_for_missing_dataset(self.setup.config, self.setup.requested_gpus)

    # ------------------------------------------------------------------------------ DAG time --
    def at_dag(self) -> None:
        """While the DAG is built: the dry run's preview, a dead run's lock, ``auto`` on a cluster, the
        GPU counter. Neither earlier (while the Snakefile is parsed every run looks local) nor later (the
        scheduler copies the resources before ``onstart``)."""
        if self.view.dryrun:
            self.print_replay_preview()
            self.print_features_preview()
        if not self.view.is_main_process:
            return
        self.release_lock_of_dead_run()
        self.refuse_auto_count_on_cluster()
        self.widen_gpu_counter()

    def print_replay_preview(self) -> None:
        """How many samples the generate jobs will replay, and how many regenerate and why."""
        from regen.generate.replay import preview_lines

        for line in preview_lines(self.setup.run, self.setup.dataset, self.setup.shards, self.layout):
            self.say(line)

    def print_features_preview(self) -> None:
        """With ``features.enabled``: the features' rows, tokens, bytes and GPU-hours
        (``regen.features.projection``), and the refusal when they do not fit."""
        for line in self.features_preview():
            self.say(line)

    def features_preview(self) -> tuple[str, ...]:
        from regen.features.projection import preview_lines_naming_errors

        return tuple(preview_lines_naming_errors(self.setup.config, self.layout))

    def release_lock_of_dead_run(self) -> None:
        """The lock a provably dead controller of this directory left is released, with one line
        (``regen.run_marker``), and the Slurm jobs it left are waited for, so the DAG adopts their work."""
        line = release_dead_lock(self.layout.run_marker, self.layout.snakemake_locks)
        released = line is not None
        if line is None and not self.view.dryrun:
            line = lock_refused_line(self.layout.run_marker, self.layout.snakemake_locks)
        if line:
            self.say(line)
        if released and not self.view.dryrun:
            from regen.serving.slurm_jobs import wait_for_jobs_left_in

            wait_for_jobs_left_in(self.workdir, self.say)

    def refuse_auto_count_on_cluster(self) -> None:
        """``shards.count: auto`` on a cluster, unless an earlier one-node run settled it: refused (a
        check only; the ``shard_count`` rule writes the count): :class:`RunRefused` says why."""
        on_cluster = self.view.executor_known() and not self.view.local_exec()
        try:
            settle_auto_count(
                self.setup.config["shards"]["count"],
                len(self.setup.shards),
                self.setup.run.gpu_slots,
                on_cluster,
                dry_run=True,
            )
        except ValueError as exc:
            raise RunRefused(str(exc)) from exc

    def widen_gpu_counter(self) -> None:
        """A local run with ``--resources gpu=N`` may start :data:`JOBS_PER_GPU_SLOT` generate jobs per
        GPU slot; Slurm group jobs are left as they are."""
        requested = self.setup.requested_gpus
        if self.local_run() and requested:
            from regen.check import gpu_counter_line

            self.view.set_gpu_counter(JOBS_PER_GPU_SLOT * self.setup.run.gpu_slots)
            self.say(gpu_counter_line(requested, JOBS_PER_GPU_SLOT))

    # ------------------------------------------------------------------------------- onstart --
    def on_start(self) -> None:
        """The run marker, other outputs set aside, the preflight, the servers started early."""
        if not self.view.is_main_process:
            return
        self.begin_run()
        self.settle_run_outputs()
        self.run_preflight()
        self.prestart_gpu_servers()

    def begin_run(self) -> None:
        """The run marker says this run is under way, in its check phase (``regen status``)."""
        previous = RunMarker.read(self.layout.run_marker)
        identity = self.identity
        marker = new_marker(identity.config, identity.config_id, list(self.setup.configfiles), previous)
        self.marker = MarkerWriter(self.layout.run_marker, marker)
        self.marker.start_heartbeat()

    def remade_outputs(self) -> RemadeOutputs:
        """The outputs of every job this run will execute."""
        jobs = self.view.needrun_jobs()
        return RemadeOutputs(
            outputs=tuple(Path(f) for job in jobs for f in job.output),
            rules=frozenset(job.rule.name for job in jobs),
            generated_shards=frozenset(job.wildcards["shard"] for job in jobs if job.rule.name == "generate"),
        )

    def kept_outputs(self) -> KeptOutputs:
        """The files of the DAG's jobs this run reuses as up to date, and their rules."""
        needrun = set(map(id, self.view.needrun_jobs()))
        reused = [job for job in self.view.all_jobs() if id(job) not in needrun]
        return KeptOutputs(
            paths=frozenset(Path(str(f)) for job in reused for f in [*job.output, *job.input]),
            rules=frozenset(job.rule.name for job in reused),
        )

    def settle_run_outputs(self) -> None:
        """An earlier config's finished run kept whole (named on the console), the files of other plans
        moved aside, the outputs this run remakes removed before it starts (``regen.output.stale``)."""
        if self.marker is not None:
            self.marker.update(phase="settle")
        identities = Identities(
            results_of=self.marker.marker.results_of if self.marker is not None else None,
            current=self.identity,
            kept=self.kept_outputs(),
        )
        planned = PlannedOutputs(
            shards=frozenset(self.setup.shards), export=self.setup.export, publish=self.setup.publish
        )
        keep = KeepConfig.from_dict(self.setup.config.get("keep"))
        lines = settle_outputs(
            self.layout,
            planned,
            self.remade_outputs(),
            "report_assets",
            identities=identities,
            keep_last=keep.earlier_runs,
        )
        for line in lines:
            self.say(line)
        if self.marker is not None:
            self.marker.update(phase="check", results_of=self.identity)

    def run_preflight(self) -> None:
        """``regen check`` first: every problem at once, before any job. A run stopped here still ends as
        failed (its marker, the NOT READY page): Snakemake calls no ``onerror`` for an ``onstart`` that
        raises."""
        from regen.check import preflight

        try:
            preflight(self.setup.config, self.setup.requested_gpus)
        except Exception:
            self.end_run("failed")
            self.report_failed_run(None)
            raise
        if self.marker is not None:
            self.marker.update(phase="running")

    def prestart_gpu_servers(self) -> None:
        """A local run starts its GPU servers while the data is prepared, in one detached process
        (``regen.tune.prestart``); Snakemake does not wait. The plan file is current when the ``tune``
        rule will not run again."""
        from regen.tune.prestart import PrestartRequest, prestart_skip_reason, spawn_prestart

        remade = self.remade_outputs()
        to_generate = len(remade.generated_shards)
        dataset = self.setup.dataset.path
        skip = prestart_skip_reason(
            self.setup.run.server,
            local=self.local_run(),
            dry_run=self.view.dryrun,
            shards_to_generate=to_generate,
            dataset_path=dataset,
        )
        if skip is not None:
            return
        request = PrestartRequest(
            config=self.setup.config,
            gpu_slots=self.setup.run.gpu_slots,
            owner_pid=os.getpid(),
            shards_to_generate=to_generate,
            plan_current="tune" not in remade.rules and self.layout.server_plan.is_file(),
            dataset_path=dataset,
        )
        self.say(spawn_prestart(request, self.layout))

    # ------------------------------------------------------------------------- the end --
    def on_success(self) -> None:
        """The servers stopped; the marker says finished."""
        if not self.view.is_main_process:
            return
        self.stop_gpu_servers()
        self.end_run("finished")

    def on_error(self, log: str | Sequence[str] | None) -> None:
        """The servers stopped; the marker says failed; how to go on; the NOT READY page."""
        if not self.view.is_main_process:
            return
        self.stop_gpu_servers()
        self.end_run("failed")
        self.say(RESUME_HINT)
        self.report_failed_run(log)

    def stop_gpu_servers(self) -> None:
        """Stop the per-GPU servers this run started, per node and per Slurm job."""
        from regen.serving.lifecycle import stop_all_servers

        stop_all_servers(self.layout.servers_root)

    def end_run(self, outcome: str) -> None:
        """The run marker says how the run ended."""
        if self.marker is not None:
            self.marker.end(outcome)

    def report_failed_run(self, log: str | Sequence[str] | None) -> None:
        """The report's first page says NOT READY and why (``snakemake --report`` shows it)."""
        from regen.observe.landing import RunFacts, write_failed_run_landing

        logs = [log] if isinstance(log, str) else list(log or [])
        facts = RunFacts(
            dataset=self.setup.dataset.path,
            model=self.setup.run.server.model_path,
            mode=self.setup.run.server.mode,
            shards=len(self.setup.shards),
            features=self.features_preview(),
        )
        path = write_failed_run_landing(self.layout, facts, ", ".join(map(str, logs)) or None)
        self.say(f"regen: NOT READY; `snakemake --report` shows why ({path})")
