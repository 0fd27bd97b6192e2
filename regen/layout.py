"""The run's file layout: every path under ``results/``, ``work/``, ``logs/`` and ``benchmarks/`` has one
name here, and so has the shard-name format.

``results/`` holds the Snakemake outputs (the rules declare them through this module, and
``tests/workflow/test_file_contract.py`` checks every rule of the loaded workflow against it); ``logs/``
the rules' logs and the gates' kept verdicts;
``work/`` holds what survives failed and killed jobs and is not a Snakemake output: the request
journals, the per-shard status files, the per-GPU server slot files, the settled shard count and the
sweep's scratch.

Server slot files live per node (``work/servers/gpu{k}.*``) or, on a Slurm cluster, per Slurm job
(``work/servers/slurm-{job}/gpu{k}.*``): a job's GPUs are its own, and files on a shared filesystem
must not collide across nodes. Whoever looks for servers (``stop_all_servers``, ``regen status``, the
report) looks in every one of these directories through :meth:`RunLayout.server_dirs`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

#: the per-Slurm-job subdirectory of a slot or log directory
SLURM_DIR_PREFIX = "slurm-"

#: the run config's JSON Schema, inside the installed package (``regen/schemas/`` links ``schemas/``, which
#: is where it is edited; a wheel carries the file itself): ``rules/common.smk`` validates against it
CONFIG_SCHEMA = Path(__file__).resolve().parent / "schemas" / "config.schema.yaml"
#: the generation record's JSON shape (regen.records.GenerationRecord), shipped beside the config schema
RECORD_SCHEMA = Path(__file__).resolve().parent / "schemas" / "record.schema.json"

#: a per-shard compressed output (generation records, quarantine): ``{shard}.jsonl.zst``
SHARD_OUTPUT_SUFFIX = ".jsonl.zst"
#: a shard's request journal in ``work/journal/``: ``{shard}.jsonl``
JOURNAL_SUFFIX = ".jsonl"
#: the merged dataset's manifest, written last into its directory (``regen.output.merge``)
MANIFEST_NAME = "_manifest.json"
#: what a slot's server really allocated (``regen.sglang.realized``): ``gpu{k}.realized.json``
REALIZED_SUFFIX = ".realized.json"
#: beside a kept earlier run's ``results/``: its config and every file's content digest
#: (``regen.output.kept_runs``)
KEPT_INDEX = "kept.json"
#: a job's log of an attempt that did not finish, kept beside the rule's log (``regen.runlog``):
#: ``logs/generate/00003.attempt-1.log``
ATTEMPT_LOG_INFIX = ".attempt-"
#: a Slurm job's slot host log, beside its server logs (``regen.serving.slothost``)
SLOT_HOST_LOG = "host.log"


def journal_batch(n: int) -> str:
    """The ``n``-th batch of a shard's journal synced to object storage (``regen.storage``)."""
    return f"batch-{n:08d}{JOURNAL_SUFFIX}"


def dataset_part(dataset_dir: str | os.PathLike[str], index: int) -> Path:
    """The merged dataset's Parquet part ``index``: ``part-00000.parquet`` ..."""
    return Path(dataset_dir) / f"part-{index:05d}.parquet"


def dataset_parts(dataset_dir: str | os.PathLike[str]) -> list[Path]:
    """Every Parquet part of a merged dataset, in order."""
    return sorted(Path(dataset_dir).glob("part-[0-9]*.parquet"))


# ------------------------------------------------------------------ files beside a file --
def journal_index(journal: str | os.PathLike[str]) -> Path:
    """The journal's index (``regen.generate.journal``): ``00000.jsonl`` -> ``00000.jsonl.index``."""
    p = Path(journal)
    return p.with_name(p.name + ".index")


def journal_lock(journal: str | os.PathLike[str]) -> Path:
    """The journal's writer lock (``regen.generate.journal_writer``): ``00000.jsonl`` ->
    ``00000.jsonl.lock``."""
    p = Path(journal)
    return p.with_name(p.name + ".lock")


#: a gate's verdict file ends so (``regen.verdict``)
VERDICT_SUFFIX = ".verdict.json"


