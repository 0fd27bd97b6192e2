"""The generation fingerprint: a stable hash of everything that decides an answer.

Two levels:

* ``GenerationSettings`` — what the config decides for every request of one sampling variant
  (``generate.variants``; one implicit ``default`` without them), in two parts. The run's
  (``RunSettings``, built once a run): model path and revision, server mode, chat template hash,
  reasoning parser, the regenerate mode, the thinking fraction, ``max_tokens`` and the base seed, the
  truncation policy, the extra request fields and whether token ids are kept; and what the server
  reports of its own numerics (its SGLang version, weight/KV/state dtypes, quantization, deterministic
  inference: ``SERVER_NUMERICS_KEYS``), filled in by the client from ``/server_info`` once it has a
  server, so a journal written by a bf16-state server is not replayed under an fp32-state one. The
  variant's own (``VariantSettings``): its name, thinking mode, temperature, top_p, top_k (with the
  per-thinking-mode overrides) and reasoning effort, the keys a variant may set. Its ``fingerprint``
  (``settings_fingerprint`` in records) is one per variant of a run, computed once when the settings are
  built: adding, changing or removing a variant touches its records alone. The ``default`` variant's
  settings hash as they did before variants existed (the hashed JSON is the two parts' flat keys, as
  before the split).
* ``request_fingerprint`` — one per completion: the settings fingerprint, the completion's key
  (``Variant.completion_key``: the sample id for the default variant's first completion, else
  ``{sample_id}/{variant}/{k}``; the seed derives from it, and with ``thinking: mix`` the thinking
  switch from the sample id) and the digest of the exact prompt content the requests send
  (``content_digest`` of ``regen.prompts.request_content``; the shards carry it per ``regenerate`` mode).

The journal stores both on every entry; a rerun replays an entry only when its request fingerprint
equals the current one (whatever record id it was journaled under), so a changed setting regenerates
its variant's completions and an edited prompt regenerates that sample alone. Operational settings
(timeouts, ports, idle time, restarts, concurrency, retries) are not part of it, so changing them never
invalidates work.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from regen.runconfig import (
    DEFAULT_VARIANT,
    GenerateConfig,
    RunConfig,
    ServerConfig,
    Variant,
    setting_name,
)

#: bump when the hashed content changes meaning: every old journal entry is then regenerated
#: (2: the server's numerics joined the settings; 3: a request hashes its content's digest, which the
#: shard writer stores beside each prompt, so the dry run need not rebuild 914,000 prompts; regenerate all
#: ends a row at a turn whose tool calls differ from the dataset's, and sends matching calls under the
#: ids its tool turns answer; the chat template's preserve_thinking and the per-thinking-mode sampling
#: blocks joined the settings)
FINGERPRINT_VERSION = 3
#: the ``/server_info`` fields (SGLang: every server arg, and its version) that change an answer's numbers
#: for the same model, prompt and sampling: the rest (ports, timeouts, scheduler knobs, memory sizes)
#: decide only how fast answers come
SERVER_NUMERICS_KEYS = (
    "version",
    "dtype",
    "quantization",
    "kv_cache_dtype",
    "mamba_ssm_dtype",
    "enable_deterministic_inference",
)


def server_numerics(server_info: Mapping[str, Any]) -> dict[str, Any]:
    """What of a server's ``/server_info`` decides an answer's numbers (missing fields: None)."""
    return {key: server_info.get(key) for key in SERVER_NUMERICS_KEYS}


_DIGEST_BYTES = 8  # 16 hex characters: collisions need ~4e9 distinct settings or prompts per id


def _digest(payload: Any) -> str:
    raw = orjson.dumps(payload, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    return hashlib.blake2b(raw, digest_size=_DIGEST_BYTES).hexdigest()


def chat_template_hash(tokenizer_dir: str | None) -> str | None:
    """sha256 of the chat template string in ``tokenizer_dir/tokenizer_config.json``, if there is one."""
    if not tokenizer_dir:
        return None
    path = Path(tokenizer_dir) / "tokenizer_config.json"
    if not path.exists():
        return None
    template = json.loads(path.read_text()).get("chat_template")
    if not isinstance(template, str):
        return None
    return hashlib.sha256(template.encode()).hexdigest()


def model_revision(model_path: str) -> str | None:
    """The checkpoint revision when the model directory says (HF cache snapshot or a `.revision` file)."""
    path = Path(model_path)
    if (path / ".revision").exists():
        return (path / ".revision").read_text().strip()
    if path.parent.name == "snapshots":
        return path.name
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSettings:
    """What every sampling variant of a run shares (see the module docstring): what its answers come from,
    and the ``generate`` keys no variant may set (``max_tokens`` and ``seed`` of ``generate.sampling``
    among them: a variant sets ``regen.runconfig.VARIANT_SAMPLING_KEYS`` alone)."""

    model_path: str
    model_revision: str | None
    server_mode: str
    chat_template_sha256: str | None
    reasoning_parser: str
    regenerate: str
    thinking_fraction: float
    max_tokens: int
    #: the base seed each completion's own derives from (``regen.generate.sample_record.derive_seed``)
    seed: int
    truncation: str
    retry_max_tokens_factor: float
    extra_body: dict[str, Any]
    #: whether records carry the server's token ids (what a replayed record holds)
    return_token_ids: bool
    #: the chat template's ``preserve_thinking`` (earlier turns' reasoning in context); None: not sent
    preserve_thinking: bool | None
    #: ``server_numerics`` of the server the answers come from; empty until the client has asked it
    server_numerics: dict[str, Any] = field(default_factory=dict)
    version: int = FINGERPRINT_VERSION

    @classmethod
    def of(
        cls,
        generate: GenerateConfig,
        *,
        model_path: str = "default",
        model_revision: str | None = None,
        server_mode: str = "unknown",
        chat_template_sha256: str | None = None,
        reasoning_parser: str = "unknown",
    ) -> RunSettings:
        """The run-wide settings of a typed ``generate`` section; the rest names what the answers come from
        (a bare generate config, as benches and tests drive the client with, has placeholders there)."""
        return cls(
            model_path=model_path,
            model_revision=model_revision,
            server_mode=server_mode,
            chat_template_sha256=chat_template_sha256,
            reasoning_parser=reasoning_parser,
            regenerate=generate.regenerate,
            thinking_fraction=generate.thinking_fraction,
            max_tokens=generate.sampling.max_tokens,
            seed=generate.sampling.seed,
            truncation=generate.truncation.setting,
            retry_max_tokens_factor=generate.retry_max_tokens_factor,
            extra_body=dict(generate.extra_body),
            return_token_ids=generate.return_token_ids,
            preserve_thinking=generate.preserve_thinking,
        )

    @classmethod
    def for_run(cls, run: RunConfig) -> RunSettings:
        """A workflow run's settings: reads the chat template hash and the model revision from disk."""
        return cls.of(
            run.generate,
            model_path=run.server.model_path,
            model_revision=model_revision(run.server.model_path),
            server_mode=run.server.mode,
            chat_template_sha256=chat_template_hash(run.tokenizer),
            reasoning_parser=run.server.reasoning_parser,
        )

    def served_by(self, numerics: Mapping[str, Any]) -> RunSettings:
        """These settings as answered by a server reporting ``numerics``."""
        return replace(self, server_numerics=dict(numerics))

    def for_variant(self, generate: GenerateConfig, variant: Variant) -> GenerationSettings:
        """The settings of ``variant`` (of ``generate``, the section these settings are of) in this run."""
        return GenerationSettings(self, VariantSettings.of(generate, variant))

    def to_json(self) -> dict[str, Any]:
        """The run's part of every variant's settings as hashed and journaled."""
        return asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class VariantSettings:
    """What one sampling variant decides on its own (see the module docstring)."""

    #: the variant's name (``generate.variants``); None: ``default``, the one implicit variant. Left out of
    #: the hash when None, so settings from before variants keep theirs
    name: str | None
    #: the ``generate.thinking`` mode of its samples (``Variant.thinking_mode``)
    thinking: str
    temperature: float
    top_p: float
    top_k: int
    #: the per-thinking-mode overrides left after the variant's own values (``Variant.sampling``)
    sampling_thinking: tuple[tuple[str, Any], ...]
    sampling_non_thinking: tuple[tuple[str, Any], ...]
    #: its ``reasoning_effort`` (chat_template_kwargs); None: not sent, and left out of the hash
    reasoning_effort: str | None

    @classmethod
    def of(cls, generate: GenerateConfig, variant: Variant) -> VariantSettings:
        """``variant`` of a typed ``generate`` section. One record is one completion of one request, so
        the variant's ``n`` is no part of it: raising it adds completions and keeps those made before."""
        s = variant.sampling(generate.sampling)
        return cls(
            name=None if variant.name == DEFAULT_VARIANT else variant.name,
            thinking=variant.thinking_mode(generate.thinking),
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            sampling_thinking=s.thinking,
            sampling_non_thinking=s.non_thinking,
            reasoning_effort=variant.reasoning_effort,
        )

    def to_json(self) -> dict[str, Any]:
        """The variant's part of its settings as hashed and journaled: ``n`` 1 (a record is one completion
        of one request), ``variant`` and ``reasoning_effort`` only when set (so settings from before
        variants keep their fingerprint)."""
        out: dict[str, Any] = {
            "thinking": self.thinking,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "n": 1,
            "sampling_thinking": dict(self.sampling_thinking),
            "sampling_non_thinking": dict(self.sampling_non_thinking),
        }
        if self.name is not None:
            out["variant"] = self.name
        if self.reasoning_effort is not None:
            out["reasoning_effort"] = self.reasoning_effort
        return out


