"""A simulated SGLang server: SGLang 0.5.23's HTTP surface, synthetic text, injectable faults.

Shapes follow SGLang's source (``srt/entrypoints/http_server.py``,
``srt/entrypoints/openai/protocol.py`` and ``serving_chat.py``,
``srt/observability/metrics_collector.py``, ``srt/managers/scheduler.py``):

- ``GET /health`` and ``GET /health_generate``: empty 200, or 503 while starting.
- ``GET /server_info``: resolved launch fields at the top level plus ``internal_states`` (one per DP rank).
- ``GET /model_info``, ``GET /v1/models`` (``max_model_len``), ``GET /metrics`` (Prometheus text).
- ``POST /v1/chat/completions`` (non-streaming). As in SGLang, ``message.tool_calls`` is left
  out when it is None, and ``usage.completion_tokens_details`` is set only when there are
  reasoning tokens.

Generated text is made of synthetic words, determined by (messages, seed, choice index). At
temperature 0 the seed is ignored, as in greedy decoding. Thinking on gives reasoning plus an
answer; a budget that runs out inside the reasoning gives ``content == ""`` like SGLang's
Qwen3 reasoning parser on an unclosed think block.

Token ids: with ``tokenizer_path`` (SGLang's ``--tokenizer-path``) the server works in tokens, as
SGLang does. The prompt is the chat template rendered with the generation prompt and
``chat_template_kwargs`` and tokenized (``prompt_tokens``); the completion is a token sequence
(``<think>\n`` reasoning ``\n</think>\n\n`` answer, then the end-of-turn token on a natural
stop) cut at ``max_tokens``; its text is the ids decoded without special tokens and split by the
Qwen3 reasoning parser exactly as 0.5.23 does (no stripping: ``reasoning_content`` keeps the
newlines around the think block, ``content`` the two after it). With ``"return_token_ids": true`` each
choice carries ``prompt_token_ids`` and the raw completion ids before reasoning parsing, under
``response_token_ids`` (0.5.23) or ``token_ids`` (versions before 0.5.23, e.g. 0.5.17).
``Faults.noncanonical_rate`` makes a completion's ids differ from its text's canonical encoding (one
token emitted as two), which a real model does now and then. Without a tokenizer, words stand in
for tokens and no ids are returned.

Faults are drawn per request from ``hash(faults.seed, sample id, n-th request for that id)``,
so one run's faults do not depend on request order. The sample id is the
``X-Regen-Sample-Id`` header, percent-encoded by the client (real SGLang ignores it) or else the
request's ``rid``.
``GET /_sim/stats`` returns ``{"received", "completed": {id: n}, "received_by_id", "faults"}``;
``POST /_sim/stall`` stalls the server at once (``Faults.stall_after_tokens`` and ``stall_at_s`` do it
on their own): it stays up and healthy, takes requests, and generates nothing more.

``request_log`` (``--request-log PATH``, or the ``REGEN_SIM_REQUEST_LOG`` environment variable, which
the server inherits through Snakemake and the supervisor) appends one JSON line per chat request
received, per chat request completed and per fault injected:
``{"event": "received"|"completed"|"fault:<kind>", "id", "pid", "t"}`` (kinds as in ``FAULT_KINDS``, plus
``poison``, ``crash`` and ``stall``).
Lines are single ``O_APPEND`` writes, so several servers and server lifetimes share one file; it
lets a test count, across restarts and kills, requests re-sent for ids already finished.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import hashlib
import heapq
import json
import math
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import IO, Any

import orjson
from aiohttp import web

SAMPLE_ID_HEADER = "X-Regen-Sample-Id"
QWEN_IM_END_ID = 151645  # <|im_end|>: what matched_stop reports for a natural stop on Qwen3
FAULT_KINDS: tuple[str, ...] = ("error", "hang", "disconnect", "malformed", "truncate")
REQUEST_LOG_ENV = "REGEN_SIM_REQUEST_LOG"
# chain mode (known-answer target, bench/gpu/known_target.py): answer from that model's designed chain;
# read from the environment like the request log, so a workflow's simulated servers inherit them
CHAIN_ENV = "REGEN_SIM_CHAIN"  # path of the model's chain.json
TOOL_CALL_PARSER_ENV = "REGEN_SIM_TOOL_CALL_PARSER"  # like SGLang's --tool-call-parser (qwen25, hermes)
#: JSON object of further SimOptions fields, applied after ``--options`` (a bench's per-server behaviour,
#: e.g. ``speculative_num_steps`` and the speculative memory map, which a real SGLang takes from its flags)
OPTIONS_ENV = "REGEN_SIM_OPTIONS"
#: SGLang's own benchmarking knob (speculative/spec_utils.py): the accept length it forces per verify step
SIMULATE_ACC_LEN_ENV = "SGLANG_SIMULATE_ACC_LEN"


def _make_words() -> tuple[str, ...]:
    rng = random.Random(20240531)
    onsets = [
        "b",
        "c",
        "d",
        "f",
        "g",
        "h",
        "k",
        "l",
        "m",
        "n",
        "p",
        "r",
        "s",
        "t",
        "v",
        "w",
        "z",
        "br",
        "tr",
        "st",
        "pl",
        "gr",
    ]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou", "ea"]
    words = {
        "".join(rng.choice(onsets) + rng.choice(vowels) for _ in range(rng.randint(1, 3))) for _ in range(600)
    }
    return tuple(sorted(words))[:512]


WORDS: tuple[str, ...] = _make_words()


def _unit_hash(*parts: object) -> float:
    """A uniform number in [0, 1) determined by ``parts``."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


@dataclass(frozen=True, slots=True)
class Faults:
    """Fault injection. Rates are per request; each request draws at most one fault."""

    error_rate: float = 0.0
    hang_rate: float = 0.0
    disconnect_rate: float = 0.0
    malformed_rate: float = 0.0
    truncate_rate: float = 0.0
    crash_after: int | None = None
    bad_request_for: tuple[str, ...] = ()
    error_for: tuple[str, ...] = ()  # ids/patterns that always get HTTP 500 (poison samples)
    hang_for: tuple[str, ...] = ()  # ids/patterns whose requests are accepted and never answered
    # bad model output (HTTP 200, well-formed JSON): drawn independently of the transport faults above,
    # for the validation stage to catch
    think_leak_rate: float = 0.0  # the answer carries a stray "</think>"
    empty_answer_rate: float = 0.0  # reasoning but no answer
    # token mode only: the completion's ids split one multi-character token in two, so the text
    # re-tokenizes differently from the ids the model produced
    noncanonical_rate: float = 0.0
    # scripted tool calls (a real model decides; tests and the demo script them): {id pattern: [calls of
    # answer 0, calls of answer 1, ...]}, answer k being the one after k assistant turns of the request,
    # each call {"name", "arguments"}; made only when the request sends tools and the answer stops
    tool_calls_for: tuple[tuple[str, tuple[tuple[Any, ...], ...]], ...] = ()
    # a stall as SGLang's (#30314, PR #34705): the process lives, /health and /metrics answer, requests are
    # taken, and no token is generated any more, no decode batch logged; once this lifetime has generated
    # this many tokens, or this many seconds after it became ready (``POST /_sim/stall`` stalls it at once)
    stall_after_tokens: int | None = None
    stall_at_s: float | None = None
    seed: int = 0

    @classmethod
    def from_json(cls, obj: dict[str, Any] | None) -> Faults:
        if not obj:
            return cls()
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(obj) - known)
        if unknown:
            raise ValueError(f"--faults: unknown key(s) {unknown}; known: {sorted(known)}")
        kwargs = dict(obj)
        for key in ("bad_request_for", "error_for", "hang_for"):
            if key in kwargs:
                kwargs[key] = tuple(str(x) for x in kwargs[key])
        if "tool_calls_for" in kwargs:
            kwargs["tool_calls_for"] = tuple(
                (str(p), tuple(tuple(calls or ()) for calls in answers))
                for p, answers in dict(kwargs["tool_calls_for"]).items()
            )
        faults = cls(**kwargs)
        total = sum(getattr(faults, f"{k}_rate") for k in FAULT_KINDS)
        if total > 1.0 or any(getattr(faults, f"{k}_rate") < 0 for k in FAULT_KINDS):
            raise ValueError(f"--faults: rates must be >= 0 and sum to <= 1 (sum {total})")
        return faults

    def draw(self, key: str, nth: int) -> str | None:
        """The fault (or None) for the ``nth`` request carrying sample id ``key``."""
        u = _unit_hash(self.seed, key, nth)
        edge = 0.0
        for kind in FAULT_KINDS:
            edge += getattr(self, f"{kind}_rate")
            if u < edge:
                return kind
        return None

    def is_bad_request(self, sample_id: str | None) -> bool:
        return _matches(sample_id, self.bad_request_for)

    def spoil(self, completion: Completion, key: str, nth: int) -> tuple[Completion, str | None]:
        """The completion with a bad-output fault applied (and its name), or unchanged (None)."""
        u = _unit_hash(self.seed, "output", key, nth)
        if u < self.think_leak_rate:
            return replace(completion, content="</think>\n" + completion.content), "think_leak"
        if u < self.think_leak_rate + self.empty_answer_rate and completion.reasoning:
            return replace(completion, content=""), "empty_answer"
        return completion, None

    def is_noncanonical(self, key: str, nth: int) -> bool:
        return _unit_hash(self.seed, "noncanonical", key, nth) < self.noncanonical_rate

    def is_poison(self, sample_id: str | None) -> bool:
        return _matches(sample_id, self.error_for)

    def is_wedged(self, sample_id: str | None) -> bool:
        return _matches(sample_id, self.hang_for)

    def scripted_tool_calls(self, sample_id: str | None, messages: list[Any]) -> list[dict[str, Any]]:
        """The tool calls scripted for this answer of ``sample_id`` (OpenAI shape, as SGLang's parser
        returns them: ids, indexes, arguments as JSON text); none when not scripted."""
        answer = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
        for pattern, answers in self.tool_calls_for:
            if _matches(sample_id, (pattern,)) and answer < len(answers):
                return [
                    {
                        "id": "call_"
                        + hashlib.blake2b(repr((sample_id, answer, i)).encode()).hexdigest()[:24],
                        "index": i,
                        "type": "function",
                        "function": {
                            "name": call["name"],
                            "arguments": json.dumps(call.get("arguments") or {}, ensure_ascii=False),
                        },
                    }
                    for i, call in enumerate(answers[answer])
                ]
        return []


