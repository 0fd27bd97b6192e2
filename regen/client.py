"""The generation client: one shard of prompts against one SGLang server, journaled and resumable.

``generate_shard`` keeps the server saturated with a fixed pool of worker tasks pulling from
the sample iterator; each finished sample goes to the journal (``regen.journal``) at once, so a
killed job resumes where it stopped and never re-sends a finished sample. A journaled sample is
replayed only when its generation fingerprint (``regen.fingerprint``: settings, id and prompt
content) equals the current one; otherwise it is generated again, so an output never mixes
settings. Journaled failures are retried unless ``retry_failed`` is off. At the end the shard
outputs are written atomically from the journal, from entries with the current fingerprints only.

Failure semantics
-----------------
- 4xx (except 408/429): no retry; the sample fails with reason ``client_error: <message>``.
- 5xx, 408, 429, connection errors, disconnects, truncated or malformed bodies, timeouts:
  retried with jittered exponential backoff (``backoff_base_s * 2**(k-1) * U(0.5, 1.5)``,
  capped at 60 s) up to ``max_attempts`` requests. A sample that still fails is a
  *server-level* failure.
- A request lost because the job's own server was restarted under it (it crashed, or its supervisor
  restarted it for a stall: ``regen.sglang.progress``) waits for the restarted server and goes again,
  once per restart, without using an attempt; a supervisor that gave up fails the shard with its cause.
- Server-level failures are held back, not journaled, while the run goes on. The run aborts
  with ``ShardFailedError`` (outputs not written; the journal keeps every finished sample and a
  rerun retries the held ones) when ``breaker_threshold = clamp(concurrency, 3, 16)``
  server-level failures happen in a row with no success between them (the server is down), or
  when, at the end, no sample completed in this run, or more than half of the samples attempted
  in this run failed at server level. Otherwise the held failures are isolated poison samples:
  they are journaled as terminal failures and the shard is finalized.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import os
import random
import re
import signal
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import orjson

from regen.fingerprint import (
    GenerationSettings,
    content_digest,
    request_fingerprint,
    server_numerics,
)
from regen.io import write_json
from regen.journal import FAILED, RECORD, Journal, JournalSink
from regen.layout import RunLayout
from regen.prompts import (
    request_content,
    sample_request_fingerprint,
)
from regen.records import GenerationRecord, RecordSampling
from regen.runconfig import GenerateConfig
from regen.toolcalls import answered_calls, tool_call_mismatch, with_answered_ids
from regen.types import Endpoint, Sample

log = logging.getLogger(__name__)

SAMPLE_ID_HEADER = "X-Regen-Sample-Id"
DEFAULT_CONCURRENCY = 64
MAX_BACKOFF_S = 60.0
RETRY_STATUSES = frozenset({408, 429})


@dataclass(frozen=True, slots=True)
class Lenders(Protocol):
    """Other GPU slots' servers with room to spare (``regen.lending.SlotLenders``): a job whose own
    server is full sends its next samples there, so no GPU drains or idles while samples wait."""

    poll_s: float

    async def spare(self, session: aiohttp.ClientSession) -> list[tuple[Endpoint, int]]:
        """(server, how many more requests this job may send it now) for each server with room."""
        ...

    def close(self) -> None: ...


class ServerRestarts(Protocol):
    """The job's own server across restarts (``regen.sglang.progress.SlotRestarts``): a request lost
    because the server was restarted under it (stalled or crashed) is sent again to the restarted server,
    once per restart, without using one of its attempts."""

    generation: int  # server starts seen so far
    failure: str | None  # the supervisor's cause when it gave up

    async def lost_to_restart(self, generation: int) -> str | None:
        """After a failed request sent at ``generation``: the server's URL when it was restarted since."""
        ...


@dataclass(slots=True)
class ShardStats:
    total: int | None = None
    skipped_resumed: int = 0
    #: journaled under another fingerprint (changed settings or edited prompt): generated again
    regenerated_changed: int = 0
    #: journaled as failures under the current fingerprint: tried again
    retried_failed: int = 0
    completed: int = 0
    failed: int = 0
    truncated: int = 0
    retried_requests: int = 0
    output_tokens: int = 0
    wall_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ProgressOptions:
    """Progress reporting: log lines, a status JSON, and a ``\\r`` bar when stderr is a TTY."""

    log_every_s: float = 30.0
    status_path: Path | None = None
    status_every_s: float = 5.0
    bar: bool | None = None  # None: only when stderr is a TTY


class ShardFailedError(RuntimeError):
    """The server failed the shard (down, crashed, or failing most requests); outputs not written."""


# ------------------------------------------------------------------------------ pure helpers


def _hash64(*parts: str) -> int:
    return int.from_bytes(hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).digest(), "big")


def derive_seed(base_seed: int, sample_id: str) -> int:
    """Per-sample seed: blake2b of (base seed, id), as a 31-bit integer."""
    return _hash64("seed", str(base_seed), sample_id) & 0x7FFFFFFF


