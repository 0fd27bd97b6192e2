"""The simulated server's response bodies, in SGLang's shapes (``serving_chat``, ``serving_base``)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson
from aiohttp import web

from regen.simulated.completion import Completion
from regen.simulated.parsers import completion_ids_field
from regen.simulated.tokens import QWEN_IM_END_ID, TokenCompletion


def error_body(message: str, status: int, err_type: str = "BadRequestError") -> bytes:
    """SGLang's ErrorResponse (serving_base.create_error_response)."""
    return orjson.dumps(
        {"object": "error", "message": message, "type": err_type, "param": None, "code": status}
    )


def error_response(message: str, status: int, err_type: str = "BadRequestError") -> web.Response:
    return web.Response(
        status=status, body=error_body(message, status, err_type), content_type="application/json"
    )


def cache_details(cached_tokens: int | None, version: str) -> dict[str, int] | None:
    """``usage.prompt_tokens_details`` under ``--enable-cache-report`` (``cached_tokens`` given): 0.5.23
    always ``{"cached_tokens": n}`` (``UsageProcessor.calculate_response_usage``), 0.5.17 null for 0
    (``_details_if_cached``); null without the report."""
    if cached_tokens is None or (not cached_tokens and version == "0.5.17"):
        return None
    return {"cached_tokens": int(cached_tokens)}


def response_body(
    req: dict[str, Any],
    choices: list[Completion],
    prompt_tokens: int,
    prompt_ids: list[int] | None = None,
    tokenized: list[TokenCompletion] | None = None,
    calls: list[list[dict[str, Any]] | None] | None = None,
    *,
    version: str,
    model_name: str,
    cached_tokens: int | None = None,
) -> bytes:
    """SGLang's ChatCompletionResponse for ``choices`` (serving_chat's non-streaming response): the prompt
    counted once however many choices (``UsageProcessor.calculate_response_usage``), and its tokens served
    from the prefix cache as ``prompt_tokens_details`` when ``cached_tokens`` is given (the server runs with
    ``--enable-cache-report``): :func:`cache_details`."""
    out_choices = []
    reasoning_tokens = 0
    sep = bool(req.get("separate_reasoning", True))
    want_ids = bool(req.get("return_token_ids")) and prompt_ids is not None and tokenized
    want_prompt_ids = want_ids or (bool(req.get("return_prompt_token_ids")) and prompt_ids is not None)
    ids_field = completion_ids_field(version)
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
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": cache_details(cached_tokens, version),
        "reasoning_tokens": reasoning_tokens,
    }
    if reasoning_tokens:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return orjson.dumps(
        {
            "id": uuid.uuid4().hex,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.get("model") or model_name,
            "choices": out_choices,
            "usage": usage,
            "metadata": {"weight_version": "default"},
        }
    )
