"""The pilot file, ``results/plan/pilot.json`` (:attr:`regen.layout.run.RunLayout.pilot`): what ``regen tune
--sweep`` measured of each candidate and what it projects for the run; the plan file's companion
(:class:`regen.sglang.config.PlanFile`).

One writer, :func:`regen.tune.sweep.write_pilot`; one reader, :meth:`PilotFile.read`. Every other module
takes the typed record: ``regen check`` (a forced speculative setting the sweep measured slower), ``regen
status`` and the server-plan page (the projection, the candidates), the sweep's own print
(:mod:`regen.tune.sweep_report`), the client's request time (the measured decode-step line,
:mod:`regen.generate.server_time`) and the projection replay bench. A section a reader shows whole (the
pooled lengths, the censored-length model, the MTP decision) stays the mapping it was written as; the
numbers code computes with are typed fields. A section the file lacks reads as absent (None, empty): older
pilots and hand-made ones in tests have fewer sections; a section of the wrong type is a
:class:`PilotFileError` naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regen.io import read_json


class PilotFileError(ValueError):
    """A pilot file that is not one: not a JSON object, or a field of the wrong type."""


def _section(doc: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any] | None:
    value = doc.get(key)
    if value is not None and not isinstance(value, Mapping):
        raise PilotFileError(f"{where}: {key} is {type(value).__name__}, not an object")
    return value


@dataclass(frozen=True, slots=True)
class Projection:
    """Wall time and GPU-hours for ``remaining_samples`` (completions: requests, one answer each) at the
    pilot's measured rate and tokens per completion (``tokens_per_sample``). Made by
    :func:`regen.tune.projection.project`; here, beside its one reader, so a ground module can type it."""

    remaining_samples: int
    tokens_per_sample: float
    out_tok_s_per_server: float
    gpus: int
    tp: int
    servers: int
    remaining_output_tokens: float
    wall_s: float
    gpu_hours: float

    def to_json(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "wall_h": self.wall_s / 3600,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Projection:
        """The projection as written; a missing rate, wall or GPU-hours reads 0 (a rate of 0 is one
        :func:`regen.tune.projection.project` refuses), missing servers, GPUs or output tokens are derived.
        KeyError, TypeError or ValueError where its samples, tokens or tp are missing or not numbers."""
        tp = int(d["tp"])
        servers = int(d.get("servers") or int(d.get("gpus") or 0) // max(1, tp))
        samples, tokens = int(d["remaining_samples"]), float(d["tokens_per_sample"])
        out = d.get("remaining_output_tokens")
        return cls(
            remaining_samples=samples,
            tokens_per_sample=tokens,
            out_tok_s_per_server=float(d.get("out_tok_s_per_server") or 0.0),
            gpus=int(d.get("gpus") or servers * tp),
            tp=tp,
            servers=servers,
            remaining_output_tokens=samples * tokens if out is None else float(out),
            wall_s=float(d.get("wall_s") or 0.0),
            gpu_hours=float(d.get("gpu_hours") or 0.0),
        )


@dataclass(frozen=True, slots=True)
class PilotProjection:
    """One projection section of the pilot file: the :class:`Projection` as written, ``lower_bound``
    beside it (the pilot saw too few whole answers), and every key as written."""

    projection: Projection
    lower_bound: bool
    #: every key as written (the server-plan page's table)
    fields: Mapping[str, Any]

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> PilotProjection | None:
        """The section, or None where it is absent or lacks its samples, tokens or tp."""
        if not d:
            return None
        try:
            return cls(Projection.from_json(d), bool(d.get("lower_bound")), dict(d))
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True, slots=True)
class PilotCandidate:
    """One measured candidate (``regen.tune.sweep.CandidateResult`` as written)."""

    label: str
    args: tuple[str, ...]
    ok: bool
    error: str | None
    concurrency: int | None
    out_tok_s: float | None
    #: the rate the sweep chose by (the server's decode rate where it had one, else the client's window)
    rate_tok_s: float | None
    req_s: float | None
    #: p50/p90/p99 and the truncation rate of its completions, as written
    lengths: Mapping[str, Any]
    #: the seconds its running set took to fill (the closed-loop projection's ramp)
    ramp_s: float | None = None

    @property
    def rate(self) -> float:
        """The rate the sweep ranked it by: ``rate_tok_s``, else the client's ``out_tok_s``."""
        return float(self.rate_tok_s if self.rate_tok_s is not None else self.out_tok_s or 0.0)

    @classmethod
    def from_json(cls, d: Mapping[str, Any], where: str) -> PilotCandidate:
        if not isinstance(d, Mapping):
            raise PilotFileError(f"{where}: a candidate is {type(d).__name__}, not an object")

        def num(key: str) -> float | None:
            return None if d.get(key) is None else float(d[key])

        try:
            return cls(
                str(d.get("label") or ""),
                tuple(str(a) for a in d.get("args") or ()),
                bool(d.get("ok")),
                None if d.get("error") is None else str(d["error"]),
                None if d.get("concurrency") is None else int(d["concurrency"]),
                num("out_tok_s"),
                num("rate_tok_s"),
                num("req_s"),
                dict(d.get("lengths") or {}),
                num("ramp_s"),
            )
        except (TypeError, ValueError) as exc:
            raise PilotFileError(f"{where}: candidate {d.get('label')!r}: {exc}") from exc