def thinking_for(sample_id: str, mode: str, fraction: float) -> bool:
    """Whether thinking is on for this sample (mix: deterministic from the id)."""
    if mode == "on":
        return True
    if mode == "off":
        return False
    return _hash64("thinking", sample_id) / 2.0**64 < fraction


#: what ``urllib.parse.quote(..., safe="")`` leaves as it is
_UNRESERVED_ID = re.compile(r"[A-Za-z0-9_.~-]+")


def sample_id_header(sample_id: str) -> str:
    """The sample id as an HTTP header value: percent-encoded, so no id (newlines, non-ASCII) can
    break or inject a header. The simulated server decodes it; real SGLang ignores the header."""
    if _UNRESERVED_ID.fullmatch(sample_id):  # the usual id: nothing to encode (and no quote() per request)
        return sample_id
    return urllib.parse.quote(sample_id, safe="")


def sample_fingerprint(settings: GenerationSettings, sample: Sample) -> str:
    """The sample's request fingerprint under ``settings`` (what the journal replays by)."""
    return sample_request_fingerprint(settings.fingerprint, sample, settings.regenerate)


def backoff_delay(base: float, attempt: int, rng: random.Random) -> float:
    return min(MAX_BACKOFF_S, base * 2.0 ** (attempt - 1)) * rng.uniform(0.5, 1.5)


# -------------------------------------------------------------------------------- requests


class RequestError(Exception):
    """One failed request: ``category`` is client_error, server_error, connection_error,
    truncated_response, malformed_response or timeout."""

    def __init__(self, category: str, detail: str, retryable: bool) -> None:
        super().__init__(f"{category}: {detail}")
        self.category = category
        self.detail = detail
        self.retryable = retryable


class SampleFailed(Exception):
    def __init__(self, err: RequestError, attempts: int) -> None:
        super().__init__(str(err))
        self.err = err
        self.attempts = attempts


def _error_message(body: bytes) -> str:
    try:
        obj = orjson.loads(body)
        if isinstance(obj, dict):
            msg = obj.get("message") or (obj.get("error") or {}).get("message") or obj.get("detail")
            if msg:
                return str(msg)
    except (orjson.JSONDecodeError, AttributeError):
        pass
    return body[:300].decode("utf-8", "replace")


@dataclass(slots=True)
class _Answer:
    reasoning_content: str | None
    content: str
    finish_reason: str
    usage: dict[str, Any]
    model: str | None
    started_at: float
    latency_s: float
    max_tokens: int
    tool_calls: list[Any] | None = None  # parsed by the server's tool-call parser, when it has one
    lender: str | None = None  # the lent server's chat URL when another slot's server answered
    #: the server's token ids (``return_token_ids``): the rendered prompt, and the raw completion
    #: before reasoning parsing (end-of-turn included when the model stopped on it); None when absent
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None

    def token_id_fields(self) -> dict[str, list[int]]:
        """The journal's additive token-id fields (none when the server sent no ids)."""
        if self.prompt_token_ids is None or self.completion_token_ids is None:
            return {}
        return {"prompt_token_ids": self.prompt_token_ids, "completion_token_ids": self.completion_token_ids}


#: where SGLang puts the completion ids of a choice: ``token_ids`` up to 0.5.17, ``response_token_ids``
#: in 0.5.23 (``ChatCompletionResponseChoice`` in srt/entrypoints/openai/protocol.py)
COMPLETION_IDS_FIELDS = ("response_token_ids", "token_ids")


def _token_ids(choice: dict[str, Any], names: tuple[str, ...]) -> list[int] | None:
    """The first present field of ``names`` as a list of token ids; None when none is present."""
    for name in names:
        value = choice.get(name)
        if value is None:
            continue
        if not isinstance(value, list) or not all(type(t) is int and t >= 0 for t in value):
            raise ValueError(f"choices[0].{name}: expected a list of non-negative integers")
        return value
    return None


def _parse_answer(body: bytes, started_at: float, latency: float, max_tokens: int) -> _Answer:
    try:
        obj = orjson.loads(body)
        choice = obj["choices"][0]
        msg = choice["message"]
        usage = obj.get("usage") or {}
        reasoning_tokens = usage.get("reasoning_tokens")
        if reasoning_tokens is None:
            reasoning_tokens = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
        return _Answer(
            reasoning_content=msg.get("reasoning_content"),
            content=msg.get("content") or "",
            finish_reason=choice.get("finish_reason") or "abort",
            usage={
                "prompt_tokens": int(usage.get("prompt_tokens", 0)),
                "completion_tokens": int(usage.get("completion_tokens", 0)),
                "reasoning_tokens": reasoning_tokens,
            },
            model=obj.get("model"),
            started_at=started_at,
            latency_s=latency,
            max_tokens=max_tokens,
            tool_calls=msg.get("tool_calls") or None,
            prompt_token_ids=_token_ids(choice, ("prompt_token_ids",)),
            completion_token_ids=_token_ids(choice, COMPLETION_IDS_FIELDS),
        )
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise RequestError("malformed_response", f"{type(exc).__name__}: {exc}", True) from exc


