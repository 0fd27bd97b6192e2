"""One completion of a sample as its journal entry: which completion it is (:class:`Completion`: the
sample, its sampling variant and index ``k``), the seed and thinking mode it is sent with, the turns it
regenerates (``last``: the final assistant turn; ``all``: each assistant turn, the row ending early at a
tool-call mismatch), and the :class:`~regen.records.GenerationRecord` (or the ``truncated``
:class:`~regen.records.FailureEntry` when the truncation policy drops it).

The requests themselves are ``regen.generate.request``'s; what is sent when, and where entries go, is
``regen.generate.scheduler``'s. A sample that fails at request level raises ``SampleFailed`` from here.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

from regen.fingerprint import RunSettings
from regen.generate.request import Answer, Ask, Requests, Sampled
from regen.records import FailureEntry, GenerationRecord, RecordSampling
from regen.runconfig import GenerateConfig, SamplingConfig, Variant
from regen.toolcalls import answered_calls, tool_call_mismatch, with_answered_ids
from regen.types import Endpoint, Sample


def hash64(*parts: str) -> int:
    return int.from_bytes(hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).digest(), "big")


def derive_seed(base_seed: int, key: str) -> int:
    """A completion's seed: blake2b of (base seed, its key), as a 31-bit integer. The key is
    ``Variant.completion_key``: the sample id for the first completion of the default variant (its seed as
    before variants), ``{sample_id}/{variant}/{k}`` for every other, so each completion has its own."""
    return hash64("seed", str(base_seed), key) & 0x7FFFFFFF


def thinking_for(sample_id: str, mode: str, fraction: float) -> bool:
    """Whether thinking is on for this sample (mix: deterministic from the id)."""
    if mode == "on":
        return True
    if mode == "off":
        return False
    return hash64("thinking", sample_id) / 2.0**64 < fraction


@functools.lru_cache(maxsize=256)
def record_sampling(
    sampling: SamplingConfig, thinking: bool, max_tokens: int, own: bool = False, effort: str | None = None
) -> RecordSampling:
    """The sampling a record of this thinking mode names (``max_tokens``: as last sent; ``own``: its
    variant sets sampling values itself, ``effort``: its reasoning_effort). Cached, for speed: a shard's
    records share a handful (one per variant, mode and max_tokens), and ``for_thinking`` with an override
    block builds a new config each call."""
    s, block = sampling.for_thinking(thinking)
    return RecordSampling(s.temperature, s.top_p, s.top_k, max_tokens, "variant" if own else block, effort)


@dataclass(frozen=True, slots=True)
class VariantRun:
    """One sampling variant as a shard sends it: its sampling, thinking mode and settings (fingerprint,
    and the settings JSON every record carries, serialized once)."""

    variant: Variant
    sampled: Sampled
    thinking_mode: str
    settings_fingerprint: str
    settings_json: orjson.Fragment

    @classmethod
    def of(cls, cfg: GenerateConfig, settings: RunSettings, variant: Variant) -> VariantRun:
        """``variant`` of ``cfg``; ``settings``: the run's (what its answers come from, served)."""
        own = settings.for_variant(cfg, variant)
        sampled = Sampled(variant.name, variant.sampling(cfg.sampling), variant.reasoning_effort)
        settings_json = orjson.Fragment(orjson.dumps(own.to_json()))
        return cls(variant, sampled, variant.thinking_mode(cfg.thinking), own.fingerprint, settings_json)

    @property
    def name(self) -> str:
        return self.variant.name


@dataclass(frozen=True, slots=True)
class Completion:
    """One completion to send: completion ``k`` of ``sample`` under ``variant``, its record ``id``, its
    ``key`` (``Variant.completion_key``: its seed and fingerprint derive from it), its request
    ``fingerprint`` and the messages it sends (``regen.prompts.request_content``)."""

    sample: Sample
    variant: VariantRun
    k: int
    id: str
    key: str
    fingerprint: str
    messages: list[Any]

    def failure(self, reason: str, attempts: int, error: str) -> FailureEntry:
        """This completion's terminal failure."""
        return FailureEntry(self.id, reason, attempts, error, self.sample.id, self.variant.name, self.k)


@dataclass(frozen=True, slots=True)
class RecordContext:
    """What every record of a shard shares: its shard name, the model and the server that answers."""

    shard: str
    model: str
    server: dict[str, Any]  # {"id", "url", "version"} of the job's own server

    def lent_server(self, lender: Endpoint) -> dict[str, Any]:
        """The record's ``server`` for an answer from another slot's server."""
        version = lender.version or self.server["version"]
        return {"id": lender.server_id, "url": lender.url, "version": version}


@dataclass(slots=True)
class _Turns:
    """The answers of one sample so far: the last prompt sent, the last answer, every turn (``all``)."""

    prompt: list[dict[str, Any]]
    answer: Answer | None = None
    turns: list[dict[str, Any]] | None = None
    cut: str | None = None  # regenerate all: the tool-call mismatch that ended the row early


