"""The run config, typed: one frozen dataclass per config section, built once from the validated config.

``schemas/config.schema.yaml`` is the only place a default or a rule of a config value is written: a
section is filled with the schema's defaults, validated against it, and only then typed, so code reads
``cfg.sampling.top_p``, never ``cfg.get("top_p", ...)``. Whether a key decides the answers (a change
regenerates: ``regen.fingerprint``) or the server plan (a change replans: the ``tune`` rule), or only how a
job runs, is said once, in its field's metadata (:func:`decides`); :func:`keys_deciding` reads it back.

This module is on the ground: it imports no stage module.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

import jsonschema
import yaml

from regen.layout.names import CONFIG_SCHEMA as CONFIG_SCHEMA_PATH
from regen.truncation import TruncationPolicy

#: what a config key may decide besides how a job runs (field metadata key ``decides``)
ANSWERS = "answers"  # the generation fingerprint, and the generate rule's tracked ``settings`` param
PLAN = "plan"  # the server plan: the tune rule's tracked ``settings`` param


def decides(*what: str, setting: str | None = None) -> dict[str, Any]:
    """The field metadata of a config key that decides ``what`` (:data:`ANSWERS`, :data:`PLAN`); a key
    without it is operational: changing it never reruns or regenerates anything. ``setting``: its name
    among the fingerprinted settings (``regen.fingerprint.GenerationSettings``) when that differs."""
    return {"decides": frozenset(what), "setting": setting}


def setting_name(section: type, key: str) -> str:
    """The name of config key ``key`` of ``section`` among the fingerprinted settings."""
    meta = next(f.metadata for f in fields(section) if f.name == key)
    return meta.get("setting") or key


def keys_deciding(section: type, what: str) -> tuple[str, ...]:
    """The config keys of a section dataclass that decide ``what``, in field order."""
    return tuple(f.name for f in fields(section) if what in f.metadata.get("decides", ()))


class ConfigError(ValueError):
    """A config value the schema does not allow; the message names the section and field."""


#: PyYAML's safe loader in C (libyaml, in PyYAML's wheels): the same documents, ~10x faster than the
#: Python one; every Snakemake start (a Slurm group's members included) reads the schema and the config
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load_yaml(stream: Any) -> Any:
    """``yaml.safe_load`` through :data:`SAFE_LOADER`."""
    return yaml.load(stream, Loader=SAFE_LOADER)


@functools.cache
def config_schema() -> dict[str, Any]:
    with open(CONFIG_SCHEMA_PATH) as fh:
        return safe_load_yaml(fh)


def section_schema(name: str) -> dict[str, Any]:
    """One top-level section of the config schema (``generate``, ``server``, ``export``, ...)."""
    return config_schema()["properties"][name]


def config_section(config: Mapping[str, Any], name: str) -> Any:
    """The ``name`` section of a config as loaded (``regen.configfile.load_config``, or the workflow's
    ``validate_config``), for its owner's typed ``from_dict`` / ``from_mapping``; None when absent. The one
    read of a config by key outside this module and ``regen.configfile``
    (``tests/test_typed_sections.py`` scans for others)."""
    return config.get(name)


def filling_validator(schema: Mapping[str, Any]) -> jsonschema.protocols.Validator:
    """The one default filler: Draft 2020-12 that fills every missing property that has a default wherever
    the validator walks, as ``snakemake.utils.validate(..., set_default=True)`` does (so the workflow and
    ``regen check`` read the same config); a default is copied, never the schema's own object."""
    base = jsonschema.Draft202012Validator
    check_properties = base.VALIDATORS["properties"]

    def set_defaults(
        validator: Any, properties: Mapping[str, Any], instance: Any, schema: Any
    ) -> Iterator[Any]:
        if validator.is_type(instance, "object"):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from check_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(base, {"properties": set_defaults})(schema)


def validated(
    name: str, raw: Mapping[str, Any] | None, error: type[ConfigError] = ConfigError
) -> dict[str, Any]:
    """A copy of the ``name`` section ``raw`` with the schema's defaults filled in
    (:func:`filling_validator`), validated against the schema."""
    filled = copy.deepcopy(dict(raw or {}))
    problem = jsonschema.exceptions.best_match(filling_validator(section_schema(name)).iter_errors(filled))
    if problem is not None:
        where = ".".join(str(p) for p in problem.absolute_path) or "(section)"
        raise error(f"{name}.{where}: {problem.message}")
    return filled