def verdict_for(log: str | os.PathLike[str]) -> Path:
    """A gate's verdict beside its rule's log (``regen.verdict``): ``reaudit.log`` ->
    ``reaudit.verdict.json``."""
    return Path(log).with_suffix(VERDICT_SUFFIX)


def attempt_log(log: str | os.PathLike[str], n: int) -> Path:
    """Attempt ``n``'s log of a job, beside the rule's log (``regen.runlog``): ``logs/generate/00003.log``
    -> ``logs/generate/00003.attempt-1.log``."""
    path = Path(log)
    return path.with_name(f"{path.stem}{ATTEMPT_LOG_INFIX}{n}{path.suffix}")


def attempt_logs(log: str | os.PathLike[str]) -> dict[int, Path]:
    """Every attempt's log kept beside the rule's log ``log``, by attempt number."""
    path = Path(log)
    prefix = f"{path.stem}{ATTEMPT_LOG_INFIX}"
    found = {}
    for p in path.parent.glob(f"{prefix}*{path.suffix}"):
        number = p.name[len(prefix) : len(p.name) - len(path.suffix)]
        if number.isdigit():
            found[int(number)] = p
    return dict(sorted(found.items()))


def eval_split_beside(train_path: str | os.PathLike[str]) -> Path:
    """The eval-split file beside a training file: ``specforge.jsonl`` -> ``specforge.eval.jsonl``."""
    path = Path(train_path)
    return path.with_name(f"{path.stem}.eval{path.suffix}")


def thinking_beside(tokenized: str | os.PathLike[str]) -> Path:
    """Each exported row's thinking mode and split side, beside ``tokenized.jsonl``
    (``regen.output.serving``)."""
    return Path(tokenized).with_name("thinking.jsonl")


def token_freq_beside(tokenized: str | os.PathLike[str]) -> Path:
    """The supervised-token counts beside ``tokenized.jsonl`` (``regen.output.vocab``)."""
    return Path(tokenized).with_name("token_freq.json")


def failure_note(notes_dir: str | os.PathLike[str], key: str) -> Path:
    """One failure cause's note in a slot directory's ``failures/`` (``regen.generate.generation``)."""
    return Path(notes_dir) / f"{key}.txt"


@dataclass(frozen=True, slots=True)
class ScratchShardFiles:
    """A scratch generation's journal, records and failed requests (the sweep's warm-up and pilot)."""

    journal: Path
    records: Path
    failed: Path

    @classmethod
    def in_dir(cls, directory: str | os.PathLike[str]) -> ScratchShardFiles:
        """``journal.jsonl``, ``records.jsonl`` and ``failed.jsonl`` in ``directory``."""
        d = Path(directory)
        return cls(d / f"journal{JOURNAL_SUFFIX}", d / "records.jsonl", d / "failed.jsonl")

    @classmethod
    def beside(cls, journal: str | os.PathLike[str]) -> ScratchShardFiles:
        """Beside ``journal``: ``journal.jsonl`` -> ``journal.records.jsonl``, ``journal.failed.jsonl``."""
        j = Path(journal)
        return cls(j, j.with_suffix(".records.jsonl"), j.with_suffix(".failed.jsonl"))

    def all(self) -> tuple[Path, Path, Path]:
        return self.journal, self.records, self.failed


@dataclass(frozen=True, slots=True)
class SweepCandidateFiles:
    """One sweep candidate's scratch, ``cand{i:02d}/`` under ``RunLayout.sweep_dir``
    (``regen.tune.sweep``)."""

    root: Path

    @classmethod
    def of(cls, sweep_dir: str | os.PathLike[str], index: int) -> SweepCandidateFiles:
        return cls(Path(sweep_dir) / f"cand{index:02d}")

    @property
    def servers(self) -> Path:
        """The candidate server's slot directory."""
        return self.root / "servers"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def server_log(self) -> Path:
        """The candidate server's log (it runs on slot 0)."""
        return SlotFiles.of(0, self.servers, self.logs).log

    @property
    def warmup_dir(self) -> Path:
        """The warm-up request's scratch (``ScratchShardFiles.in_dir``)."""
        return self.root / "warmup"

    @property
    def pilot_journal(self) -> Path:
        """The pilot's journal (its records and failed requests ``ScratchShardFiles.beside`` it)."""
        return self.root / f"journal{JOURNAL_SUFFIX}"


