# Config validation (once, with the schema's defaults filled in) and named input functions.
import os
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

from regen.check import gpu_counter_line, preflight, report_for_missing_dataset
from regen.configfile import ConfigFileError, read_layers, validate_config
from regen.fingerprint import decisive_config, decisive_plan_config
from regen.layout import (
    AUDIT_HTML,
    FINISH_REASONS_SVG,
    LANDING_RST,
    QUARANTINE_REASONS_SVG,
    REAUDIT_HTML,
    RECONCILE_HTML,
    RUN,
    SERVER_PLAN_HTML,
    SHARD_PATTERN,
    THROUGHPUT_SVG,
    TOKEN_LENGTHS_SVG,
    TRAINER_WINDOW_SVG,
    shard_name,
)
from regen.generate.replay import preview_lines
from regen.ingest.dataset import DatasetConfig
from regen.observe.report import RunFacts, write_failed_run_landing
from regen.output.stale import (
    Identities,
    KeptOutputs,
    PlannedOutputs,
    RemadeOutputs,
    settle_outputs,
)
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
from regen.ingest.shard_count import AUTO, settle_auto_count, shard_count
from regen.runlog import RESUME_HINT
from regen.serving.lifecycle import stop_all_servers
from regen.serving.slurm_jobs import wait_for_jobs_left_in
from regen.tune.prestart import PrestartRequest, prestart_skip_reason, spawn_prestart


def config_layers():
    """The config's sources in Snakemake's merge order (the Snakefile's configfile, then --configfile's,
    then --config): which file a bad key came from."""
    given = [str(f) for f in workflow.config_settings.configfiles]
    files = [*map(str, workflow.configfiles[len(given) :]), *given]
    return read_layers(files, dict(workflow.config_settings.config))


# validated once, the schema's defaults filled in place; one line per error, naming key and file
try:
    validate_config(config, config_layers())
except ConfigFileError as exc:
    raise WorkflowError(str(exc)) from None

# the dataset section, typed once by its owner (regen.ingest.dataset); the rest: RUN_CONFIG below
DATASET = DatasetConfig.from_dict(lookup(dpath="dataset", within=config))


# An s3:// dataset is fetched by the S3 storage plugin (endpoint and credentials from the usual AWS
# environment/config chain); a local run does not need the plugin installed.
S3_ENDPOINT = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get(
    "AWS_ENDPOINT_URL"
)
if DATASET.path.startswith("s3://"):

    storage s3:
        provider="s3",
        endpoint_url=S3_ENDPOINT,
        retries=10,


wildcard_constraints:
    shard=SHARD_PATTERN,


def dataset_path():
    """The input dataset: a local path, or an s3:// URI fetched by the S3 storage plugin.
    A local dataset that is missing stops the workflow here with every preflight problem at once.
    """
    path = DATASET.path
    if path.startswith("s3://"):
        return storage.s3(path)
    if not os.path.exists(path):
        raise WorkflowError(report_for_missing_dataset(config, REQUESTED_GPUS))
    return path


def requested_gpus():
    """N of --resources gpu=N, or None when not given."""
    given = workflow.global_resources.get("gpu")
    value = getattr(given, "value", given)
    return None if value is None else int(value)


def run_preflight():
    """`regen check` as the workflow's first step (onstart): every problem at once, before any job.
    A run stopped here still ends as failed (its run marker, the report's NOT READY page): Snakemake
    calls no onerror for an onstart that raises."""
    try:
        preflight(config, REQUESTED_GPUS)
    except Exception:
        end_run("failed")
        report_failed_run(None)
        raise
    if workflow.is_main_process and MARKER:
        MARKER[0].update(phase="running")


def benchmark_files():
    """The benchmark prompt files of audit.decontamination: the audit reruns when one changes."""
    benchmarks = lookup(dpath="audit/decontamination/benchmarks", within=config)
    return [b["path"] for b in benchmarks]


