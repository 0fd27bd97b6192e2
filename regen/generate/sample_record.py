"""One sample's answers as its journal entry: the seed and thinking mode it is sent with, the turns it
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

from regen.generate.request import Answer, Requests, chat_url
from regen.records import FailureEntry, GenerationRecord, RecordSampling
from regen.runconfig import GenerateConfig, SamplingConfig
from regen.toolcalls import answered_calls, tool_call_mismatch, with_answered_ids
from regen.types import Endpoint, Sample


def hash64(*parts: str) -> int:
    return int.from_bytes(hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).digest(), "big")


def derive_seed(base_seed: int, sample_id: str) -> int:
    """Per-sample seed: blake2b of (base seed, id), as a 31-bit integer."""
    return hash64("seed", str(base_seed), sample_id) & 0x7FFFFFFF


def thinking_for(sample_id: str, mode: str, fraction: float) -> bool:
    """Whether thinking is on for this sample (mix: deterministic from the id)."""
    if mode == "on":
        return True
    if mode == "off":
        return False
    return hash64("thinking", sample_id) / 2.0**64 < fraction


@functools.lru_cache(maxsize=256)
def record_sampling(sampling: SamplingConfig, thinking: bool, max_tokens: int) -> RecordSampling:
    """The sampling a record of this thinking mode names (``max_tokens``: as last sent). Cached, for
    speed: a shard's records share a handful (one per mode and max_tokens), and ``for_thinking`` with
    an override block builds a new config each call."""
    s, block = sampling.for_thinking(thinking)
    return RecordSampling(s.temperature, s.top_p, s.top_k, max_tokens, block)


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


async def answer_sample(
    requests: Requests, cfg: GenerateConfig, ctx: RecordContext, sample: Sample, messages: list[Any],
    lender: Endpoint | None = None,
) -> GenerationRecord | FailureEntry:  # fmt: skip
    """One sample's journal entry; ``messages`` is its ``request_content``'s: the prompt (``last``) or the
    turns before each answer (``all``). Raises ``SampleFailed`` when its requests fail."""
    sid = sample.id
    first_url = None if lender is None else chat_url(lender.url)
    seed = derive_seed(cfg.sampling.seed, sid)
    thinking = thinking_for(sid, cfg.thinking, cfg.thinking_fraction)
    tools = list(sample.tools) if sample.tools else None
    attempts = [0]
    if cfg.regenerate == "last":
        answer = await requests.answer_turn(sid, messages, seed, thinking, attempts, tools, first_url)
        got = _Turns(messages, answer)
    else:
        got = await _answer_all(requests, sample, messages, seed, thinking, attempts, tools, first_url)
    answer, turns = got.answer, got.turns
    if answer is None:  # dropped under truncation: drop
        error = f"finish_reason length at max_tokens={cfg.sampling.max_tokens}"
        return FailureEntry(sid, "truncated", attempts[0], error)
    truncated = (
        any(t["finish_reason"] == "length" for t in turns) if turns else answer.finish_reason == "length"
    )
    return GenerationRecord(
        id=sid,
        shard=ctx.shard,
        messages=got.prompt,
        reasoning_content=answer.reasoning_content,
        content=answer.content,
        finish_reason=answer.finish_reason,
        truncated=truncated,
        thinking=thinking,
        usage=answer.usage,
        sampling=record_sampling(cfg.sampling, thinking, answer.max_tokens),
        seed=seed,
        model=answer.model or ctx.model,
        server=ctx.server if answer.lender is None or lender is None else ctx.lent_server(lender),
        attempts=attempts[0],
        started_at=answer.started_at,
        latency_s=answer.latency_s,
        turns=turns,
        **answer.token_id_fields(),
        tools=tools,
        tool_calls=answer.tool_calls,
        tool_call_mismatch=None if got.cut is None else {"turn": len(turns or ()) - 1, "kind": got.cut},
    )


async def _answer_all(
    requests: Requests, sample: Sample, segments: list[Any], seed: int, thinking: bool, attempts: list[int],
    tools: list[Any] | None, first_url: str | None,
) -> _Turns:  # fmt: skip
    """``regenerate: all``: each assistant turn in order, the earlier regenerated answers in the prompt;
    the next turns answer the dataset's calls, so a turn that called otherwise ends the row."""
    sid = sample.id
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
        got.answer = answer = await requests.answer_turn(
            sid, list(got.prompt), seed, thinking, attempts, tools, first_url
        )
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
