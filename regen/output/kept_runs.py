"""Earlier runs kept whole in ``work/earlier-runs/`` (``RunLayout.earlier_runs_dir``): sharing unchanged
files, never kept twice, pruned to the last K.

When a run starts and would remake or drop an earlier run's finished work, ``regen.output.stale`` keeps
that run whole here, its ``results/`` paths kept (:func:`keep_run`). A checkout switched between configs
keeps one run per switch, so each kept run shares what it has in common with the others:

- every file of a kept run is a **hard link** where it can be: to a file with the same content (SHA-256)
  already in a kept run (``KEPT_INDEX``, written beside each kept ``results/``, lists each file's digest),
  else for a large file to the live one (regen writes its outputs by atomic rename and Snakemake removes
  an output before remaking it, so the kept inode is never written again); small files are copied once,
  so a tool that rewrites one in place (``snakemake --report``) cannot change the kept copy;
- a run whose files are all identical to those of a run already kept is **not kept again** (the kept one
  is named instead);
- only the last ``keep.earlier_runs`` kept runs stay (:func:`prune_kept_runs`); older *kept copies* are
  removed, with one console line naming each and what it freed. The live ``results/`` is never pruned,
  and the run just kept is always among those that stay, so pruning never removes a run's only copy.

A kept run is assembled in a hidden folder beside the others and renamed into place once whole; a
leftover one (a crash while keeping: its run was still in ``results/`` then) is removed on the next keep.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regen.io import read_json, write_json
from regen.layout.names import KEPT_INDEX
from regen.layout.run import RunLayout
from regen.run_marker import ResultsOf
from regen.runconfig import validated

#: files at least this large may be kept by a hard link to the live file (see the module docstring)
LINK_FROM_BYTES = 1 << 20
#: prefix of a kept run still being assembled
PARTIAL_PREFIX = ".partial-"
HASH_CHUNK = 1 << 20
#: a kept symlink's digest: this, then its target
SYMLINK = "symlink:"


@dataclass(frozen=True, slots=True)
class KeepConfig:
    """The ``keep`` config section: how many earlier runs ``work/earlier-runs/`` keeps."""

    earlier_runs: int

    @classmethod
    def from_dict(cls, raw: Any) -> KeepConfig:
        """Validate ``raw`` against the schema's ``keep`` section, fill its defaults, and type it."""
        return cls(earlier_runs=int(validated("keep", raw)["earlier_runs"]))


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _as_kept(path: Path) -> dict[str, Any]:
    """What ``KEPT_INDEX`` records of a kept file besides its digest: size and mtime, by which a file
    rewritten after it was kept (``regen reconcile --results`` there rewrites reconcile.json) is told
    from the one kept."""
    st = path.lstat()
    return {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


@dataclass(frozen=True, slots=True)
class KeptRun:
    """One kept run: its folder (``results/`` inside), when it was kept, and per file its digest, size and
    mtime as kept (None: kept before ``KEPT_INDEX`` was written)."""

    folder: Path
    kept_at: float
    files: dict[str, dict[str, Any]] | None

    @property
    def results(self) -> Path:
        return self.folder / "results"

    @classmethod
    def read(cls, folder: Path) -> KeptRun:
        index = folder / KEPT_INDEX
        obj = read_json(index) if index.is_file() else None
        if isinstance(obj, dict) and isinstance(obj.get("files"), dict):
            return cls(folder, float(obj.get("kept_at") or folder.stat().st_mtime), dict(obj["files"]))
        return cls(folder, folder.stat().st_mtime, None)

    def unchanged(self) -> dict[str, str]:
        """relative path -> digest of the files still as they were kept (a file rewritten or gone since
        is left out: its recorded digest no longer says what it holds)."""
        out = {}
        for rel, entry in (self.files or {}).items():
            try:
                same = _as_kept(self.results / rel) == {k: entry.get(k) for k in ("bytes", "mtime_ns")}
            except OSError:
                continue
            if same or str(entry.get("sha256", "")).startswith(SYMLINK):
                out[rel] = str(entry["sha256"])
        return out

    def as_kept(self) -> dict[str, str] | None:
        """Every file's digest when none changed since it was kept, else None."""
        unchanged = self.unchanged()
        return unchanged if self.files is not None and len(unchanged) == len(self.files) else None


def kept_runs(layout: RunLayout) -> list[KeptRun]:
    """Every kept run, oldest first (leftover partial folders left out)."""
    root = layout.earlier_runs_dir
    if not root.is_dir():
        return []
    runs = [KeptRun.read(d) for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")]
    return sorted(runs, key=lambda r: (r.kept_at, r.folder.name))


class _SharedFiles:
    """Files already kept, by content digest and by inode: where a new kept file can link to."""

    def __init__(self, runs: list[KeptRun]) -> None:
        self.by_digest: dict[str, Path] = {}
        self.digest_of_inode: dict[tuple[int, int], str] = {}
        for run in runs:
            for rel, digest in run.unchanged().items():
                path = run.results / rel
                if digest.startswith(SYMLINK):
                    continue
                st = path.lstat()
                self.by_digest.setdefault(digest, path)
                self.digest_of_inode[(st.st_dev, st.st_ino)] = digest

    def digest(self, src: Path) -> str:
        """``src``'s digest: known when its inode is already kept, else read."""
        st = src.stat()
        return self.digest_of_inode.get((st.st_dev, st.st_ino)) or sha256_of(src)

    def keep(self, src: Path, dst: Path, digest: str) -> None:
        """``src`` kept at ``dst``: linked to a kept file of the same content, else (large) to ``src``
        itself, else copied; the kept file is then a link target for later runs."""
        dst.parent.mkdir(parents=True, exist_ok=True)
        same = self.by_digest.get(digest)
        try:
            if same is not None:
                os.link(same, dst)
                return
        except OSError:
            pass
        try:
            if src.stat().st_size >= LINK_FROM_BYTES:
                os.link(src, dst)
            else:
                shutil.copy2(src, dst)
        except OSError:
            shutil.copy2(src, dst)
        self.by_digest[digest] = dst


def _walk(results: Path) -> Iterator[tuple[Path, list[Path]]]:
    """Each directory under ``results`` (itself first) with its files and symlinks, sorted; symlinks are
    not followed."""
    for dirpath, dirnames, filenames in os.walk(results):
        dirnames.sort()
        base = Path(dirpath)
        links = [base / d for d in dirnames if (base / d).is_symlink()]
        yield base, [*(base / name for name in sorted(filenames)), *links]


@dataclass(frozen=True, slots=True)
class Kept:
    """Where an earlier run is kept (``results/`` of the folder), and whether it was kept just now
    (False: a run already kept holds the same files)."""

    results: Path
    new: bool


def _digests(results: Path, shared: _SharedFiles) -> dict[str, str]:
    """relative path -> content digest of every regular file under ``results`` (a symlink: its target)."""
    out = {}
    for path in (f for _, files in _walk(results) for f in files):
        rel = str(path.relative_to(results))
        out[rel] = SYMLINK + os.readlink(path) if path.is_symlink() else shared.digest(path)
    return out


def keep_run(layout: RunLayout, of: ResultsOf | None, now: float | None = None) -> Kept:
    """The whole of ``layout.results`` kept in ``RunLayout.earlier_run`` (see the module docstring),
    unless a kept run holds the same files; where it is kept."""
    runs = kept_runs(layout)
    shared = _SharedFiles(runs)
    files = _digests(layout.results, shared)
    for run in reversed(runs):
        if run.as_kept() == files:
            return Kept(run.results, new=False)
    t = time.time() if now is None else now
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(t))
    dest = layout.earlier_run(stamp, of.config if of is not None else "unknown-config")
    n = 0
    while dest.exists():
        n += 1
        dest = dest.with_name(f"{dest.name.split('~')[0]}~{n}")
    partial = dest.with_name(PARTIAL_PREFIX + dest.name)
    shutil.rmtree(partial, ignore_errors=True)
    index_files = {}
    for rel, digest in files.items():
        src, dst = layout.results / rel, partial / "results" / rel
        if digest.startswith(SYMLINK):
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(src), dst)
        else:
            shared.keep(src, dst, digest)
        index_files[rel] = {"sha256": digest, **_as_kept(dst)}
    for d, _ in _walk(layout.results):  # empty folders too
        (partial / "results" / d.relative_to(layout.results)).mkdir(parents=True, exist_ok=True)
    index = {
        "config": of.config if of is not None else None,
        "config_id": of.config_id if of is not None else None,
        "kept_at": t,
        "files": index_files,
    }
    write_json(partial / KEPT_INDEX, index)
    os.replace(partial, dest)
    return Kept(dest / "results", new=True)