@dataclass(frozen=True, slots=True)
class PilotFile:
    """``results/plan/pilot.json``, typed."""

    path: Path | None
    created_at: float | None
    candidates: tuple[PilotCandidate, ...]
    best_index: int | None
    best_label: str | None
    best_args: tuple[str, ...]
    rate_method: str
    seconds_per_candidate: float | None
    #: the pooled output lengths (``regen.tune.sweep.LengthStats``), as written
    lengths: Mapping[str, Any]
    #: the MTP decision (``regen.tune.sweep.mtp_decision``), as written; None without one
    mtp: Mapping[str, Any] | None
    #: completions each prompt counted in the projection (``Remaining.completions_per_sample``)
    completions_per_sample: int
    projection: PilotProjection | None
    projection_whole_run: PilotProjection | None
    #: the closed-loop projection (``regen.tune.sweep.closed_loop_projection``), as written
    projection_closed_loop: Mapping[str, Any] | None
    #: the pilot's unfinished answers and their model (``regen.tune.sweep.CensoredLengths``), as written
    censored_lengths: Mapping[str, Any]
    assumptions: tuple[str, ...]

    @property
    def best(self) -> PilotCandidate | None:
        """The starred candidate, None when the index points at none."""
        i = self.best_index
        return self.candidates[i] if i is not None and 0 <= i < len(self.candidates) else None

    @property
    def step_model(self) -> Mapping[str, Any] | None:
        """The measured decode-step line (``projection_closed_loop.step_model``), as written."""
        closed = self.projection_closed_loop or {}
        step = closed.get("step_model")
        return step if isinstance(step, Mapping) else None

    @classmethod
    def from_json(cls, doc: object, path: Path | None = None) -> PilotFile:
        where = str(path) if path is not None else "pilot file"
        if not isinstance(doc, Mapping):
            raise PilotFileError(f"{where}: not a pilot file (not a JSON object)")
        rows = doc.get("candidates")
        rows = [] if rows is None else rows
        if not isinstance(rows, list):
            raise PilotFileError(f"{where}: candidates is {type(rows).__name__}, not a list")
        remaining = _section(doc, "remaining", where) or {}
        try:
            return cls(
                path=path,
                created_at=None if doc.get("created_at") is None else float(doc["created_at"]),
                candidates=tuple(PilotCandidate.from_json(r, where) for r in rows),
                best_index=None if doc.get("best_index") is None else int(doc["best_index"]),
                best_label=None if doc.get("best_label") is None else str(doc["best_label"]),
                best_args=tuple(str(a) for a in doc.get("best_args") or ()),
                rate_method=str(doc.get("rate_method") or "client window"),
                seconds_per_candidate=None
                if doc.get("seconds_per_candidate") is None
                else float(doc["seconds_per_candidate"]),
                lengths=dict(_section(doc, "lengths", where) or {}),
                mtp=_section(doc, "mtp", where),
                completions_per_sample=int(remaining.get("completions_per_sample") or 1),
                projection=PilotProjection.from_json(_section(doc, "projection", where)),
                projection_whole_run=PilotProjection.from_json(_section(doc, "projection_whole_run", where)),
                projection_closed_loop=_section(doc, "projection_closed_loop", where),
                censored_lengths=dict(_section(doc, "censored_lengths", where) or {}),
                assumptions=tuple(str(a) for a in doc.get("assumptions") or ()),
            )
        except (TypeError, ValueError) as exc:
            if isinstance(exc, PilotFileError):
                raise
            raise PilotFileError(f"{where}: {exc}") from exc

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> PilotFile | None:
        """The pilot file at ``path``; None when there is none. ``OSError`` or :class:`PilotFileError`
        (a ``ValueError``) when it cannot be read as one."""
        p = Path(path)
        if not p.is_file():
            return None
        try:
            doc = read_json(p)
        except ValueError as exc:
            raise PilotFileError(f"{p}: not JSON ({exc})") from exc
        return cls.from_json(doc, p)