# ---------------------------------------------------------------------------------- runner


@dataclass(slots=True)
class _Progress:
    done: int = 0
    failed: int = 0
    output_tokens: int = 0


class _ShardRun:
    """State of one ``generate_shard`` call."""

    def __init__(
        self,
        cfg: GenerateConfig,
        endpoint: Endpoint,
        shard: str,
        journal: Journal,
        stats: ShardStats,
        samples: Iterator[Sample],
        settings: GenerationSettings,
    ) -> None:
        self.cfg = cfg
        self.settings = settings
        self.settings_json = settings.to_json()
        self.settings_fingerprint = settings.fingerprint
        #: every sample id read from the shard -> its current fingerprint (finalize keeps only these)
        self.current: dict[str, str] = {}
        self.endpoint = endpoint
        self.shard = shard
        self.journal = journal
        self.stats = stats
        self.samples = samples
        self.chat_url = endpoint.url.rstrip("/") + "/v1/chat/completions"
        self.server = {"id": endpoint.server_id, "url": endpoint.url, "version": endpoint.version}
        self.model = endpoint.model or "default"
        self.base_headers = {"Content-Type": "application/json"}
        if endpoint.api_key:
            self.base_headers["Authorization"] = f"Bearer {endpoint.api_key}"
        self.timeout = aiohttp.ClientTimeout(total=cfg.request_timeout_s)
        self.rng = random.Random(_hash64("backoff", shard))
        self.seen: set[str] = set()
        self.in_flight: dict[str, float] = {}  # sample id -> when its first request was sent (regen status)
        self.retrying: set[str] = set()  # sample ids waiting out a back-off before their next attempt
        self.held: list[dict[str, Any]] = []
        self.attempted = 0
        self.consecutive_server_failures = 0
        self.breaker_threshold = 16
        self.abort: str | None = None
        self._flush_scheduled = False
        self.session: aiohttp.ClientSession | None = None
        self.exhausted = False  # every sample has been handed out
        self.on_exhausted: Callable[[], None] | None = None
        self.restarts: ServerRestarts | None = None

    # ------------------------------------------------------------------ samples
    def next_sample(self) -> tuple[Sample, str, list[Any]] | None:
        """The next sample to send, its fingerprint and the messages it sends (``request_content``:
        built once, hashed here and sent by ``run_sample``); replays (skips) what the journal holds."""
        for sample in self.samples:
            sid = sample.id
            if sid in self.seen:
                log.warning("shard %s: duplicate sample id %r in the input; sent once", self.shard, sid)
                continue
            self.seen.add(sid)
            content = request_content(sample, self.cfg.regenerate)
            fingerprint = request_fingerprint(self.settings_fingerprint, sid, content_digest(content))
            self.current[sid] = fingerprint
            outcome = self.journal.outcome(sid, fingerprint)
            if outcome == RECORD or (outcome == FAILED and not self.cfg.retry_failed):
                self.stats.skipped_resumed += 1
                continue
            if outcome == FAILED:
                self.stats.retried_failed += 1
            elif sid in self.journal.finished_ids:
                self.stats.regenerated_changed += 1
            return sample, fingerprint, content["messages"]
        if not self.exhausted:
            self.exhausted = True
            if self.on_exhausted is not None:
                self.on_exhausted()
        return None

    async def worker(self) -> None:
        while self.abort is None:
            nxt = self.next_sample()
            if nxt is None:
                return
            await self.one_sample(*nxt, None)

    async def one_sample(
        self, sample: Sample, fingerprint: str, messages: list[Any], lender: Endpoint | None
    ) -> None:
        self.attempted += 1
        entry = await self.run_sample(sample, messages, lender)
        if entry is None:
            return
        self.stamp(entry, fingerprint)
        self.journal.append(entry, flush=False)
        self._schedule_flush()

    async def lend(self, lenders: Lenders) -> None:
        """Send samples to other slots' servers while they have room and samples are left; each sample
        still goes out once and lands in this job's journal (exactly-once as with the own server)."""
        assert self.session is not None
        tasks: set[asyncio.Task[None]] = set()
        try:
            while self.abort is None and not self.exhausted:
                await asyncio.sleep(lenders.poll_s)
                for lender, room in await lenders.spare(self.session):
                    for _ in range(room):
                        nxt = None if self.abort is not None else self.next_sample()
                        if nxt is None:
                            break
                        task = asyncio.create_task(self.one_sample(*nxt, lender))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        try:
            self.journal.flush()
        except OSError as exc:  # e.g. disk full: stop sending; the caller's final flush raises it
            if self.abort is None:
                log.error("shard %s: cannot write the journal %s: %s", self.shard, self.journal.path, exc)
                self.abort = f"cannot write the journal {self.journal.path}: {exc}"

    def stamp(self, entry: dict[str, Any], fingerprint: str) -> None:
        """Add what decided the entry: its fingerprints (and, on records, the settings themselves)."""
        entry["fingerprint"] = fingerprint
        entry["settings_fingerprint"] = self.settings_fingerprint
        if entry["kind"] == RECORD:
            entry["settings"] = self.settings_json
        else:
            entry["at"] = time.time()

    # ------------------------------------------------------------------ one sample
    async def run_sample(
        self, sample: Sample, messages: list[Any], lender: Endpoint | None = None
    ) -> dict[str, Any] | None:
        """One sample's answer(s); ``messages`` is its ``request_content``'s: the prompt (``last``) or the
        turns before each answer (``all``)."""
        cfg = self.cfg
        sid = sample.id
        first_url = None if lender is None else lender.url.rstrip("/") + "/v1/chat/completions"
        seed = derive_seed(cfg.sampling.seed, sid)
        thinking = thinking_for(sid, cfg.thinking, cfg.thinking_fraction)
        tools = list(sample.tools) if sample.tools else None
        attempts = [0]
        cut: str | None = None  # regenerate all: the tool-call mismatch that ended the row early
        try:
            if cfg.regenerate == "last":
                prompt = messages
                answer = await self.answer_turn(sid, prompt, seed, thinking, attempts, tools, first_url)
                turns = None
            else:
                prompt = []
                turns = []
                answer = None
                segments = messages
                answered = answered_calls(sample.messages)
                for k, segment in enumerate(segments):
                    if answer is not None:
                        prev: dict[str, Any] = {"role": "assistant", "content": answer.content}
                        if answer.reasoning_content is not None:
                            prev["reasoning_content"] = answer.reasoning_content
                        if answer.tool_calls:  # under the ids the dataset's tool turns answer
                            prev["tool_calls"] = with_answered_ids(answer.tool_calls, answered[k - 1])
                        prompt.append(prev)
                    prompt.extend(segment)
                    answer = await self.answer_turn(
                        sid, list(prompt), seed, thinking, attempts, tools, first_url
                    )
                    if answer is None:
                        break
                    turns.append(
                        {
                            "reasoning_content": answer.reasoning_content,
                            "content": answer.content,
                            "finish_reason": answer.finish_reason,
                            "usage": answer.usage,
                            **({"tool_calls": answer.tool_calls} if answer.tool_calls else {}),
                            **answer.token_id_fields(),
                        }
                    )
                    # the next turns answer the dataset's calls: a turn that called otherwise ends the row
                    if k + 1 < len(segments):
                        cut = tool_call_mismatch(answer.tool_calls, answered[k])
                        if cut is not None:
                            break
        except SampleFailed as exc:
            return self.on_failure(sid, exc)
        self.consecutive_server_failures = 0
        if answer is None:  # dropped under truncation: drop
            self.stats.failed += 1
            self.stats.truncated += 1
            return {
                "kind": "failed",
                "id": sid,
                "reason": "truncated",
                "attempts": attempts[0],
                "error": f"finish_reason length at max_tokens={cfg.sampling.max_tokens}",
            }
        truncated = (
            any(t["finish_reason"] == "length" for t in turns) if turns else answer.finish_reason == "length"
        )
        s, block = cfg.sampling.for_thinking(thinking)
        out_tokens = (
            sum(t["usage"]["completion_tokens"] for t in turns)
            if turns
            else answer.usage["completion_tokens"]
        )
        self.stats.completed += 1
        self.stats.output_tokens += out_tokens
        if truncated:
            self.stats.truncated += 1
        record = GenerationRecord(
            id=sid,
            shard=self.shard,
            messages=prompt,
            reasoning_content=answer.reasoning_content,
            content=answer.content,
            finish_reason=answer.finish_reason,
            truncated=truncated,
            thinking=thinking,
            usage=answer.usage,
            sampling=RecordSampling(s.temperature, s.top_p, s.top_k, answer.max_tokens, block),
            seed=seed,
            model=answer.model or self.model,
            server=self.server if answer.lender is None or lender is None else self.lent_server(lender),
            attempts=attempts[0],
            started_at=answer.started_at,
            latency_s=answer.latency_s,
            turns=turns,
            **answer.token_id_fields(),
            tools=tools,
            tool_calls=answer.tool_calls,
            tool_call_mismatch=None if cut is None else {"turn": len(turns) - 1, "kind": cut},
        ).journal_entry()
        return record

    def lent_server(self, lender: Endpoint) -> dict[str, Any]:
        """The record's ``server`` for an answer from another slot's server."""
        return {
            "id": lender.server_id,
            "url": lender.url,
            "version": lender.version or self.server["version"],
        }

    def on_failure(self, sid: str, exc: SampleFailed) -> dict[str, Any] | None:
        err = exc.err
        if err.category == "client_error":
            self.consecutive_server_failures = 0
            self.stats.failed += 1
            return {
                "kind": "failed",
                "id": sid,
                "reason": f"client_error: {err.detail}",
                "attempts": exc.attempts,
                "error": str(err),
            }
        held = {
            "kind": FAILED,
            "id": sid,
            "reason": err.category,
            "attempts": exc.attempts,
            "error": str(err),
        }
        self.stamp(held, self.current[sid])
        self.held.append(held)
        self.consecutive_server_failures += 1
        if self.consecutive_server_failures >= self.breaker_threshold and self.abort is None:
            self.abort = (
                f"{self.consecutive_server_failures} samples in a row failed at server level "
                f"after {self.cfg.max_attempts} attempts each; last: {err}"
            )
        return None

    async def answer_turn(
        self,
        sid: str,
        messages: list[dict[str, Any]],
        seed: int,
        thinking: bool,
        attempts: list[int],
        tools: list[Any] | None = None,
        first_url: str | None = None,
    ) -> _Answer | None:
        """One regenerated turn under the truncation policy; None means dropped. ``first_url``: a lent
        server for the first request (retries go to the job's own server)."""
        cfg = self.cfg
        limit = cfg.max_tokens_for(sid)
        answer = await self.request(sid, messages, seed, thinking, limit, attempts, tools, first_url)
        if answer.finish_reason != "length" or cfg.truncation == "keep":
            return answer
        if cfg.truncation == "drop":
            return None
        bigger = math.ceil(limit * cfg.retry_max_tokens_factor)
        return await self.request(sid, messages, seed, thinking, bigger, attempts, tools)

    async def request(
        self,
        sid: str,
        messages: list[dict[str, Any]],
        seed: int,
        thinking: bool,
        max_tokens: int,
        attempts: list[int],
        tools: list[Any] | None = None,
        first_url: str | None = None,
    ) -> _Answer:
        """POST with retries (the first to ``first_url`` when given); raises SampleFailed. ``tools`` (the
        sample's tool definitions) go with it. The sample counts as in flight meanwhile (``regen status``)."""
        self.in_flight.setdefault(sid, time.time())
        try:
            body = self._body(messages, seed, thinking, max_tokens, tools)
            return await self._post_with_retries(sid, body, max_tokens, attempts, first_url)
        finally:
            self.in_flight.pop(sid, None)
            self.retrying.discard(sid)

    def _body(
        self,
        messages: list[dict[str, Any]],
        seed: int,
        thinking: bool,
        max_tokens: int,
        tools: list[Any] | None,
    ) -> bytes:
        """The chat-completions request body for one sample."""
        s = self.cfg.sampling.for_thinking(thinking)[0]
        token_ids = {"return_token_ids": True} if self.cfg.return_token_ids else {}
        template_kwargs: dict[str, Any] = {"enable_thinking": thinking}
        if self.cfg.preserve_thinking is not None:
            template_kwargs["preserve_thinking"] = self.cfg.preserve_thinking
        return orjson.dumps(
            {
                **dict(self.cfg.extra_body),
                **token_ids,
                "model": self.model,
                "messages": messages,
                "temperature": s.temperature,
                "top_p": s.top_p,
                "top_k": s.top_k,
                "max_tokens": max_tokens,
                "n": s.n,
                "seed": seed,
                "chat_template_kwargs": template_kwargs,
                "separate_reasoning": True,
                **({"tools": tools} if tools else {}),
            }
        )

    async def _post_with_retries(
        self, sid: str, body: bytes, max_tokens: int, attempts: list[int], first_url: str | None
    ) -> _Answer:
        headers = {**self.base_headers, SAMPLE_ID_HEADER: sample_id_header(sid)}
        delay = 0.0
        for attempt in range(1, self.cfg.max_attempts + 1):
            if attempt > 1:
                self.stats.retried_requests += 1
                self.retrying.add(sid)
                await asyncio.sleep(delay)
                self.retrying.discard(sid)
            attempts[0] += 1
            lent = first_url if attempt == 1 else None
            generation = self.restarts.generation if self.restarts is not None else 0
            try:
                try:
                    answer = await self.post_once(body, headers, max_tokens, lent or self.chat_url)
                except RequestError as err:
                    if lent is not None or self.restarts is None or not err.retryable:
                        raise
                    answer = await self.resend_after_restart(
                        err, generation, body, headers, max_tokens, attempts, sid
                    )
                answer.lender = lent
                return answer
            except RequestError as err:
                if not err.retryable or attempt == self.cfg.max_attempts or self.abort is not None:
                    log.warning(
                        "shard %s: sample %r: request %d/%d failed (%s); giving up on it",
                        self.shard, sid, attempt, self.cfg.max_attempts, err,
                    )  # fmt: skip
                    raise SampleFailed(err, attempts[0]) from err
                delay = backoff_delay(self.cfg.backoff_base_s, attempt, self.rng)
                log.warning(
                    "shard %s: sample %r: request %d/%d failed (%s); retrying in %.2f s",
                    self.shard, sid, attempt, self.cfg.max_attempts, err, delay,
                )  # fmt: skip
        raise AssertionError("unreachable")

    async def resend_after_restart(
        self, err: RequestError, generation: int, body: bytes, headers: dict[str, str], max_tokens: int,
        attempts: list[int], sid: str,
    ) -> _Answer:  # fmt: skip
        """After a request to the job's own server failed (``err``, sent at server ``generation``): while it
        was lost to a restart of that server, send it again to the restarted one (``ServerRestarts``);
        otherwise raise the failure."""
        assert self.restarts is not None
        while True:
            url = await self.restarts.lost_to_restart(generation)
            if self.restarts.failure is not None and self.abort is None:
                self.abort = f"its server gave up: {self.restarts.failure}"
            if url is None:
                raise err
            self.chat_url = url.rstrip("/") + "/v1/chat/completions"
            attempts[0] += 1
            log.warning("shard %s: sample %r: its request was lost to a server restart (%s); "
                        "sending it again to %s", self.shard, sid, err.category, url)  # fmt: skip
            generation = self.restarts.generation
            try:
                return await self.post_once(body, headers, max_tokens, self.chat_url)
            except RequestError as again:
                if not again.retryable:
                    raise
                err = again

    async def post_once(self, body: bytes, headers: dict[str, str], max_tokens: int, url: str) -> _Answer:
        assert self.session is not None
        started_at = time.time()
        t0 = time.perf_counter()
        try:
            async with self.session.post(url, data=body, headers=headers, timeout=self.timeout) as resp:
                data = await resp.read()
                status = resp.status
        except aiohttp.ClientPayloadError as exc:
            raise RequestError("truncated_response", str(exc), True) from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientResponseError) as exc:
            raise RequestError("connection_error", f"{type(exc).__name__}: {exc}", True) from exc
        except TimeoutError as exc:
            raise RequestError("timeout", f"no response within {self.cfg.request_timeout_s} s", True) from exc
        if status != 200:
            if 400 <= status < 500 and status not in RETRY_STATUSES:
                raise RequestError("client_error", f"HTTP {status}: {_error_message(data)}", False)
            raise RequestError("server_error", f"HTTP {status}: {_error_message(data)}", True)
        return _parse_answer(data, started_at, time.perf_counter() - t0, max_tokens)