def _matches(sample_id: str | None, patterns: tuple[str, ...]) -> bool:
    if sample_id is None:
        return False
    return any(sample_id == p or re.fullmatch(p, sample_id) for p in patterns)


@dataclass(frozen=True, slots=True)
class SimOptions:
    """What the simulated server pretends to be and how it behaves."""

    model_path: str = "demo-model"
    served_model_name: str | None = None
    max_running_requests: int = 64
    effective_max_running_requests: int | None = None  # e.g. a mamba-capped value; None = same
    token_rate: float = 0.0  # decode tokens/s per request; 0 answers at once
    # batch throughput model: with N running, each request decodes at token_rate / (1 + N / this), so a
    # bigger batch gives more total tok/s but less per request (saturating at token_rate x this, like a
    # memory-bandwidth-bound decode); None keeps token_rate per request whatever the batch
    half_speed_running: int | None = None
    startup_delay_s: float = 0.0
    context_len: int = 32768
    max_total_num_tokens: int = 1_048_576
    version: str = "0.5.23"
    inline: bool = False  # answer inside the handler: no scheduler, queue or sleeps
    mean_reasoning_tokens: int = 96
    mean_answer_tokens: int = 48
    long_fraction: float = 0.05  # share of answers made long_factor times longer (to hit length)
    long_factor: int = 64
    log_interval_s: float = 5.0
    request_log: str | None = None  # JSONL of received/completed chat requests (see module doc)
    tokenizer_path: str | None = None  # tokenizer.json + chat template: work in tokens (module doc)
    faults: Faults = field(default_factory=Faults)
    virtual: VirtualTime | None = None  # virtual-time mode (VirtualSimulatedServer); None: real time
    # the memory map SGLang reports (/server_info memory_usage, startup log); regen launches the
    # simulated server with the plan's values so realized matches what the plan predicted
    weights_gib: float = 15.3
    kv_cache_gib: float = 40.1
    mem_fraction_static: float = 0.85
    available_gpu_mem_gib: float = 12.34
    # --enable-linear-replayssm's decode ring (the plan's prediction); logged in SGLang's phrasing, all of
    # it as the d ring (SGLang splits it into d, k and g; regen reads their sum); 0: flag off
    replay_ring_gib: float = 0.0
    max_mamba_cache_size: int | None = None  # the plan's (hybrid models); None: 5 x the running cap
    # numerics SGLang reports in /server_info (regen.fingerprint.SERVER_NUMERICS_KEYS): the launch flags'
    kv_cache_dtype: str = "auto"
    mamba_ssm_dtype: str | None = None
    dtype: str = "auto"
    quantization: str | None = None
    enable_deterministic_inference: bool = False
    # SGLang 0.5.17 builds flashinfer's sampling kernels (JIT, nvcc) on the first request that needs
    # top-k/top-p/min-p sampling: on a fresh H200 machine its scheduler served nothing for ~110 s
    # (2026-11-30); greedy requests never build them. Seconds of that stall; 0: none.
    sampling_build_s: float = 0.0
    # chain mode (ChainModel): the completion ids are sampled from a known target's chain, as SGLang
    # samples that model (needs tokenizer_path: the model's tokenizer); None: synthetic text
    chain_path: str | None = None
    tool_call_parser: str | None = None  # qwen25 / hermes: parse <tool_call> blocks when tools are sent
    # speculative decoding (EAGLE/NEXTN, topk 1): draft steps (0: off) and the accept length per verify step
    # (SGLANG_SIMULATE_ACC_LEN; None: 1 + 0.8 x steps); the plan's speculative memory map for the startup log
    speculative_num_steps: int = 0
    simulated_accept_len: float | None = None
    state_pool_gib: float = 0.0
    spec_scratch_gib: float = 0.0
    draft_weights_gib: float = 0.0
    draft_kv_gib: float = 0.0

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model_path

    @property
    def running_cap(self) -> int:
        return self.effective_max_running_requests or self.max_running_requests


@dataclass(frozen=True, slots=True)
class Completion:
    reasoning: str | None
    content: str
    reasoning_tokens: int
    completion_tokens: int
    finish_reason: str
    tool_calls: tuple[dict[str, Any], ...] | None = None  # parsed calls (finish_reason "tool_calls")


@dataclass(frozen=True, slots=True)
class Ask:
    """What one chat-completions request asks of each of its ``n`` choices."""

    messages: list[Any]
    seed: int | None
    temperature: float
    max_tokens: int
    thinking: bool
    ignore_eos: bool


def synth_completion(ask: Ask, opts: SimOptions, index: int = 0) -> Completion:
    """Deterministic synthetic completion for (messages, seed, index)."""
    max_tokens, thinking, ignore_eos = ask.max_tokens, ask.thinking, ask.ignore_eos
    key = orjson.dumps(ask.messages) + repr((None if ask.temperature == 0 else ask.seed, index)).encode()
    rng = random.Random(hashlib.blake2b(key, digest_size=8).digest())
    r_len = rng.randint(1, 2 * opts.mean_reasoning_tokens) if thinking else 0
    a_len = rng.randint(1, 2 * opts.mean_answer_tokens)
    if rng.random() < opts.long_fraction:
        a_len *= opts.long_factor
    want = max_tokens if ignore_eos else r_len + a_len
    finish = "length" if ignore_eos or want > max_tokens else "stop"
    total = min(want, max_tokens)
    r_used = min(r_len, total)
    reasoning = " ".join(rng.choices(WORDS, k=r_used)) if thinking else None
    # a budget spent inside the think block leaves no answer (unclosed <think>)
    content = " ".join(rng.choices(WORDS, k=total - r_used)) if r_used == r_len else ""
    return Completion(reasoning, content, r_used, total, finish)


def with_tool_calls(made: Completion, calls: list[dict[str, Any]]) -> Completion:
    """A stopped completion that ends in ``calls``: SGLang's tool-call parser takes them out of the text,
    reports them as ``message.tool_calls`` and turns finish_reason ``stop`` into ``tool_calls``."""
    return replace(made, tool_calls=tuple(calls), finish_reason="tool_calls")


def tool_call_text(calls: tuple[dict[str, Any], ...]) -> str:
    """The calls as the Qwen3 chat template writes them in an assistant turn (what the model emits)."""
    return "\n".join(
        '<tool_call>\n{"name": "' + c["function"]["name"] + '", "arguments": ' + c["function"]["arguments"]
        + "}\n</tool_call>"
        for c in calls
    )  # fmt: skip


TOOL_CALL_OPEN = "<tool_call>"


def tool_call_pairing_error(messages: list[Any]) -> str | None:
    """SGLang 0.5.23's check (``serving_chat._tool_call_pairing_error``): every assistant tool call is
    answered by exactly one following tool message, unless that assistant message is the last one."""
    pending: set[Any] | None = None
    unpaired_ids = False
    for m in messages:
        m = m if isinstance(m, dict) else {}
        if m.get("role") == "tool":
            if unpaired_ids:
                continue
            if pending is None:
                return "A tool message must follow an assistant message with tool_calls."
            if m.get("tool_call_id") not in pending:
                return f"tool_call_id {m.get('tool_call_id')!r} does not match an unanswered tool call."
            pending.discard(m.get("tool_call_id"))
            continue
        if pending:
            return f"Tool calls {sorted(pending)} have no tool message answering them."
        pending, unpaired_ids = None, False
        if m.get("role") == "assistant" and m.get("tool_calls"):
            call_ids = [c.get("id") if isinstance(c, dict) else None for c in m["tool_calls"]]
            unpaired_ids = None in call_ids  # calls without ids cannot be paired: results unchecked
            pending = None if unpaired_ids else set(call_ids)
    last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    if pending and last.get("role") == "tool":
        return f"Tool calls {sorted(pending)} have no tool message answering them."
    return None


