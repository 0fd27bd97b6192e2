"""The GPU server slots' files: per node (``work/servers/gpu{k}.*``) or, on a Slurm cluster, per Slurm
job (``work/servers/slurm-{job}/gpu{k}.*``), found again through :func:`server_dirs`; and a sweep
candidate's scratch, whose server runs on slot 0."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from regen.layout.names import JOURNAL_SUFFIX, REALIZED_SUFFIX, SLURM_DIR_PREFIX


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