# ------------------------------------------------------------------------------- progress


class _Reporter:
    def __init__(self, run: _ShardRun, opts: ProgressOptions, t0: float) -> None:
        self.run = run
        self.opts = opts
        self.t0 = t0
        self.bar = opts.bar if opts.bar is not None else sys.stderr.isatty()

    def snapshot(self) -> dict[str, Any]:
        st = self.run.stats
        elapsed = max(1e-9, time.monotonic() - self.t0)
        done_now = st.completed + st.failed
        done = done_now + st.skipped_resumed
        req_s = done_now / elapsed
        total = st.total
        eta = (total - done) / req_s if total is not None and req_s > 0 else None
        return {
            "shard": self.run.shard,
            "server": {"id": self.run.endpoint.server_id, "url": self.run.endpoint.url},
            "done": done,
            "total": total,
            "failed": st.failed,
            "truncated": st.truncated,
            "req_s": round(req_s, 3),
            "out_tok_s": round(st.output_tokens / elapsed, 1),
            "eta_s": None if eta is None else round(eta, 1),
            "updated_at": time.time(),
            "in_flight": len(self.run.in_flight),
            "retrying": len(self.run.retrying),
            "retried_requests": st.retried_requests,
            "oldest_in_flight_at": min(self.run.in_flight.values(), default=None),
        }

    def write_status(self, final: bool = False) -> None:
        if self.opts.status_path is None:
            return
        snap = self.snapshot()
        if final:
            snap["finished"] = True
        write_json(self.opts.status_path, snap)

    def log_line(self) -> None:
        s = self.snapshot()
        log.info(
            "shard %s: %s/%s done, %d failed, %.1f req/s, %.0f out tok/s, ETA %s",
            s["shard"],
            s["done"],
            s["total"] if s["total"] is not None else "?",
            s["failed"],
            s["req_s"],
            s["out_tok_s"],
            "?" if s["eta_s"] is None else f"{s['eta_s']:.0f} s",
        )

    def draw_bar(self) -> None:
        s = self.snapshot()
        total = s["total"]
        frac = s["done"] / total if total else 0.0
        filled = int(30 * frac)
        eta = "?" if s["eta_s"] is None else f"{s['eta_s']:.0f}s"
        sys.stderr.write(
            f"\r[{'#' * filled}{'.' * (30 - filled)}] {s['done']}/{total or '?'} "
            f"{s['req_s']:.1f} req/s {s['out_tok_s']:.0f} tok/s ETA {eta}   "
        )
        sys.stderr.flush()

    async def loop(self) -> None:
        tick = min(self.opts.log_every_s, self.opts.status_every_s, 0.5 if self.bar else math.inf)
        next_log = time.monotonic() + self.opts.log_every_s
        next_status = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= next_status:
                self.write_status()
                next_status = now + self.opts.status_every_s
            if now >= next_log:
                self.log_line()
                next_log = now + self.opts.log_every_s
            if self.bar:
                self.draw_bar()
            await asyncio.sleep(tick)


