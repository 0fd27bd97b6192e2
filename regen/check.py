"""``regen check --configfile FILE``: every problem a run would hit, found at once, before any job.

Each problem names the config key and the path it concerns: the dataset is readable, the tokenizer
has a chat template, the model config parses, SGLang imports at the version the planner assumes in
the Python that will launch it, ``--resources gpu=N`` fits the GPUs present, the disk has room for the
outputs, and S3 answers where the config uses it. The workflow runs the same checks first (Snakefile
``onstart``), so a bad set-up stops before any job instead of one problem per run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import yaml

from regen.chat import ChatTemplate, ChatTemplateError
from regen.configfile import ConfigFileError, load_config
from regen.features.config import FeaturesConfig
from regen.features.projection import free_bytes_at, preview_lines, projection_for_run, refusal
from regen.generate.server_time import timeout_notes
from regen.ingest.audit_config import AuditConfig
from regen.ingest.audit_run import first_rows
from regen.ingest.dataset import DatasetConfig, detect_format
from regen.ingest.decontam import DecontaminationConfig
from regen.ingest.flags import BAD_ROW
from regen.ingest.readers import check_dataset_path, known_row_count
from regen.layout.run import RunLayout
from regen.pilot_file import PilotFile
from regen.runconfig import RunConfig, ServerConfig, config_section, validated
from regen.serving.gpus import count_gpus
from regen.sglang.flags import parse_flags
from regen.sglang.models import ModelConfigError, ModelShape
from regen.sglang.plan import DEFAULT_VERSION, SUPPORTED_VERSIONS
from regen.storage import is_s3_uri, parse_location
from regen.tune.projection import completion_notes
from regen.types import BadInputError

#: outputs take about this many times the input (prompt shards, generation JSONL with reasoning,
#: valid shards, the merged Parquet, journals); a rough floor, not a promise
OUTPUT_SIZE_FACTOR = 4.0
MIN_FREE_BYTES = 1 << 30
SGLANG_PROBE_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing that would fail the run: the config key, the path it concerns, what is wrong."""

    key: str
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.key} ({self.path}): {self.message}"


@dataclass(frozen=True, slots=True)
class Host:
    """What the checks read from the machine; tests pass their own."""

    python: str = sys.executable
    results_dir: str = "results"
    gpus_present: Callable[[], int | None] = lambda: count_gpus()
    sglang_version: Callable[[str], tuple[str | None, str]] = lambda python: sglang_version_in(python)
    s3_probe: Callable[[str], str | None] = lambda uri: probe_s3(uri)


# --------------------------------------------------------------------------------------------------
# the machine


#: found, not imported: importing sglang took ~20 s on the H200 host, before any job and before the
#: prestarted servers (the server's own start imports it and reports a broken install in its log)
_SGLANG_VERSION_CODE = (
    "import importlib.metadata as m, importlib.util as u, sys; "
    "sys.exit('No module named sglang') if u.find_spec('sglang') is None else print(m.version('sglang'))"
)


def sglang_version_in(python: str) -> tuple[str | None, str]:
    """(sglang version, '') when ``python`` has sglang installed, else (None, why not); sglang itself
    is not imported (:data:`_SGLANG_VERSION_CODE`)."""
    code = _SGLANG_VERSION_CODE
    try:
        out = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=SGLANG_PROBE_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines()
        return None, lines[-1] if lines else f"exit status {out.returncode}"
    return out.stdout.strip().splitlines()[-1], ""


