"""One regenerated turn against the server: its request body, the POST, the parsed answer, retries with
back-off, the truncation policy, and requests lost to a restart of the job's own server.

:class:`Requests` sends; the scheduling loop (``regen.generate.scheduler``) decides what to send and where the
answers go. The failure semantics are the client's (``regen.generate.client``): 4xx other than 408/429 are
final
(``client_error``); everything else is retried up to ``max_attempts`` requests, then raised as
:class:`SampleFailed`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import re
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import orjson

from regen.generate.pacing import OK, OTHER, OVERLOAD, AimdWindow, InFlightPlan
from regen.runconfig import DEFAULT_VARIANT, GenerateConfig, SamplingConfig
from regen.sglang.cache_report import PrefillSaved, cached_tokens
from regen.truncation import DROP, KEEP, RETRY_WITHOUT_THINKING, truncated_where
from regen.types import Endpoint

log = logging.getLogger(__name__)

SAMPLE_ID_HEADER = "X-Regen-Sample-Id"
MAX_BACKOFF_S = 60.0
RETRY_STATUSES = frozenset({408, 429})
#: what the server answers when it may have too much: the client's window shrinks when these (and timeouts
#: behind other answers) come in a burst above their background share (``regen.generate.pacing.AimdWindow``)
OVERLOAD_STATUSES = frozenset({429, 503})
#: timeouts of one sample's requests that waited behind the client's own excess (the server answered others
#: meanwhile) sent again without using one of its ``max_attempts``; past these they count as attempts
EXCESS_TIMEOUTS_MAX = 8
CHAT_PATH = "/v1/chat/completions"
#: the answer tokens of a request sent only to prefill its prompt (``Requests.prefill_prompt``)
PREFILL_ONLY_TOKENS = 1

#: where SGLang puts the completion ids of a choice: ``token_ids`` up to 0.5.17, ``response_token_ids``
#: in 0.5.23 (``ChatCompletionResponseChoice`` in srt/entrypoints/openai/protocol.py)
COMPLETION_IDS_FIELDS = ("response_token_ids", "token_ids")


def chat_url(base_url: str) -> str:
    return base_url.rstrip("/") + CHAT_PATH


class ServerRestarts(Protocol):
    """The job's own server across restarts (``regen.serving.progress.SlotRestarts``): a request lost
    because the server was restarted under it (stalled or crashed) is sent again to the restarted server,
    once per restart, without using one of its attempts."""

    generation: int  # server starts seen so far
    failure: str | None  # the supervisor's cause when it gave up

    async def lost_to_restart(self, generation: int) -> str | None:
        """After a failed request sent at ``generation``: the server's URL when it was restarted since."""
        ...


