"""Files named after another file: a journal's index and lock, a log's verdict and attempt logs, the
exports' eval split, thinking modes and token counts, a failure note, a scratch generation's files and
the audit's files beside its summary."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from regen.layout.names import ATTEMPT_LOG_INFIX, JOURNAL_SUFFIX, VERDICT_SUFFIX


def journal_index(journal: str | os.PathLike[str]) -> Path:
    """The journal's index (``regen.generate.journal``): ``00000.jsonl`` -> ``00000.jsonl.index``."""
    p = Path(journal)
    return p.with_name(p.name + ".index")


def journal_lock(journal: str | os.PathLike[str]) -> Path:
    """The journal's writer lock (``regen.generate.journal_writer``): ``00000.jsonl`` ->
    ``00000.jsonl.lock``."""
    p = Path(journal)
    return p.with_name(p.name + ".lock")


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