# ---------------------------------------------------------------------------- entry points


async def _discover(session: aiohttp.ClientSession, endpoint: Endpoint, cfg: GenerateConfig) -> Endpoint:
    """Fill model, max_running_requests, version and numerics from the server when unknown."""
    headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    base = endpoint.url.rstrip("/")
    timeout = aiohttp.ClientTimeout(total=30)
    model, mrr, version = endpoint.model, endpoint.max_running_requests, endpoint.version
    numerics = endpoint.numerics
    if model is None:
        try:
            async with session.get(base + "/v1/models", headers=headers, timeout=timeout) as r:
                model = orjson.loads(await r.read())["data"][0]["id"]
        except (
            aiohttp.ClientError,
            TimeoutError,
            KeyError,
            IndexError,
            TypeError,
            orjson.JSONDecodeError,
        ) as exc:
            log.warning("could not read the model name from %s/v1/models (%s); sending 'default'", base, exc)
    if (mrr is None and cfg.concurrency is None) or version is None or numerics is None:
        info = await _server_info(session, base, headers, timeout)
        version = version or info.get("version")
        if numerics is None:  # a server without /server_info (not SGLang) reports none: {} every run
            numerics = server_numerics(info) if info else {}
        if mrr is None:
            states = info.get("internal_states") or [{}]
            first = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
            mrr = first.get("effective_max_running_requests_per_dp") or info.get("max_running_requests")
    return Endpoint(endpoint.url, endpoint.server_id, mrr, version, model, endpoint.api_key, numerics)