@dataclass(slots=True)
class Halt:
    """Why the shard stops sending (None while it goes on); the first cause given stands."""

    reason: str | None = None

    def stop(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason


@dataclass(frozen=True, slots=True)
class Sampled:
    """How a sampling variant's requests sample: its name, its sampling (per-thinking-mode overrides
    inside) and its ``reasoning_effort`` (sent in chat_template_kwargs; None: not sent)."""

    name: str
    sampling: SamplingConfig
    reasoning_effort: str | None = None


@dataclass(slots=True)
class Ask:
    """What every request of one completion shares: its record id (in logs, the sample-id header and
    ``in_flight``), seed, thinking switch, attempts so far (``attempts[0]``, counted over its turns), its
    variant's sampling, the sample's tools, and a lent server for its first request."""

    id: str
    seed: int
    thinking: bool
    attempts: list[int]
    sampled: Sampled
    tools: list[Any] | None = None
    lender: Endpoint | None = None


class RequestError(Exception):
    """One failed request: ``category`` is client_error, server_error, connection_error,
    truncated_response, malformed_response or timeout."""

    def __init__(self, category: str, detail: str, retryable: bool, excess: bool = False) -> None:
        super().__init__(f"{category}: {detail}")
        self.category = category
        self.detail = detail
        self.retryable = retryable
        #: a timeout while the server answered other requests: it waited behind the client's own excess
        #: (too many in flight), not for a failed server
        self.excess = excess


class SampleFailed(Exception):
    def __init__(self, err: RequestError, attempts: int) -> None:
        super().__init__(str(err))
        self.err = err
        self.attempts = attempts


@dataclass(slots=True)
class Answer:
    reasoning_content: str | None
    content: str
    finish_reason: str
    usage: dict[str, Any]
    model: str | None
    started_at: float
    latency_s: float
    max_tokens: int
    tool_calls: list[Any] | None = None  # parsed by the server's tool-call parser, when it has one
    lender: Endpoint | None = None  # another slot's server, when it answered
    #: the server's token ids (``return_token_ids``): the rendered prompt, and the raw completion
    #: before reasoning parsing (end-of-turn included when the model stopped on it); None when absent
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    #: the prompt tokens SGLang read from its radix cache (``usage.prompt_tokens_details.cached_tokens``,
    #: ``--enable-cache-report``); None where not reported. The shard's stats count it, never the record
    cached_tokens: int | None = None

    def token_id_fields(self) -> dict[str, list[int]]:
        """The journal's additive token-id fields (none when the server sent no ids)."""
        if self.prompt_token_ids is None or self.completion_token_ids is None:
            return {}
        return {"prompt_token_ids": self.prompt_token_ids, "completion_token_ids": self.completion_token_ids}


#: what ``urllib.parse.quote(..., safe="")`` leaves as it is
_UNRESERVED_ID = re.compile(r"[A-Za-z0-9_.~-]+")


def sample_id_header(sample_id: str) -> str:
    """The sample id as an HTTP header value: percent-encoded, so no id (newlines, non-ASCII) can
    break or inject a header. The simulated server decodes it; real SGLang ignores the header."""
    if _UNRESERVED_ID.fullmatch(sample_id):  # the usual id: nothing to encode (and no quote() per request)
        return sample_id
    return urllib.parse.quote(sample_id, safe="")


def backoff_delay(base: float, attempt: int, rng: random.Random) -> float:
    return min(MAX_BACKOFF_S, base * 2.0 ** (attempt - 1)) * rng.uniform(0.5, 1.5)


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


_INT = frozenset({int})


def _token_ids(choice: dict[str, Any], names: tuple[str, ...]) -> list[int] | None:
    """The first present field of ``names`` as a list of token ids; None when none is present."""
    for name in names:
        value = choice.get(name)
        if value is None:
            continue
        # every item an int (not a bool) and none negative, checked in C: a long answer has thousands
        if not isinstance(value, list) or not (
            _INT.issuperset(map(type, value)) and min(value, default=0) >= 0
        ):
            raise ValueError(f"choices[0].{name}: expected a list of non-negative integers")
        return value
    return None


def parse_answer(body: bytes, started_at: float, latency: float, max_tokens: int) -> Answer:
    try:
        obj = orjson.loads(body)
        choice = obj["choices"][0]
        msg = choice["message"]
        usage = obj.get("usage") or {}
        reasoning_tokens = usage.get("reasoning_tokens")
        if reasoning_tokens is None:
            reasoning_tokens = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
        return Answer(
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
            cached_tokens=cached_tokens(obj),
        )
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise RequestError("malformed_response", f"{type(exc).__name__}: {exc}", True) from exc


class Requests:
    """The requests of one shard's samples to its server (``chat_url``, moved on a restart), sharing
    one session, one back-off random stream and the shard's ``halt``. ``in_flight`` and ``retrying``
    (and ``retried``) are what ``regen status`` shows. Each server (the own one, each lent one) has its
    :class:`regen.generate.pacing.AimdWindow`, started at ``pacing``: a request waits for room there before it
    is sent, and its outcome moves the window."""

    def __init__(
        self,
        cfg: GenerateConfig,
        session: aiohttp.ClientSession,
        *,
        server: Endpoint,
        model: str,
        shard: str,
        rng: random.Random,
        halt: Halt,
        restarts: ServerRestarts | None,
        pacing: InFlightPlan,
    ) -> None:
        self.cfg = cfg
        self.session = session
        self.chat_url = chat_url(server.url)
        #: a prompt with several completions is prefilled first (``prefill_prompt``) only where the own
        #: server keeps its radix cache: without it the request would be one more prefill, saving none
        self.prefill_first = server.radix_cache is not False
        self.model = model
        self.shard = shard
        self.rng = rng
        self.halt = halt
        self.restarts = restarts
        self.base_headers = {"Content-Type": "application/json"}
        if server.api_key:
            self.base_headers["Authorization"] = f"Bearer {server.api_key}"
        self.timeout = aiohttp.ClientTimeout(total=cfg.request_timeout_s)
        self.in_flight: dict[str, float] = {}  # sample id -> when its first request was sent
        self.pacing = pacing
        self.windows: dict[str, AimdWindow] = {}  # chat URL -> its server's window
        #: other servers with room (chat URL -> [server, requests it may still take]), from the lenders'
        #: last look (:meth:`offer`): a retry goes there while the own server's window is full
        self.offers: dict[str, list[Any]] = {}
        self.rerouted = 0  # retries sent to another server than the own one
        self.excess_timeouts = 0  # timeouts sent again without using an attempt (EXCESS_TIMEOUTS_MAX)
        self.retrying: set[str] = set()  # sample ids waiting out a back-off before their next attempt
        self.retried = 0  # requests sent again after a failure
        #: the answered requests' prompt tokens and the part SGLang read from its radix cache
        self.prefill = PrefillSaved()
        # the body fields every request of one variant and thinking mode shares (built on first use)
        self._fixed: dict[tuple[Sampled, bool], dict[str, Any]] = {}
        #: the sampling of a run without variants
        self.plain = Sampled(DEFAULT_VARIANT, cfg.sampling)

    def asking(
        self,
        rid: str,
        seed: int,
        thinking: bool,
        attempts: list[int],
        sampled: Sampled | None = None,
        tools: list[Any] | None = None,
        lender: Endpoint | None = None,
    ) -> Ask:
        """One completion's :class:`Ask` (``sampled`` None: the run's sampling, no variants)."""
        return Ask(rid, seed, thinking, attempts, sampled or self.plain, tools, lender)

    async def answer_turn(self, ask: Ask, messages: list[dict[str, Any]]) -> Answer | None:
        """One regenerated turn under the truncation policy (``regen.truncation``: a cut inside the
        reasoning and one inside the answer apart); None means dropped. ``ask.lender``: a lent server for
        the first request (retries go where :meth:`retry_target` says). A retry without thinking turns
        ``ask.thinking`` off, so the record says how its answer was made."""
        cfg = self.cfg
        limit = cfg.sampling.max_tokens  # the run's: no variant sets it
        answer = await self.request(ask, messages, limit, ask.lender)
        where = truncated_where(
            answer.finish_reason, answer.content, answer.reasoning_content, bool(answer.tool_calls)
        )
        action = cfg.truncation.action(where)
        if action == KEEP:
            return answer
        if action == DROP:
            return None
        if action == RETRY_WITHOUT_THINKING:
            ask.thinking = False
            return await self.request(ask, messages, limit)
        bigger = math.ceil(limit * cfg.retry_max_tokens_factor)
        return await self.request(ask, messages, bigger)

    async def prefill_prompt(self, ask: Ask, messages: list[dict[str, Any]]) -> None:
        """Put the prompt in the radix cache of the server its completions go to (``ask.lender``, else the own
        one) before they go out, as SGLang's own ``n`` > 1 does (``TokenizerManager``: one ``max_new_tokens``
        0 request per prompt, awaited before the n copies). Under SGLang's default ``fcfs`` policy, requests
        admitted in one prefill batch each match the tree as it was before the batch, so completions sent at
        once prefill their prompt once each. One request of 1 token (the API reads 0 as no limit); its
        answer is dropped and a failure is left to the completions' own requests."""
        body = self.body(messages, ask.seed, ask.thinking, PREFILL_ONLY_TOKENS, ask.tools, ask.sampled)
        url = chat_url(ask.lender.url) if ask.lender is not None else self.chat_url
        try:
            await self.post_once(body, self.base_headers, PREFILL_ONLY_TOKENS, url)
        except RequestError as err:
            log.info("shard %s: %s: the prompt's prefill request failed (%s); its completions go out anyway",
                     self.shard, ask.id, err)  # fmt: skip

    async def request(
        self, ask: Ask, messages: list[dict[str, Any]], max_tokens: int, lender: Endpoint | None = None
    ) -> Answer:
        """POST with retries (the first to ``lender`` when given, each retry where :meth:`retry_target`
        says); raises SampleFailed. The sample's tool definitions go with it. The completion counts as in
        flight meanwhile (``regen status``)."""
        sid, attempts = ask.id, ask.attempts
        try:
            body = self.body(messages, ask.seed, ask.thinking, max_tokens, ask.tools, ask.sampled)
            headers = {**self.base_headers, SAMPLE_ID_HEADER: sample_id_header(sid)}
            max_attempts = self.cfg.max_attempts
            used = 0  # attempts of max_attempts used
            forgiven = 0  # timeouts behind the client's own excess, sent again (EXCESS_TIMEOUTS_MAX)
            delay = 0.0
            url: str | None = None  # where the last request went
            while True:
                if used or forgiven:
                    self.retried += 1
                    self.retrying.add(sid)
                    await asyncio.sleep(delay)
                    self.retrying.discard(sid)
                attempts[0] += 1
                lent = lender if used == 0 and forgiven == 0 else self.retry_target(url)
                url = chat_url(lent.url) if lent is not None else self.chat_url
                generation = self.restarts.generation if self.restarts is not None else 0
                try:
                    try:
                        answer = await self.post_once(body, headers, max_tokens, url, sid)
                    except RequestError as err:
                        if lent is not None or self.restarts is None or not err.retryable:
                            raise
                        answer = await self._resend_after_restart(
                            err, generation, body, headers, max_tokens, attempts, sid
                        )
                    answer.lender = lent
                    return answer
                except RequestError as err:
                    if err.excess and forgiven < EXCESS_TIMEOUTS_MAX and self.halt.reason is None:
                        forgiven += 1
                        self.excess_timeouts += 1
                        delay = 0.0
                        log.info("shard %s: sample %r: %s while the server answered others (too many in "
                                 "flight): sent again, no attempt used", self.shard, sid, err)  # fmt: skip
                        continue
                    used += 1
                    if not err.retryable or used >= max_attempts or self.halt.reason is not None:
                        log.warning("shard %s: sample %r: request %d/%d failed (%s); giving up on it",
                                    self.shard, sid, used, max_attempts, err)  # fmt: skip
                        raise SampleFailed(err, attempts[0]) from err
                    delay = backoff_delay(self.cfg.backoff_base_s, used, self.rng)
                    log.warning("shard %s: sample %r: request %d/%d failed (%s); retrying in %.2f s",
                                self.shard, sid, used, max_attempts, err, delay)  # fmt: skip
        finally:
            self.in_flight.pop(sid, None)
            self.retrying.discard(sid)

    def _fixed_fields(self, sampled: Sampled, thinking: bool) -> dict[str, Any]:
        """The request body every request of one variant and thinking mode shares, in its field order: the
        ``extra_body``, ``return_token_ids`` and ``model`` first, then the sampling and the chat
        template's kwargs; ``messages``, ``max_tokens`` and ``seed`` (None here) are each request's.
        ``n`` is 1: each completion is its own request, with its own seed and journal line."""
        cfg = self.cfg
        head = {**dict(cfg.extra_body), **({"return_token_ids": True} if cfg.return_token_ids else {})}
        head["model"] = self.model
        template_kwargs: dict[str, Any] = {"enable_thinking": thinking}
        if cfg.preserve_thinking is not None:
            template_kwargs["preserve_thinking"] = cfg.preserve_thinking
        if sampled.reasoning_effort is not None:
            template_kwargs["reasoning_effort"] = sampled.reasoning_effort
        s = sampled.sampling.for_thinking(thinking)[0]
        return {
            **head,
            "messages": None,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
            "max_tokens": None,
            "n": 1,
            "seed": None,
            "chat_template_kwargs": template_kwargs,
            "separate_reasoning": True,
        }

    def body(
        self, messages: list[dict[str, Any]], seed: int, thinking: bool, max_tokens: int,
        tools: list[Any] | None, sampled: Sampled | None = None,
    ) -> bytes:  # fmt: skip
        """The chat-completions request body for one completion (``extra_body`` never overrides these
        fields); ``sampled`` None: the run's sampling."""
        # speed: a copy of the variant's fixed body with this request's fields set (a key keeps its place)
        key = (sampled or self.plain, thinking)
        fixed = self._fixed.get(key)
        if fixed is None:
            fixed = self._fixed[key] = self._fixed_fields(*key)
        body = fixed.copy()
        body["messages"] = messages
        body["max_tokens"] = max_tokens
        body["seed"] = seed
        if tools:
            body["tools"] = tools
        return orjson.dumps(body)

    async def _resend_after_restart(
        self, err: RequestError, generation: int, body: bytes, headers: dict[str, str], max_tokens: int,
        attempts: list[int], sid: str,
    ) -> Answer:  # fmt: skip
        """After a request to the job's own server failed (``err``, sent at server ``generation``): while it
        was lost to a restart of that server, send it again to the restarted one (``ServerRestarts``);
        otherwise raise the failure."""
        assert self.restarts is not None
        while True:
            url = await self.restarts.lost_to_restart(generation)
            if self.restarts.failure is not None:
                self.halt.stop(f"its server gave up: {self.restarts.failure}")
            if url is None:
                raise err
            self.chat_url = chat_url(url)
            attempts[0] += 1
            log.warning("shard %s: sample %r: its request was lost to a server restart (%s); "
                        "sending it again to %s", self.shard, sid, err.category, url)  # fmt: skip
            generation = self.restarts.generation
            try:
                return await self.post_once(body, headers, max_tokens, self.chat_url, sid)
            except RequestError as again:
                if not again.retryable:
                    raise
                err = again

    def offer(self, servers: list[tuple[Endpoint, int]]) -> None:
        """The other servers with room now (``Lenders.spare``: each with the requests it may take)."""
        self.offers = {chat_url(ep.url): [ep, room] for ep, room in servers}

    def retry_target(self, failed_at: str | None = None) -> Endpoint | None:
        """Where a retry goes: another server than ``failed_at`` (the chat URL its last request failed at)
        with room, the own server first, then one whose offer and window both have room (it takes one of
        the offer); else the own server (None), to wait there for room."""
        if failed_at != self.chat_url and self.window(self.chat_url).room > 0:
            return None
        for url, offer in self.offers.items():
            if url != failed_at and offer[1] > 0 and self.window(url).room > 0:
                offer[1] -= 1
                self.rerouted += 1
                return offer[0]
        return None

    def window(self, url: str) -> AimdWindow:
        """The in-flight window of the server at chat URL ``url`` (made at ``pacing`` when first used)."""
        found = self.windows.get(url)
        if found is None:
            found = self.windows[url] = AimdWindow.of(self.pacing)
        return found

    async def post_once(
        self, body: bytes, headers: dict[str, str], max_tokens: int, url: str, sid: str | None = None
    ) -> Answer:
        """One POST once its server's window has room (the wait before it is the client's own: no timeout
        runs); its outcome moves the window."""
        window = self.window(url)
        ticket = await window.acquire()
        if sid is not None:
            self.in_flight.setdefault(sid, time.time())
        answered = window.completed
        outcome = OTHER
        try:
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
                # the server answered others while this one waited: too many in flight (the window shrinks);
                # none: the server is stalled or down, a failure (its breaker, not the window, handles it)
                excess = window.completed > answered
                outcome = OVERLOAD if excess else OTHER
                raise RequestError(
                    "timeout", f"no response within {self.cfg.request_timeout_s} s", True, excess
                ) from exc
            if status != 200:
                if status in OVERLOAD_STATUSES:
                    outcome = OVERLOAD
                if 400 <= status < 500 and status not in RETRY_STATUSES:
                    raise RequestError("client_error", f"HTTP {status}: {_error_message(data)}", False)
                raise RequestError("server_error", f"HTTP {status}: {_error_message(data)}", True)
            answer = parse_answer(data, started_at, time.perf_counter() - t0, max_tokens)
            self.prefill.count(int(answer.usage["prompt_tokens"]), answer.cached_tokens)
            outcome = OK
            return answer
        finally:
            window.release(ticket, outcome)