def version_tuple(version: str) -> tuple[int, ...]:
    """``"0.5.23"`` -> ``(0, 5, 23)`` (non-numeric parts end it)."""
    out: list[int] = []
    for part in version.split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


def completion_ids_field(version: str) -> str:
    """The choice field SGLang puts completion ids in: ``response_token_ids`` from 0.5.23 on."""
    return "response_token_ids" if version_tuple(version) >= (0, 5, 23) else "token_ids"


def parse_qwen3_reasoning(text: str, thinking: bool) -> tuple[str | None, str]:
    """SGLang 0.5.23's Qwen3 reasoning parser on a whole completion (``detect_and_parse``).

    With thinking on the parser forces reasoning mode: leading ``<think>`` tags are dropped, the text
    up to the first ``</think>`` is the reasoning (all of it when there is none) and the rest the
    answer, neither stripped. With thinking off the text is the answer.
    """
    if not thinking and THINK_OPEN not in text:
        return None, text
    while text.startswith(THINK_OPEN):
        text = text[len(THINK_OPEN) :]
    if THINK_CLOSE not in text:
        return text or None, ""
    reasoning, answer = text.split(THINK_CLOSE, 1)
    return reasoning or None, answer


THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


@dataclass(frozen=True, slots=True)
class TokenCompletion:
    """A completion made in tokens: what SGLang's chat endpoint reports for one choice."""

    completion: Completion
    ids: list[int]
    matched_stop: int | None


class TokenModel:
    """The simulated model's token side: the target tokenizer and chat template (``regen.chat``)."""

    def __init__(self, tokenizer_path: str) -> None:
        from regen.chat import ChatTemplate  # only in token mode

        self.template = ChatTemplate.from_dir(tokenizer_path)
        tok = self.template.tokenizer
        self.tokenizer = tok
        self.eos_id = tok.token_to_id(self.template.end_of_turn)
        self.think_close_id = tok.token_to_id(THINK_CLOSE)
        self._word_tokens: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def prompt_ids(
        self, messages: list[Any], thinking: bool, template_kwargs: dict[str, Any] | None = None
    ) -> list[int]:
        """The prompt as SGLang tokenizes it: the chat template with the generation prompt and the
        request's other ``chat_template_kwargs`` (e.g. ``preserve_thinking``)."""
        if not template_kwargs:
            text = self.template.render(messages, add_generation_prompt=True, enable_thinking=thinking)
        else:
            from regen.chat import to_template_dicts  # only in token mode

            dicts = to_template_dicts(messages)
            text = self.template.render_dicts(dicts, True, thinking, template_kwargs=template_kwargs)
        return self.encode(text)

    def complete(
        self, made: Completion, thinking: bool, max_tokens: int, ignore_eos: bool, noncanonical: bool
    ) -> TokenCompletion:
        """Turn a synthetic completion into the model's raw tokens and SGLang's parsed view of them."""
        calls = made.tool_calls
        if calls:  # the model stops after its calls: the text ends with them, then the end of turn
            made = replace(made, finish_reason="stop", tool_calls=None)
        made = replace(
            made,
            reasoning=(
                self._fit(made.reasoning, made.reasoning_tokens)
                if made.reasoning is not None and (made.content or made.finish_reason == "stop")
                else made.reasoning
            ),
            content=(  # a cut answer keeps a word per token, so its tokens still reach max_tokens
                self._fit(made.content, made.completion_tokens - made.reasoning_tokens)
                if made.finish_reason == "stop"
                else made.content
            ),
        )
        raw = made.content
        if made.reasoning is not None:
            raw = f"{THINK_OPEN}\n{made.reasoning}"
            if made.content or made.finish_reason == "stop":  # a budget spent inside the think block
                raw += f"\n{THINK_CLOSE}\n\n{made.content}"
        if calls:
            raw += ("\n" if made.content else "") + tool_call_text(calls)
        ids = self.encode(raw)
        if noncanonical:
            ids = self._split_one_token(ids)
        stopped = made.finish_reason == "stop" and not ignore_eos
        if stopped:
            ids.append(self.eos_id)
        if len(ids) > max_tokens:
            ids, stopped = ids[:max_tokens], False
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        reasoning, content = parse_qwen3_reasoning(text, thinking)
        if reasoning is None:
            reasoning_tokens = 0
        elif self.think_close_id in ids:
            reasoning_tokens = ids.index(self.think_close_id) + 1
        else:
            reasoning_tokens = len(ids)
        finish = "stop" if stopped else "length"
        if calls and stopped:  # parsed out of the text (a call cut by max_tokens stays text, unparsed)
            content = content.split(TOOL_CALL_OPEN, 1)[0].strip()
            completion = Completion(reasoning, content, reasoning_tokens, len(ids), "tool_calls", calls)
            return TokenCompletion(completion, ids, None)
        completion = Completion(reasoning, content, reasoning_tokens, len(ids), finish)
        return TokenCompletion(completion, ids, self.eos_id if stopped else None)

    def _fit(self, words: str, n_tokens: int) -> str:
        """The leading words of ``words`` whose tokens fit in ``n_tokens`` (at least one word): the
        synthetic lengths are drawn in tokens, the text in words."""
        if not words:
            return words
        kept: list[str] = []
        used = 0
        for w in words.split(" "):
            cost = self._word_tokens.get(w)
            if cost is None:
                cost = self._word_tokens[w] = len(self.encode(" " + w))
            if kept and used + cost > n_tokens:
                break
            kept.append(w)
            used += cost
        return " ".join(kept)

    def _split_one_token(self, ids: list[int]) -> list[int]:
        """Emit the longest plain token as two (its first character, then the rest)."""
        best, best_len = -1, 1
        for i, tid in enumerate(ids):
            piece = self.tokenizer.decode([tid], skip_special_tokens=False)
            if len(piece) > best_len and piece.isalpha():
                best, best_len = i, len(piece)
        if best < 0:
            return ids
        piece = self.tokenizer.decode([ids[best]], skip_special_tokens=False)
        return ids[:best] + self.encode(piece[:1]) + self.encode(piece[1:]) + ids[best + 1 :]


class ChainModel:
    """A known-answer target's chain (``chain.json`` of ``bench/gpu/known_target.py``): each token's
    successors and their logits. Sampled as SGLang 0.5.17 samples: logits / temperature, softmax over the
    vocabulary (every other id at ``other_logit``), then top-k and top-p ("joint": kept when among the k
    largest and the mass strictly above is below top_p), renormalized; temperature 0 is greedy."""

    def __init__(self, path: str) -> None:
        with open(path, "rb") as fh:
            obj = orjson.loads(fh.read())
        self.succ = {int(s["token"]): [(int(t), float(lg)) for t, lg in s["succ"]] for s in obj["states"]}
        self.eos = int(obj["eos"])
        self._cache: dict[tuple[int, float, int, float], tuple[list[int], list[float]]] = {}

    def dist(self, token: int, temperature: float, top_k: int, top_p: float) -> tuple[list[int], list[float]]:
        """The kept successors of ``token`` and their cumulative probabilities."""
        key = (token, temperature, top_k, top_p)
        if key not in self._cache:
            pairs = sorted(self.succ.get(token, []), key=lambda x: -x[1])
            if not pairs:  # a token outside the chain (uniform over the vocabulary): end the turn instead
                pairs = [(self.eos, 0.0)]
            if temperature <= 1e-6 or top_k == 1:
                self._cache[key] = ([pairs[0][0]], [1.0])
            else:
                w = [math.exp((lg - pairs[0][1]) / temperature) for _, lg in pairs]
                total = sum(w)
                kept, above = [], 0.0
                for i, (t, _) in enumerate(pairs):
                    if (top_k <= 0 or i < top_k) and above < top_p:
                        kept.append((t, w[i] / total))
                    above += w[i] / total
                norm = sum(p for _, p in kept)
                cum, acc = [], 0.0
                for _, p in kept:
                    acc += p / norm
                    cum.append(acc)
                self._cache[key] = ([t for t, _ in kept], cum)
        return self._cache[key]

    def sample(
        self,
        start: int,
        rng: random.Random,
        max_tokens: int,
        ignore_eos: bool,
        sampling: tuple[float, int, float],
    ) -> tuple[list[int], bool]:
        """Completion ids after a prompt ending in ``start``; True when it ended on the end-of-turn id."""
        ids: list[int] = []
        cur = start
        while len(ids) < max_tokens:
            toks, cum = self.dist(cur, *sampling)
            u = rng.random()
            cur = toks[next((i for i, c in enumerate(cum) if u < c), len(toks) - 1)]
            ids.append(cur)
            if cur == self.eos and not ignore_eos:
                return ids, True
        return ids, False


TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>\n", "\n</tool_call>"


def parse_qwen25_tool_calls(text: str, tools: list[Any]) -> tuple[str, list[dict[str, Any]]] | None:
    """SGLang 0.5.17's Qwen25Detector.detect_and_parse and serving_chat's ToolCall list: None when the
    text has no ``<tool_call>`` line; else (the text before it, stripped; the calls to known tools)."""
    idx = text.find(TOOL_CALL_OPEN)
    if idx < 0:
        return None
    names = [t.get("function", {}).get("name") if isinstance(t, dict) else None for t in tools]
    calls = []
    for body in re.findall(re.escape(TOOL_CALL_OPEN) + "(.*?)" + re.escape(TOOL_CALL_CLOSE), text, re.DOTALL):
        try:
            act = orjson.loads(body.strip())
        except orjson.JSONDecodeError:
            continue
        for a in act if isinstance(act, list) else [act]:
            name = a.get("name") if isinstance(a, dict) else None
            if not name or name not in names:
                continue  # SGLang drops calls to undefined functions
            args = a.get("parameters") or a.get("arguments", {})
            calls.append(
                {
                    "id": f"call_{uuid.uuid4().hex[:24]}",
                    "index": names.index(name),
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
                }
            )
    return text[:idx].strip(), calls


def needs_filtered_sampling(req: dict[str, Any]) -> bool:
    """SGLang samples with flashinfer's top-k/top-p/min-p kernels unless the request is greedy
    (temperature 0, or top_k 1) or its filters are off (top_k -1 or 2**30, top_p 1, min_p 0)."""
    temperature = req.get("temperature")
    top_k = req.get("top_k")
    if (temperature is not None and float(temperature) <= 1e-6) or top_k == 1:
        return False
    top_p = req.get("top_p")
    min_p = req.get("min_p")
    return (
        (top_k is not None and 0 < int(top_k) < 1 << 30)
        or (top_p is not None and float(top_p) < 1.0)
        or (min_p is not None and float(min_p) > 0.0)
    )


def _prompt_tokens(messages: list[Any]) -> int:
    n = 3
    for m in messages:
        c = m.get("content") if isinstance(m, dict) else None
        n += 4 + (len(c.split()) if isinstance(c, str) else 0)
    return n


def error_body(message: str, status: int, err_type: str = "BadRequestError") -> bytes:
    """SGLang's ErrorResponse (serving_base.create_error_response)."""
    return orjson.dumps(
        {"object": "error", "message": message, "type": err_type, "param": None, "code": status}
    )


def _error(message: str, status: int, err_type: str = "BadRequestError") -> web.Response:
    return web.Response(
        status=status, body=error_body(message, status, err_type), content_type="application/json"
    )


class LogWriter:
    """Writes lines in SGLang's log format: ``[YYYY-mm-dd HH:MM:SS TP0] message``."""

    def __init__(self, path: str | None) -> None:
        self._fh: IO[str] | None = open(path, "a", buffering=1) if path else None  # noqa: SIM115

    def __call__(self, msg: str, prefix: str = " TP0") -> None:
        if self._fh is None:
            return
        self._fh.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}{prefix}] {msg}\n")

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class RequestLog:
    """Append-only JSONL of chat requests, shared by every server process and lifetime."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._fd: int | None = None
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)

    def __call__(self, event: str, sample_id: str | None, **extra: Any) -> None:
        if self._fd is None:
            return
        line = orjson.dumps({"event": event, "id": sample_id, "pid": os.getpid(), "t": time.time(), **extra})
        os.write(self._fd, line + b"\n")  # one write with O_APPEND: lines never interleave

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_request_log(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The events of a request log (a torn last line, from a killed server, is skipped)."""
    out: list[dict[str, Any]] = []
    try:
        data = open(path, "rb").read()  # noqa: SIM115
    except FileNotFoundError:
        return out
    for raw in data.splitlines():
        try:
            out.append(orjson.loads(raw))
        except orjson.JSONDecodeError:
            continue
    return out


# ------------------------------------------------------------------ speculative decoding (EAGLE/NEXTN)
#: per draft step, the draft model's forward pass as a share of a plain decode step at an empty batch
SPEC_DRAFT_STEP_COST = 0.1
#: per draft token, the verify pass's extra GEMM work per request, as a share of its plain decode work
SPEC_VERIFY_TOKEN_COST = 0.5


def accept_length(opts: SimOptions) -> float | None:
    """Accepted tokens per verify step, as SGLang's match-expected simulation gives it:
    ``min(max(1, SGLANG_SIMULATE_ACC_LEN), steps + 1)``; None without speculative decoding."""
    steps = opts.speculative_num_steps
    if steps <= 0:
        return None
    wanted = opts.simulated_accept_len if opts.simulated_accept_len is not None else 1 + 0.8 * steps
    return max(1.0, min(float(steps + 1), wanted))


def spec_speedup(opts: SimOptions, load: float) -> float:
    """Accepted tokens per request per unit of plain decode time at batch load ``load`` (running /
    half_speed_running): a verify step yields ``accept_length`` tokens and costs the draft passes plus
    the verified tokens' GEMMs, which weigh more as the batch grows (MTP helps at low batch)."""
    accepted = accept_length(opts)
    if accepted is None:
        return 1.0
    steps = opts.speculative_num_steps
    plain = 1.0 + load
    spec = 1.0 + SPEC_DRAFT_STEP_COST * steps + load * (1.0 + SPEC_VERIFY_TOKEN_COST * steps)
    return accepted * plain / spec


def spec_log_part(opts: SimOptions) -> str:
    """The decode line's ``accept len: a, accept rate: r, `` (metrics_reporter), empty without it."""
    accepted = accept_length(opts)
    if accepted is None:
        return ""
    return f"accept len: {accepted:.2f}, accept rate: {(accepted - 1) / opts.speculative_num_steps:.2f}, "


def spec_startup_lines(opts: SimOptions) -> list[str]:
    """SGLang 0.5.17's startup lines for a speculative server's memory (the draft model's weights, the
    state pool with its verify buffers, the target's and the draft's KV pools); empty without it."""
    if opts.speculative_num_steps <= 0:
        return []
    k = opts.max_mamba_cache_size or 5 * opts.running_cap
    tokens = opts.max_total_num_tokens
    return [
        f"Load weight end. elapsed=0.10 s, type=Qwen3_5ForCausalLM, avail mem=90.00 GB, "
        f"mem usage={opts.weights_gib:.2f} GB.",
        f"Load weight end. elapsed=0.10 s, type=Qwen3_5ForCausalLMMTP, avail mem=84.00 GB, "
        f"mem usage={opts.draft_weights_gib:.2f} GB.",
        f"Mamba Cache is allocated. max_mamba_cache_size: {k}, conv_state size: 0.00GB, "
        f"ssm_state size: {opts.state_pool_gib:.2f}GB intermediate_ssm_state_cache size: "
        f"{opts.spec_scratch_gib:.2f}GB intermediate_conv_window_cache size: 0.00GB ",
        *(
            f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {tokens}, K size: {gib / 2:.2f} GB, "
            f"V size: {gib / 2:.2f} GB"
            for gib in (opts.kv_cache_gib, opts.draft_kv_gib)
        ),
    ]


def env_options(environ: dict[str, str] | os._Environ[str]) -> dict[str, Any]:
    """SimOptions fields from the environment: ``REGEN_SIM_OPTIONS`` (JSON) and SGLang's
    ``SGLANG_SIMULATE_ACC_LEN`` (a negative value, SGLang's default -1, is off)."""
    out: dict[str, Any] = orjson.loads(environ[OPTIONS_ENV]) if environ.get(OPTIONS_ENV) else {}
    raw = environ.get(SIMULATE_ACC_LEN_ENV)
    if raw and float(raw) > 0:
        out.setdefault("simulated_accept_len", float(raw))
    return out