# ------------------------------------------------------------------------------ generate --
def sampling_overrides(block: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    """A ``sampling.thinking`` / ``sampling.non_thinking`` block with typed values, sorted by key."""
    types = {"temperature": float, "top_p": float, "top_k": int}
    return tuple((k, types[k](v)) for k, v in sorted((block or {}).items()))


#: the block a sample's sampling comes from when no per-mode override applies
SAMPLING_BLOCK = "sampling"


@dataclass(frozen=True, slots=True)
class SamplingConfig:
    """``generate.sampling``: every field decides the answers (the section is :data:`ANSWERS` as a whole)."""

    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    n: int
    seed: int
    #: per-mode overrides (``sampling.thinking`` / ``sampling.non_thinking``): (key, value) pairs
    thinking: tuple[tuple[str, Any], ...]
    non_thinking: tuple[tuple[str, Any], ...]

    @classmethod
    def from_filled(cls, s: Mapping[str, Any]) -> SamplingConfig:
        return cls(
            temperature=float(s["temperature"]),
            top_p=float(s["top_p"]),
            top_k=int(s["top_k"]),
            max_tokens=int(s["max_tokens"]),
            n=int(s["n"]),
            seed=int(s["seed"]),
            thinking=sampling_overrides(s.get("thinking")),
            non_thinking=sampling_overrides(s.get("non_thinking")),
        )

    def for_thinking(self, thinking: bool) -> tuple[SamplingConfig, str]:
        """The sampling of a sample with thinking on or off, and the block it comes from: ``thinking`` or
        ``non_thinking`` when that override block is configured, else ``sampling`` (one block for both)."""
        overrides = self.thinking if thinking else self.non_thinking
        if not overrides:
            return self, SAMPLING_BLOCK
        return replace(self, **dict(overrides)), "thinking" if thinking else "non_thinking"


#: the name of the one implicit variant of a run without ``generate.variants`` (``regen.records``)
DEFAULT_VARIANT = "default"
#: the sampling keys a variant may set itself
VARIANT_SAMPLING_KEYS = ("temperature", "top_p", "top_k")


@dataclass(frozen=True, slots=True)
class Variant:
    """One named way of sampling every prompt (``generate.variants``): ``n`` completions each, one record
    per completion. ``None`` fields take ``generate.sampling``'s own (its per-thinking-mode blocks
    included) and the dataset's ``generate.thinking``; ``reasoning_effort`` None is not sent."""

    name: str
    n: int
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    #: thinking on (True) or off (False) for every sample; None: ``generate.thinking`` decides per sample
    thinking: bool | None = None
    #: ``low`` / ``medium`` / ``high`` (gpt-oss's chat template takes it); None: not sent
    reasoning_effort: str | None = None

    @classmethod
    def from_filled(cls, v: Mapping[str, Any]) -> Variant:
        thinking = v.get("thinking")
        return cls(
            name=str(v["name"]),
            n=int(v["n"]),
            temperature=None if v.get("temperature") is None else float(v["temperature"]),
            top_p=None if v.get("top_p") is None else float(v["top_p"]),
            top_k=None if v.get("top_k") is None else int(v["top_k"]),
            thinking=None if thinking is None else thinking == "on",
            reasoning_effort=v.get("reasoning_effort"),
        )

    def as_configured(self, key: str) -> Any:
        """The value of config key ``key`` of this variant as the config writes it (``thinking``: ``on`` /
        ``off``); None where the variant does not set it."""
        if key == "thinking":
            return None if self.thinking is None else "on" if self.thinking else "off"
        return getattr(self, key)

    @property
    def own_sampling(self) -> tuple[tuple[str, Any], ...]:
        """The sampling values the variant sets itself, as (key, value) pairs."""
        return tuple((k, getattr(self, k)) for k in VARIANT_SAMPLING_KEYS if getattr(self, k) is not None)

    def sampling(self, base: SamplingConfig) -> SamplingConfig:
        """``base`` under this variant: the values it sets replace the block's own and its per-thinking-mode
        overrides of them; ``n`` is the variant's."""
        own = dict(self.own_sampling)
        if not own:
            return replace(base, n=self.n)
        return replace(
            base,
            **own,
            n=self.n,
            thinking=tuple((k, v) for k, v in base.thinking if k not in own),
            non_thinking=tuple((k, v) for k, v in base.non_thinking if k not in own),
        )

    def thinking_mode(self, dataset_mode: str) -> str:
        """The ``generate.thinking`` mode of this variant's samples: its own, else the dataset's."""
        if self.thinking is None:
            return dataset_mode
        return "on" if self.thinking else "off"

    def completion_key(self, sample_id: str, k: int) -> str:
        """What a completion's seed and request fingerprint derive from: the sample id for completion 0 of
        the ``default`` variant (so answers journaled before variants replay), else
        ``{sample_id}/{variant}/{k}``. Independent of how many variants the run has, so adding or removing
        one never changes another's seeds or fingerprints."""
        return sample_id if self.name == DEFAULT_VARIANT and k == 0 else f"{sample_id}/{self.name}/{k}"


def variants_of(raw: Any) -> tuple[Variant, ...]:
    """The validated ``generate.variants`` list, typed; a name twice is an error naming both places."""
    out: list[Variant] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(raw or ()):
        variant = Variant.from_filled(item)
        if variant.name in seen:
            raise ConfigError(
                f"generate.variants.{i}.name: {variant.name!r} is already the name of "
                f"generate.variants.{seen[variant.name]}; each variant needs its own name"
            )
        seen[variant.name] = i
        out.append(variant)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class JournalSyncConfig:
    """``generate.journal_sync``: batched upload of the request journal to S3 (operational)."""

    s3_prefix: str | None
    every_records: int
    every_seconds: float


@dataclass(frozen=True, slots=True)
class GenerateConfig:
    """The ``generate`` config section (see ``schemas/config.schema.yaml`` for every field's meaning).

    The fields that decide answers are marked :data:`ANSWERS`; the generate rule's rerun contract (which
    keys, in which order) is ``regen.fingerprint.RERUN_GENERATE_KEYS``, not this field order."""

    regenerate: str = field(metadata=decides(ANSWERS))
    thinking: str = field(metadata=decides(ANSWERS))
    thinking_fraction: float = field(metadata=decides(ANSWERS))
    sampling: SamplingConfig = field(metadata=decides(ANSWERS))
    #: what a cut answer becomes, inside the answer and inside the reasoning apart (``regen.truncation``)
    truncation: TruncationPolicy = field(metadata=decides(ANSWERS))
    retry_max_tokens_factor: float = field(metadata=decides(ANSWERS))
    #: extra request fields passed as-is (SGLang extras such as ``ignore_eos``, ``min_p``); never overrides
    #: the fields regen sets itself
    extra_body: tuple[tuple[str, Any], ...] = field(metadata=decides(ANSWERS))
    #: ask for the server's own prompt and completion token ids (SGLang ``return_token_ids``)
    return_token_ids: bool = field(metadata=decides(ANSWERS))
    #: the chat template's preserve_thinking (sent in chat_template_kwargs); None: not sent
    preserve_thinking: bool | None = field(metadata=decides(ANSWERS))
    concurrency: int | None
    request_timeout_s: float
    max_attempts: int
    backoff_base_s: float
    #: with ``concurrency`` null, requests kept waiting in the server's queue beyond its running cap, as a
    #: fraction of the cap: a finished request's place is refilled at the next step, not after a round trip
    #: to the client (which may be stalled)
    queue_headroom: float
    #: retry samples the journal holds as failures (under the current fingerprint) on a rerun
    retry_failed: bool
    spill: bool
    journal_sync: JournalSyncConfig
    #: ``generate.variants`` as configured (empty: one implicit variant); read them through
    #: :meth:`variants`. Decides the answers, tracked by ``regen.fingerprint.decisive_config`` as
    #: ``RERUN_VARIANT_KEYS`` (only when set, so a config without variants keeps the generate rule's param)
    configured_variants: tuple[Variant, ...] = ()

    def variants(self) -> tuple[Variant, ...]:
        """Every sampling variant of the run, in config order: ``generate.variants``, or when that is empty
        the one implicit variant ``default`` with ``generate.sampling.n`` completions."""
        return self.configured_variants or (Variant(DEFAULT_VARIANT, n=self.sampling.n),)

    @property
    def plain_ids(self) -> bool:
        """Whether record ids are the sample ids: one variant of one completion (else
        ``{sample_id}/{variant}/{k}``, ``regen.records.record_id``)."""
        only = self.variants()
        return len(only) == 1 and only[0].n == 1

    @property
    def completions_per_prompt(self) -> int:
        """Records per prompt: the variants' completions together."""
        return sum(v.n for v in self.variants())

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> GenerateConfig:
        """Validate ``raw`` against the schema's ``generate`` section, fill its defaults, and type it."""
        g = validated("generate", raw)
        sync = g["journal_sync"]
        return cls(
            regenerate=str(g["regenerate"]),
            thinking=str(g["thinking"]),
            thinking_fraction=float(g["thinking_fraction"]),
            sampling=SamplingConfig.from_filled(g["sampling"]),
            truncation=TruncationPolicy.from_config(g["truncation"]),
            retry_max_tokens_factor=float(g["retry_max_tokens_factor"]),
            extra_body=tuple(sorted(g["extra_body"].items())),
            return_token_ids=bool(g["return_token_ids"]),
            preserve_thinking=g["preserve_thinking"],
            concurrency=g["concurrency"],
            request_timeout_s=float(g["request_timeout_s"]),
            max_attempts=int(g["max_attempts"]),
            backoff_base_s=float(g["backoff_base_s"]),
            queue_headroom=float(g["queue_headroom"]),
            retry_failed=bool(g["retry_failed"]),
            spill=bool(g["spill"]),
            journal_sync=JournalSyncConfig(
                s3_prefix=sync["s3_prefix"],
                every_records=int(sync["every_records"]),
                every_seconds=float(sync["every_seconds"]),
            ),
            configured_variants=variants_of(g["variants"]),
        )


# -------------------------------------------------------------------------------- server --
ServerMode = Literal["sglang", "simulated", "external"]


class ServerConfigError(ConfigError):
    """A ``server`` config value the schema does not allow; the message names the field."""


@dataclass(frozen=True, slots=True)
class SimulatedConfig:
    """``server.simulated``: the simulated server's behaviour."""

    token_rate: float
    max_running_requests: int | None
    startup_delay_s: float
    half_speed_running: int | None
    tokenizer_path: str | None
    faults: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """The ``server`` config section (see ``schemas/config.schema.yaml`` for every field's meaning).

    The fields that decide the answers or the plan are marked so; the tune rule's rerun contract (which
    keys, in which order) is ``regen.fingerprint.RERUN_PLAN_SERVER_KEYS``, not this field order."""

    mode: ServerMode = field(metadata=decides(ANSWERS, PLAN, setting="server_mode"))
    url: str | None
    api_key_env: str | None
    model_path: str = field(metadata=decides(ANSWERS, PLAN))
    model_config: str | None = field(metadata=decides(PLAN))
    gpus: int
    gpu_memory_mib: int | None = field(metadata=decides(PLAN))
    sglang_version: str | None = field(metadata=decides(PLAN))
    tp: int = field(metadata=decides(PLAN))
    args: tuple[str, ...] = field(metadata=decides(PLAN))
    allow_fp8_kv: bool = field(metadata=decides(PLAN))
    allow_bf16_state: bool = field(metadata=decides(PLAN))
    use_tuner: bool = field(metadata=decides(PLAN))
    host: str
    port_base: int
    reasoning_parser: str = field(metadata=decides(ANSWERS))
    startup_timeout_s: float
    idle_timeout_s: float
    prestart_rows: int
    max_restarts: int
    stall_timeout_s: float
    simulated: SimulatedConfig

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> ServerConfig:
        """Validate ``raw`` against the schema's ``server`` section, fill its defaults, and type it."""
        filled = validated("server", raw, ServerConfigError)
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
            prestart_rows=int(filled["prestart_rows"]),
            max_restarts=int(filled["max_restarts"]),
            stall_timeout_s=float(filled["stall_timeout_s"]),
            simulated=SimulatedConfig(**{k: v for k, v in sim.items() if k in known}),
        )

    @property
    def planned_model(self) -> str:
        """The config.json (or model dir) the tuner plans from."""
        return self.model_config or self.model_path