#: how long the client waits for a server that does not answer ``/server_info`` (restarting after a
#: crash): its numerics decide which journaled answers replay, so they are worth waiting for
SERVER_INFO_WAIT_S = 60.0


async def _server_info(
    session: aiohttp.ClientSession, base: str, headers: dict[str, str], timeout: aiohttp.ClientTimeout
) -> dict[str, Any]:
    """``/server_info``; retried while the server cannot be reached; {} when it has none (not SGLang)."""
    deadline = time.monotonic() + SERVER_INFO_WAIT_S
    while True:
        try:
            async with session.get(base + "/server_info", headers=headers, timeout=timeout) as r:
                if r.status >= 400:
                    log.warning("%s/server_info answered HTTP %d: no server numerics", base, r.status)
                    return {}
                info = orjson.loads(await r.read())
            return info if isinstance(info, dict) else {}
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            if time.monotonic() > deadline:
                log.warning("could not reach %s/server_info for %.0f s (%s)", base, SERVER_INFO_WAIT_S, exc)
                return {}
            await asyncio.sleep(0.5)
        except (aiohttp.ClientError, orjson.JSONDecodeError) as exc:
            log.warning("could not read %s/server_info (%s)", base, exc)
            return {}


def _samples_and_total(samples: Iterable[Sample] | str | os.PathLike[str], total: int | None):
    if isinstance(samples, str | os.PathLike):
        from regen.shards import read_shard  # another helper's module

        if total is None:
            import pyarrow.parquet as pq

            total = pq.ParquetFile(samples).metadata.num_rows
        return iter(read_shard(samples)), total
    if total is None and hasattr(samples, "__len__"):
        total = len(samples)  # type: ignore[arg-type]
    return iter(samples), total