def probe_s3(uri: str) -> str | None:
    """None when the object (or, for a prefix, its bucket) answers; else why not. Fails fast."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    loc = parse_location(uri)
    client = boto3.session.Session().client(
        "s3",
        config=Config(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=5, read_timeout=10),
    )
    try:
        if loc.key and not uri.endswith("/"):
            try:
                client.head_object(Bucket=loc.bucket, Key=loc.key)
                return None
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
                    raise
        client.list_objects_v2(Bucket=loc.bucket, Prefix=loc.key, MaxKeys=1)
        return None
    except (BotoCoreError, ClientError) as exc:
        return str(exc)


# --------------------------------------------------------------------------------------------------
# the checks


@dataclass(frozen=True, slots=True)
class Sections:
    """What the checks read of the loaded config (:func:`regen.configfile.load_config`, or the workflow's
    validated config), each section typed by its owner."""

    run: RunConfig
    dataset: DatasetConfig
    audit: AuditConfig
    #: ``merge.output_prefix``, from the validated section: ``regen.output.merge`` types the section, a
    #: floor above this module
    merge_output_prefix: str | None
    #: ``features.output_prefix`` (``regen.features.publish``); None when unset
    features_output_prefix: str | None

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> Sections:
        run = RunConfig.from_config(config)
        return cls(
            run=run,
            dataset=DatasetConfig.from_dict(config_section(config, "dataset")),
            audit=AuditConfig.from_dict(config_section(config, "audit"), run.generate.regenerate),
            merge_output_prefix=validated("merge", config_section(config, "merge"))["output_prefix"],
            features_output_prefix=validated("features", config_section(config, "features"))["output_prefix"],
        )

    @property
    def server(self) -> ServerConfig:
        return self.run.server


def check_dataset(config: Sections, host: Host) -> list[Problem]:
    path = config.dataset.path
    if not path:
        return [Problem("dataset.path", "-", "not set")]
    if is_s3_uri(path):
        why = host.s3_probe(path)
        return [] if why is None else [Problem("dataset.path", path, f"S3 object not reachable: {why}")]
    p = Path(path)
    if not p.exists():
        return [Problem("dataset.path", path, "no such file or folder")]
    try:  # a file, a datasets save_to_disk folder or a folder of shards (regen.ingest.readers)
        files = check_dataset_path(p).files
    except (OSError, ValueError) as exc:
        return [Problem("dataset.path", path, str(exc).removeprefix(f"{path}: "))]
    for f in files:
        if not os.access(f, os.R_OK):
            return [Problem("dataset.path", str(f), "not readable (permissions)")]
        if f.stat().st_size == 0:
            return [Problem("dataset.path", str(f), "empty file")]
        if f.suffix == ".parquet":
            try:
                pq.read_metadata(f)
            except (OSError, ValueError) as exc:
                return [Problem("dataset.path", str(f), f"not a readable Parquet file: {exc}")]
    if known_row_count(check_dataset_path(p)) == 0:
        return [Problem("dataset.path", path, "has no rows: nothing to generate")]
    if config.dataset.format == "auto":
        try:
            detect_format(p)
        except (OSError, ValueError) as exc:
            return [Problem("dataset.format", path, str(exc))]
    return []


#: rows ``regen check`` reads with the audit's own reader and verdicts
FIRST_ROWS = 50


def check_first_rows(config: Sections, rows: int = FIRST_ROWS) -> list[Problem]:
    """The audit's own reading and verdicts over the dataset's first ``rows`` rows
    (:func:`regen.ingest.audit_run.first_rows`; benchmark decontamination left to the audit): a problem
    when the audit would exclude every row, because none of those rows can be read as configured (a
    format that does not fit: the first row's field and reason named) or the dataset ends within them."""
    dataset = config.dataset
    path = dataset.path
    if not path or is_s3_uri(path):
        return []
    try:
        audit = dataclasses.replace(config.audit, decontamination=DecontaminationConfig())
        first = first_rows(Path(path), audit, config.run.tokenizer, dataset, rows)
    except BadInputError as exc:  # dataset.on_bad_row: stop
        return [Problem("dataset.on_bad_row", path, f"stop: the audit would stop at {exc}")]
    except (OSError, ValueError) as exc:
        return [Problem("dataset.path", path, str(exc))]
    if not first.excludes_all():
        return []
    unreadable = set(first.summary.excluded_reasons) == {BAD_ROW}
    if not (unreadable or first.whole):
        return []  # more rows follow, which the audit judges
    key = "dataset.format" if unreadable else "dataset.path"
    how = f"read as format {dataset.format} by the audit's own reader"
    return [Problem(key, path, f"the audit would exclude every row ({how}): {first.in_words()}")]


def check_tokenizer(config: Sections) -> list[Problem]:
    path = config.run.tokenizer
    if not path:
        return [Problem("tokenizer", "-", "not set")]
    p = Path(path)
    if not p.is_dir():
        return [Problem("tokenizer", path, "no such directory (tokenizer.json + tokenizer_config.json)")]
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if not (p / name).is_file():
            return [Problem("tokenizer", str(p / name), "missing")]
    try:
        ChatTemplate.from_dir(p)
    except (ChatTemplateError, OSError, ValueError, KeyError) as exc:
        return [Problem("tokenizer", path, f"no usable chat template: {exc}")]
    return []


def model_config_path(server: ServerConfig) -> str:
    if server.model_config:
        return server.model_config
    return str(Path(server.model_path) / "config.json") if server.model_path else ""


def check_model_config(config: Sections) -> list[Problem]:
    if config.server.mode == "external":
        return []
    key = "server.model_config" if config.server.model_config else "server.model_path"
    path = model_config_path(config.server)
    if not path:
        return [Problem(key, "-", "not set")]
    try:
        ModelShape.from_config(path)
    except (ModelConfigError, OSError, ValueError, KeyError) as exc:
        return [Problem(key, path, f"model config unusable for the planner: {exc}")]
    return []


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def hub_cache_dir(repo_id: str) -> Path:
    """Where huggingface_hub keeps a downloaded model (``HF_HUB_CACHE``, else ``HF_HOME/hub``)."""
    home = os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
    cache = os.environ.get("HF_HUB_CACHE") or str(Path(home) / "hub")
    return Path(cache) / ("models--" + repo_id.replace("/", "--"))


def check_model_path(config: Sections) -> list[Problem]:
    """mode sglang with ``server.model_config`` set: the server still loads ``server.model_path`` (the
    planner reads the other), so a wrong one would fail only once the job started its server."""
    if config.server.mode != "sglang" or not config.server.model_config:
        return []  # without model_config, check_model_config reads model_path's config.json
    key, path = "server.model_path", config.server.model_path
    p = Path(path).expanduser()
    if p.is_dir():
        ok = (p / "config.json").is_file()
        return [] if ok else [Problem(key, str(p / "config.json"), "missing: not a model directory")]
    if p.exists():
        return [Problem(key, path, "not a directory: a model directory or a Hugging Face hub id")]
    if not HUB_ID.match(path):
        return [Problem(key, path, "no such directory (a model directory or a Hugging Face hub id)")]
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    if offline and not hub_cache_dir(path).is_dir():
        return [Problem(key, path, f"HF_HUB_OFFLINE is set and the hub cache has no {hub_cache_dir(path)}")]
    return []


def model_path_notes(server: ServerConfig) -> list[str]:
    """A hub id that is not downloaded yet: SGLang fetches it at server start (a typo fails only then)."""
    path = server.model_path
    if server.mode != "sglang" or Path(path).expanduser().exists() or not HUB_ID.match(path):
        return []
    if hub_cache_dir(path).is_dir():
        return []
    return [
        f"server.model_path ({path}): not a local directory nor in the hub cache; each server downloads it "
        "from the Hugging Face Hub when it starts (a misspelt id fails only then)"
    ]


def check_sglang(config: Sections, host: Host) -> list[Problem]:
    """mode sglang: the Python that launches the servers imports sglang at the planner's version."""
    if config.server.mode != "sglang":
        return []
    pinned = config.server.sglang_version
    version, why = host.sglang_version(host.python)
    if version is None:
        return [
            Problem(
                "server.mode",
                host.python,
                f"sglang is not installed ({why}); install it into this Python: "
                f"{host.python} -m pip install sglang=={pinned or DEFAULT_VERSION}",
            )
        ]
    if pinned and version != str(pinned):
        return [
            Problem(
                "server.sglang_version",
                host.python,
                f"the planner assumes sglang {pinned} but this Python has {version}; "
                "set server.sglang_version to the installed one or install the pinned one",
            )
        ]
    if not pinned and version not in SUPPORTED_VERSIONS:
        return [
            Problem(
                "server.sglang_version",
                host.python,
                f"sglang {version} is installed; the planner knows {', '.join(SUPPORTED_VERSIONS)} "
                "(memory plans for other versions are unverified)",
            )
        ]
    return []


def check_gpus(server: ServerConfig, requested: int | None, host: Host) -> list[Problem]:
    """``--resources gpu=N`` (else server.gpus) x server.tp against the GPUs present (mode sglang)."""
    key = "--resources gpu" if requested is not None else "server.gpus"
    slots = requested if requested is not None else server.gpus
    if slots < 1:
        return [
            Problem(key, f"gpu={slots}", "no GPU slot: generate jobs need gpu=1 each; give gpu=N with N >= 1")
        ]
    if server.mode != "sglang":
        return []
    tp = server.tp
    present = host.gpus_present()
    if present is None:
        return [Problem(key, "nvidia-smi", "no NVIDIA GPU found (nvidia-smi missing or failing)")]
    if slots * tp > present:
        return [
            Problem(
                key,
                f"gpu={slots}",
                f"{slots} slot(s) x server.tp {tp} = {slots * tp} GPUs, but {present} present",
            )
        ]
    return []


def gpu_notes(config: Mapping[str, Any], requested: int | None, host: Host) -> list[str]:
    """mode sglang: fewer GPU slots than the node has GPUs (the rest stay idle), naming both numbers."""
    server = RunConfig.from_config(config).server
    if server.mode != "sglang":
        return []
    given = f"--resources gpu={requested}" if requested is not None else f"server.gpus {server.gpus}"
    slots = requested if requested is not None else server.gpus
    tp = server.tp
    present = host.gpus_present()
    if present is None or slots < 1 or slots * tp >= present:
        return []
    seen = "CUDA_VISIBLE_DEVICES" if os.environ.get("CUDA_VISIBLE_DEVICES") is not None else "nvidia-smi"
    return [
        f"{given}: {slots} GPU slot(s) x server.tp {tp} use {slots * tp} of the {present} GPUs this node has "
        f"({seen}); the other {present - slots * tp} stay idle (give gpu={present // tp} to use them all)"
    ]


def gpu_counter_line(requested: int, jobs_per_slot: int) -> str:
    """What ``--resources gpu=N`` became: Snakemake then prints its widened job counter as
    ``Provided resources: gpu=Resource("gpu", 2N)``, which is not the N GPUs given."""
    return (
        f"regen: --resources gpu={requested}: {requested} GPU slot(s); Snakemake's 'Provided resources' "
        f"line counts {jobs_per_slot * requested} for gpu: up to {jobs_per_slot} generate jobs per slot, "
        "the next shard's job waiting for its slot's server"
    )


def check_disk(config: Sections, host: Host) -> list[Problem]:
    path = config.dataset.path
    size = 0
    if path and not is_s3_uri(path) and Path(path).exists():
        with contextlib.suppress(OSError, ValueError):  # check_dataset reports an unreadable dataset
            size = sum(f.stat().st_size for f in check_dataset_path(path).files)
    where = Path(host.results_dir)
    probe = where if where.exists() else Path(".")
    free = shutil.disk_usage(probe).free
    # every prompt's completions (the variants' n together) are written out
    need = max(int(size * OUTPUT_SIZE_FACTOR * config.run.generate.completions_per_prompt), MIN_FREE_BYTES)
    if free < need:
        return [
            Problem(
                "dataset.path",
                str(where),
                f"{free / 2**30:.1f} GiB free; the outputs need about {need / 2**30:.1f} GiB "
                f"({OUTPUT_SIZE_FACTOR:g} x the input x {config.run.generate.completions_per_prompt} "
                "completion(s) per prompt)",
            )
        ]
    return []


def check_s3(config: Sections, host: Host) -> list[Problem]:
    problems = []
    uris = {
        "generate.journal_sync.s3_prefix": config.run.generate.journal_sync.s3_prefix,
        "merge.output_prefix": config.merge_output_prefix,
        "features.output_prefix": config.features_output_prefix,
    }
    for key, uri in uris.items():
        if uri and is_s3_uri(str(uri)):
            why = host.s3_probe(str(uri))
            if why is not None:
                problems.append(Problem(key, str(uri), f"S3 not reachable: {why}"))
    return problems


def check_features(config: Mapping[str, Any], host: Host) -> list[Problem]:
    """With ``features.enabled``: layer ids the target has, and the features' projection
    (``regen.features.projection``) within ``features.max_storage`` and the free space under
    ``results/features``; over either, the run refuses to start, naming both numbers and what fits."""
    layout = RunLayout(results=Path(host.results_dir))
    try:
        projection = projection_for_run(config, layout)
        if projection is None:
            return []
        cfg = FeaturesConfig.from_dict(config_section(config, "features"))
    except (OSError, ValueError) as exc:  # FeaturesConfigError, ModelConfigError, an unreadable Parquet
        return [Problem("features", str(layout.features_dir), str(exc))]
    where = str(layout.features_dir)
    why = refusal(projection, cfg.max_storage, free_bytes_at(where), where)
    return [Problem("features.max_storage", where, why)] if why else []


def features_notes(config: Mapping[str, Any], results_dir: str | os.PathLike[str] = "results") -> list[str]:
    """The features' projection (rows, tokens, bytes, GPU-hours, each with its source); nothing when the
    section is off, and a line saying why when there is nothing to project from yet."""
    layout = RunLayout(results=Path(results_dir))
    try:
        return [line for line in preview_lines(config, layout) if "REFUSED" not in line]
    except (OSError, ValueError):
        return []  # check_features names the problem


def check_config(
    config: Mapping[str, Any], requested_gpus: int | None = None, host: Host | None = None
) -> list[Problem]:
    """Every problem at once (an empty list: the run can start)."""
    host = host or Host()
    sections = Sections.of(config)
    readable = [*check_dataset(sections, host), *check_tokenizer(sections)]
    return [
        *readable,
        *(check_first_rows(sections) if not readable else ()),
        *check_model_config(sections),
        *check_model_path(sections),
        *check_sglang(sections, host),
        *check_gpus(sections.server, requested_gpus, host),
        *check_disk(sections, host),
        *check_s3(sections, host),
        *check_features(config, host),
    ]


#: SGLang applies a request's ``seed`` only with this launch flag (0.5.17's sampler builds the
#: per-request seed tensor only under deterministic inference)
DETERMINISTIC_FLAG = "--enable-deterministic-inference"


def notes_for(config: Mapping[str, Any]) -> list[str]:
    """What does not stop the run but makes the output claim more than it holds (printed, not fatal)."""
    server = RunConfig.from_config(config).server
    if server.mode not in ("sglang", "external"):
        return []
    hub = model_path_notes(server)
    flags = {a.split("=", 1)[0] for a in server.args}
    if DETERMINISTIC_FLAG in flags:
        return hub
    launched = "is not launched" if server.mode == "sglang" else "may not be launched"
    return [
        *hub,
        f"generate.sampling.seed (server.args): SGLang {launched} with {DETERMINISTIC_FLAG}, and applies "
        "a request's seed only with it: each record keeps its seed, but its sampling cannot be "
        "reproduced from it",
    ]


def speculative_notes(
    config: Mapping[str, Any], results_dir: str | os.PathLike[str] = "results"
) -> list[str]:
    """A warning when ``server.args`` force a speculative setting (``--speculative-algorithm``, its steps)
    that the last ``regen tune --sweep`` (``RESULTS/plan/pilot.json``) measured slower than another
    candidate; nothing without args forcing it, without a sweep file, or when it measured fastest."""
    args = list(RunConfig.from_config(config).server.args)
    forced = parse_flags(args) if args else None
    if forced is None or not forced.speculative_algorithm:
        return []
    pilot = RunLayout(results=Path(results_dir)).pilot
    try:
        sweep = PilotFile.read(pilot)
    except (OSError, ValueError):
        return []
    if sweep is None:
        return []

    def setting(row_args: list[str]) -> tuple[str, int] | None:
        flags = parse_flags([str(a) for a in row_args])
        if not flags.speculative_algorithm:
            return None
        return flags.speculative_algorithm.upper().replace("NEXTN", "EAGLE"), flags.speculative_num_steps or 3

    wanted = setting(args)
    rows = [r for r in sweep.candidates if r.ok and r.rate_tok_s]
    same = [r for r in rows if setting(list(r.args)) == wanted]
    if not same:
        return []
    mine = max(same, key=lambda r: r.rate)
    best = max(rows, key=lambda r: r.rate)
    if best.rate <= mine.rate:
        return []
    other = setting(list(best.args))
    what = "no MTP" if other is None else f"MTP {other[1]} step{'s' if other[1] != 1 else ''}"
    return [
        f"server.args force {forced.speculative_algorithm} with {wanted[1]} steps: the sweep ({pilot}) "
        f"measured it at {mine.rate:.0f} tok/s ({mine.label}), slower than {what} at "
        f"{best.rate:.0f} tok/s ({best.label}); drop the speculative flags from "
        "server.args to let the tuner choose"
    ]


#: the planned numbers ``regen check`` repeats from the plan file, with the SGLang rule each follows
PLANNED_NUMBERS = (
    ("weights_gib", "weights (GiB)"),
    ("kv_cache_tokens", "KV tokens"),
    ("effective_max_running_requests", "running cap"),
    ("client_concurrency", "client in flight"),
)


def planned_notes(results_dir: str | os.PathLike[str] = "results") -> list[str]:
    """The last plan's few headline numbers (``RESULTS/plan/server.json``, written by ``regen tune`` or
    the workflow's tune job), each with the SGLang rule it follows (issue 33 item 6); nothing without a
    plan file or for an external server."""
    path = RunLayout(results=Path(results_dir)).server_plan
    try:
        plan = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    section = plan.get(str(plan.get("launched", "recommended"))) or {}
    rules = section.get("rules") or {}
    parts = [
        f"{label} {section[key]:,}" + (f" ({rules[key]})" if rules.get(key) else "")
        for key, label in PLANNED_NUMBERS
        if isinstance(section.get(key), int | float)
    ]
    return [f"planned ({path}): " + "; ".join(parts)] if parts else []


def report(problems: list[Problem], notes: list[str] | None = None) -> str:
    tail = [f"  note: {n}" for n in notes or ()]
    if not problems:
        return "\n".join(["regen check: OK", *tail])
    lines = [f"regen check: {len(problems)} problem(s) found before any job ran:"]
    lines += [f"  - {p}" for p in problems]
    return "\n".join([*lines, *tail])


class PreflightError(RuntimeError):
    """The workflow's first step found problems (the message lists them all)."""


def preflight(config: Mapping[str, Any], requested_gpus: int | None) -> None:
    """The workflow's ``onstart``: raise with every problem, else say OK."""
    problems = check_config(config, requested_gpus)
    notes = [*notes_for(config), *gpu_notes(config, requested_gpus, Host()), *speculative_notes(config)]
    notes += timeout_notes(config)  # generate.request_timeout_s against the plan (regen.generate.server_time)
    notes += completion_notes(RunConfig.from_config(config).generate, RunLayout().pilot)  # x completions
    notes += features_notes(config)  # the features' bytes and GPU-hours (regen.features.projection)
    if problems:
        raise PreflightError(report(problems, notes))
    print(report(problems, notes), file=sys.stderr)


def report_for_missing_dataset(config: Mapping[str, Any], requested_gpus: int | None) -> str:
    """The message when the workflow cannot even build its jobs (the local dataset or the chat
    template is missing): every preflight problem, not only that one."""
    return report(check_config(config, requested_gpus))


# --------------------------------------------------------------------------------------------------
# the command


def cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="regen check", description=__doc__.splitlines()[0])
    p.add_argument(
        "--configfile",
        nargs="+",
        action="extend",
        required=True,
        help="the config file(s) the run will use, in the order given to snakemake",
    )
    p.add_argument(
        "--gpus",
        type=int,
        default=None,
        help="the N of the run's --resources gpu=N (default: server.gpus from the config)",
    )
    p.add_argument(
        "--results",
        default="results",
        help="the run's results directory, where a sweep's plan/pilot.json is read (default: results)",
    )
    args = p.parse_args(argv)
    try:
        config = load_config(args.configfile)
    except (OSError, yaml.YAMLError) as exc:
        print(f"regen check: cannot read the config: {exc}", file=sys.stderr)
        return 2
    except ConfigFileError as exc:  # one line per schema violation, naming key and file
        print(f"regen check: {exc}", file=sys.stderr)
        return 2
    problems = check_config(config, args.gpus)
    notes = [
        *notes_for(config),
        *gpu_notes(config, args.gpus, Host()),
        *speculative_notes(config, args.results),
        *planned_notes(args.results),
        *features_notes(config, args.results),
        *timeout_notes(config, args.results),
        *completion_notes(
            RunConfig.from_config(config).generate, RunLayout(results=Path(args.results)).pilot
        ),
    ]
    print(report(problems, notes), file=sys.stderr if problems else sys.stdout)
    return 1 if problems else 0