@dataclass(frozen=True, slots=True)
class GenerationSettings:
    """One sampling variant's settings in one run: the run's and the variant's own. Its fingerprint
    (``settings_fingerprint`` in records) is computed once, when it is built."""

    run: RunSettings
    variant: VariantSettings
    fingerprint: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fingerprint", _digest(self.to_json()))

    @classmethod
    def of(
        cls, generate: GenerateConfig, *, variant: Variant | None = None, **what: Any
    ) -> GenerationSettings:
        """The settings of ``variant`` (None: the first, :meth:`GenerateConfig.variants`) of a typed
        ``generate`` section; ``what``: :meth:`RunSettings.of`'s names of what the answers come from."""
        return RunSettings.of(generate, **what).for_variant(generate, variant or generate.variants()[0])

    @classmethod
    def for_run(cls, run: RunConfig, variant: Variant | None = None) -> GenerationSettings:
        """A workflow run's settings of ``variant`` (None: its first); see :meth:`RunSettings.for_run`."""
        return RunSettings.for_run(run).for_variant(run.generate, variant or run.generate.variants()[0])

    def served_by(self, numerics: Mapping[str, Any]) -> GenerationSettings:
        """These settings as answered by a server reporting ``numerics``."""
        return GenerationSettings(self.run.served_by(numerics), self.variant)

    @property
    def regenerate(self) -> str:
        return self.run.regenerate

    @property
    def variant_name(self) -> str:
        """The variant these settings are of (``default`` for the implicit one)."""
        return self.variant.name or DEFAULT_VARIANT

    def to_json(self) -> dict[str, Any]:
        """The settings as hashed and journaled: the run's part and the variant's, as flat keys."""
        return {**self.run.to_json(), **self.variant.to_json()}