#: a shard's name: its index, 5 digits zero-padded (the workflow's ``{shard}`` wildcard)
SHARD_DIGITS = 5
SHARD_PATTERN = f"[0-9]{{{SHARD_DIGITS}}}"
_SHARD_RE = re.compile(rf"^{SHARD_PATTERN}$")


def shard_name(k: int) -> str:
    """The zero-padded shard name: ``shard_name(3) == "00003"``."""
    return f"{k:0{SHARD_DIGITS}d}"


def is_shard_name(name: str) -> bool:
    """Whether ``name`` is a shard's name (``shard_name`` of some index)."""
    return _SHARD_RE.match(name) is not None


# the report's pages and plots (``regen.observe.report`` writes every one, always), in
# ``RunLayout.report_dir``
TOKEN_LENGTHS_SVG = "token_lengths.svg"
FINISH_REASONS_SVG = "finish_reasons.svg"
QUARANTINE_REASONS_SVG = "quarantine_reasons.svg"
THROUGHPUT_SVG = "throughput.svg"
TRAINER_WINDOW_SVG = "trainer_window.svg"
RECONCILE_HTML = "reconcile.html"
SERVER_PLAN_HTML = "server_plan.html"
AUDIT_HTML = "audit.html"
REAUDIT_HTML = "reaudit.html"
LANDING_RST = "landing.rst"
ASSET_NAMES = (
    TOKEN_LENGTHS_SVG,
    FINISH_REASONS_SVG,
    QUARANTINE_REASONS_SVG,
    THROUGHPUT_SVG,
    TRAINER_WINDOW_SVG,
    RECONCILE_HTML,
    SERVER_PLAN_HTML,
    AUDIT_HTML,
    REAUDIT_HTML,
    LANDING_RST,
)


def slurm_job_id() -> str | None:
    """This process's Slurm job, if it runs in one."""
    return os.environ.get("SLURM_JOB_ID") or None


def slot_of(path: str | os.PathLike[str]) -> int | None:
    """The GPU slot ``k`` whose file ``path`` is (``gpu{k}.url``, ``gpu{k}.lock``, ... of
    :class:`SlotFiles`); None for a file of another name."""
    m = re.fullmatch(r"gpu(\d+)", Path(path).name.split(".", 1)[0])
    return int(m.group(1)) if m else None


@dataclass(frozen=True, slots=True)
class SlotFiles:
    """The files of GPU slot ``k`` (``work/servers/gpu{k}.*`` and ``logs/servers/gpu{k}.log``)."""

    slot: int
    lock: Path
    lease: Path
    url: Path
    realized: Path
    log: Path
    #: the supervisor's latest look at its server (``regen.serving.progress``): in flight, stalled since
    progress: Path
    #: one JSON line per server restart (and per give-up), with its cause (``regen.serving.progress``)
    restarts: Path

    @classmethod
    def of(cls, slot: int, workdir: str | os.PathLike[str], log_dir: str | os.PathLike[str]) -> SlotFiles:
        w = Path(workdir)
        return cls(
            slot=slot,
            lock=w / f"gpu{slot}.lock",
            lease=w / f"gpu{slot}.lease",
            url=w / f"gpu{slot}.url",
            realized=w / f"gpu{slot}{REALIZED_SUFFIX}",
            log=Path(log_dir) / f"gpu{slot}.log",
            progress=w / f"gpu{slot}.progress.json",
            restarts=w / f"gpu{slot}.restarts.jsonl",
        )

    @classmethod
    def beside(cls, url_file: str | os.PathLike[str]) -> SlotFiles:
        """The slot files next to a ``gpu{k}.url`` (its log path is not known there: left beside it)."""
        path = Path(url_file)
        slot = slot_of(path)
        if slot is None:
            raise ValueError(f"{path}: not a slot file (gpu{{k}}.url)")
        return cls.of(slot, path.parent, path.parent)