class SimulatedServer:
    """State and handlers of one simulated server."""

    def __init__(self, opts: SimOptions, log: LogWriter, on_crash: Callable[[], None]) -> None:
        self.opts = opts
        self.log = log
        self.on_crash = on_crash
        self.started_at = time.time()
        self.ready_at = self.started_at + opts.startup_delay_s
        self.received = 0
        self.received_by_id: Counter[str] = Counter()
        self.completed: Counter[str] = Counter()
        self.n_completed = 0
        self.fault_counts: Counter[str] = Counter()
        self.running = 0
        self.queued = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.window_tokens = 0.0  # tokens decoded since the last decode line
        self.window_start = time.monotonic()
        self.last_gen_throughput = 0.0
        self.slots = asyncio.Semaphore(opts.running_cap)
        self.hung: set[asyncio.Future[None]] = set()
        self.crashed = False
        self.stalled = False
        self.request_log = RequestLog(opts.request_log)
        self.tokens = TokenModel(opts.tokenizer_path) if opts.tokenizer_path else None
        self.chain = ChainModel(opts.chain_path) if opts.chain_path and self.tokens is not None else None
        self.sampling_built_at: float | None = None  # monotonic time the sampling kernels are ready

    # -------------------------------------------------------------------- app
    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024**2)
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health)
        r.add_get("/server_info", self.server_info)
        r.add_get("/get_server_info", self.server_info)
        r.add_get("/model_info", self.model_info)
        r.add_get("/get_model_info", self.model_info)
        r.add_get("/v1/models", self.models)
        r.add_get("/metrics", self.metrics)
        r.add_post("/v1/chat/completions", self.chat)
        r.add_get("/_sim/stats", self.stats)
        r.add_post("/_sim/stall", self.stall_now)
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_cleanup)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        o = self.opts
        self.log(
            f"max_total_num_tokens={o.max_total_num_tokens}, chunked_prefill_size=8192, "
            f"max_prefill_tokens=16384, max_running_requests={o.running_cap}, "
            f"context_len={o.context_len}, available_gpu_mem={o.available_gpu_mem_gib:.2f} GB"
        )
        for line in spec_startup_lines(o):
            self.log(line)
        if o.replay_ring_gib > 0:
            self.log(
                "GDN ReplaySSM ring buffers allocated (record_len=16, fold=False): "
                f"d={o.replay_ring_gib:.3f}GB, k=0.000GB, g=0.000GB "
            )
        self._ticker = asyncio.create_task(self._tick())
        if o.startup_delay_s <= 0:
            self.log("The server is fired up and ready to roll!", prefix="")

    async def _on_cleanup(self, app: web.Application) -> None:
        if not self._ticker.done():
            self._ticker.cancel()
        for fut in list(self.hung):
            fut.cancel()
        self.request_log.close()

    async def _tick(self) -> None:
        announced = self.opts.startup_delay_s <= 0
        last = time.monotonic()
        while True:
            await asyncio.sleep(min(self.opts.log_interval_s, 0.2))
            now = time.monotonic()
            if self.opts.token_rate > 0 and not self.stalled:
                # as SGLang counts them, step by step: each running request decodes at its rate (an instant
                # server, token_rate 0, counts a request's tokens when it completes)
                self.window_tokens += self.running * self.per_request_rate() * (now - last)
            last = now
            if not announced and self.ready:
                announced = True
                self.log("The server is fired up and ready to roll!", prefix="")
            at = self.opts.faults.stall_at_s
            if at is not None and self.ready and time.time() >= self.ready_at + at:
                self.stall(f"stall_at_s={at:g}")
            if self.stalled:  # the scheduler is stuck: no decode batch, gauges keep their last values
                continue
            gap = now - self.window_start
            if gap >= self.opts.log_interval_s:
                self.last_gen_throughput = self.window_tokens / gap
                self.window_tokens = 0
                self.window_start = now
                if self.running or self.queued:
                    self.log(self._decode_line())

    def _decode_line(self) -> str:
        used = self.running * (self.opts.mean_reasoning_tokens + self.opts.mean_answer_tokens)
        usage = used / self.opts.max_total_num_tokens
        mamba = self.running / max(1, self.opts.running_cap)
        return (
            f"Decode batch, #running-req: {self.running}, #full token: {used}, "
            f"full token usage: {usage:.2f}, "
            f"mamba num: {self.running}, mamba usage: {mamba:.2f}, {spec_log_part(self.opts)}"
            "cuda graph: True, "
            f"gen throughput (token/s): {self.last_gen_throughput:.2f}, #queue-req: {self.queued}"
        )

    @property
    def ready(self) -> bool:
        return time.time() >= self.ready_at

    def stall(self, why: str) -> None:
        """From now on nothing is generated (see ``Faults.stall_after_tokens``)."""
        if self.stalled:
            return
        self.stalled = True
        self.request_log("fault:stall", None, why=why)

    async def _hold_if_stalled(self) -> None:
        """A request on a stalled server waits forever (until the server is stopped)."""
        if self.stalled:
            await self._hang()

    async def _hang(self) -> None:
        """Wait until the server is stopped (a request that is never answered)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.hung.add(fut)
        try:
            await fut
        finally:
            self.hung.discard(fut)

    async def stall_now(self, request: web.Request) -> web.Response:
        self.stall("POST /_sim/stall")
        return web.Response(status=200)

    # --------------------------------------------------------------- handlers
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready else 503)

    def server_info_dict(self) -> dict[str, Any]:
        o = self.opts
        return {
            "model_path": o.model_path,
            "tokenizer_path": o.model_path,
            "served_model_name": o.model_name,
            "host": "127.0.0.1",
            "tp_size": 1,
            "dp_size": 1,
            "max_running_requests": o.max_running_requests,
            "mem_fraction_static": o.mem_fraction_static,
            "chunked_prefill_size": 8192,
            "page_size": 1,
            "context_length": o.context_len,
            "attention_backend": "fa3",
            "dtype": o.dtype,
            "quantization": o.quantization,
            "kv_cache_dtype": o.kv_cache_dtype,
            "mamba_ssm_dtype": o.mamba_ssm_dtype,
            "enable_deterministic_inference": o.enable_deterministic_inference,
            "reasoning_parser": "qwen3",
            "mamba_full_memory_ratio": 0.9,
            "max_mamba_cache_size": None,
            "launch_command": f"python -m regen.sglang.simulated --model-path {o.model_path}",
            "max_total_num_tokens": o.max_total_num_tokens,
            "max_req_input_len": o.context_len - 1,
            "startup_time": self.started_at,
            "internal_states": [
                {
                    "effective_max_running_requests_per_dp": o.running_cap,
                    "max_mamba_cache_size": o.max_mamba_cache_size or 5 * o.running_cap,
                    "last_gen_throughput": self.last_gen_throughput,
                    "avg_spec_accept_length": accept_length(self.opts),
                    "memory_usage": {
                        "weight": o.weights_gib,
                        "kvcache": o.kv_cache_gib,
                        "startup_available": o.available_gpu_mem_gib,
                        "token_capacity": o.max_total_num_tokens,
                        "graph": {"decode": 1.2},
                    },
                }
            ],
            "version": o.version,
            "frontend": "python",
        }

    async def server_info(self, request: web.Request) -> web.Response:
        return web.json_response(self.server_info_dict(), dumps=lambda x: orjson.dumps(x).decode())

    async def model_info(self, request: web.Request) -> web.Response:
        o = self.opts
        info = {
            "model_path": o.model_path,
            "served_model_name": o.model_name,
            "tokenizer_path": o.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": "auto",
            "reasoning_parser": "qwen3",
            "tool_call_parser": "qwen3_coder",
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "qwen3",
            "architectures": ["Qwen3ForCausalLM"],
        }
        return web.Response(body=orjson.dumps(info), content_type="application/json")

    async def models(self, request: web.Request) -> web.Response:
        name = self.opts.model_name
        card = {
            "id": name,
            "object": "model",
            "created": int(self.started_at),
            "owned_by": "sglang",
            "root": name,
            "parent": None,
            "max_model_len": self.opts.context_len,
        }
        return web.Response(
            body=orjson.dumps({"object": "list", "data": [card]}), content_type="application/json"
        )

    async def metrics(self, request: web.Request) -> web.Response:
        name = self.opts.model_name
        sched = f'engine_type="unified",model_name="{name}",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
        tok = f'engine_type="unified",is_streaming="false",model_name="{name}"'
        used = self.running * (self.opts.mean_reasoning_tokens + self.opts.mean_answer_tokens)
        lines = []
        for metric, help_, kind, labels, value in (
            ("sglang:num_running_reqs", "The number of running requests.", "gauge", sched, self.running),
            (
                "sglang:num_queue_reqs",
                "The number of requests in the waiting queue.",
                "gauge",
                sched,
                self.queued,
            ),
            (
                "sglang:gen_throughput",
                "The generation throughput (token/s).",
                "gauge",
                sched,
                self.last_gen_throughput,
            ),
            (
                "sglang:token_usage",
                "The token usage.",
                "gauge",
                sched,
                round(used / self.opts.max_total_num_tokens, 2),
            ),
            (
                "sglang:mamba_usage",
                "The mamba usage.",
                "gauge",
                sched,
                round(self.running / max(1, self.opts.running_cap), 2),
            ),
            (
                "sglang:spec_accept_length",
                "The average acceptance length of speculative decoding.",
                "gauge",
                sched,
                accept_length(self.opts) or 0.0,
            ),
            (
                "sglang:prompt_tokens_total",
                "Number of prefill tokens processed.",
                "counter",
                tok,
                self.prompt_tokens_total,
            ),
            (
                "sglang:generation_tokens_total",
                "Number of generation tokens processed.",
                "counter",
                tok,
                self.generation_tokens_total,
            ),
        ):
            lines.append(f"# HELP {metric} {help_}")
            lines.append(f"# TYPE {metric} {kind}")
            lines.append(f"{metric}{{{labels}}} {float(value)}")
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def stats(self, request: web.Request) -> web.Response:
        body = {
            "received": self.received,
            "received_by_id": dict(self.received_by_id),
            "completed": dict(self.completed),
            "faults": dict(self.fault_counts),
            "running": self.running,
            "queued": self.queued,
        }
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        if self.crashed:
            _abort(request)
            return web.Response(status=500)
        if not self.ready:
            return _error("The server is starting up.", 503, "ServiceUnavailableError")
        raw = await request.read()
        try:
            req = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return _error(f"JSON decode error: {exc}", 400)
        if not isinstance(req, dict):
            return _error("Request body must be a JSON object.", 400)
        messages = req.get("messages")
        if not isinstance(messages, list) or not messages:
            return _error("Messages cannot be empty.", 400)
        header_id = request.headers.get(SAMPLE_ID_HEADER)
        sid = (urllib.parse.unquote(header_id) if header_id else None) or (
            req.get("rid") if isinstance(req.get("rid"), str) else None
        )
        self.received += 1
        key = sid if sid is not None else f"#{self.received}"
        self.received_by_id[key] += 1
        self.request_log("received", sid)
        if self.opts.faults.is_bad_request(sid):
            return _error(f"Invalid request for sample {sid}: rejected by the simulator.", 400)
        pairing = (
            tool_call_pairing_error(messages) if version_tuple(self.opts.version) >= (0, 5, 23) else None
        )
        if pairing is not None:
            return _error(pairing, 400)
        max_tokens = req.get("max_completion_tokens") or req.get("max_tokens") or 128
        n = req.get("n", 1)
        if not isinstance(max_tokens, int) or max_tokens < 1 or not isinstance(n, int) or n < 1:
            return _error("max_tokens and n must be positive integers.", 400)
        if self.opts.faults.is_poison(sid):
            self.fault_counts["error"] += 1
            self.request_log("fault:poison", sid)
            return _error("Internal server error (simulated poison sample).", 500, "InternalServerError")
        fault = self.opts.faults.draw(key, self.received_by_id[key])
        if fault is None and self.opts.faults.is_wedged(sid):
            fault = "hang"
        if fault is not None:
            self.fault_counts[fault] += 1
            self.request_log(f"fault:{fault}", sid)
            return await self._fault(request, fault)

        await self._hold_if_stalled()
        await self._sampling_kernels(req)
        ctk = req.get("chat_template_kwargs") or {}
        thinking = bool(ctk.get("enable_thinking", True)) and req.get("reasoning_effort") != "none"
        temperature = req.get("temperature")
        temperature = 1.0 if temperature is None else float(temperature)
        seed = req.get("seed")
        ignore_eos = bool(req.get("ignore_eos", False))
        ask = Ask(messages, seed, temperature, max_tokens, thinking, ignore_eos)
        choices = []
        tokenized: list[TokenCompletion] = []
        more_kwargs = {k: v for k, v in ctk.items() if k != "enable_thinking"}
        prompt_ids = (
            self.tokens.prompt_ids(messages, thinking, more_kwargs) if self.tokens is not None else None
        )
        chain_calls: list[list[dict[str, Any]] | None] = []  # per choice, in chain mode
        for i in range(n):
            if self.chain is not None and prompt_ids:
                done, made, choice_calls = self.chain_choice(req, ask, prompt_ids, i)
                tokenized.append(done)
                chain_calls.append(choice_calls)
                choices.append(made)
                continue
            made = self.make_completion(ask, i, key)
            nth = self.received_by_id[key] * n + i
            made, spoiled = self.opts.faults.spoil(made, key, nth)
            calls = self.opts.faults.scripted_tool_calls(sid, messages) if req.get("tools") else []
            if calls and made.finish_reason == "stop":
                made = with_tool_calls(made, calls)
            if spoiled is not None:
                self.fault_counts[spoiled] += 1
                self.request_log(f"fault:{spoiled}", sid)
            if self.tokens is not None:
                noncanonical = self.opts.faults.is_noncanonical(key, nth)
                if noncanonical:
                    self.fault_counts["noncanonical"] += 1
                done = self.tokens.complete(made, thinking, max_tokens, ignore_eos, noncanonical)
                tokenized.append(done)
                made = done.completion
            choices.append(made)
        prompt_tokens = _prompt_tokens(messages) if prompt_ids is None else len(prompt_ids)
        n_out = sum(c.completion_tokens for c in choices)
        if not self.opts.inline:
            await self._schedule(n_out)
            if self.crashed:
                _abort(request)
                return web.Response(status=500)
        body = self._response_body(
            req,
            choices,
            prompt_tokens,
            bool(req.get("separate_reasoning", True)),
            prompt_ids,
            tokenized,
            chain_calls,
        )
        self.prompt_tokens_total += prompt_tokens
        self.generation_tokens_total += n_out
        if self.opts.token_rate <= 0:
            self.window_tokens += n_out
        self.completed[key] += 1
        self.n_completed += 1
        self.request_log("completed", sid)
        stall_after = self.opts.faults.stall_after_tokens
        if stall_after is not None and self.generation_tokens_total >= stall_after:
            self.stall(f"stall_after_tokens={stall_after}")
        crash = self.opts.faults.crash_after is not None and self.n_completed >= self.opts.faults.crash_after
        if not crash:
            return web.Response(body=body, content_type="application/json")
        resp = web.Response(body=body, content_type="application/json")
        await resp.prepare(request)
        await resp.write_eof()
        self.crashed = True
        self.request_log("fault:crash", sid)
        self.log(f"crash_after={self.opts.faults.crash_after} reached: exiting", prefix="")
        self.on_crash()
        return resp

    async def _sampling_kernels(self, req: dict[str, Any]) -> None:
        """The first request needing filtered sampling starts the kernel build; until it ends, every
        request waits (SGLang's scheduler is busy building)."""
        if self.opts.sampling_build_s <= 0:
            return
        if self.sampling_built_at is None and needs_filtered_sampling(req):
            self.sampling_built_at = time.monotonic() + self.opts.sampling_build_s
            self.log(f"building the sampling kernels ({self.opts.sampling_build_s:g} s)", prefix="")
        if self.sampling_built_at is not None:
            await asyncio.sleep(max(0.0, self.sampling_built_at - time.monotonic()))

    def chain_choice(
        self, req: dict[str, Any], ask: Ask, prompt_ids: list[int], index: int
    ) -> tuple[TokenCompletion, Completion, list[dict[str, Any]] | None]:
        """One choice sampled from the known target's chain, parsed as SGLang parses it (reasoning, then
        tool calls when the request has tools and a tool-call parser is set). The draw depends on the
        messages, seed, choice index and max_tokens: a retry with a larger budget is a fresh draw, as on
        SGLang, whose flashinfer sampler ignores the request seed."""
        assert self.chain is not None and self.tokens is not None
        key = orjson.dumps(ask.messages) + repr((ask.seed, index, ask.max_tokens)).encode()
        rng = random.Random(hashlib.blake2b(key, digest_size=8).digest())
        top_k, top_p = req.get("top_k"), req.get("top_p")
        sampling = (ask.temperature, int(top_k) if top_k is not None else -1, float(top_p) if top_p else 1.0)
        ids, stopped = self.chain.sample(prompt_ids[-1], rng, ask.max_tokens, ask.ignore_eos, sampling)
        text = self.tokens.tokenizer.decode(ids, skip_special_tokens=True)
        reasoning, content = parse_qwen3_reasoning(text, ask.thinking)
        if reasoning is None:
            reasoning_tokens = 0
        elif self.tokens.think_close_id in ids:
            reasoning_tokens = ids.index(self.tokens.think_close_id) + 1
        else:
            reasoning_tokens = len(ids)
        finish = "stop" if stopped else "length"
        choice_calls = None
        tools = req.get("tools")
        if self.opts.tool_call_parser in ("qwen25", "hermes") and tools and req.get("tool_choice") != "none":
            parsed = parse_qwen25_tool_calls(content, tools)
            if parsed is not None:
                content, found = parsed
                if found:
                    choice_calls = found
                    finish = "tool_calls" if finish == "stop" else finish
        made = Completion(reasoning, content, reasoning_tokens, len(ids), finish)
        matched = self.chain.eos if finish == "stop" else None
        return TokenCompletion(made, ids, matched), made, choice_calls

    def make_completion(self, ask: Ask, index: int, key: str) -> Completion:
        """The completion for one choice (``key``: the sample id, or a per-request stand-in)."""
        return synth_completion(ask, self.opts, index)

    def per_request_rate(self) -> float:
        """Decode tokens/s of one request with ``self.running`` requests in the batch (itself included)."""
        half = self.opts.half_speed_running
        if not half:
            return self.opts.token_rate * spec_speedup(self.opts, 0.0)
        return (
            self.opts.token_rate * spec_speedup(self.opts, self.running / half) / (1.0 + self.running / half)
        )

    async def _schedule(self, n_tokens: int) -> None:
        self.queued += 1
        try:
            await self.slots.acquire()
        finally:
            self.queued -= 1
        self.running += 1
        try:
            await self._hold_if_stalled()
            if self.opts.token_rate > 0:
                await asyncio.sleep(n_tokens / self.per_request_rate())
            await self._hold_if_stalled()
        finally:
            self.running -= 1
            self.slots.release()

    def _response_body(
        self,
        req: dict[str, Any],
        choices: list[Completion],
        prompt_tokens: int,
        sep: bool,
        prompt_ids: list[int] | None = None,
        tokenized: list[TokenCompletion] | None = None,
        calls: list[list[dict[str, Any]] | None] | None = None,
    ) -> bytes:
        out_choices = []
        reasoning_tokens = 0
        want_ids = bool(req.get("return_token_ids")) and prompt_ids is not None and tokenized
        want_prompt_ids = want_ids or (bool(req.get("return_prompt_token_ids")) and prompt_ids is not None)
        ids_field = completion_ids_field(self.opts.version)
        for i, c in enumerate(choices):
            reasoning_tokens += c.reasoning_tokens
            if sep or c.reasoning is None:
                message = {"role": "assistant", "content": c.content, "reasoning_content": c.reasoning}
            else:
                closed = "</think>" if c.finish_reason == "stop" or c.content else ""
                message = {
                    "role": "assistant",
                    "content": f"<think>{c.reasoning}{closed}{c.content}",
                    "reasoning_content": None,
                }
            if c.tool_calls:
                message["tool_calls"] = list(c.tool_calls)
            out_choices.append(
                {
                    "index": i,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": c.finish_reason,
                    "matched_stop": (
                        tokenized[i].matched_stop
                        if tokenized
                        else (QWEN_IM_END_ID if c.finish_reason == "stop" else None)
                    )
                    if not c.tool_calls
                    else None,
                }
            )
            if calls and calls[i]:
                message["tool_calls"] = calls[i]
            if want_prompt_ids:
                out_choices[-1]["prompt_token_ids"] = prompt_ids
            if want_ids:
                out_choices[-1][ids_field] = tokenized[i].ids  # type: ignore[index]
        completion_tokens = sum(c.completion_tokens for c in choices)
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens * len(choices),
            "total_tokens": prompt_tokens * len(choices) + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": None,
            "reasoning_tokens": reasoning_tokens,
        }
        if reasoning_tokens:
            usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
        return orjson.dumps(
            {
                "id": uuid.uuid4().hex,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": req.get("model") or self.opts.model_name,
                "choices": out_choices,
                "usage": usage,
                "metadata": {"weight_version": "default"},
            }
        )

    async def _fault(self, request: web.Request, kind: str) -> web.StreamResponse:
        if kind == "error":
            if self.received % 2:
                return _error("Internal server error (simulated).", 500, "InternalServerError")
            return _error("Service unavailable (simulated).", 503, "ServiceUnavailableError")
        if kind == "hang":
            await self._hang()
            return web.Response(status=500)
        if kind == "malformed":
            return web.Response(
                body=b'{"id": "chatcmpl-broken", "choices": [{"index": 0, "mess',
                content_type="application/json",
            )
        if kind == "truncate":
            body = error_body("x" * 256, 200)
            resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
            resp.content_length = len(body) * 2
            await resp.prepare(request)
            await resp.write(body)
            await asyncio.sleep(0)
            _abort(request)
            return resp
        # disconnect: the connection is closed after the request was read, before any response byte
        _abort(request)
        return web.Response(status=500)