async def prefill_prompt(
    requests: Requests, cfg: GenerateConfig, c: Completion, lender: Endpoint | None = None
) -> None:
    """Put ``c``'s prompt in the radix cache of the server its sample goes to (``lender``, or the own) before
    the other completions of its sample go out (``Requests.prefill_prompt``), asked as ``c`` itself will
    be: its thinking mode, sampling and tools."""
    await requests.prefill_prompt(completion_ask(requests, cfg, c, [0], lender), c.messages)


def completion_ask(
    requests: Requests,
    cfg: GenerateConfig,
    c: Completion,
    attempts: list[int],
    lender: Endpoint | None = None,
) -> Ask:
    """How ``c`` is asked: its seed (from its key), its sample's thinking mode and tools, its sampling."""
    thinking = thinking_for(c.sample.id, c.variant.thinking_mode, cfg.thinking_fraction)
    tools = list(c.sample.tools) if c.sample.tools else None
    seed = derive_seed(cfg.sampling.seed, c.key)
    return requests.asking(c.id, seed, thinking, attempts, c.variant.sampled, tools, lender)


async def answer_sample(
    requests: Requests, cfg: GenerateConfig, ctx: RecordContext, c: Completion, lender: Endpoint | None = None
) -> GenerationRecord | FailureEntry:
    """One completion's journal entry; ``c.messages`` is its ``request_content``'s: the prompt (``last``) or
    the turns before each answer (``all``). Raises ``SampleFailed`` when its requests fail."""
    sample, variant = c.sample, c.variant
    attempts = [0]
    ask = completion_ask(requests, cfg, c, attempts, lender)
    if cfg.regenerate == "last":
        got = _Turns(c.messages, await requests.answer_turn(ask, c.messages))
    else:
        got = await _answer_all(requests, ask, sample, c.messages)
    answer, turns = got.answer, got.turns
    if answer is None:  # dropped under truncation: drop
        error = f"finish_reason length at max_tokens={cfg.sampling.max_tokens}"
        return c.failure("truncated", attempts[0], error)
    truncated = (
        any(t["finish_reason"] == "length" for t in turns) if turns else answer.finish_reason == "length"
    )
    own = bool(variant.variant.own_sampling)
    return GenerationRecord(
        id=c.id,
        shard=ctx.shard,
        messages=got.prompt,
        reasoning_content=answer.reasoning_content,
        content=answer.content,
        finish_reason=answer.finish_reason,
        truncated=truncated,
        thinking=ask.thinking,  # off when the truncation policy retried without thinking
        usage=answer.usage,
        sampling=record_sampling(
            variant.sampled.sampling, ask.thinking, answer.max_tokens, own, variant.variant.reasoning_effort
        ),
        seed=ask.seed,
        model=answer.model or ctx.model,
        server=ctx.server if answer.lender is None else ctx.lent_server(answer.lender),
        attempts=attempts[0],
        started_at=answer.started_at,
        latency_s=answer.latency_s,
        turns=turns,
        **answer.token_id_fields(),
        tools=ask.tools,
        tool_calls=answer.tool_calls,
        tool_call_mismatch=None if got.cut is None else {"turn": len(turns or ()) - 1, "kind": got.cut},
        sample_id=sample.id,
        variant=variant.name,
        k=c.k,
    )


async def _answer_all(requests: Requests, ask: Ask, sample: Sample, segments: list[Any]) -> _Turns:
    """``regenerate: all``: each assistant turn in order, the earlier regenerated answers in the prompt;
    the next turns answer the dataset's calls, so a turn that called otherwise ends the row."""
    got = _Turns(prompt=[], turns=[])
    answered = answered_calls(sample.messages)
    for k, segment in enumerate(segments):
        answer = got.answer
        if answer is not None:
            prev: dict[str, Any] = {"role": "assistant", "content": answer.content}
            if answer.reasoning_content is not None:
                prev["reasoning_content"] = answer.reasoning_content
            if answer.tool_calls:  # under the ids the dataset's tool turns answer
                prev["tool_calls"] = with_answered_ids(answer.tool_calls, answered[k - 1])
            got.prompt.append(prev)
        got.prompt.extend(segment)
        got.answer = answer = await requests.answer_turn(ask, list(got.prompt))
        if answer is None:
            break
        got.turns.append(_turn_json(answer))  # type: ignore[union-attr]
        if k + 1 < len(segments):
            got.cut = tool_call_mismatch(answer.tool_calls, answered[k])
            if got.cut is not None:
                break
    return got


def _turn_json(answer: Answer) -> dict[str, Any]:
    return {
        "reasoning_content": answer.reasoning_content,
        "content": answer.content,
        "finish_reason": answer.finish_reason,
        "usage": answer.usage,
        **({"tool_calls": answer.tool_calls} if answer.tool_calls else {}),
        **answer.token_id_fields(),
    }


def output_tokens(record: GenerationRecord) -> int:
    """The completion tokens a record's answers took (every regenerated turn's, with ``all``)."""
    if record.turns:
        return sum(t["usage"]["completion_tokens"] for t in record.turns)
    return record.usage["completion_tokens"]