def changed_settings(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Names of the settings that differ, as ``name old→new`` (for logs and dry-run reasons)."""
    out = []
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            out.append(f"{key} {old.get(key)!r}→{new.get(key)!r}")
    return out


# ------------------------------------------------------------------------------- the request


def content_digest(content: Any) -> str:
    """The digest of what of a sample the requests send (``regen.prompts.request_content``)."""
    return _digest(["content", content])


def request_fingerprint(settings_fingerprint: str, sample_id: str, content_digest: str) -> str:
    """One sample's fingerprint: settings, id (seed, thinking switch) and the digest of exactly what of
    the sample the requests send (:func:`content_digest`). The two digests are hex, so NUL-separated
    with the id last the bytes are unambiguous; no JSON encoding, since the dry run computes 914,000."""
    raw = f"request\0{settings_fingerprint}\0{content_digest}\0{sample_id}".encode()
    return hashlib.blake2b(raw, digest_size=_DIGEST_BYTES).hexdigest()


# ------------------------------------------------------------ decisive vs operational config


#: The generate rule's rerun contract: the config keys of its tracked ``settings`` param, in this order.
#: Snakemake compares the param by its repr, so the order is part of the contract: reordering or renaming
#: reruns every generate job once. Every field marked :data:`regen.runconfig.ANSWERS` is in it
#: (``tests/test_fingerprint.py`` holds both, and the demo's param, to these lists).
RERUN_GENERATE_KEYS: tuple[str, ...] = (
    "regenerate",
    "thinking",
    "thinking_fraction",
    "sampling",
    "truncation",
    "retry_max_tokens_factor",
    "extra_body",
    "return_token_ids",
    "preserve_thinking",
)
#: the ``server`` keys of the contract, in the order of the settings they become (``model_path``,
#: ``server_mode``, ``reasoning_parser``)
RERUN_SERVER_KEYS: tuple[str, ...] = ("model_path", "mode", "reasoning_parser")
#: the top-level keys of the contract: the tokenizer (its chat template)
RERUN_RUN_KEYS: tuple[str, ...] = ("tokenizer",)
#: the keys of each ``generate.variants`` entry in the contract (``generate.variants``, only when set), in
#: this order, those a variant leaves unset left out: every key a variant may have (the typed
#: ``regen.runconfig.Variant``'s, written as configured by ``Variant.as_configured``)
RERUN_VARIANT_KEYS: tuple[str, ...] = (
    "name",
    "temperature",
    "top_p",
    "top_k",
    "thinking",
    "reasoning_effort",
    "n",
)


def variant_as_tracked(variant: Variant) -> dict[str, Any]:
    """One variant's part of the generate rule's tracked param: its :data:`RERUN_VARIANT_KEYS` that it
    sets, as configured."""
    values = ((k, variant.as_configured(k)) for k in RERUN_VARIANT_KEYS)
    return {k: v for k, v in values if v is not None}


def decisive_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``generate`` rule's tracked ``settings`` param: every config value that decides an answer (the
    fields marked :data:`regen.runconfig.ANSWERS`), as configured, and the variants as the loader types
    them (:func:`variant_as_tracked`).

    A plain dict, so Snakemake compares it between runs (by its repr: key order counts, and stays as it
    was): a change reruns the generate jobs, which regenerate exactly the samples whose fingerprint changed.
    """
    generate = config.get("generate") or {}
    server = config.get("server") or {}
    decided = {k: generate[k] for k in RERUN_GENERATE_KEYS if k in generate}
    variants = GenerateConfig.from_dict(config.get("generate")).configured_variants
    if variants:  # only when set: a config without variants keeps the param it had
        decided["variants"] = [variant_as_tracked(v) for v in variants]
    return {
        "generate": decided,
        **{setting_name(ServerConfig, k): server.get(k) for k in RERUN_SERVER_KEYS},
        **{k: config.get(k) for k in RERUN_RUN_KEYS},
    }


class TrackedRun(dict[str, Any]):
    """The ``generate`` rule's one param: the dict of what decides an answer (:func:`decisive_config`;
    Snakemake compares a dict param between runs by its repr, so a change reruns the job), carrying the
    typed run config the job reads everything from (:attr:`run`), which by itself never reruns a job."""

    run: RunConfig

    @classmethod
    def of(cls, config: Mapping[str, Any], run: RunConfig) -> TrackedRun:
        """``config`` validated (its defaults filled), and ``run`` typed from it (``rules/common.smk``)."""
        tracked = cls(decisive_config(config))
        tracked.run = run
        return tracked


#: The tune rule's rerun contract: the ``server`` keys of its tracked ``settings`` param, in this order
#: (Snakemake compares the param by its repr: reordering or renaming replans every run once). Every field
#: marked :data:`regen.runconfig.PLAN` is in it (``tests/test_fingerprint.py``).
RERUN_PLAN_SERVER_KEYS: tuple[str, ...] = (
    "mode",
    "model_path",
    "model_config",
    "gpu_memory_mib",
    "sglang_version",
    "tp",
    "args",
    "allow_fp8_kv",
    "allow_bf16_state",
    "use_tuner",
)


def decisive_plan_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``tune`` rule's tracked ``settings`` param: the server keys the plan depends on
    (:data:`RERUN_PLAN_SERVER_KEYS`), and the answer budget; with ``generate.variants`` set, also each
    variant's completions per prompt and thinking mode (and ``thinking_fraction`` where a mode is ``mix``),
    which weigh the planned answer length (``regen.tune.workload_plan.variant_shares``). Without variants,
    ``generate.thinking`` where it is not the default ``on`` (with ``thinking_fraction`` for ``mix``): it
    weighs the answer length too, and a run that switches it replans; a thinking-on run's param stays as
    it was. ``generate.sampling.n`` (without variants) and ``generate.regenerate`` where they are not the
    defaults (1, ``last``): completions that share a prompt, or turns that extend the last, decide whether
    the plan keeps the radix cache on; a default run's param stays as it was."""
    server = config.get("server") or {}
    generate = GenerateConfig.from_dict(config.get("generate"))
    out: dict[str, Any] = {
        "server": {k: server[k] for k in RERUN_PLAN_SERVER_KEYS if k in server},
        "max_tokens": generate.sampling.max_tokens,
    }
    if generate.configured_variants:
        modes = [(v.name, v.n, v.thinking_mode(generate.thinking)) for v in generate.configured_variants]
        out["variants"] = [{"name": name, "n": n, "thinking": mode} for name, n, mode in modes]
        if any(mode == "mix" for _, _, mode in modes):
            out["thinking_fraction"] = generate.thinking_fraction
    else:
        if generate.thinking != "on":
            out["thinking"] = generate.thinking
            if generate.thinking == "mix":
                out["thinking_fraction"] = generate.thinking_fraction
        if generate.sampling.n != 1:
            out["n"] = generate.sampling.n
    if generate.regenerate != "last":
        out["regenerate"] = generate.regenerate
    return out