# as given, before the JOBS_PER_GPU_SLOT widening below (preflight); gpu=0 counts as not given
REQUESTED_GPUS = requested_gpus()
# the typed run config, built once from the validated config (regen.runconfig)
RUN_CONFIG = RunConfig.from_config(config, REQUESTED_GPUS)
GPU_SLOTS = RUN_CONFIG.gpu_slots


def gpu_slots():
    """GPU slots on this node: --resources gpu=N when given, else server.gpus."""
    return GPU_SLOTS


# Run locally with --resources gpu=N, Snakemake may start JOBS_PER_GPU_SLOT generate jobs per GPU slot:
# the next shard's job waits for a slot and takes it the moment the job on it has sent its last
# sample, so its requests queue behind the draining ones and no GPU waits for Snakemake to start a
# job (regen.serving.lifecycle.acquire_server). Slurm group jobs are left as they are. The executor is
# known only once Snakemake builds the DAG (while the Snakefile is parsed every run looks local and a
# Slurm group job would ask for 2 GPUs), so final_outputs widens the counter, before the scheduler reads it.
JOBS_PER_GPU_SLOT = 2


def local_run():
    """Snakemake runs the jobs on this node (known once the DAG is built: final_outputs)."""
    return workflow.executor_plugin is not None and workflow.local_exec


def widen_gpu_counter_for_local_runs():
    """A local run with --resources gpu=N may start JOBS_PER_GPU_SLOT generate jobs per GPU slot."""
    if local_run() and workflow.is_main_process and REQUESTED_GPUS:
        workflow.global_resources["gpu"] = JOBS_PER_GPU_SLOT * GPU_SLOTS
        print(gpu_counter_line(REQUESTED_GPUS, JOBS_PER_GPU_SLOT), file=sys.stderr)


# shards.count, or with "auto" one per GPU slot (settled by final_outputs: regen.ingest.shard_count)
SHARDS = [
    shard_name(k)
    for k in range(
        shard_count(lookup(dpath="shards/count", within=config), gpu_slots())
    )
]


def refuse_auto_count_on_cluster():
    """shards.count auto, once the executor is known: refused on a cluster unless an earlier run on one
    node settled it (a check only: the shard_count rule writes the count)."""
    if not workflow.is_main_process:
        return
    on_cluster = workflow.executor_plugin is not None and not workflow.local_exec
    try:
        settle_auto_count(
            lookup(dpath="shards/count", within=config),
            len(SHARDS),
            GPU_SLOTS,
            on_cluster,
            dry_run=True,
        )
    except ValueError as exc:
        raise WorkflowError(str(exc)) from exc


def settled_shard_count():
    """With shards.count auto, the count this run settled (the shard_count rule's output), else none."""
    return (
        [rules.shard_count.output.settled]
        if lookup(dpath="shards/count", within=config) == AUTO
        else []
    )


def chat_template_file():
    """The target chat template: decides every prompt the servers render, so a change regenerates.
    A missing one stops the workflow here with every preflight problem at once."""
    path = os.path.join(RUN_CONFIG.tokenizer, "tokenizer_config.json")
    if not os.path.exists(path):
        raise WorkflowError(report_for_missing_dataset(config, REQUESTED_GPUS))
    return path


def generation_settings():
    """What decides an answer (model, chat template, sampling, modes): the generate rule's tracked param."""
    return decisive_config(config)


def plan_settings():
    """What decides the server plan: the tune rule's tracked param."""
    return decisive_plan_config(config)


def run_config():
    """The typed run config a job reads everything from; a non-builtin param: never a rerun trigger."""
    return RUN_CONFIG


def print_replay_preview():
    """On a dry run: how many samples the generate jobs will replay, and how many regenerate and why."""
    for line in preview_lines(RUN_CONFIG, DATASET, SHARDS):
        print(line, file=sys.stderr)


def shard_files(pattern):
    """One path per shard: every per-shard job is known at plan time."""
    return expand(str(pattern), shard=SHARDS)


def pilot_file():
    """`regen tune --sweep`'s pilot when one was written before the run (the report shows it), else none."""
    return [RUN.pilot] if RUN.pilot.is_file() else []