def _abort(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()


# ------------------------------------------------------------------------- virtual time


@dataclass(frozen=True, slots=True)
class VirtualTime:
    """A GPU-shaped server in virtual time, for run-level benchmarks (``bench/efficiency.py``).

    Virtual seconds = ``speed`` x (real seconds since the Unix time ``epoch``), the same on every server
    that gets the same ``epoch``. A decode step with N running requests takes ``step_ms +
    step_ms_per_running x N`` virtual ms and gives each running request one token (the H200 fit of
    issue #16 by default: 350 running decode 5,220 tok/s); requests beyond the running cap wait in a
    FIFO queue, as in SGLang. A request's output length is drawn per sample id from a lognormal of mean
    ``length_mean`` and shape ``length_sigma``, capped at ``length_cap`` and at the request's
    ``max_tokens``. Text is a few synthetic words (the usage counts the modelled tokens): the response
    keeps SGLang's shape, not its size.
    """

    speed: float
    epoch: float
    step_ms: float = 13.2
    step_ms_per_running: float = 0.154
    length_mean: float = 3000.0
    length_sigma: float = 1.0
    length_cap: int = 8192
    seed: int = 0

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> VirtualTime:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(obj) - known)
        if unknown:
            raise ValueError(f"--virtual: unknown key(s) {unknown}; known: {sorted(known)}")
        out = cls(**obj)
        if out.speed <= 0 or out.step_ms <= 0 or out.step_ms_per_running < 0 or out.length_cap < 1:
            raise ValueError(f"--virtual: speed and step_ms must be > 0, length_cap >= 1: {obj}")
        return out

    def now(self) -> float:
        """Virtual seconds now."""
        return (time.time() - self.epoch) * self.speed

    def real_time(self, virtual_s: float) -> float:
        """The Unix time at which virtual time ``virtual_s`` is reached."""
        return self.epoch + virtual_s / self.speed

    def step_s(self, running: int) -> float:
        """Virtual seconds of one decode step with ``running`` requests."""
        return (self.step_ms + self.step_ms_per_running * running) / 1000.0

    def full_batch_tokens_per_s(self, cap: int) -> float:
        """Decode tokens per virtual second of one server running ``cap`` requests."""
        return cap / self.step_s(cap)

    def output_tokens(self, sample_key: str, max_tokens: int) -> int:
        """The modelled output length of ``sample_key`` (deterministic), at most ``max_tokens``."""
        u1 = max(_unit_hash(self.seed, "vlen1", sample_key), 1e-12)
        u2 = _unit_hash(self.seed, "vlen2", sample_key)
        normal = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
        mu = math.log(self.length_mean) - self.length_sigma**2 / 2.0
        drawn = max(1, round(math.exp(mu + self.length_sigma * normal)))
        return min(drawn, self.length_cap, max_tokens)


