"""The simulated SGLang server: SGLang 0.5.23's HTTP surface, synthetic text, injectable faults.

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

Faults are drawn per request from ``hash(faults.seed, lifetime, sample id, n-th request for that id)``
(``lifetime``: random per server process), so one server's faults do not depend on request order and each
attempt draws its own: a retry on another server or after a restart does not meet the same fault again.
The sample id is the ``X-Regen-Sample-Id`` header, percent-encoded by the client (real SGLang ignores it)
or else the request's ``rid``.
``GET /_sim/stats`` returns ``{"received", "completed": {id: n}, "received_by_id", "faults"}``;
``POST /_sim/stall`` stalls the server at once (``Faults.stall_after_tokens`` and ``stall_at_s`` do it
on their own): it stays up and healthy, takes requests, and generates nothing more. ``POST
/_sim/refuse?seconds=S`` answers every chat request 503 for S seconds (a burst).

``request_log`` (``--request-log PATH``, or the ``REGEN_SIM_REQUEST_LOG`` environment variable, which
the server inherits through Snakemake and the supervisor) appends one JSON line per chat request
received, per chat request completed and per fault injected:
``{"event": "received"|"completed"|"fault:<kind>", "id", "pid", "t"}`` (kinds as in ``FAULT_KINDS``, plus
``poison``, ``crash``, ``stall``; a completed one adds ``cached``: the prompt tokens its radix cache served).
Lines are single ``O_APPEND`` writes, so several servers and server lifetimes share one file; it
lets a test count, across restarts and kills, requests re-sent for ids already finished.
"""

from __future__ import annotations

import asyncio
import os
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import orjson
from aiohttp import web

from regen.simulated.completion import Ask, Completion
from regen.simulated.options import (
    SAMPLE_ID_HEADER,
    SimOptions,
    accept_length,
    spec_log_part,
    spec_speedup,
    spec_startup_lines,
)
from regen.simulated.parsers import (
    count_prompt_tokens,
    needs_filtered_sampling,
    tool_call_pairing_error,
    version_tuple,
)
from regen.simulated.prefixcache import PrefillWindow, PrefixCache, stand_in_prompt
from regen.simulated.requestlog import LogWriter, RequestLog
from regen.simulated.responses import error_body, error_response, response_body
from regen.simulated.tokens import TokenCompletion, TokenModel, synth_completion, with_tool_calls

#: makes the server of one process: ``SimulatedServer`` itself, or a bench's subclass through the hook
#: ``regen.simulated.launcher.SERVER_HOOK_ENV``
ServerFactory = Callable[[SimOptions, LogWriter, Callable[[], None]], "SimulatedServer"]