# ----------------------------------------------------------------------------- the whole --
@dataclass(frozen=True, slots=True)
class RunConfig:
    """The sections of the run config that code reads typed, built once (``rules/common.smk``).

    Passed to a job as a rule param of a non-builtin type on purpose: Snakemake compares only
    builtin-typed params between runs (others are "unrepresentable" and skipped), so nothing in it
    reruns a job by itself; what decides outputs reaches the jobs as tracked params too
    (``regen.fingerprint.decisive_config`` and ``decisive_plan_config``).
    """

    #: the target's tokenizer directory (its chat template decides every prompt)
    tokenizer: str = field(metadata=decides(ANSWERS))
    generate: GenerateConfig
    server: ServerConfig
    #: GPU slots on this node (not a config key: ``--resources gpu=N`` when given, else ``server.gpus``)
    gpu_slots: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any], gpu_slots: int | None = None) -> RunConfig:
        """From the whole config mapping (each section validated with the schema's defaults filled in)."""
        server = ServerConfig.from_mapping(config_section(config, "server"))
        tokenizer = config_section(config, "tokenizer")
        if tokenizer is None:  # a top-level key, not a section: its schema default read here
            tokenizer = section_schema("tokenizer")["default"]
        return cls(
            tokenizer=str(tokenizer),
            generate=GenerateConfig.from_dict(config_section(config, "generate")),
            server=server,
            gpu_slots=int(gpu_slots or server.gpus),
        )