class FluidBatch:
    """Continuous batching in virtual time: every running request gains one token per step, so one
    progress counter (tokens per request so far) orders all completions; the running set changes only
    at arrivals and completions, between which the step time is constant."""

    def __init__(self, clock: VirtualTime, cap: int) -> None:
        self.clock = clock
        self.cap = cap
        self.progress = 0.0
        self.at = clock.now()
        self.running: list[
            tuple[float, int, asyncio.Future[float]]
        ] = []  # heap of (done at progress, seq, fut)
        self.waiting: deque[tuple[int, asyncio.Future[float]]] = deque()
        self.seq = 0

    def next_completion(self) -> float | None:
        """Virtual time of the next completion (None when nothing runs)."""
        if not self.running:
            return None
        return self.at + (self.running[0][0] - self.progress) * self.clock.step_s(len(self.running))

    def advance(self, now: float) -> None:
        """Complete every request due by virtual time ``now`` (each at its own virtual time)."""
        while (due := self.next_completion()) is not None and due <= now:
            target, _, fut = heapq.heappop(self.running)
            self.progress, self.at = target, due
            if not fut.done():
                fut.set_result(due)
            self._admit()
        if self.running:
            self.progress += (now - self.at) / self.clock.step_s(len(self.running))
        self.at = max(self.at, now)

    def arrive(self, tokens: int, fut: asyncio.Future[float]) -> None:
        self.waiting.append((tokens, fut))
        self._admit()

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.cap:
            tokens, fut = self.waiting.popleft()
            if fut.done():  # the client went away while it waited
                continue
            self.seq += 1
            heapq.heappush(self.running, (self.progress + tokens, self.seq, fut))


#: the modelled virtual completion time of the request the current handler task serves
_DONE_AT: contextvars.ContextVar[float | None] = contextvars.ContextVar("regen_sim_done_at", default=None)


class VirtualRequestLog(RequestLog):
    """The request log with each event's virtual time ``vt`` (for ``completed``: the modelled
    completion time, not the later moment the handler got to answer)."""

    def __init__(self, path: str | None, clock: VirtualTime) -> None:
        super().__init__(path)
        self.clock = clock

    def __call__(self, event: str, sample_id: str | None, **extra: Any) -> None:
        done_at = _DONE_AT.get() if event == "completed" else None
        super().__call__(event, sample_id, vt=self.clock.now() if done_at is None else done_at, **extra)


