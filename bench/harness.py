"""The harness every bench shares (issue 51 item 6), so a bench file holds its campaign and nothing else:

- ``--smoke``: the bench at tiny sizes for CI, the same last line (:func:`add_smoke`, :func:`parse_args`);
- the last line every bench ends with, ``NAME: key=value ... ratio=...`` (:func:`result_line`,
  :func:`report`; :func:`fmt` for a number that may be missing);
- timing, wall and CPU (:class:`Stopwatch`), and the peak resident memory (:func:`peak_rss_mb`);
- the GPU campaigns' ``--dry-cpu``, ``--out`` and ``--work`` (:func:`add_campaign_args`);
- results: JSON written atomically (:func:`write_json`), by default under ``measurements/``
  (:data:`MEASUREMENTS`), outside the code tree; a campaign's end, JSON, page and last line
  (:func:`publish`).

The GPU campaigns add their side (the workload, the server section, the GPU's memory) in
``bench.gpu.harness``; the workflow copy a bench runs in is ``bench.workflow``.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from regen.io import atomic_open

REPO = Path(__file__).resolve().parent.parent
#: where measured pages, JSON and logs live (not under bench/: results are not code)
MEASUREMENTS = REPO / "measurements"


def add_smoke(parser: argparse.ArgumentParser, **tiny: Any) -> None:
    """``--smoke``: the bench at ``tiny``'s sizes (argument dest -> value) for CI: seconds, same last line."""
    sizes = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in tiny.items())
    parser.add_argument(
        "--smoke", action="store_true", help=f"CI smoke run at tiny sizes ({sizes}; given ones win)"
    )
    parser.set_defaults(_smoke_sizes=tiny)


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``parser.parse_args`` with ``--smoke``'s sizes where the command line left the default."""
    args = parser.parse_args(argv)
    tiny: dict[str, Any] = getattr(args, "_smoke_sizes", {})
    if getattr(args, "smoke", False):
        for dest, value in tiny.items():
            if getattr(args, dest) == parser.get_default(dest):
                setattr(args, dest, value)
    return args


def add_campaign_args(
    parser: argparse.ArgumentParser,
    *,
    work: Path | None = None,
    dry_help: str = "regen's simulated server instead of SGLang, on CPU",
) -> None:
    """The arguments every GPU campaign takes: ``--dry-cpu`` (its CPU rehearsal), ``--out`` (results;
    default :data:`MEASUREMENTS`) and ``--work`` (scratch: servers, logs, model; ``work`` its default)."""
    parser.add_argument("--dry-cpu", action="store_true", help=dry_help)
    parser.add_argument(
        "--out", type=Path, default=MEASUREMENTS, help="results folder (JSON, markdown, logs)"
    )
    parser.add_argument("--work", type=Path, default=work, help="scratch folder (servers, logs, model)")


def fmt(value: Any, nd: int | str = 1, missing: str = "none", thousands: bool = False) -> str:
    """A float with ``nd`` decimals (a str ``nd`` is a format spec: ``"g"``, ``".4g"``), anything else as
    ``str``; ``missing`` for None or NaN; with ``thousands`` (a page's tables), numbers grouped by commas.
    Every bench's numbers go through it (a last line: ``missing="na"``)."""
    if value is None or (isinstance(value, float) and value != value):
        return missing
    sep = "," if thousands else ""
    if isinstance(value, float):
        return f"{value:{sep}{nd if isinstance(nd, str) else f'.{nd}f'}}"
    return f"{value:{sep}}" if isinstance(value, int) and thousands else str(value)


def result_line(name: str, **fields: Any) -> str:
    """``NAME: key=value ...``, the line a bench ends with; a value is printed as given (None: ``none``)."""
    return f"{name}: " + " ".join(f"{k}={'none' if v is None else v}" for k, v in fields.items())


def report(name: str, **fields: Any) -> int:
    """Print the bench's last line (:func:`result_line`); returns 0, the bench's exit status."""
    print(result_line(name, **fields), flush=True)
    return 0


@dataclass
class Stopwatch:
    """``with Stopwatch() as t: ...``; then ``t.wall_s`` and ``t.cpu_s`` (this process's CPU)."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    _start: tuple[float, float] = field(default=(0.0, 0.0), repr=False)

    def __enter__(self) -> Stopwatch:
        self._start = (time.perf_counter(), time.process_time())
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.wall_s = time.perf_counter() - self._start[0]
        self.cpu_s = time.process_time() - self._start[1]


def peak_rss_mb(who: Literal["self", "children", "either"] = "self") -> float:
    """The peak resident memory in MiB of this process, of its largest waited-for child, or the larger."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"self": own, "children": children, "either": max(own, children)}[who] / 1024


def log(msg: str) -> None:
    """A console line with the wall-clock time in front."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def write_json(path: Path, obj: Any) -> None:
    """``obj`` as indented JSON at ``path``, atomically (values JSON has no type for as ``str``)."""
    with atomic_open(path) as fh:
        fh.write(json.dumps(obj, indent=1, default=str) + "\n")


def publish(out: Path, stem: str, doc: Any, page: str | None = None, line: str | None = None) -> int:
    """A campaign's end: ``{stem}.json`` (and its markdown page ``{stem}.md``) under ``out``, each
    written atomically, then its last line; returns 0, the campaign's exit status."""
    write_json(out / f"{stem}.json", doc)
    if page is not None:
        with atomic_open(out / f"{stem}.md") as fh:
            fh.write(page)
    if line is not None:
        print(line, flush=True)
    return 0