def get_final_outputs():
    """READY (re-audited), the reconciliation and the report; the S3 upload and the trainer exports when
    configured; the settled shard count of shards.count auto."""
    published = (
        [rules.publish.output.record]
        if lookup(dpath="merge/output_prefix", within=config)
        else []
    )
    exported = (
        [rules.export.output.manifest]
        if lookup(dpath="export/enabled", within=config)
        else []
    )
    return (
        settled_shard_count()
        + published
        + exported
        + [
            rules.reaudit.output.ready,
            rules.reconcile.output.table,
            rules.report_assets.output.throughput,
        ]
    )


def final_outputs(wildcards):
    """The final targets, as an input function: evaluated once while the DAG is built, the first moment
    Snakemake knows the executor and whether this is a dry run. Two things cannot happen earlier (while
    the Snakefile is parsed every run looks local) nor later (the scheduler copies the resources before
    onstart), so they happen here: a dry run prints the replay preview, and a local run widens the GPU
    counter (widen_gpu_counter_for_local_runs). Nothing is written."""
    if workflow.dryrun:
        print_replay_preview()
    release_lock_of_dead_run()
    refuse_auto_count_on_cluster()
    widen_gpu_counter_for_local_runs()
    return get_final_outputs()


def planned_outputs():
    """What this config and plan produce, as far as the files of other plans can differ (regen.output.stale)."""
    return PlannedOutputs(
        shards=frozenset(SHARDS),
        export=bool(lookup(dpath="export/enabled", within=config)),
        publish=bool(lookup(dpath="merge/output_prefix", within=config)),
    )


def remade_outputs():
    """The outputs of every job this run will execute (Snakemake's DAG, known at onstart)."""
    jobs = list(workflow.dag.needrun_jobs())
    return RemadeOutputs(
        outputs=tuple(Path(f) for job in jobs for f in job.output),
        rules=frozenset(job.rule.name for job in jobs),
        generated_shards=frozenset(
            job.wildcards["shard"] for job in jobs if job.rule.name == "generate"
        ),
    )


def given_configfiles():
    """The config files of this run, as given (--configfile), else the Snakefile's."""
    return [str(f) for f in workflow.config_settings.configfiles] or [
        str(f) for f in workflow.configfiles
    ]


# this run's name and identity (regen.run_marker): which config's outputs lie in results/
RUN_IDENTITY = ResultsOf(
    config=config_name(given_configfiles()),
    config_id=config_identity(config, GPU_SLOTS),
)
# the controller's hold on the run marker (begin_run), once onstart has written it
MARKER = []


def release_lock_of_dead_run():
    """While the DAG is built (before Snakemake takes its lock): the lock a provably dead controller of
    this directory left is released, with one line (regen.run_marker), and the Slurm jobs it left there
    are waited for (regen.serving.slurm_jobs), so the DAG adopts what they finish."""
    if workflow.is_main_process:
        line = release_dead_lock(RUN.run_marker, RUN.snakemake_locks)
        released = line is not None
        if line is None and not workflow.dryrun:
            line = lock_refused_line(RUN.run_marker, RUN.snakemake_locks)
        if line:
            print(line, file=sys.stderr)
        if released and not workflow.dryrun:
            wait_for_jobs_left_in(Path.cwd(), lambda text: print(text, file=sys.stderr))


def begin_run():
    """onstart, first: the run marker says this run is under way, in its check phase (regen status)."""
    if not workflow.is_main_process:
        return
    previous = RunMarker.read(RUN.run_marker)
    marker = new_marker(
        RUN_IDENTITY.config, RUN_IDENTITY.config_id, given_configfiles(), previous
    )
    writer = MarkerWriter(RUN.run_marker, marker)
    writer.start_heartbeat()
    MARKER.append(writer)


def end_run(outcome):
    """onsuccess/onerror: the run marker says how the run ended."""
    if workflow.is_main_process and MARKER:
        MARKER[0].end(outcome)


