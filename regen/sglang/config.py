"""The typed plan file, built once, at the boundary.

:class:`PlanFile` is ``results/plan/server.json`` (written by the ``tune`` rule, only through
:meth:`PlanFile.write`): the launch flags, both predictions (``given`` flags as configured,
``recommended`` by the tuner) and which of the two the servers are launched with
(:attr:`PlanFile.launched`, decided once, by the tuner, from ``use_tuner``).
The typed ``server`` config section is :class:`regen.runconfig.ServerConfig`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from regen.io import read_json, write_json

# ------------------------------------------------------------------------------- plan file --
PlanSectionName = Literal["recommended", "given"]


@dataclass(frozen=True, slots=True)
class PlanFile:
    """``results/plan/server.json``: what the tuner predicted and which flags the servers launch with.

    ``given`` and ``recommended`` are ``MemoryPlan.to_json()`` sections (named fields such as
    ``kv_cache_tokens``, ``effective_max_running_requests``; ``regen.sglang.realized.PREDICTED_VS_REALIZED``
    pairs them with what a server really got). An external server's plan has no sections.
    """

    launch_args: tuple[str, ...]
    launched: PlanSectionName
    given: Mapping[str, Any]
    recommended: Mapping[str, Any]
    warnings: tuple[str, ...] = ()
    sglang_version: str | None = None
    model_config: str | None = None
    gpu_memory_mib: int | None = None
    external: bool = False
    #: servers started while the data was prepared, and whether the tune rule adopted them and why
    #: (``regen.tune.prestart.confirm_prestarted``); None: no server was prestarted from a provisional plan
    prestart: Mapping[str, Any] | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> PlanFile | None:
        """The plan file's JSON object (``None`` stays ``None``: no plan)."""
        if data is None:
            return None
        launched = data.get("launched", "recommended")
        if launched not in ("recommended", "given"):
            raise ValueError(f"plan file: field 'launched': {launched!r} is not 'recommended' or 'given'")
        return cls(
            launch_args=tuple(str(a) for a in data.get("launch_args") or ()),
            launched=launched,
            given=dict(data.get("given") or {}),
            recommended=dict(data.get("recommended") or {}),
            warnings=tuple(data.get("warnings") or ()),
            sglang_version=data.get("sglang_version"),
            model_config=data.get("model_config"),
            gpu_memory_mib=data.get("gpu_memory_mib"),
            external=bool(data.get("external", False)),
            prestart=data.get("prestart"),
        )

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> PlanFile:
        """The plan file at ``path`` (the ``tune`` rule's output), typed once, where a job reads it."""
        plan = cls.from_json(read_json(path))
        if plan is None:
            raise ValueError(f"{path}: the plan file holds null, not a plan")
        return plan

    @classmethod
    def for_external_server(cls) -> PlanFile:
        """``server.mode external``: nothing planned, no flags (the endpoint is the user's)."""
        return cls(launch_args=(), launched="recommended", given={}, recommended={}, external=True)

    def to_json(self) -> dict[str, Any]:
        """The JSON object :meth:`from_json` reads back."""
        out: dict[str, Any] = {
            "launch_args": list(self.launch_args),
            "launched": self.launched,
            "given": dict(self.given),
            "recommended": dict(self.recommended),
            "warnings": list(self.warnings),
            "sglang_version": self.sglang_version,
            "model_config": self.model_config,
            "gpu_memory_mib": self.gpu_memory_mib,
            "external": self.external,
        }
        if self.prestart is not None:
            out["prestart"] = dict(self.prestart)
        return out

    def write(self, path: str | os.PathLike[str]) -> None:
        """Write the plan file atomically: the one place it is written."""
        write_json(path, self.to_json())

    @property
    def launched_section(self) -> Mapping[str, Any]:
        """The prediction for the flags the servers are launched with."""
        return self.recommended if self.launched == "recommended" else self.given

    @property
    def client_concurrency(self) -> int | None:
        """Requests to keep in flight per server under the launched flags (the tuner's
        ``client_concurrency``: for attention-only models the KV filled at the expected context, above
        the running cap it leaves to SGLang); None: no plan, use the server's running cap."""
        value = self.launched_section.get("client_concurrency")
        return int(value) if value else None
