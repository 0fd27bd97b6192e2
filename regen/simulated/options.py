"""What the simulated server pretends to be (``SimOptions``), and its speculative-decoding model."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import orjson

from regen.simulated.faults import Faults

SAMPLE_ID_HEADER = "X-Regen-Sample-Id"
REQUEST_LOG_ENV = "REGEN_SIM_REQUEST_LOG"
TOOL_CALL_PARSER_ENV = "REGEN_SIM_TOOL_CALL_PARSER"  # like SGLang's --tool-call-parser (qwen25, hermes)
#: JSON object of further SimOptions fields, applied after ``--options`` (a bench's per-server behaviour,
#: e.g. ``speculative_num_steps`` and the speculative memory map, which a real SGLang takes from its flags)
OPTIONS_ENV = "REGEN_SIM_OPTIONS"
#: SGLang's own benchmarking knob (speculative/spec_utils.py): the accept length it forces per verify step
SIMULATE_ACC_LEN_ENV = "SGLANG_SIMULATE_ACC_LEN"
WAIT_TIMEOUT_ENV = "SGLANG_REQUEST_STATE_WAIT_TIMEOUT"


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
    #: tokens the radix cache holds (``regen.simulated.prefixcache``); None: the KV pool's
    #: ``max_total_num_tokens``
    prefix_cache_tokens: int | None = None
    #: SGLang's ``--enable-cache-report``: usage.prompt_tokens_details.cached_tokens in every answer
    enable_cache_report: bool = False
    #: SGLang's ``--disable-radix-cache``: no prefix is matched (``ChunkCache``), ``cached_tokens`` is 0
    disable_radix_cache: bool = False
    #: SGLang's ``--page-size``: the radix cache matches and holds whole pages only
    page_size: int = 1
    version: str = "0.5.23"
    inline: bool = False  # answer inside the handler: no scheduler, queue or sleeps
    mean_reasoning_tokens: int = 96
    mean_answer_tokens: int = 48
    long_fraction: float = 0.05  # share of answers made long_factor times longer (to hit length)
    long_factor: int = 64
    log_interval_s: float = 5.0
    #: SGLang's tokenizer manager checks a non-streaming request's connection each time this long passes
    #: without an answer and aborts the request (queued or running) when the client has gone
    #: (``SGLANG_REQUEST_STATE_WAIT_TIMEOUT``, default 4: ``tokenizer_manager._wait_one_response``, 0.5.17)
    disconnect_check_s: float = 4.0
    request_log: str | None = None  # JSONL of received/completed chat requests (see module doc)
    tokenizer_path: str | None = None  # tokenizer.json + chat template: work in tokens (module doc)
    faults: Faults = field(default_factory=Faults)
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
    ``SGLANG_SIMULATE_ACC_LEN`` (a negative value, SGLang's default -1, is off) and
    ``SGLANG_REQUEST_STATE_WAIT_TIMEOUT`` (seconds, an integer as SGLang reads it)."""
    out: dict[str, Any] = orjson.loads(environ[OPTIONS_ENV]) if environ.get(OPTIONS_ENV) else {}
    raw = environ.get(SIMULATE_ACC_LEN_ENV)
    if raw and float(raw) > 0:
        out.setdefault("simulated_accept_len", float(raw))
    if environ.get(WAIT_TIMEOUT_ENV):
        out.setdefault("disconnect_check_s", float(int(environ[WAIT_TIMEOUT_ENV])))
    return out