class SimulatedServer:
    """State and handlers of one simulated server."""

    def __init__(self, opts: SimOptions, log: LogWriter, on_crash: Callable[[], None]) -> None:
        self.opts = opts
        self.log = log
        self.on_crash = on_crash
        self.started_at = time.time()
        self.refuse_until = 0.0  # POST /_sim/refuse: every chat request 503 until then
        self.lifetime = os.urandom(8).hex()  # faults are independent per attempt across servers and restarts
        self.ready_at = self.started_at + opts.startup_delay_s
        self.received = 0
        self.received_by_id: Counter[str] = Counter()
        self.completed: Counter[str] = Counter()
        self.n_completed = 0
        self.fault_counts: Counter[str] = Counter()
        self.running = 0
        self.queued = 0
        self.prompt_tokens_total = 0
        self.prefix_cache = PrefixCache(opts.prefix_cache_tokens or opts.max_total_num_tokens, opts.page_size)
        self.generation_tokens_total = 0
        self.window_tokens = 0.0  # tokens decoded since the last decode line
        self.window_prefill = PrefillWindow()  # prefills since the last ``Prefill batch`` line
        self.prefill_start = time.monotonic()
        self.window_start = time.monotonic()
        self.last_gen_throughput = 0.0
        self.slots = asyncio.Semaphore(opts.running_cap)
        self.hung: set[asyncio.Future[None]] = set()
        self.crashed = False
        self.stalled = False
        self.request_log = RequestLog(opts.request_log)
        self.tokens = TokenModel(opts.tokenizer_path) if opts.tokenizer_path else None
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
        r.add_post("/_sim/refuse", self.refuse_now)
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
        self._log_prefill()  # the last tick's prefills: the log counts every prompt token
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
            self._log_prefill()  # SGLang logs every prefill batch; here, what a tick admitted
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

    def _log_prefill(self) -> None:
        """Log the ``Prefill batch`` line of the prefills since the last one, if any."""
        if self.window_prefill.seqs:
            now = time.monotonic()
            w, self.window_prefill = self.window_prefill, PrefillWindow()
            self.prefix_cache.commit()
            self.log(w.line(now - self.prefill_start, self._token_usage(), self.running, self.queued))
            self.prefill_start = now

    def _tokens_in_use(self) -> int:
        """The KV tokens the running requests hold, at their mean length."""
        return self.running * (self.opts.mean_reasoning_tokens + self.opts.mean_answer_tokens)

    def _token_usage(self) -> float:
        """The KV pool's share the running requests hold (SGLang's ``token usage``)."""
        return self._tokens_in_use() / self.opts.max_total_num_tokens

    def _decode_line(self) -> str:
        used, usage = self._tokens_in_use(), self._token_usage()
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

    async def refuse_now(self, request: web.Request) -> web.Response:
        """A burst: every chat request is answered 503 for ``?seconds=`` (a test's run of 503s)."""
        self.refuse_until = time.monotonic() + float(request.query.get("seconds", "1"))
        return web.Response(status=200)

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
            "page_size": o.page_size,
            "disable_radix_cache": o.disable_radix_cache,
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
            "launch_command": f"python -m regen.simulated --model-path {o.model_path}",
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
                round(self._token_usage(), 2),
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
            "prefix_cache": self.prefix_cache.stats(),
        }
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        if self.crashed:
            _abort(request)
            return web.Response(status=500)
        if not self.ready:
            return error_response("The server is starting up.", 503, "ServiceUnavailableError")
        raw = await request.read()
        try:
            req = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return error_response(f"JSON decode error: {exc}", 400)
        if not isinstance(req, dict):
            return error_response("Request body must be a JSON object.", 400)
        messages = req.get("messages")
        if not isinstance(messages, list) or not messages:
            return error_response("Messages cannot be empty.", 400)
        header_id = request.headers.get(SAMPLE_ID_HEADER)
        sid = (urllib.parse.unquote(header_id) if header_id else None) or (
            req.get("rid") if isinstance(req.get("rid"), str) else None
        )
        self.received += 1
        key = sid if sid is not None else f"#{self.received}"
        self.received_by_id[key] += 1
        self.request_log("received", sid)
        max_tokens = req.get("max_completion_tokens") or req.get("max_tokens") or 128
        n = req.get("n", 1)
        refused = self._refusal(sid, messages, max_tokens, n)
        if refused is not None:
            return refused
        fault = self.opts.faults.draw(key, self.received_by_id[key], self.lifetime)
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
        more_kwargs = {k: v for k, v in ctk.items() if k != "enable_thinking"}
        prompt_ids = (
            self.tokens.prompt_ids(messages, thinking, more_kwargs) if self.tokens is not None else None
        )
        choices, tokenized, sampled_calls = self._choices(req, ask, key, sid, prompt_ids, n)
        prompt_tokens = count_prompt_tokens(messages) if prompt_ids is None else len(prompt_ids)
        cached = self._prefill(prompt_ids if prompt_ids is not None else stand_in_prompt(messages), n)
        unlogged = self.window_prefill  # this request's prefill, until a Prefill line counts it
        n_out = sum(c.completion_tokens for c in choices)
        if not self.opts.inline:
            if not await self._schedule(n_out, request):
                self.request_log("aborted", sid)  # the client went away: SGLang aborts, nothing is sent
                return web.Response(status=499)
            if self.crashed:
                _abort(request)
                return web.Response(status=500)
        body = response_body(
            req,
            choices,
            prompt_tokens,
            prompt_ids,
            tokenized,
            sampled_calls,
            version=self.opts.version,
            model_name=self.opts.model_name,
            cached_tokens=cached if self.opts.enable_cache_report else None,
        )
        self._count_completed(key, sid, prompt_tokens, n_out, cached)
        if self.window_prefill is unlogged:  # SGLang logs a batch's Prefill line before its answers go out
            self._log_prefill()
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

    def _choices(
        self,
        req: dict[str, Any],
        ask: Ask,
        key: str,
        sid: str | None,
        prompt_ids: list[int] | None,
        n: int,
    ) -> tuple[list[dict[str, Any]], list[TokenCompletion], list[list[dict[str, Any]] | None]]:
        """The request's ``n`` choices: sampled from the model's tokens where there are any, else made;
        with each choice's tokens and (sampled ones) tool calls."""
        choices: list[dict[str, Any]] = []
        tokenized: list[TokenCompletion] = []
        sampled_calls: list[list[dict[str, Any]] | None] = []  # per choice, from sampled_choice
        for i in range(n):
            sampled = self.sampled_choice(req, ask, prompt_ids, i) if prompt_ids else None
            if sampled is not None:
                done, made, choice_calls = sampled
                tokenized.append(done)
                sampled_calls.append(choice_calls)
                choices.append(made)
                continue
            made, done = self._made_choice(req, ask, key, sid, i, self.received_by_id[key] * n + i)
            if done is not None:
                tokenized.append(done)
            choices.append(made)
        return choices, tokenized, sampled_calls

    def _prefill(self, prompt: Sequence[Hashable], n: int) -> int:
        """Prefill ``prompt`` for ``n`` choices: the tokens its radix cache served, into the next line."""
        page = None if self.opts.disable_radix_cache else self.opts.page_size  # None: ChunkCache, no match
        cached = 0 if page is None else self.prefix_cache.serve(prompt)
        self.window_prefill.add(len(prompt), cached, n, page)
        return cached

    def _count_completed(self, key: str, sid: str | None, n_in: int, n_out: int, cached: int) -> None:
        """Count a request answered (its tokens in and out), and stall when the faults say so."""
        self.prompt_tokens_total += n_in
        self.generation_tokens_total += n_out
        if self.opts.token_rate <= 0:
            self.window_tokens += n_out
        self.completed[key] += 1
        self.n_completed += 1
        self.request_log("completed", sid, cached=cached)
        stall_after = self.opts.faults.stall_after_tokens
        if stall_after is not None and self.generation_tokens_total >= stall_after:
            self.stall(f"stall_after_tokens={stall_after}")

    def _refusal(self, sid: str | None, messages: list[Any], max_tokens: Any, n: Any) -> web.Response | None:
        """The error SGLang (or a simulated fault) answers a request with before sampling, if any."""
        if self.opts.faults.is_bad_request(sid):
            return error_response(f"Invalid request for sample {sid}: rejected by the simulator.", 400)
        pairing = (
            tool_call_pairing_error(messages) if version_tuple(self.opts.version) >= (0, 5, 23) else None
        )
        if pairing is not None:
            return error_response(pairing, 400)
        if not isinstance(max_tokens, int) or max_tokens < 1 or not isinstance(n, int) or n < 1:
            return error_response("max_tokens and n must be positive integers.", 400)
        if time.monotonic() < self.refuse_until:
            self.fault_counts["refused"] += 1
            return error_response("Service unavailable (simulated burst).", 503, "ServiceUnavailableError")
        if self.opts.faults.is_poison(sid):
            self.fault_counts["error"] += 1
            self.request_log("fault:poison", sid)
            return error_response(
                "Internal server error (simulated poison sample).", 500, "InternalServerError"
            )
        return None

    def _made_choice(
        self, req: dict[str, Any], ask: Ask, key: str, sid: str | None, index: int, nth: int
    ) -> tuple[Completion, TokenCompletion | None]:
        """Choice ``index`` made up from the answer model (no sampled token ids): spoiled or given scripted
        tool calls as the faults say, and tokenized when the server has a tokenizer; ``nth``: the choice's
        number over every request of ``key``."""
        made = self.make_completion(ask, index, key)
        made, spoiled = self.opts.faults.spoil(made, key, nth)
        calls = self.opts.faults.scripted_tool_calls(sid, ask.messages) if req.get("tools") else []
        if calls and made.finish_reason == "stop":
            made = with_tool_calls(made, calls)
        if spoiled is not None:
            self.fault_counts[spoiled] += 1
            self.request_log(f"fault:{spoiled}", sid)
        if self.tokens is None:
            return made, None
        noncanonical = self.opts.faults.is_noncanonical(key, nth)
        if noncanonical:
            self.fault_counts["noncanonical"] += 1
        done = self.tokens.complete(made, ask.thinking, ask.max_tokens, ask.ignore_eos, noncanonical)
        return done.completion, done

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

    def sampled_choice(
        self, req: dict[str, Any], ask: Ask, prompt_ids: list[int], index: int
    ) -> tuple[TokenCompletion, Completion, list[dict[str, Any]] | None] | None:
        """A hook for a server that samples a choice's ids itself (a known target's chain: bench code):
        (its tokens, the parsed completion, its parsed tool calls); None: the synthetic completion."""
        return None

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

    async def _schedule(self, n_tokens: int, request: web.Request | None = None) -> bool:
        """Queue for a slot, then decode ``n_tokens``; False when ``request``'s client went away first. As
        SGLang's tokenizer manager does, the connection is checked every ``disconnect_check_s`` without an
        answer, and a request whose client has gone is aborted, queued or running, freeing its slot (a
        stalled scheduler frees nothing: the request hangs with it)."""
        check = self.opts.disconnect_check_s
        self.queued += 1
        try:
            while True:
                try:
                    await asyncio.wait_for(self.slots.acquire(), check)
                    break
                except TimeoutError:
                    if _gone(request):
                        return False
        finally:
            self.queued -= 1
        self.running += 1
        try:
            await self._hold_if_stalled()
            left = n_tokens / self.per_request_rate() if self.opts.token_rate > 0 else 0.0
            while left > 0:
                await asyncio.sleep(min(left, check))
                left -= check
                if left > 0 and _gone(request):
                    return False
            await self._hold_if_stalled()
        finally:
            self.running -= 1
            self.slots.release()
        return True

    async def _fault(self, request: web.Request, kind: str) -> web.StreamResponse:
        if kind == "error":
            if self.received % 2:
                return error_response("Internal server error (simulated).", 500, "InternalServerError")
            return error_response("Service unavailable (simulated).", 503, "ServiceUnavailableError")
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


def _gone(request: web.Request | None) -> bool:
    """Whether the client closed ``request``'s connection (aiohttp drops the transport on connection_lost)."""
    return request is not None and request.transport is None


def _abort(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()