class VirtualSimulatedServer(SimulatedServer):
    """The simulated server in virtual time (``SimOptions.virtual``): same HTTP surface and shapes, a
    batch-dependent decode step instead of a fixed token rate, modelled output lengths."""

    def __init__(self, opts: SimOptions, log: LogWriter, on_crash: Callable[[], None]) -> None:
        super().__init__(opts, log, on_crash)
        assert opts.virtual is not None
        self.clock = opts.virtual
        self.request_log.close()
        self.request_log = VirtualRequestLog(opts.request_log, self.clock)
        self.batch = FluidBatch(self.clock, opts.running_cap)
        self.timer: asyncio.TimerHandle | None = None
        self.tokens = None  # lengths are modelled, not tokenized (a tokenizer would recount the few words)

    def make_completion(self, ask: Ask, index: int, key: str) -> Completion:
        max_tokens, ignore_eos, thinking = ask.max_tokens, ask.ignore_eos, ask.thinking
        wanted = self.clock.output_tokens(f"{key}#{index}", 1 << 30)
        total = max_tokens if ignore_eos else min(wanted, max_tokens)
        finish = "length" if ignore_eos or wanted > max_tokens else "stop"
        rng = random.Random(_unit_hash(self.clock.seed, "vtext", key, ask.seed, index))
        reasoning = " ".join(rng.choices(WORDS, k=4)) if thinking else None
        r_tokens = total * 3 // 4 if thinking else 0
        return Completion(reasoning, " ".join(rng.choices(WORDS, k=4)), r_tokens, total, finish)

    async def _schedule(self, n_tokens: int) -> None:
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.batch.advance(self.clock.now())
        self.batch.arrive(n_tokens, fut)
        self._sync_counts()
        self._arm()
        try:
            _DONE_AT.set(await fut)
        finally:
            if not fut.done():
                fut.cancel()
                self.batch.running = [r for r in self.batch.running if r[2] is not fut]
                heapq.heapify(self.batch.running)
                self._sync_counts()

    def _sync_counts(self) -> None:
        self.running = len(self.batch.running)
        self.queued = len(self.batch.waiting)

    def _arm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        due = self.batch.next_completion()
        if due is None:
            return
        loop = asyncio.get_running_loop()
        delay = max(0.0, self.clock.real_time(due) - time.time())
        self.timer = loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        self.batch.advance(self.clock.now())
        self._sync_counts()
        self._arm()


# ---------------------------------------------------------------------------------- runners


async def _serve(
    opts: SimOptions,
    host: str,
    port: int,
    log: LogWriter,
    on_crash: Callable[[], None],
    reuse_port: bool = False,
) -> tuple[web.AppRunner, int]:
    server = (VirtualSimulatedServer if opts.virtual is not None else SimulatedServer)(opts, log, on_crash)
    runner = web.AppRunner(server.app(), access_log=None, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_port=reuse_port or None, backlog=1024)
    await site.start()
    bound = runner.addresses[0][1]
    return runner, bound


def start_simulated_server(
    port: int = 0,
    host: str = "127.0.0.1",
    *,
    subprocess_mode: bool = False,
    cpus: set[int] | None = None,
    log_file: str | None = None,
    **opts: Any,
) -> tuple[str, Callable[[], None]]:
    """Start a simulated server; return ``(url, stop)``.

    In-thread by default (fast to start; ``crash_after`` closes the listener and every
    connection). ``subprocess_mode=True`` runs the CLI in a child process (optionally pinned
    to ``cpus``); there ``crash_after`` really exits the process.
    """
    if subprocess_mode:
        return _start_subprocess(port, host, cpus, log_file, opts)
    if "faults" in opts and not isinstance(opts["faults"], Faults):
        opts["faults"] = Faults.from_json(opts["faults"])
    if isinstance(opts.get("virtual"), dict):
        opts["virtual"] = VirtualTime.from_json(opts["virtual"])
    options = SimOptions(**opts)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict[str, Any] = {}
    log = LogWriter(log_file)

    def crash() -> None:
        loop.call_soon(lambda: asyncio.ensure_future(box["runner"].cleanup()))

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            box["runner"], box["port"] = loop.run_until_complete(_serve(options, host, port, log, crash))
        except BaseException as exc:
            box["error"] = exc
            started.set()
            return
        started.set()
        loop.run_forever()
        loop.run_until_complete(box["runner"].cleanup())
        loop.close()

    thread = threading.Thread(target=run, name=f"sim-sglang-{port}", daemon=True)
    thread.start()
    started.wait()
    if "error" in box:
        raise box["error"]

    def stop() -> None:
        if loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        log.close()

    return f"http://{host}:{box['port']}", stop


def _start_subprocess(
    port: int, host: str, cpus: set[int] | None, log_file: str | None, opts: dict[str, Any]
) -> tuple[str, Callable[[], None]]:
    argv = [
        sys.executable,
        "-m",
        "regen.sglang.simulated",
        "--host",
        host,
        "--port",
        str(port),
        "--print-url",
    ]
    if log_file:
        argv += ["--log-file", log_file]
    faults = opts.pop("faults", None)
    if faults:
        fj = (
            {f.name: getattr(faults, f.name) for f in fields(Faults)}
            if isinstance(faults, Faults)
            else faults
        )
        argv += ["--faults", orjson.dumps(fj).decode()]
    argv += ["--options", orjson.dumps(opts).decode()]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    if cpus:
        os.sched_setaffinity(proc.pid, cpus)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("http://"):
        proc.kill()
        raise RuntimeError(f"simulated server did not start (exit {proc.wait()}): {line!r}")

    def stop() -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    return line, stop


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="regen simulate-server", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=30000, help="port to listen on; 0 picks a free one")
    p.add_argument("--model-path", default="demo-model", help="model name it reports")
    p.add_argument("--served-model-name", default=None, help="served name (default: --model-path)")
    p.add_argument(
        "--max-running-requests",
        type=int,
        default=64,
        help="concurrent requests decoded at once (default 64)",
    )
    p.add_argument("--token-rate", type=float, default=0.0, help="decode tokens/s per request; 0 = instant")
    p.add_argument("--startup-delay", type=float, default=0.0, help="seconds until /health answers 200")
    p.add_argument(
        "--half-speed-running",
        type=int,
        default=None,
        help="batch model: per-request rate = token-rate / (1 + running / N); default: no batch effect",
    )
    p.add_argument("--faults", default=None, help="JSON object of Faults fields")
    p.add_argument("--virtual", default=None, help="JSON object of VirtualTime fields: run in virtual time")
    p.add_argument("--version", default="0.5.23", help="SGLang version it reports and imitates")
    p.add_argument("--log-file", default=None, help="write SGLang-style log lines here (default stderr)")
    p.add_argument("--inline", action="store_true", help="answer inside the handler (no queue, no sleeps)")
    p.add_argument(
        "--context-length", type=int, default=32768, help="context length it reports (default 32768)"
    )
    p.add_argument(
        "--tokenizer-path",
        default=None,
        help="directory with tokenizer.json and the chat template: work in tokens and return token ids",
    )
    p.add_argument("--options", default=None, help="JSON object of further SimOptions fields")
    p.add_argument("--reuse-port", action="store_true", help="SO_REUSEPORT (several processes on one port)")
    p.add_argument("--print-url", action="store_true", help="print the bound URL on stdout once listening")
    p.add_argument(
        "--request-log",
        default=os.environ.get(REQUEST_LOG_ENV) or None,
        help=f"append received/completed chat requests as JSONL (default: ${REQUEST_LOG_ENV})",
    )
    a = p.parse_args(argv)
    extra = orjson.loads(a.options) if a.options else {}
    if "faults" in extra:
        raise SystemExit("--options: pass faults with --faults")
    opts = SimOptions(
        model_path=a.model_path,
        served_model_name=a.served_model_name,
        max_running_requests=a.max_running_requests,
        token_rate=a.token_rate,
        half_speed_running=a.half_speed_running,
        startup_delay_s=a.startup_delay,
        version=a.version,
        inline=a.inline,
        context_len=a.context_length,
        request_log=a.request_log,
        tokenizer_path=a.tokenizer_path,
        chain_path=os.environ.get(CHAIN_ENV) or None,
        tool_call_parser=os.environ.get(TOOL_CALL_PARSER_ENV) or None,
        faults=Faults.from_json(orjson.loads(a.faults) if a.faults else None),
        virtual=VirtualTime.from_json(orjson.loads(a.virtual)) if a.virtual else None,
    )
    opts = replace(opts, **extra)
    opts = replace(opts, **env_options(os.environ))
    log = LogWriter(a.log_file) if a.log_file else LogWriterStderr()

    def crash() -> None:
        log.close()
        os._exit(3)

    async def main() -> None:
        runner, port = await _serve(opts, a.host, a.port, log, crash, reuse_port=a.reuse_port)
        if a.print_url:
            print(f"http://{a.host}:{port}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
    return 0


class LogWriterStderr(LogWriter):
    def __init__(self) -> None:
        self._fh = sys.stderr

    def close(self) -> None:
        self._fh = None


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    raise SystemExit(cli(sys.argv[1:]))
