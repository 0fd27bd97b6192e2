"""The running-cap search behind every recommendation and candidate: what is planned for
(:class:`Target`), the memory and quality choices a candidate keeps (:class:`Choice`), and the two
sizing rules: the worst case for linear-attention hybrids (their state pool sets the cap:
:func:`best_running`), the expected context for attention-only models (:func:`expected_length_running`).

Every memory number comes from :func:`regen.sglang.plan.plan`; SGLang's admission and retraction, which
the expected-length rule leans on, are ``managers/schedule_policy.py::PrefillAdder`` (free KV less the
running requests' ``max_new_tokens x new_token_ratio``; ``SGLANG_INIT_NEW_TOKEN_RATIO`` 0.7 decaying to
0.14 of it) and ``managers/scheduler.py::Scheduler.update_running_batch`` ->
``ScheduleBatch.retract_decode`` (0.5.17 and 0.5.23).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from regen.sglang.cache_report import CACHE_REPORT_FLAG
from regen.sglang.flags import ServerFlags, cuda_graph_max_bs_flag, flag_names, parse_flags, strip_flags
from regen.sglang.kv_cache_configurator import mamba_slots_per_request
from regen.sglang.models import ModelShape
from regen.sglang.plan import (
    DEFAULT_DECODE_GRAPH_LIMIT_NOTE,
    MemoryPlan,
    PlanError,
    Workload,
    plan,
)
from regen.sglang.pools import has_state, kv_pool
from regen.sglang.pools.base import text_config
from regen.sglang.pools.swa import (
    swa_cap_per_request,
    swa_decode_per_request,
    swa_eviction_span,
    swa_eviction_why,
    swa_steady_tokens,
)
from regen.sglang.workload import page_waste

T = TypeVar("T")

#: the largest decode CUDA-graph batch the planner asks SGLang to capture, and the largest batch it plans:
#: above the captured range SGLang decodes eagerly, and eager decode loses what the batch gains. Measured
#: on the H200 (SGLang 0.5.17, issue 49): gpt-oss-20b decoded 15-21K tok/s at 2,130 running eager, the
#: same as its defaults' 19.7-21.3K at 256 in graphs, and 5.1K at ~1,500 eager once its sliding-window pool
#: filled (measurements/families-2026-12-04.md). SGLang's own largest default is 512 (B200, or tp >= 4:
#: ``handle_gpu_memory_settings``); each captured size costs capture time and graph memory
MAX_PLANNED_DECODE_GRAPH_BS = 1024
#: why the planned batch stops at the decode graphs (the plan's ``rules``)
EAGER_DECODE_REASON = (
    "in flight bounded to {graphs:,}, the decode CUDA graphs regen captures ({flag}), though the KV holds "
    "{fill:,}: above the graphs SGLang decodes eagerly, and on the H200 gpt-oss-20b decoded no faster eager "
    "at 2,130 running than in graphs at 256 (measurements/families-2026-12-04.md)"
)

#: why the tuner turns the radix (prefix) cache off for an attention-only model (issue 34 item 14)
RADIX_OFF_DENSE_REASON = (
    "--disable-radix-cache: the workload's prompts are unique (Workload.unique_prompts), so the prefix tree "
    "would only keep finished requests' KV that no later request reuses; off, SGLang frees it at once and "
    "skips the tree's match, insert and evict work per request (a prefix shared by every prompt, such as "
    "a long system prompt, is then prefilled again for each request)"
)

#: the user gave ``--disable-radix-cache`` though the prompts share prefixes: kept, and what it costs
RADIX_OFF_GIVEN_REASON = (
    "--disable-radix-cache (given, kept): the prompts share prefixes ({why}), so each request prefills its "
    "prompt in full; without the flag the plan keeps the radix cache and SGLang prefills a shared prefix once"
)


def radix_off_reason(target: Target, unique: str) -> str:
    """Why the radix cache is off: ``unique`` (the planner's reason) where the prompts are unique, else the
    user's flag, kept, and what it costs."""
    if target.workload.unique_prompts:
        return unique
    return RADIX_OFF_GIVEN_REASON.format(why="; ".join(target.workload.shared_prefixes))


#: why the tuner keeps the radix cache on (issue 57 item 4), with the memory it plans for it
RADIX_KEPT_REASON = (
    "radix (prefix) cache kept on: {why}. Its memory: {state}the tree keeps a finished request's KV only "
    "while the pool has room, and SGLang's admission counts that KV as free (PrefillAdder.rem_total_tokens "
    "includes the tree's evictable size; the least recently used is evicted first), so the KV cache and "
    "the client are planned as without it, a shared prefix counted once per request (errs long: fewer in "
    "flight); {report} puts SGLang's cached_tokens, the prompt tokens read from the cache, in each answer's "
    "usage"
)
#: the state part of :data:`RADIX_KEPT_REASON` for a linear-attention hybrid
RADIX_KEPT_STATE = (
    "the state pool holds the slots per running request planned above (the tree keeps a state per cached "
    "prefix; unique prompts would need one), "
)


def radix_kept_reason(target: Target) -> str:
    """The plan's rule for a kept radix cache: why the prompts share prefixes, and its memory."""
    why = "; ".join(target.workload.shared_prefixes) or "the prompts are not known to be unique"
    state = RADIX_KEPT_STATE if has_state(target.model) else ""
    return RADIX_KEPT_REASON.format(why=why, state=state, report=CACHE_REPORT_FLAG)


def cache_report(target: Target, choice: Choice) -> list[str]:
    """``--enable-cache-report`` where the radix cache stays on and the given flags lack it."""
    return [] if choice.disable_radix or CACHE_REPORT_FLAG in target.base else [CACHE_REPORT_FLAG]


#: the KV page the tuner asks for on a plain multi-head-attention model (:func:`planned_page_size`)
PLANNED_PAGE_SIZE = 64
#: why, with what it measured: SGLang's own page on SM100 (trtllm_mha), against 1 on Hopper's fa3
PAGE_SIZE_REASON = (
    "--page-size {page}: the KV cache in pages of {page} tokens instead of SGLang's 1 on Hopper "
    "(arg_groups/overrides.py::_page_size_default; SGLang takes 64 itself with its trtllm_mha decode on "
    "SM100): fa3's decode reads whole pages instead of gathering token by token; measured on the H200 "
    "(SGLang 0.5.17, Llama-3.1-8B, measurements/dense-2026-12-02-pages.md) 14,300 tok/s at 671 running "
    "against 13,763 at 687 with page 1; each request holds on average {waste} more tokens (its last page "
    "half full), counted in the fill"
)


#: given flags that decide the page or the kernel reading it: the user's choice stands
_PAGE_DECIDING_FLAGS = frozenset(
    {
        "--page-size",
        "--attention-backend",
        "--decode-attention-backend",
        "--prefill-attention-backend",
        "--speculative-algorithm",
    }
)


def sliding_window_config(model: ModelShape) -> bool:
    """A sliding window in the config (``sliding_window`` set and not switched off, or sliding layers):
    fa3's sliding-window paths assume page 1 (``FlashAttentionBackend``: "Prefill-aware SWA requires
    page_size=1")."""
    cfg = text_config(model)
    types = cfg.get("layer_types")
    if isinstance(types, list) and "sliding_attention" in types:
        return True
    return cfg.get("sliding_window") is not None and cfg.get("use_sliding_window", True) is not False


def planned_page_size(target: Target) -> list[str]:
    """``--page-size`` :data:`PLANNED_PAGE_SIZE` for a plain multi-head-attention model (dense or MoE: the
    MHA pool, no linear-attention state, no sliding window, no MLA) when the given flags leave the page
    and the attention backend to SGLang; nothing otherwise (SGLang's own page)."""
    model = target.model
    if set(flag_names(target.base)) & _PAGE_DECIDING_FLAGS:
        return []
    if has_state(model) or sliding_window_config(model) or kv_pool(model, target.version).name != "mha":
        return []
    return ["--page-size", str(PLANNED_PAGE_SIZE)]


@dataclass(frozen=True, slots=True)
class Target:
    """What every candidate is planned for: the model on its GPUs, the flags kept from the given ones
    (``base``, the planner's own flags stripped), the workload and the SGLang version."""

    model: ModelShape
    gpu_mib: int
    tp: int
    base: tuple[str, ...]
    workload: Workload
    version: str

    def plan(self, args: list[str], workload: Workload | None = None) -> MemoryPlan:
        return plan(self.model, self.gpu_mib, self.tp, args, workload, self.version)

    def with_base(self, base: list[str]) -> Target:
        return replace(self, base=tuple(base))

    def with_workload(self, workload: Workload) -> Target:
        return replace(self, workload=workload)


@dataclass(frozen=True, slots=True)
class Choice:
    """The memory and quality choices a candidate keeps: radix cache off, SSM state dtype, KV dtype and
    memory fraction (None: SGLang's own)."""

    disable_radix: bool
    state_dtype: str | None
    kv_dtype: str
    mfs: float | None

    @classmethod
    def of(cls, flags: ServerFlags) -> Choice:
        """The choices ``flags`` (a chosen candidate's) made."""
        return cls(
            flags.disable_radix_cache, flags.mamba_ssm_dtype, flags.kv_cache_dtype, flags.mem_fraction_static
        )

    def reasons(self) -> list[str]:
        out = []
        if self.state_dtype == "bfloat16":
            out.append("--mamba-ssm-dtype bfloat16 (opted in): halves the SSM state; a quality trade-off")
        if self.kv_dtype != "auto":
            out.append(
                f"--kv-cache-dtype {self.kv_dtype} (opted in): halves the KV cell; a quality trade-off"
            )
        if self.mfs is not None:
            out.append(f"--mem-fraction-static {self.mfs:g}: less runtime slack, more pool memory")
        return out


@dataclass(frozen=True, slots=True)
class Candidate:
    args: tuple[str, ...]
    plan: MemoryPlan
    score: int
    reasons: tuple[str, ...]


def highest(lo: int, hi: int, attempt: Callable[[int], T | None]) -> tuple[int, T] | None:
    """The highest n in [lo, hi] that ``attempt`` accepts, with what it returned (bisection: ``attempt``
    must accept every n below one it accepts); None when it accepts none."""
    best = None
    while lo <= hi:
        mid = (lo + hi) // 2
        found = attempt(mid)
        if found is not None:
            best, lo = (mid, found), mid + 1
        else:
            hi = mid - 1
    return best


def tradeoffs(args: tuple[str, ...]) -> int:
    return sum(1 for a in args if a in ("bfloat16", "fp8_e4m3"))


def _candidate_args(target: Target, choice: Choice, running: int, slots: int) -> list[str]:
    out = list(target.base)
    if choice.mfs is not None:
        out += ["--mem-fraction-static", f"{choice.mfs:g}"]
    out += ["--max-running-requests", str(running)]
    if has_state(target.model):
        if choice.disable_radix:
            out.append("--disable-radix-cache")
        else:
            out += ["--max-mamba-cache-size", str(running * slots)]
        if choice.state_dtype is not None:
            out += ["--mamba-ssm-dtype", choice.state_dtype]
    elif choice.disable_radix:
        out.append("--disable-radix-cache")
    if choice.kv_dtype != "auto":
        out += ["--kv-cache-dtype", choice.kv_dtype]
    out += cache_report(target, choice)
    if running > DEFAULT_DECODE_GRAPH_LIMIT_NOTE:
        out += [cuda_graph_max_bs_flag(target.version), str(running)]
    return out


def best_running(target: Target, choice: Choice, most: int) -> Candidate | None:
    """The highest running cap (at most ``most``) whose KV cache holds every running request at the worst
    case (prompt p99 + max_tokens), with the state pool sized for it (linear-attention hybrids)."""
    model, workload = target.model, target.workload
    radix = ["--disable-radix-cache"] if choice.disable_radix else []
    slots = target.plan([*target.base, *radix]).mamba_slots_per_request or 1

    def attempt(n: int) -> MemoryPlan | None:
        try:
            p = target.plan(_candidate_args(target, choice, n, slots), workload)
        except PlanError:
            return None
        holds = p.kv_cache_tokens >= n * workload.tokens_per_request
        return p if holds and p.effective_max_running_requests >= n and p.decode_step_fits else None

    best = highest(1, max(1, most), attempt)
    if best is None:
        return None
    n, p = best
    reasons = [
        f"--max-running-requests {n}: the KV cache holds {p.kv_cache_tokens:,} tokens = {n} x "
        f"(prompt p99 {workload.prompt_p99} + max_tokens {workload.max_tokens}) with "
        f"{p.kv_cache_tokens - n * workload.tokens_per_request:,} tokens to spare",
    ]
    if has_state(model) and choice.disable_radix:
        unique = (
            "--disable-radix-cache: prompts are unique, so prefix caching saves nothing and each request "
            f"needs 1 state slot instead of {probe_slots(target)}; the state pool is sized to "
            "--max-running-requests, leaving the rest to KV"
        )
        reasons.append(radix_off_reason(target, unique))
    elif has_state(model):
        reasons.append(f"--max-mamba-cache-size {n * slots}: {slots} state slots per running request")
    elif choice.disable_radix:
        reasons.append(radix_off_reason(target, RADIX_OFF_DENSE_REASON))
    if not choice.disable_radix:
        reasons.append(radix_kept_reason(target))
    reasons += choice.reasons()
    if n > DEFAULT_DECODE_GRAPH_LIMIT_NOTE:
        reasons.append(
            f"{cuda_graph_max_bs_flag(target.version)} {n}: SGLang captures decode graphs only to 256 by "
            "default; above that it decodes eagerly"
        )
    score = min(n, workload.target_concurrency or n)
    return Candidate(args=tuple(p.args), plan=p, score=score, reasons=tuple(reasons))


def swa_need(target: Target, p: MemoryPlan, running: int) -> int | None:
    """SWA tokens ``running`` requests of the workload hold at the top of SGLang's eviction saw
    (:func:`regen.sglang.pools.swa.swa_steady_tokens`); None without a sliding-window pool."""
    if p.swa_tokens is None:
        return None
    flags = parse_flags(list(p.args))
    return swa_steady_tokens(
        target.model,
        running=running,
        prompt_tokens=target.workload.prompt_p99,
        expected_output=target.workload.expected_output,
        page_size=flags.page_size,
        chunked_prefill_size=p.chunked_prefill_size,
        overlap_schedule=not flags.disable_overlap_schedule,
        version=target.version,
    )


def swa_holds(target: Target, p: MemoryPlan, running: int) -> bool:
    need = swa_need(target, p, running)
    return need is None or p.swa_tokens is None or need <= p.swa_tokens


def swa_running_bound(target: Target, p: MemoryPlan, most: int) -> int:
    """The most requests (at most ``most``) whose steady decode the plan's SWA pool holds."""
    found = highest(1, most, lambda n: n if swa_holds(target, p, n) else None)
    return found[0] if found is not None else 0


def swa_reason(target: Target, p: MemoryPlan, running: int) -> str:
    need = swa_need(target, p, running)
    per = swa_decode_per_request(target.model, parse_flags(list(p.args)).page_size, target.version)
    span = swa_eviction_span(target.version)
    why = swa_eviction_why(target.version)
    return (
        f"SWA pool {p.swa_tokens:,} tokens >= {need:,} that {running:,} running requests hold before an "
        f"eviction: {per} each (window + {span} decode steps between two evictions + page + the next "
        f"step's page: {why}), plus prompt p99 - window for each request admitted within those {span} steps "
        "(it holds its whole prompt until its first eviction, "
        f"{target.workload.expected_output:,}-token answers: running x {span} / that), plus "
        "the prefill chunks in flight; SGLang's admission checks only the SWA free now and its decode "
        "check retracts when the pool is short (a retraction storm, issue 49)"
    )


def swa_cap_for(target: Target, p: MemoryPlan, running: int) -> int:
    """The smallest request cap whose SGLang-sized SWA pool (``compute_swa_request_cap``: per request x
    cap + the prefill chunks in flight + a page) holds ``running`` requests' steady decode
    (:func:`swa_need`): above ``running`` by the prompts of the requests admitted between two evictions
    (``--swa-full-tokens-ratio`` does not apply: with a cap given and the radix cache off both 0.5.17's
    ``SWAChunkCapPoolConfigurator`` and 0.5.23's ``SWARequestCapPoolConfigurator`` size the SWA pool from
    the cap alone; the cap is the planner's lever on the split)."""
    flags = parse_flags(list(p.args))
    need = swa_need(target, p, running) or 0
    per = swa_cap_per_request(target.model, flags.page_size)
    fixed = (1 if flags.disable_overlap_schedule else 2) * p.chunked_prefill_size + flags.page_size
    return max(running, -(-(need - fixed) // per))


def with_swa_steady(target: Target, candidate: Candidate) -> Candidate:
    """``candidate`` with a running cap whose SWA pool holds its client's steady decode and the SWA need
    recorded in the plan (its ``rules``); unchanged without a sliding-window pool.

    A request-capped SWA pool (radix cache off, a cap given) grows with the cap: the client is the most
    requests (at most what the full KV holds at the expected context) for which a cap sized for their
    SWA need still fits a decode step and leaves the KV for them. A ratio-split pool bounds the client."""
    p = candidate.plan
    if p.swa_tokens is None:
        return candidate
    client = p.client_concurrency or p.effective_max_running_requests
    flags = parse_flags(list(candidate.args))
    capped = "CapPoolConfigurator" in p.kv_pool_rule and flags.max_running_requests is not None
    per_request = target.workload.paged_tokens_per_request(flags.page_size)
    bare = strip_flags(list(candidate.args), {"--max-running-requests"})

    def attempt(n: int) -> MemoryPlan | None:
        cap = max(p.effective_max_running_requests, swa_cap_for(target, p, n))
        try:
            q = target.plan([*bare, "--max-running-requests", str(cap)], target.workload)
        except PlanError:
            return None
        kv_ok = n <= client or q.kv_cache_tokens >= n * per_request
        fits = q.decode_step_fits and q.effective_max_running_requests >= n
        return q if kv_ok and fits and swa_holds(target, q, n) else None

    reasons = list(candidate.reasons)
    most = max(client, min(p.kv_cache_tokens // per_request, MAX_PLANNED_DECODE_GRAPH_BS))
    found = highest(1, most, attempt) if capped else None
    if found is not None:
        n, q = found
        if n != client or q.effective_max_running_requests != p.effective_max_running_requests:
            reasons.append(
                f"client in flight {n:,} (was {client:,}), --max-running-requests "
                f"{q.effective_max_running_requests:,} (was {p.effective_max_running_requests:,}): the "
                f"request-capped SWA pool ({q.kv_pool_rule}) is sized from the cap, so the cap is raised "
                f"above the client until the pool ({q.swa_tokens:,} tokens) holds the client's steady "
                f"decode; the full KV still holds {n:,} x {per_request:,} ({q.kv_cache_tokens:,} tokens) and "
                "a decode step at the cap fits"
            )
        client, p = n, replace(q, client_rule=p.client_rule)
    elif not swa_holds(target, p, client):
        bound = swa_running_bound(target, p, client)
        reasons.append(
            f"client in flight {bound:,} (was {client:,}): the most whose steady decode the SWA pool "
            f"({p.swa_tokens:,} tokens, {p.kv_pool_rule}) holds"
        )
        client = bound
    p = replace(
        p,
        client_concurrency=client,
        swa_steady_tokens=swa_need(target, p, client),
        swa_rule=swa_reason(target, p, client),
    )
    return Candidate(tuple(p.args), p, client, tuple(reasons))


def _running_cap_reason(p: MemoryPlan, client: int, default_cap: int, swa_capped: bool) -> str:
    """Why the plan's ``--max-running-requests`` is what it is (``expected_length_running``)."""
    room, cap = p.decode_headroom, p.effective_max_running_requests
    if room is not None and room.fitting_batch == cap < default_cap:
        return (
            f"--max-running-requests {cap:,}: the largest batch whose decode step fits in the "
            f"{room.free_after_capture_gib:.2f} GiB CUDA-graph capture leaves "
            f"({room.transient_gib:.2f} GiB at it: fp32 logits and sampling buffers over the vocab, eager "
            "activations above the decode graphs; regen.sglang.headroom); a larger batch would run out of "
            "memory mid-step"
        )
    elif swa_capped:
        return (
            f"--max-running-requests {max(client, default_cap):,}: SGLang's default cap or more, given so "
            f"that SGLang sizes the sliding-window pool for it ({p.swa_tokens:,} tokens, {p.kv_pool_rule}) "
            "and gives the rest to full attention, instead of swa_full_tokens_ratio of it"
        )
    elif client > default_cap:
        return (
            f"--max-running-requests {client:,}: above SGLang's default cap {default_cap:,} "
            "(KVCacheConfigurator.resolve_max_num_reqs)"
        )
    else:
        return (
            f"--max-running-requests left to SGLang (its default cap {default_cap:,}, "
            "KVCacheConfigurator.resolve_max_num_reqs): the client's in-flight count bounds the batch"
        )


def expected_length_running(target: Target, choice: Choice) -> Candidate | None:
    """Attention-only models (dense, MoE, MLA): the batch that fills the KV cache at the *expected* context
    (:attr:`Workload.expected_tokens_per_request`: the running set's length-biased mean when the answers'
    spread is known, else prompt p50 + expected answer), with decode graphs captured up to it, relying on
    SGLang's own admission and retraction for the requests that run long; never below SGLang's defaults
    (its running cap, ``KVCacheConfigurator.resolve_max_num_reqs``, and its decode-graph range)."""
    workload, version = target.workload, target.version
    own = [*(["--mem-fraction-static", f"{choice.mfs:g}"] if choice.mfs is not None else [])]
    own += ["--disable-radix-cache"] if choice.disable_radix else []
    own += ["--kv-cache-dtype", choice.kv_dtype] if choice.kv_dtype != "auto" else []
    own += cache_report(target, choice)
    own += planned_page_size(target)
    try:
        default = target.plan([*target.base, *own], workload)
    except PlanError:
        return None
    default_cap, default_graphs = default.effective_max_running_requests, default.cuda_graph_max_bs
    page = parse_flags([*target.base, *own]).page_size
    per_request = workload.paged_tokens_per_request(page, radix_cache=not choice.disable_radix)
    # a sliding-window model with the radix cache off: a cap given selects SGLang's request-capped SWA pool
    # (SWAChunkCapPoolConfigurator / SWARequestCapPoolConfigurator) instead of the ratio split
    swa_capped = choice.disable_radix and default.swa_tokens is not None

    def args_for(n: int) -> list[str]:
        out = [*target.base, *own]
        if n > default_graphs:
            out += [cuda_graph_max_bs_flag(version), str(min(n, MAX_PLANNED_DECODE_GRAPH_BS))]
        least = swa_cap_for(target, default, n) if swa_capped else n
        cap = max(least, default_cap) if n > default_cap or swa_capped else None
        room = target.plan([*out, *(["--max-running-requests", str(cap)] if cap else [])]).decode_headroom
        if room is not None and n <= room.fitting_batch < room.batch:
            cap = room.fitting_batch  # every batch the cap allows must fit beside the graphs
            if swa_capped and cap < least:
                # the fitting batch found at the larger cap is conservative (a smaller cap leaves more
                # memory: SGLang's req_to_token table is cap x context_len); the SWA pool needs ``least``
                at_least = target.plan([*out, "--max-running-requests", str(least)]).decode_headroom
                cap = least if at_least is None or at_least.fits else cap
        return [*out, *(["--max-running-requests", str(cap)] if cap else [])]

    def attempt(n: int) -> MemoryPlan | None:
        try:
            p = target.plan(args_for(n), workload)
        except PlanError:
            return None
        holds = p.kv_cache_tokens >= n * per_request and swa_holds(target, p, n)
        return p if holds and p.effective_max_running_requests >= n and p.decode_step_fits else None

    most = attempt(1)  # the fewest graphs: the most KV, so no larger batch can fit
    kv_most = most.kv_cache_tokens // per_request if most is not None else 0
    found = highest(1, min(kv_most, MAX_PLANNED_DECODE_GRAPH_BS), attempt) if most is not None else None
    fill = found[0] if found is not None else 0
    client = min(max(fill, default_graphs), default_cap) if fill <= default_cap else fill
    p = target.plan(args_for(client), workload)
    client = min(client, p.effective_max_running_requests)  # the cap bounded to what a step fits
    p = replace(p, client_concurrency=client)
    kv_fill = p.kv_cache_tokens // per_request
    held = f"room for {kv_fill:,}; the decode step's memory bounds it, below" if kv_fill > fill else ""
    reasons = [
        f"client in flight {client:,} (client_concurrency): the KV cache holds {p.kv_cache_tokens:,} tokens "
        f"= {fill:,} x {per_request:,}{f' ({held})' if held else ''}: {workload.running_context_words()}"
        f"{workload.shared_pages_words(page, radix_cache=not choice.disable_radix)}; "
        "the expected context, not the "
        "worst case: SGLang admits by free KV less the running requests' expected growth "
        "(schedule_policy.PrefillAdder, new_token_ratio) and retracts when decode runs out "
        "(Scheduler.update_running_batch -> ScheduleBatch.retract_decode)",
    ]
    if kv_most > MAX_PLANNED_DECODE_GRAPH_BS and fill == MAX_PLANNED_DECODE_GRAPH_BS:
        reasons.append(
            EAGER_DECODE_REASON.format(graphs=fill, flag=cuda_graph_max_bs_flag(version), fill=kv_most)
        )
    if fill < default_graphs:
        reasons.append(
            f"in flight raised from {fill:,} to SGLang's decode-graph default {default_graphs}: never below "
            "what SGLang's defaults run; its admission and retraction hold the rest, as with its defaults"
        )
    reasons.append(_running_cap_reason(p, client, default_cap, swa_capped))
    if client > default_graphs:
        reasons.append(
            f"{cuda_graph_max_bs_flag(version)} {min(client, MAX_PLANNED_DECODE_GRAPH_BS)}: decode graphs up "
            f"to the planned batch; SGLang captures only to {default_graphs} by default "
            "(handle_gpu_memory_settings) and decodes larger batches eagerly"
        )
    radix = radix_off_reason(target, RADIX_OFF_DENSE_REASON) if choice.disable_radix else None
    reasons.append(radix or radix_kept_reason(target))
    if "--page-size" in own:
        reasons.append(PAGE_SIZE_REASON.format(page=page, waste=page_waste(page)))
    reasons += choice.reasons()
    return Candidate(args=tuple(p.args), plan=p, score=client, reasons=tuple(reasons))


def probe_slots(target: Target) -> int:
    """State slots per request under the kept flags (radix cache as they have it)."""
    slots, _ = mamba_slots_per_request(target.model, parse_flags(list(target.base)), target.version)
    return slots


def within_headroom(target: Target, candidate: Candidate) -> Candidate:
    """``candidate`` with its running cap at the largest batch whose decode step fits in what CUDA-graph
    capture leaves (:mod:`regen.sglang.headroom`), where SGLang's own cap (no ``--max-running-requests``)
    would be larger: lowered where a step at the cap does not fit, raised back towards SGLang's cap where
    a later flag (smaller prefill graphs) freed memory and the KV does not shrink for it; the client
    in-flight count at most the cap."""
    room, old = candidate.plan.decode_headroom, candidate.plan
    if room is None or room.fitting_batch < 1 or not parse_flags(list(candidate.args)).max_running_requests:
        return candidate
    bare = strip_flags(list(candidate.args), {"--max-running-requests"})
    try:
        sglang_cap = target.plan(bare, target.workload).effective_max_running_requests
    except PlanError:
        return candidate
    client = old.client_concurrency or old.effective_max_running_requests
    cap = max(min(sglang_cap, room.fitting_batch), client if room.fits else 1)
    if room.fits and (
        cap <= old.effective_max_running_requests or old.effective_max_running_requests >= sglang_cap
    ):
        return candidate  # fits, and no memory freed below SGLang's cap to give back
    try:
        p = target.plan([*bare, "--max-running-requests", str(cap)], target.workload)
    except PlanError:
        return candidate
    if not p.decode_step_fits or p.effective_max_running_requests == old.effective_max_running_requests:
        return candidate
    if room.fits and p.kv_cache_tokens < old.kv_cache_tokens:
        return candidate  # a larger cap would take KV (a request-capped sliding-window pool grows with it)
    client = min(client, p.effective_max_running_requests)
    p = replace(p, client_concurrency=client, client_rule=old.client_rule)
    after = p.decode_headroom
    free = after.free_after_capture_gib if after is not None else room.free_after_capture_gib
    why = (
        f"--max-running-requests {cap:,}: the largest batch whose decode step fits in the {free:.2f} GiB "
        f"CUDA-graph capture leaves; a step at SGLang's own cap {sglang_cap:,} would not (fp32 logits and "
        "sampling buffers over the vocab, eager activations above the decode graphs: regen.sglang.headroom)"
    )
    return Candidate(tuple(p.args), p, min(candidate.score, client), (*candidate.reasons, why))