async def generate_shard_async(
    samples: Iterable[Sample] | str | os.PathLike[str],
    journal_path: str | os.PathLike[str],
    records_out: str | os.PathLike[str],
    failed_out: str | os.PathLike[str],
    cfg: dict[str, Any] | GenerateConfig,
    endpoint: Endpoint,
    shard: str,
    progress: ProgressOptions | None = None,
    *,
    total: int | None = None,
    journal_sync: JournalSink | None = None,
    lenders: Lenders | None = None,
    on_exhausted: Callable[[], None] | None = None,
    settings: GenerationSettings | None = None,
    restarts: ServerRestarts | None = None,
) -> ShardStats:
    """Generate one shard (see the module docstring); returns its stats or raises ShardFailedError.

    ``lenders``: other GPU slots' servers this job may also use while they have room. ``on_exhausted``:
    called once when every sample has been sent (only answers are awaited from then on).
    ``settings`` is what the fingerprint covers (``GenerationSettings.for_run`` in a workflow job, of the
    same typed config); without it, the generate config's own (``GenerationSettings.of``). ``restarts``:
    the own server's restarts, so requests lost to one are sent again (and a server that gave up names
    its cause).
    """
    gcfg = cfg if isinstance(cfg, GenerateConfig) else GenerateConfig.from_dict(cfg)
    if settings is None:
        settings = GenerationSettings.of(gcfg)
    if progress is None:
        jp = Path(journal_path)
        progress = ProgressOptions(status_path=RunLayout.of_journal(jp).status(shard))
    it, total = _samples_and_total(samples, total)
    t0 = time.monotonic()
    stats = ShardStats(total=total)
    journal = Journal.open(journal_path, journal_sync)
    try:
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(
            connector=connector, json_serialize=lambda o: orjson.dumps(o).decode()
        ) as sess:
            ep = await _discover(sess, endpoint, gcfg)
            concurrency = gcfg.concurrency or (
                math.ceil(ep.max_running_requests * (1 + gcfg.queue_headroom))
                if ep.max_running_requests
                else DEFAULT_CONCURRENCY
            )
            # the answers come from this server: its numerics are part of what decides them
            run = _ShardRun(gcfg, ep, shard, journal, stats, it, settings.served_by(ep.numerics or {}))
            run.session = sess
            run.on_exhausted = on_exhausted
            run.restarts = restarts
            run.breaker_threshold = max(3, min(concurrency, 16))
            log.info(
                "shard %s: %s samples, %d in the journal, settings %s, concurrency %d against %s (%s)",
                shard,
                total if total is not None else "?",
                len(journal.finished_ids),
                run.settings_fingerprint,
                concurrency,
                ep.url,
                ep.server_id,
            )
            reporter = _Reporter(run, progress, t0)
            rep_task = asyncio.create_task(reporter.loop())
            try:
                lending = [run.lend(lenders)] if lenders is not None else []
                await asyncio.gather(*(run.worker() for _ in range(concurrency)), *lending)
            finally:
                rep_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await rep_task
                if reporter.bar:
                    sys.stderr.write("\n")
        journal.flush()
        failure = _shard_failure(run)
        stats.wall_s = time.monotonic() - t0
        if failure is not None:
            reporter.write_status()
            raise ShardFailedError(f"shard {shard} on {ep.server_id} ({ep.url}): {failure}")
        for entry in run.held:
            journal.append(entry, flush=False)
            stats.failed += 1
        journal.close()
        counts = journal.finalize(records_out, failed_out, run.current)
        stats.wall_s = time.monotonic() - t0
        reporter.write_status(final=True)
        reporter.log_line()
        log.info(
            "shard %s: %d replayed from the journal, %d regenerated (changed since journaled), "
            "%d earlier failures retried; %d stale journal entries left out",
            shard,
            stats.skipped_resumed,
            stats.regenerated_changed,
            stats.retried_failed,
            counts.stale_ignored,
        )
        log.info("shard %s: wrote %d records, %d failures; %s", shard, counts.records, counts.failed, stats)
        return stats
    finally:
        journal.close()