def _bytes_freed(folders: list[Path]) -> int:
    """What removing ``folders`` frees: the bytes of the files all of whose names lie in them."""
    names: dict[tuple[int, int], int] = {}
    size: dict[tuple[int, int], tuple[int, int]] = {}
    for folder in folders:
        for dirpath, _, filenames in os.walk(folder):
            for name in filenames:
                st = os.lstat(os.path.join(dirpath, name))
                key = (st.st_dev, st.st_ino)
                names[key] = names.get(key, 0) + 1
                size[key] = (st.st_size, st.st_nlink)
    return sum(n for key, (n, links) in size.items() if names[key] == links)


def prune_kept_runs(layout: RunLayout, keep_last: int, keeping: Path | None = None) -> list[str]:
    """Remove all but the last ``keep_last`` (at least 1) kept runs, and any leftover partial folder; the
    console lines naming what went. ``keeping`` (a kept ``results/``) always stays."""
    root = layout.earlier_runs_dir
    if not root.is_dir():
        return []
    lines = []
    for leftover in sorted(root.glob(PARTIAL_PREFIX + "*")):
        shutil.rmtree(leftover, ignore_errors=True)
        lines.append(f"regen: removed {leftover}: an earlier run left it half kept (that run was kept again)")
    runs = kept_runs(layout)
    stays = {r.folder for r in runs[-max(1, keep_last) :]}
    if keeping is not None:
        stays.add(keeping.parent)
    going = [r for r in runs if r.folder not in stays]
    if not going:
        return lines
    freed = _bytes_freed([r.folder for r in going])
    for run in going:
        shutil.rmtree(run.folder)
    lines.append(
        f"regen: {root} keeps the last {keep_last} earlier run(s) (keep.earlier_runs): removed "
        f"{len(going)} older kept cop{'y' if len(going) == 1 else 'ies'}, freeing {freed / 1e6:.1f} MB "
        "(files they shared with the runs kept stay); no current output was touched:"
    )
    lines += [f"  {r.folder}" for r in going]
    return lines


def kept_line(kept: Kept, of: ResultsOf | None, layout: RunLayout) -> str:
    """The one console line naming where an earlier run is kept and how to read it there."""
    ready = kept.results / layout.ready.relative_to(layout.results)
    what = "READY run" if ready.is_file() else "run"
    whose = f"config {of.config}" if of is not None else "an earlier config"
    where = (
        f"is kept whole in {kept.results}"
        if kept.new
        else f"is already kept whole, file for file, in {kept.results} (not kept again)"
    )
    return (
        f"regen: the earlier {what} of {whose} {where} (this run remakes or does not reuse its outputs): "
        f"`regen reconcile --results {kept.results}` checks it there; copy it back over {layout.results} "
        "to make it current again"
    )
