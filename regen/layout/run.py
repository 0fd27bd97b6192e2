"""One run's paths under ``results/``, ``work/``, ``logs/`` and ``benchmarks/``: :class:`RunLayout`, and
:data:`RUN`, the run in the working directory."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from regen.layout.beside import AuditFiles, eval_split_beside, thinking_beside, token_freq_beside, verdict_for
from regen.layout.names import (
    JOURNAL_SUFFIX,
    LANDING_RST,
    MANIFEST_NAME,
    SHARD_OUTPUT_SUFFIX,
    SLURM_DIR_PREFIX,
    VERDICT_SUFFIX,
)
from regen.layout.slots import (
    SweepCandidateFiles,
    prestart_lock_in,
    realized_files,
    restart_files,
    server_dirs,
    url_files,
)


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