def _shard_failure(run: _ShardRun) -> str | None:
    if run.abort is not None:
        return run.abort
    held = len(run.held)
    if not held:
        return None
    if run.stats.completed == 0:
        return f"every request failed at server level ({held} samples); last: {run.held[-1]['error']}"
    if held * 2 > run.attempted:
        return f"{held} of {run.attempted} samples failed at server level; last: {run.held[-1]['error']}"
    return None


def generate_shard(
    samples: Iterable[Sample] | str | os.PathLike[str],
    journal_path: str | os.PathLike[str],
    records_out: str | os.PathLike[str],
    failed_out: str | os.PathLike[str],
    cfg: dict[str, Any] | GenerateConfig,
    endpoint: Endpoint,
    shard: str,
    progress: ProgressOptions | None = None,
    *,
    total: int | None = None,
    journal_sync: JournalSink | None = None,
    lenders: Lenders | None = None,
    on_exhausted: Callable[[], None] | None = None,
    settings: GenerationSettings | None = None,
    restarts: ServerRestarts | None = None,
) -> ShardStats:
    """Blocking wrapper of ``generate_shard_async``; SIGTERM cancels cleanly (journal flushed)."""

    async def main() -> ShardStats:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        in_main = threading.current_thread() is threading.main_thread()
        if in_main and task is not None:
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
        try:
            return await generate_shard_async(
                samples,
                journal_path,
                records_out,
                failed_out,
                cfg,
                endpoint,
                shard,
                progress,
                total=total,
                journal_sync=journal_sync,
                lenders=lenders,
                on_exhausted=on_exhausted,
                settings=settings,
                restarts=restarts,
            )
        finally:
            if in_main:
                loop.remove_signal_handler(signal.SIGTERM)

    return asyncio.run(main())
