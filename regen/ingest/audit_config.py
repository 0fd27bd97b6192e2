"""The ``audit`` config section, typed (:class:`AuditConfig`), and ``generate.regenerate`` as the schema
defines it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from regen.ingest.decontam import DecontaminationConfig
from regen.runconfig import section_schema, validated

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AuditConfig:
    """The ``audit`` config section (built by :meth:`from_dict`: the schema's defaults filled in and its
    rules applied), with the run's ``generate.regenerate``."""

    context_limit: int
    scaffolding_max_tokens: int
    gates: Mapping[str, float]
    override_gates: bool
    exclude: frozenset[str]
    decontamination: DecontaminationConfig
    #: ``generate.regenerate`` (which old answers this run replaces); None: not given, the schema's
    #: default is assumed and the summary says so
    regenerate: str | None

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None, regenerate: str | None = None) -> AuditConfig:
        """Validate ``raw`` against the schema's ``audit`` section, fill its defaults, and type it;
        ``regenerate`` is ``generate.regenerate`` (None: not known here)."""
        modes = regenerate_setting()["enum"]
        if regenerate is not None and regenerate not in modes:
            raise ValueError(f"generate.regenerate: {regenerate!r} is not one of {', '.join(modes)}")
        a = validated("audit", raw)
        return cls(
            context_limit=int(a["context_limit"]),
            scaffolding_max_tokens=int(a["scaffolding_max_tokens"]),
            gates={name: float(limit) for name, limit in a["gates"].items()},
            override_gates=bool(a["override_gates"]),
            exclude=frozenset(a["exclude"]),
            decontamination=DecontaminationConfig.from_dict(a["decontamination"]),
            regenerate=regenerate,
        )


def regenerate_setting() -> dict[str, Any]:
    """``generate.regenerate`` as the config schema defines it: ``enum`` and ``default`` live there."""
    return section_schema("generate")["properties"]["regenerate"]