def prestart_lock_in(slot_dir: str | os.PathLike[str]) -> Path:
    """A slot directory's ``prestart.lock``: held exclusively while the prestart process decides and
    starts that directory's supervisors (``regen.tune.prestart``); a generate job and the ``tune`` rule
    wait for it, shared, before they look at a slot's url file."""
    return Path(slot_dir) / "prestart.lock"


def server_dirs(servers_root: str | os.PathLike[str]) -> list[Path]:
    """A slot directory and its per-Slurm-job subdirectories (``slurm-{job}/``), in a stable order."""
    root = Path(servers_root)
    return [root, *sorted(p for p in root.glob(f"{SLURM_DIR_PREFIX}*") if p.is_dir())]


def url_files(servers_root: str | os.PathLike[str]) -> list[Path]:
    """Every slot's ``gpu{k}.url`` under ``servers_root``, per node and per Slurm job."""
    return [f for d in server_dirs(servers_root) for f in sorted(d.glob("gpu*.url"))]


def restart_files(servers_root: str | os.PathLike[str]) -> list[Path]:
    """Every slot's ``gpu{k}.restarts.jsonl`` under ``servers_root``, per node and per Slurm job."""
    return sorted(f for d in server_dirs(servers_root) for f in d.glob("gpu*.restarts.jsonl"))


def realized_files(servers_root: str | os.PathLike[str]) -> list[Path]:
    """Every slot's ``gpu{k}.realized.json`` under ``servers_root``, per node and per Slurm job."""
    return sorted(f for d in server_dirs(servers_root) for f in d.glob(f"gpu*{REALIZED_SUFFIX}"))


@dataclass(frozen=True, slots=True)
class AuditFiles:
    """What the input audit writes into its directory (``regen audit --out DIR``, the audit rule)."""

    out_dir: Path

    @classmethod
    def beside(cls, summary: str | os.PathLike[str]) -> AuditFiles:
        """The audit files beside its ``summary`` (a job's own output path, wherever a storage provider
        put it)."""
        return cls(Path(summary).parent)

    @property
    def summary(self) -> Path:
        return self.out_dir / "summary.json"

    @property
    def flags(self) -> Path:
        return self.out_dir / "flags.parquet"

    @property
    def excluded(self) -> Path:
        return self.out_dir / "excluded.jsonl"

    @property
    def samples(self) -> Path:
        """The kept samples, normalized (``SHARD_SCHEMA``): the shard step's input."""
        return self.out_dir / "samples.parquet"

    @property
    def supervised_plot(self) -> Path:
        return self.out_dir / "supervised_tokens.svg"

    @property
    def prompt_plot(self) -> Path:
        return self.out_dir / "prompt_tokens.svg"


