"""The typed ``server`` config section and the typed plan file, each built once, at the boundary.

:class:`ServerConfig` is made from the ``server:`` mapping after validating it against the ``server``
section of ``schemas/config.schema.yaml`` with the schema's defaults filled in: the schema is the only
place a default is written, so code reads ``cfg.model_path``, never ``cfg.get("model_path", ...)``.

:class:`PlanFile` is ``results/plan/server.json`` (written by the ``tune`` rule): the launch flags, both
predictions (``given`` flags as configured, ``recommended`` by the tuner) and which of the two the
servers are launched with (:attr:`PlanFile.launched`, decided once, by the tuner, from ``use_tuner``).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import jsonschema
import yaml

CONFIG_SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "config.schema.yaml"

ServerMode = Literal["sglang", "simulated", "external"]


class ServerConfigError(ValueError):
    """A ``server`` config value the schema does not allow; the message names the field."""


@functools.cache
def _config_schema() -> dict[str, Any]:
    with open(CONFIG_SCHEMA_PATH) as fh:
        return yaml.safe_load(fh)


def server_schema() -> dict[str, Any]:
    """The ``server`` section of the config schema."""
    return _config_schema()["properties"]["server"]


def section_schema(name: str) -> dict[str, Any]:
    """One top-level section of the config schema (``export``, ``reaudit``, ...)."""
    return _config_schema()["properties"][name]


def with_schema_defaults(value: Mapping[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
    """``value`` with every missing property that has a schema default filled in, recursively."""
    out = dict(value)
    for name, prop in (schema.get("properties") or {}).items():
        if name not in out and "default" in prop:
            out[name] = copy.deepcopy(prop["default"])
        if isinstance(out.get(name), Mapping) and prop.get("properties"):
            out[name] = with_schema_defaults(out[name], prop)
    return out


@dataclass(frozen=True, slots=True)
class SimulatedConfig:
    """``server.simulated``: the simulated server's behaviour."""

    token_rate: float
    max_running_requests: int | None
    startup_delay_s: float
    half_speed_running: int | None
    tokenizer_path: str | None
    faults: Mapping[str, Any] = field(default_factory=dict)
    virtual: Mapping[str, Any] | None = None  # VirtualTime fields (bench/efficiency.py); None: real time


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """The ``server`` config section (see ``schemas/config.schema.yaml`` for every field's meaning)."""

    mode: ServerMode
    url: str | None
    api_key_env: str | None
    model_path: str
    model_config: str | None
    gpus: int
    gpu_memory_mib: int | None
    tp: int
    host: str
    port_base: int
    reasoning_parser: str
    args: tuple[str, ...]
    sglang_version: str | None
    allow_bf16_state: bool
    allow_fp8_kv: bool
    use_tuner: bool
    startup_timeout_s: float
    idle_timeout_s: float
    max_restarts: int
    stall_timeout_s: float
    simulated: SimulatedConfig

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> ServerConfig:
        """Validate ``raw`` against the schema's ``server`` section, fill its defaults, and type it."""
        schema = server_schema()
        filled = with_schema_defaults(raw or {}, schema)
        try:
            jsonschema.validate(filled, schema)
        except jsonschema.ValidationError as exc:
            where = ".".join(str(p) for p in exc.absolute_path) or "(section)"
            raise ServerConfigError(f"server.{where}: {exc.message}") from exc
        sim = dict(filled["simulated"])
        known = {f.name for f in fields(SimulatedConfig)}
        return cls(
            mode=filled["mode"],
            url=filled["url"],
            api_key_env=filled["api_key_env"],
            model_path=str(filled["model_path"]),
            model_config=filled["model_config"],
            gpus=int(filled["gpus"]),
            gpu_memory_mib=filled["gpu_memory_mib"],
            tp=int(filled["tp"]),
            host=str(filled["host"]),
            port_base=int(filled["port_base"]),
            reasoning_parser=str(filled["reasoning_parser"]),
            args=tuple(str(a) for a in filled["args"]),
            sglang_version=filled["sglang_version"],
            allow_bf16_state=bool(filled["allow_bf16_state"]),
            allow_fp8_kv=bool(filled["allow_fp8_kv"]),
            use_tuner=bool(filled["use_tuner"]),
            startup_timeout_s=float(filled["startup_timeout_s"]),
            idle_timeout_s=float(filled["idle_timeout_s"]),
            max_restarts=int(filled["max_restarts"]),
            stall_timeout_s=float(filled["stall_timeout_s"]),
            simulated=SimulatedConfig(**{k: v for k, v in sim.items() if k in known}),
        )

    @classmethod
    def of(cls, cfg: ServerConfig | Mapping[str, Any] | None) -> ServerConfig:
        """``cfg`` itself when already typed, else :meth:`from_mapping` (the one way a mapping is read)."""
        return cfg if isinstance(cfg, ServerConfig) else cls.from_mapping(cfg)

    @property
    def planned_model(self) -> str:
        """The config.json (or model dir) the tuner plans from."""
        return self.model_config or self.model_path


#: what the server module's entry points accept: the typed config, or the ``server:`` mapping
ServerConfigLike = ServerConfig | Mapping[str, Any]


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
        )

    @property
    def launched_section(self) -> Mapping[str, Any]:
        """The prediction for the flags the servers are launched with."""
        return self.recommended if self.launched == "recommended" else self.given
