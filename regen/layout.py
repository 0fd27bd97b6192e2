"""The run's file layout: every path under ``results/``, ``work/`` and ``logs/`` has one name here.

``results/`` holds the Snakemake outputs (the rules spell the same paths, as a table of contents);
``work/`` holds what survives failed and killed jobs and is not a Snakemake output: the request
journals, the per-shard status files, the per-GPU server slot files and the sweep's scratch.

Server slot files live per node (``work/servers/gpu{k}.*``) or, on a Slurm cluster, per Slurm job
(``work/servers/slurm-{job}/gpu{k}.*``): a job's GPUs are its own, and files on a shared filesystem
must not collide across nodes. Whoever looks for servers (``stop_all_servers``, ``regen status``, the
report) looks in every one of these directories through :meth:`RunLayout.server_dirs`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: the per-Slurm-job subdirectory of a slot or log directory
SLURM_DIR_PREFIX = "slurm-"


def slurm_job_id() -> str | None:
    """This process's Slurm job, if it runs in one."""
    return os.environ.get("SLURM_JOB_ID") or None


@dataclass(frozen=True, slots=True)
class SlotFiles:
    """The files of GPU slot ``k`` (``work/servers/gpu{k}.*`` and ``logs/servers/gpu{k}.log``)."""

    slot: int
    lock: Path
    lease: Path
    url: Path
    realized: Path
    log: Path
    #: the supervisor's latest look at its server (``regen.sglang.progress``): in flight, stalled since
    progress: Path
    #: one JSON line per server restart (and per give-up), with its cause (``regen.sglang.progress``)
    restarts: Path

    @classmethod
    def of(cls, slot: int, workdir: str | os.PathLike[str], log_dir: str | os.PathLike[str]) -> SlotFiles:
        w = Path(workdir)
        return cls(
            slot=slot,
            lock=w / f"gpu{slot}.lock",
            lease=w / f"gpu{slot}.lease",
            url=w / f"gpu{slot}.url",
            realized=w / f"gpu{slot}.realized.json",
            log=Path(log_dir) / f"gpu{slot}.log",
            progress=w / f"gpu{slot}.progress.json",
            restarts=w / f"gpu{slot}.restarts.jsonl",
        )

    @classmethod
    def beside(cls, url_file: str | os.PathLike[str]) -> SlotFiles:
        """The slot files next to a ``gpu{k}.url`` (its log path is not known there: left beside it)."""
        path = Path(url_file)
        return cls.of(int(path.stem[3:]), path.parent, path.parent)


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
    return sorted(f for d in server_dirs(servers_root) for f in d.glob("gpu*.realized.json"))


@dataclass(frozen=True, slots=True)
class RunLayout:
    """The paths of one run, relative to its working directory (or under ``root``)."""

    results: Path = Path("results")
    work: Path = Path("work")
    logs: Path = Path("logs")

    @classmethod
    def under(cls, root: str | os.PathLike[str]) -> RunLayout:
        """The layout of a run whose working directory is ``root``."""
        r = Path(root)
        return cls(results=r / "results", work=r / "work", logs=r / "logs")

    @classmethod
    def of_journal(cls, journal: str | os.PathLike[str]) -> RunLayout:
        """The layout a journal ``{work}/journal/{shard}.jsonl`` belongs to (its ``work`` directory)."""
        work = Path(journal).parent.parent
        return cls(results=work.parent / "results", work=work, logs=work.parent / "logs")

    # ---------------------------------------------------------------------------- results --
    @property
    def audit_dir(self) -> Path:
        return self.results / "audit"

    @property
    def audit_summary(self) -> Path:
        return self.audit_dir / "summary.json"

    @property
    def audit_flags(self) -> Path:
        return self.audit_dir / "flags.parquet"

    @property
    def audit_samples(self) -> Path:
        """The samples the audit kept, normalized: the shard step's input."""
        return self.audit_dir / "samples.parquet"

    @property
    def audit_excluded(self) -> Path:
        return self.audit_dir / "excluded.jsonl"

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
        return self.generations_dir / f"{shard}.jsonl.zst"

    def record_files(self) -> list[Path]:
        """Every shard's generation records (``records``) written so far."""
        return self.shard_outputs_in(self.generations_dir)

    @staticmethod
    def shard_outputs_in(directory: str | os.PathLike[str]) -> list[Path]:
        """The per-shard compressed outputs in ``directory`` (``records``, ``quarantine``)."""
        return sorted(Path(directory).glob("[0-9]*.jsonl.zst"))

    def failed(self, shard: str) -> Path:
        return self.generations_dir / f"{shard}.failed.jsonl"

    @property
    def valid_dir(self) -> Path:
        return self.results / "valid"

    def valid(self, shard: str) -> Path:
        return self.valid_dir / f"{shard}.parquet"

    @property
    def quarantine_dir(self) -> Path:
        return self.results / "quarantine"

    def quarantine(self, shard: str) -> Path:
        return self.quarantine_dir / f"{shard}.jsonl.zst"

    def quarantine_files(self) -> list[Path]:
        return self.shard_outputs_in(self.quarantine_dir)

    @property
    def dataset_dir(self) -> Path:
        return self.results / "dataset"

    @property
    def reaudit_summary(self) -> Path:
        return self.results / "reaudit" / "summary.json"

    @property
    def ready(self) -> Path:
        return self.results / "READY.json"

    @property
    def export_dir(self) -> Path:
        """Trainer exports (``regen.export``): specforge.jsonl, tokenized.jsonl, manifest.json."""
        return self.results / "export"

    @property
    def reconcile(self) -> Path:
        return self.results / "reconcile.json"

    @property
    def report_dir(self) -> Path:
        return self.results / "report"

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
        return self.journal_dir / f"{shard}.jsonl"

    @property
    def status_dir(self) -> Path:
        return self.work / "status"

    def status(self, shard: str) -> Path:
        return self.status_dir / f"{shard}.json"

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


#: the layout of a run in the current working directory (the Snakefile's)
RUN = RunLayout()