@dataclass(frozen=True, slots=True)
class RunLayout:
    """The paths of one run, relative to its working directory (or under ``root``)."""

    results: Path = Path("results")
    work: Path = Path("work")
    logs: Path = Path("logs")
    benchmarks: Path = Path("benchmarks")

    @classmethod
    def under(cls, root: str | os.PathLike[str]) -> RunLayout:
        """The layout of a run whose working directory is ``root``."""
        r = Path(root)
        return cls(results=r / "results", work=r / "work", logs=r / "logs", benchmarks=r / "benchmarks")

    @classmethod
    def of_journal(cls, journal: str | os.PathLike[str]) -> RunLayout:
        """The layout a journal ``{work}/journal/{shard}.jsonl`` belongs to (its ``work`` directory)."""
        work = Path(journal).parent.parent
        return cls(
            results=work.parent / "results",
            work=work,
            logs=work.parent / "logs",
            benchmarks=work.parent / "benchmarks",
        )

    # ---------------------------------------------------------------------------- results --
    @property
    def audit_dir(self) -> Path:
        return self.results / "audit"

    @property
    def audit(self) -> AuditFiles:
        return AuditFiles(self.audit_dir)

    @property
    def audit_summary(self) -> Path:
        return self.audit.summary

    @property
    def audit_flags(self) -> Path:
        return self.audit.flags

    @property
    def audit_samples(self) -> Path:
        """The samples the audit kept, normalized: the shard step's input."""
        return self.audit.samples

    @property
    def audit_excluded(self) -> Path:
        return self.audit.excluded

    @property
    def shards_dir(self) -> Path:
        return self.results / "shards"

    def shard(self, shard: str) -> Path:
        return self.shards_dir / f"{shard}.parquet"

    def shard_files(self) -> list[Path]:
        """The prompt shards written so far (temp files of an atomic write excluded)."""
        return sorted(p for p in self.shards_dir.glob("*.parquet") if not p.name.startswith("."))

    @property
    def generations_dir(self) -> Path:
        return self.results / "generations"

    def records(self, shard: str) -> Path:
        return self.generations_dir / f"{shard}{SHARD_OUTPUT_SUFFIX}"

    def record_files(self) -> list[Path]:
        """Every shard's generation records (``records``) written so far."""
        return self.shard_outputs_in(self.generations_dir)

    def finished_shards(self) -> list[str]:
        """The shards whose generation records are written (their generate job finished)."""
        return [p.name.removesuffix(SHARD_OUTPUT_SUFFIX) for p in self.record_files()]

    @staticmethod
    def shard_outputs_in(directory: str | os.PathLike[str]) -> list[Path]:
        """The per-shard compressed outputs in ``directory`` (``records``, ``quarantine``)."""
        return sorted(Path(directory).glob(f"[0-9]*{SHARD_OUTPUT_SUFFIX}"))

    def failed(self, shard: str) -> Path:
        return self.generations_dir / f"{shard}.failed.jsonl"

    def failed_files(self) -> list[Path]:
        """Every shard's failed requests (``failed``) written so far."""
        return sorted(self.generations_dir.glob("*.failed.jsonl"))

    @property
    def valid_dir(self) -> Path:
        return self.results / "valid"

    def valid(self, shard: str) -> Path:
        return self.valid_dir / f"{shard}.parquet"

    @property
    def quarantine_dir(self) -> Path:
        return self.results / "quarantine"

    def quarantine(self, shard: str) -> Path:
        return self.quarantine_dir / f"{shard}{SHARD_OUTPUT_SUFFIX}"

    def quarantine_files(self) -> list[Path]:
        return self.shard_outputs_in(self.quarantine_dir)

    @property
    def dataset_dir(self) -> Path:
        return self.results / "dataset"

    @property
    def dataset_manifest(self) -> Path:
        return self.dataset_dir / MANIFEST_NAME

    @property
    def reaudit_summary(self) -> Path:
        return self.results / "reaudit" / "summary.json"

    @property
    def ready(self) -> Path:
        return self.results / "READY.json"

    @property
    def export_dir(self) -> Path:
        """Trainer exports (``regen.output.export``): specforge.jsonl, tokenized.jsonl, manifest.json."""
        return self.results / "export"

    @property
    def export_specforge(self) -> Path:
        return self.export_dir / "specforge.jsonl"

    @property
    def export_tokenized(self) -> Path:
        return self.export_dir / "tokenized.jsonl"

    @property
    def export_specforge_eval(self) -> Path:
        """The held-out eval split beside the training file (``eval_split_beside``)."""
        return eval_split_beside(self.export_specforge)

    @property
    def export_tokenized_eval(self) -> Path:
        return eval_split_beside(self.export_tokenized)

    @property
    def export_token_freq(self) -> Path:
        """Supervised-token counts for the draft vocabulary (``token_freq_beside``)."""
        return token_freq_beside(self.export_tokenized)

    @property
    def export_vocab_dir(self) -> Path:
        """The draft vocabulary files ``regen vocab`` writes (``regen.output.vocab``)."""
        return self.export_dir / "vocab"

    @property
    def export_thinking(self) -> Path:
        """Each row's thinking mode and split side (``thinking_beside``)."""
        return thinking_beside(self.export_tokenized)

    @property
    def export_manifest(self) -> Path:
        return self.export_dir / "manifest.json"

    @property
    def features_dir(self) -> Path:
        """The target's hidden states (``regen.features``): one folder per shard."""
        return self.results / "features"

    def features_shard_dir(self, shard: str) -> Path:
        """One shard's feature files (``regen.features.store``: one safetensors per token row)."""
        return self.features_dir / shard

    def features_manifest(self, shard: str) -> Path:
        """One shard's feature manifest (``regen.features.store.ShardManifest``), written last."""
        return self.features_shard_dir(shard) / MANIFEST_NAME

    def features_published(self, shard: str) -> Path:
        """What one shard's features upload put where (``regen.features.publish``), beside its manifest."""
        return self.features_shard_dir(shard) / "_published.json"

    @property
    def reconcile(self) -> Path:
        return self.results / "reconcile.json"

    @property
    def report_dir(self) -> Path:
        return self.results / "report"

    def report_asset(self, name: str) -> Path:
        """One of the report's ``ASSET_NAMES``."""
        return self.report_dir / name

    @property
    def report_html(self) -> Path:
        """Where the README and ``make demo`` have ``snakemake --report`` write the report."""
        return self.results / "report.html"

    @property
    def plan_dir(self) -> Path:
        return self.results / "plan"

    @property
    def server_plan(self) -> Path:
        return self.plan_dir / "server.json"

    @property
    def pilot(self) -> Path:
        return self.plan_dir / "pilot.json"

    @property
    def published(self) -> Path:
        return self.results / "published.json"

    # ------------------------------------------------------------------------------- work --
    @property
    def journal_dir(self) -> Path:
        return self.work / "journal"

    def journal(self, shard: str) -> Path:
        return self.journal_dir / f"{shard}{JOURNAL_SUFFIX}"

    def journal_files(self) -> list[Path]:
        return sorted(self.journal_dir.glob(f"*{JOURNAL_SUFFIX}"))

    def journal_shards(self) -> list[str]:
        """The shards that have a journal."""
        return [p.name.removesuffix(JOURNAL_SUFFIX) for p in self.journal_files()]

    @property
    def status_dir(self) -> Path:
        return self.work / "status"

    def status(self, shard: str) -> Path:
        return self.status_dir / f"{shard}.json"

    def replay_note(self, shard: str) -> Path:
        """What a generate job found at its start: how many samples of its shard it replays from the
        journal and how many it generates (``regen.generate.replay``; ``regen status`` shows it)."""
        return self.status_dir / "replay" / f"{shard}.json"

    def replay_notes(self) -> list[Path]:
        return sorted((self.status_dir / "replay").glob("*.json"))

    @property
    def stage_progress_dir(self) -> Path:
        """Long stages' progress files (``regen.observe.stage_progress``): beside, not among, the shards'."""
        return self.status_dir / "stages"

    def stage_progress(self, stage: str) -> Path:
        return self.stage_progress_dir / f"{stage}.json"

    @property
    def servers_root(self) -> Path:
        """Every GPU slot directory of the run lives under here (per node, or per Slurm job below it)."""
        return self.work / "servers"

    @property
    def server_logs_root(self) -> Path:
        return self.logs / "servers"

    def servers_dir(self, job: str | None = None) -> Path:
        """This allocation's slot directory: per Slurm job ``job`` when given, else per node."""
        return self.servers_root / f"{SLURM_DIR_PREFIX}{job}" if job else self.servers_root

    def server_logs_dir(self, job: str | None = None) -> Path:
        return self.server_logs_root / f"{SLURM_DIR_PREFIX}{job}" if job else self.server_logs_root

    def server_dirs(self) -> list[Path]:
        """The per-node slot directory and every per-Slurm-job one."""
        return server_dirs(self.servers_root)

    def url_files(self) -> list[Path]:
        return url_files(self.servers_root)

    def realized_files(self) -> list[Path]:
        return realized_files(self.servers_root)

    def restart_files(self) -> list[Path]:
        return restart_files(self.servers_root)

    @property
    def sweep_dir(self) -> Path:
        return self.work / "sweep"

    def sweep_candidate(self, index: int) -> SweepCandidateFiles:
        return SweepCandidateFiles.of(self.sweep_dir, index)

    def failure_notes_dir(self, job: str | None = None) -> Path:
        """One note per server-failure cause of this Snakemake run, in the slot directory
        (``failure_note``)."""
        return self.servers_dir(job) / "failures"

    @property
    def stale_dir(self) -> Path:
        """Files of other configs and plans, moved aside when a run starts (``regen.output.stale``)."""
        return self.work / "stale"

    @property
    def earlier_runs_dir(self) -> Path:
        """Earlier runs kept whole when a run of another config remakes their outputs
        (``regen.output.stale``, ``regen.output.kept_runs``):
        ``work/earlier-runs/{stamp}-{config}/results/...`` beside its ``KEPT_INDEX``; the last
        ``keep.earlier_runs`` of them."""
        return self.work / "earlier-runs"

    def earlier_run(self, stamp: str, config: str) -> Path:
        """One earlier run's folder (its ``results/`` inside, paths kept)."""
        safe = re.sub(r"[^A-Za-z0-9._+-]", "_", config) or "config"
        return self.earlier_runs_dir / f"{stamp}-{safe}"

    @property
    def run_marker(self) -> Path:
        """Which run is, or was last, under way here (``regen.run_marker``): config, pid, host, phase,
        heartbeat, outcome."""
        return self.work / "run.json"

    @property
    def snakemake_locks(self) -> Path:
        """Snakemake's own lock files (``.snakemake/locks`` in the working directory)."""
        return self.results.parent / ".snakemake" / "locks"

    @property
    def provisional_plan(self) -> Path:
        """The plan the servers were prestarted with, its workload and where it came from
        (``regen.tune.prestart``; the ``tune`` rule adopts or stops those servers)."""
        return self.work / "plan" / "provisional_server.json"

    @property
    def prestart_request(self) -> Path:
        """What ``onstart`` hands the prestart process: the run's config and what its DAG knows."""
        return self.work / "plan" / "prestart_request.json"

    def prestart_lock(self, job: str | None = None) -> Path:
        """Held exclusively while the prestart process decides, shared by ``tune`` before it confirms."""
        return prestart_lock_in(self.servers_dir(job))

    @property
    def shard_count_file(self) -> Path:
        """The settled count of ``shards.count: auto`` (``regen.ingest.shard_count``)."""
        return self.work / "plan" / "shards.json"

    # ------------------------------------------------------------------------------- logs --
    def log(self, rule: str, shard: str | None = None) -> Path:
        """A rule's log: ``logs/{rule}.log``, or per shard ``logs/{rule}/{shard}.log``."""
        return self.logs / rule / f"{shard}.log" if shard is not None else self.logs / f"{rule}.log"

    @property
    def prestart_log(self) -> Path:
        """The prestart process's stdout and stderr (``regen.tune.prestart``)."""
        return self.logs / "prestart.log"

    def verdict(self, rule: str) -> Path:
        """A gate's verdict beside its rule's log, kept when the failed job's outputs are deleted
        (``regen.verdict``)."""
        return verdict_for(self.log(rule))

    def verdicts(self) -> dict[str, Path]:
        """Every gate verdict in the log folder, by the rule it belongs to."""
        if not self.logs.is_dir():
            return {}
        found = sorted(self.logs.glob("*" + VERDICT_SUFFIX))
        return {p.name.removesuffix(VERDICT_SUFFIX): p for p in found}

    def kept_excluded(self, rule: str) -> Path:
        """A copy of the rows a gate excluded, with their reasons, beside its rule's log (``logs/audit.log``
        -> ``logs/audit.excluded.jsonl``): kept when Snakemake deletes a failed job's ``excluded.jsonl``."""
        return self.log(rule).with_suffix(".excluded.jsonl")

    @property
    def failed_run_landing(self) -> Path:
        """The report's first page a failed run leaves: NOT READY and why (``regen.observe.landing``)."""
        return self.logs / "report" / LANDING_RST

    def benchmark(self, rule: str, shard: str | None = None) -> Path:
        """A rule's Snakemake benchmark: ``benchmarks/{rule}.tsv``, or per shard."""
        return (
            self.benchmarks / rule / f"{shard}.tsv" if shard is not None else self.benchmarks / f"{rule}.tsv"
        )


#: the layout of a run in the current working directory (the Snakefile's)
RUN = RunLayout()
