# Config validation (once, with the schema's defaults filled in), the typed globals and named input
# functions. The run's start and end (onstart/onsuccess/onerror, and what happens while the DAG is built)
# are regen.run_hooks.RunHooks: HOOKS below.
import os

from snakemake.exceptions import WorkflowError

from regen.configfile import ConfigFileError, read_layers, validate_config
from regen.fingerprint import TrackedRun, decisive_plan_config
from regen.layout.names import (
    AUDIT_HTML,
    FINISH_REASONS_SVG,
    LANDING_RST,
    QUARANTINE_REASONS_SVG,
    REAUDIT_HTML,
    RECONCILE_HTML,
    SERVER_PLAN_HTML,
    SHARD_PATTERN,
    THROUGHPUT_SVG,
    TOKEN_LENGTHS_SVG,
    TRAINER_WINDOW_SVG,
    shard_name,
)
from regen.layout.run import RUN
from regen.ingest.dataset import DatasetConfig
from regen.ingest.shard_count import AUTO, shard_count
from regen.run_hooks import (
    RunHooks,
    RunRefused,
    RunSetup,
    SnakemakeWorkflow,
    given_configfiles,
    requested_gpus,
)
from regen.runconfig import RunConfig


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


# N of --resources gpu=N as given, before the lifecycle widens the counter (None: not given)
REQUESTED_GPUS = requested_gpus(workflow)
# the typed run config, built once from the validated config (regen.runconfig)
RUN_CONFIG = RunConfig.from_config(config, REQUESTED_GPUS)
# shards.count, or with "auto" one per GPU slot (settled by the shard_count rule: regen.ingest.shard_count)
SHARDS = [
    shard_name(k)
    for k in range(
        shard_count(lookup(dpath="shards/count", within=config), RUN_CONFIG.gpu_slots)
    )
]
# the run's start and end (regen.run_hooks): the Snakefile's onstart/onsuccess/onerror, and final_outputs
HOOKS = RunHooks(
    RunSetup(
        config=config,
        run=RUN_CONFIG,
        dataset=DATASET,
        shards=tuple(SHARDS),
        requested_gpus=REQUESTED_GPUS,
        configfiles=tuple(given_configfiles(workflow)),
        export=bool(lookup(dpath="export/enabled", within=config)),
        publish=bool(lookup(dpath="merge/output_prefix", within=config)),
    ),
    SnakemakeWorkflow(workflow),
)


def dataset_path():
    """The input dataset: a local path, or an s3:// URI fetched by the S3 storage plugin.
    A local dataset that is missing stops the workflow here with every preflight problem at once.
    """
    path = DATASET.path
    if path.startswith("s3://"):
        return storage.s3(path)
    if not os.path.exists(path):
        raise WorkflowError(HOOKS.missing_input_report())
    return path


def benchmark_files():
    """The benchmark prompt files of audit.decontamination: the audit reruns when one changes."""
    benchmarks = lookup(dpath="audit/decontamination/benchmarks", within=config)
    return [b["path"] for b in benchmarks]


def gpu_slots():
    """GPU slots on this node: --resources gpu=N when given, else server.gpus."""
    return RUN_CONFIG.gpu_slots


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
        raise WorkflowError(HOOKS.missing_input_report())
    return path


def generation_settings():
    """What decides an answer (model, chat template, sampling, modes): the generate rule's tracked param,
    carrying the typed run config the job reads (regen.fingerprint.TrackedRun)."""
    return TrackedRun.of(config, RUN_CONFIG)


def plan_settings():
    """What decides the server plan: the tune rule's tracked param."""
    return decisive_plan_config(config)


def run_config():
    """The typed run config a job reads everything from; a non-builtin param: never a rerun trigger."""
    return RUN_CONFIG


def shard_files(pattern):
    """One path per shard: every per-shard job is known at plan time."""
    return expand(str(pattern), shard=SHARDS)


def pilot_file():
    """`regen tune --sweep`'s pilot when one was written before the run (the report shows it), else none."""
    return [RUN.pilot] if RUN.pilot.is_file() else []


def get_final_outputs():
    """READY (re-audited), the reconciliation and the report; the S3 upload and the trainer exports when
    configured; the settled shard count of shards.count auto."""
    published = [rules.publish.output.record] if HOOKS.setup.publish else []
    exported = [rules.export.output.manifest] if HOOKS.setup.export else []
    featured = (
        list(rules.features_all.input)
        if lookup(dpath="features/enabled", within=config, default=False)
        else []
    )
    return (
        settled_shard_count()
        + published
        + exported
        + featured
        + [
            rules.reaudit.output.ready,
            rules.reconcile.output.table,
            rules.report_assets.output.throughput,
        ]
    )


def final_outputs(wildcards):
    """The final targets, as an input function: evaluated once while the DAG is built, the first moment
    Snakemake knows the executor and whether this is a dry run (RunHooks.at_dag)."""
    try:
        HOOKS.at_dag()
    except RunRefused as exc:
        raise WorkflowError(str(exc)) from exc
    return get_final_outputs()


def reported(path, caption, category, **kwargs):
    """``path`` marked for the report when it exists. `snakemake --report` refuses a report with a
    marked file missing, and after a failed gate the gate's outputs and everything after it are: the
    report of a failed run shows what it has, and its first page says why (report_landing_page).
    """
    if os.path.exists(path):
        return report(path, caption=caption, category=category, **kwargs)
    return path


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