def kept_outputs():
    """The files of the DAG's jobs that this run reuses as up to date, and their rules."""
    needrun = set(workflow.dag.needrun_jobs())
    reused = [job for job in workflow.dag.jobs if job not in needrun]
    return KeptOutputs(
        paths=frozenset(
            Path(str(f)) for job in reused for f in [*job.output, *job.input]
        ),
        rules=frozenset(job.rule.name for job in reused),
    )


def settle_run_outputs():
    """onstart: an earlier config's finished run kept whole (named on the console), the files of other
    plans moved aside, the outputs this run remakes removed before it starts (regen.output.stale).
    """
    if not workflow.is_main_process:
        return
    writer = MARKER[0] if MARKER else None
    if writer is not None:
        writer.update(phase="settle")
    identities = Identities(
        results_of=writer.marker.results_of if writer is not None else None,
        current=RUN_IDENTITY,
        kept=kept_outputs(),
    )
    lines = settle_outputs(
        RUN,
        planned_outputs(),
        remade_outputs(),
        "report_assets",
        identities=identities,
    )
    for line in lines:
        print(line, file=sys.stderr)
    if writer is not None:
        writer.update(phase="check", results_of=RUN_IDENTITY)


def prestart_gpu_servers():
    """onstart: a local run starts its GPU servers while the data is prepared, in one detached process
    (regen.tune.prestart); Snakemake does not wait for it. The plan file is current when the tune
    rule will not run again."""
    if not workflow.is_main_process:
        return
    remade = remade_outputs()
    dataset = DATASET.path
    skip = prestart_skip_reason(
        RUN_CONFIG.server,
        local=local_run(),
        dry_run=workflow.dryrun,
        shards_to_generate=len(remade.generated_shards),
        dataset_path=dataset,
    )
    if skip is not None:
        return
    request = PrestartRequest(
        config=config,
        gpu_slots=GPU_SLOTS,
        owner_pid=os.getpid(),
        shards_to_generate=len(remade.generated_shards),
        plan_current="tune" not in remade.rules and RUN.server_plan.is_file(),
        dataset_path=dataset,
    )
    print(spawn_prestart(request), file=sys.stderr)


def run_facts():
    """What the report's first page says about the run's set-up."""
    return RunFacts(
        dataset=DATASET.path,
        model=RUN_CONFIG.server.model_path,
        mode=RUN_CONFIG.server.mode,
        shards=len(SHARDS),
    )


def report_failed_run(log):
    """onerror: the report's first page says NOT READY and why (snakemake --report shows it)."""
    if workflow.is_main_process:
        logs = [log] if isinstance(log, str) else list(log or [])
        path = write_failed_run_landing(
            RUN, run_facts(), ", ".join(map(str, logs)) or None
        )
        print(
            f"regen: NOT READY; `snakemake --report` shows why ({path})",
            file=sys.stderr,
        )


def reported(path, caption, category, **kwargs):
    """``path`` marked for the report when it exists. `snakemake --report` refuses a report with a
    marked file missing, and after a failed gate the gate's outputs and everything after it are: the
    report of a failed run shows what it has, and its first page says why (report_landing_page).
    """
    if os.path.exists(path):
        return report(path, caption=caption, category=category, **kwargs)
    return path


def stop_gpu_servers():
    """Stop the per-GPU servers this run started, per node and per Slurm job (on success and on error)."""
    stop_all_servers(RUN.servers_root)


def print_resume_hint():
    """Once, when the run stops before its end (Ctrl-C or a failed job): how to go on."""
    print(RESUME_HINT, file=sys.stderr)


def report_landing_page():
    """The report's first page: the newest of the verdict report_assets wrote and the NOT READY page a
    failed run left (regen.observe.landing), else the static introduction."""
    pages = [
        p
        for p in (RUN.failed_run_landing, rules.report_assets.output.landing)
        if os.path.isfile(p)
    ]
    if not pages:
        return "report/workflow.rst"
    return os.path.abspath(max(pages, key=os.path.getmtime))
