"""What ``regen tune --sweep`` measures beside the recommendation: the scheduler candidates of
linear-attention hybrids (the cap sized for the expected answer, refills batched, ReplaySSM decode) and
MTP on or off. Each keeps the recommendation's :class:`~regen.sglang.search.Choice` and re-solves the
running cap with :func:`regen.sglang.search.best_running` for its own memory. Also what the recommendation
and the refill-batched candidates add to the search's flags: refills prefilled together
(:func:`with_batched_refills`) and prefill CUDA graphs only up to those refills
(:func:`with_refill_prefill_graphs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from regen.sglang.flags import ServerFlags, flag_names, parse_flags, strip_flags
from regen.sglang.graphs import prefill_graph_batch_sizes, sglang_prefill_graph_limit
from regen.sglang.kv_cache_configurator import mamba_slots_per_request
from regen.sglang.models import ModelShape
from regen.sglang.plan import (
    CUDA_CONTEXT_GIB,
    PlanError,
    Workload,
)
from regen.sglang.pools import has_state, is_mla
from regen.sglang.search import Candidate, Choice, Target, best_running, highest

#: the cap the alternatives search up to (SGLang's own ceiling of resolve_max_num_reqs' estimate)
MOST_RUNNING = 4096
#: SGLang admits new requests one scheduler pass at a time: at a full running cap with outputs of spread
#: lengths, about one request frees per decode step and each is prefilled in a forward pass of its own.
#: ``--min-free-slots-delay N`` (SGLang caps N at 4) waits for N free slots and prefills them together.
MIN_FREE_SLOTS_DELAY = 4
#: SGLang turns the delay off below this running cap (``min_free_slots_delayer.resolve_min_free_slots``)
MIN_FREE_SLOTS_DELAY_FROM_CAP = 8
_DELAY_FLAG = "--min-free-slots-delay"


def with_batched_refills(candidate: Candidate) -> Candidate:
    """``candidate`` with its refills prefilled :data:`MIN_FREE_SLOTS_DELAY` at a time, where SGLang applies
    the delay (a running cap of :data:`MIN_FREE_SLOTS_DELAY_FROM_CAP` or more) and the flags do not set it.
    Measured on the H200 (27B hybrid, SGLang 0.5.17, ``measurements/sweep-2026-11-30.md``): 5,278 tok/s
    with it against 4,890 without at 608 running; one single-request prefill between decode steps cost
    64 ms at 265 running (``known-target-2026-12-02-n800.md``), about 12 of them every 40 decode steps."""
    cap = candidate.plan.effective_max_running_requests
    if cap < MIN_FREE_SLOTS_DELAY_FROM_CAP or _DELAY_FLAG in flag_names(candidate.args):
        return candidate
    return replace(
        candidate,
        args=(*candidate.args, _DELAY_FLAG, str(MIN_FREE_SLOTS_DELAY)),
        reasons=(
            *candidate.reasons,
            f"{_DELAY_FLAG} {MIN_FREE_SLOTS_DELAY}: freed slots are prefilled {MIN_FREE_SLOTS_DELAY} at a "
            "time instead of one forward pass each (min_free_slots_delayer.MinFreeSlotsDelayer)",
        ),
    )


#: the fewest prefill-graph tokens the tuner asks SGLang to capture (SGLang's own smaller default for an
#: architecture: ``--cuda-graph-max-bs-prefill 512``, 0.5.23 ``cuda_graph_hook``, MuseGlimmer)
MIN_PREFILL_GRAPH_TOKENS = 512
_PREFILL_GRAPH_FLAG = "--cuda-graph-max-bs-prefill"
#: the given flags that size the prefill graphs themselves (0.5.23 and 0.5.17; the ``piecewise`` spellings
#: are 0.5.17's deprecated aliases of the first two; a ``--cuda-graph-config`` JSON wins over both): the
#: user's choice stands
_PREFILL_GRAPH_SIZE_FLAGS = frozenset(
    {
        _PREFILL_GRAPH_FLAG,
        "--cuda-graph-bs-prefill",
        "--piecewise-cuda-graph-max-tokens",
        "--piecewise-cuda-graph-tokens",
        "--cuda-graph-config",
    }
)


def refill_batch(args: Sequence[str], running: int, version: str) -> int:
    """Requests SGLang prefills together when slots free at the full batch: ``--min-free-slots-delay`` as
    ``min_free_slots_delayer.resolve_min_free_slots`` resolves it (0.5.17: capped at
    ``min(4, max(2, (running + 5) // 6))``, off below a cap of 8; 0.5.23: capped at the running cap), else 1
    (one forward pass per freed slot)."""
    value, running = parse_flags(list(args)).min_free_slots_delay, max(0, running)
    if value is None:
        return 1
    if version == "0.5.17":
        if value <= 1 or running < MIN_FREE_SLOTS_DELAY_FROM_CAP:
            return 1
        return min(value, MIN_FREE_SLOTS_DELAY, max(2, (running + 5) // 6))
    return max(1, min(value, running))


def refill_prefill_graph_tokens(
    model: ModelShape, candidate: Candidate, prompt_p99: int, version: str
) -> int | None:
    """The prefill-graph limit that covers ``candidate``'s refill passes: :func:`refill_batch` x prompt p99
    tokens, at least :data:`MIN_PREFILL_GRAPH_TOKENS`, rounded up to the next size SGLang captures
    (``generate_prefill_cuda_graph_batch_sizes``, via :func:`regen.sglang.graphs.prefill_graph_batch_sizes`).
    None where the tuner leaves SGLang's default: prefill graphs off, the given flags size them, an MLA
    model (SGLang's own default there is smaller already), or a limit that would reach SGLang's default
    (:func:`regen.sglang.graphs.sglang_prefill_graph_limit`)."""
    flags = parse_flags(list(candidate.args))
    names = set(flag_names(candidate.args))
    if flags.prefill_graphs_off or names & _PREFILL_GRAPH_SIZE_FLAGS:
        return None
    if is_mla(model):
        return None
    sizes = prefill_graph_batch_sizes(sglang_prefill_graph_limit(candidate.plan.chunked_prefill_size, flags))
    batch = refill_batch(candidate.args, candidate.plan.effective_max_running_requests, version)
    need = max(batch * prompt_p99, MIN_PREFILL_GRAPH_TOKENS)
    limit = next((s for s in sizes if s >= need), None)
    return None if limit is None or limit >= sizes[-1] else limit


def with_refill_prefill_graphs(target: Target, candidate: Candidate) -> Candidate:
    """``candidate`` with SGLang's prefill CUDA graphs captured only up to its refill passes
    (:func:`refill_prefill_graph_tokens`), re-planned under the flag: the smaller graph reserve
    (``reserve_for_graph_mb``: 8 MiB a captured size) can raise SGLang's default memory fraction, and the
    plan's KV numbers are those of the flags as launched. Its cap and client in-flight count stand (the KV
    only grows). ``target``: what ``candidate`` was planned for (its workload). Measured on the H200
    (SGLang 0.5.17, ``known-target-2026-12-02-n800.md``, ``prefill-graphs-2026-12-02.md``): a refill pass
    at the full batch cost 64 ms with prefill graphs and 141 ms without, while capturing all 58 sizes up
    to the 8192-token chunk took 34.5 s of a warm start; the chunk-sized prefills of the initial ramp are
    compute-bound and gain little from a graph."""
    workload, version = target.workload, target.version
    limit = refill_prefill_graph_tokens(target.model, candidate, workload.prompt_p99, version)
    if limit is None:
        return candidate
    old = candidate.plan
    args = (*candidate.args, _PREFILL_GRAPH_FLAG, str(limit))
    try:
        new = target.plan(list(args), workload)
    except PlanError:
        return candidate
    if (
        new.kv_cache_tokens < old.kv_cache_tokens
        or new.effective_max_running_requests != old.effective_max_running_requests
        or (old.decode_step_fits and not new.decode_step_fits)
    ):
        return candidate  # not expected: a smaller graph reserve never takes memory from the pools
    new = replace(new, client_concurrency=old.client_concurrency)
    batch = refill_batch(args, old.effective_max_running_requests, version)
    default = sglang_prefill_graph_limit(old.chunked_prefill_size, parse_flags(list(args)))
    refills = (
        f"{batch} freed slots prefilled together: {_DELAY_FLAG} as "
        "min_free_slots_delayer.resolve_min_free_slots takes it"
        if batch > 1
        else "one freed slot prefilled a pass"
    )
    why = (
        f"{_PREFILL_GRAPH_FLAG} {limit}: prefill CUDA graphs only as large as the refill passes between "
        f"decode steps ({refills}; {batch} x prompt p99 {workload.prompt_p99:,} = "
        f"{batch * workload.prompt_p99:,} tokens, at least {MIN_PREFILL_GRAPH_TOKENS}, rounded up to a size "
        "SGLang captures: ServerArgs._generate_prefill_cuda_graph_batch_sizes, 0.5.23 "
        f"cuda_graph_hook.generate_prefill_cuda_graph_batch_sizes): {len(prefill_graph_batch_sizes(limit))} "
        f"graphs instead of the {len(prefill_graph_batch_sizes(default))} SGLang captures up to its chunked "
        f"prefill size {default:,} (handle_gpu_memory_settings); larger prefills are compute-bound and run "
        "eagerly"
    )
    if new.mem_fraction_static != old.mem_fraction_static:
        why += (
            f"; the smaller graph reserve (reserve_for_graph_mb) raises SGLang's default "
            f"--mem-fraction-static from {old.mem_fraction_static:g} to {new.mem_fraction_static:g}: KV "
            f"cache {new.kv_cache_tokens:,} tokens (was {old.kv_cache_tokens:,})"
        )
    return Candidate(args=args, plan=new, score=candidate.score, reasons=(*candidate.reasons, why))


#: speculative steps the MTP candidates try (topk 1, draft tokens = steps + 1)
MTP_STEPS = (1, 2, 3)
_SPEC_FLAGS = (
    "--speculative-algorithm",
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
)


def sweep_workload(workload: Workload) -> Workload:
    """The workload the sweep's extra candidates are sized for: the expected output length when one is
    given below ``max_tokens`` (as :func:`scheduler_candidates`), else ``workload`` itself."""
    if not workload.expected_output_known:
        return workload
    return Workload(
        prompt_p50=workload.prompt_p50,
        prompt_p99=workload.prompt_p99,
        max_tokens=workload.expected_output,
        target_concurrency=None,
        shared_prefixes=workload.shared_prefixes,
    )


def _chosen(best: Candidate) -> tuple[ServerFlags, Choice]:
    flags = parse_flags(list(best.args))
    return flags, Choice.of(flags)


def speculative_alternatives(target: Target, best: Candidate) -> list[Candidate]:
    """What the sweep measures against ``best`` to keep or drop MTP: the MTP candidates (1-3 steps,
    :func:`mtp_candidates`) when the model has MTP layers, less the one ``best`` already is; and when
    ``best`` runs speculative decoding (the given flags ask for it), the same without it, its cap
    re-solved for the memory the verify buffers free."""
    target = target.with_workload(sweep_workload(target.workload))
    chosen, choice = _chosen(best)
    given_steps = (chosen.speculative_num_steps or 3) if chosen.speculative_algorithm else None
    out = [
        c
        for c in mtp_candidates(target, best)
        if parse_flags(list(c.args)).speculative_num_steps != given_steps
    ]
    if chosen.speculative_algorithm:
        try:
            found = best_running(
                target.with_base(strip_speculative_args(list(target.base))), choice, MOST_RUNNING
            )
        except PlanError:
            found = None
        if found is not None:
            n = found.plan.effective_max_running_requests
            why = f"MTP off: the given flags' speculative decoding dropped; {n} running requests without it"
            out.insert(0, replace(found, reasons=(why, *found.reasons)))
    return out


def static_mtp_note(model: ModelShape, args: list[str]) -> str:
    """Why MTP is on or off in a plan nothing has measured (``regen tune`` without ``--sweep``)."""
    flags = parse_flags(args)
    if flags.speculative_algorithm:
        return (
            f"MTP on: the given server.args ask for {flags.speculative_algorithm} (not measured; "
            "`regen tune --sweep` measures it against no MTP)"
        )
    if model.mtp_layers <= 0:
        return "MTP off: the model has no MTP layers"
    return (
        "MTP off: not measured; the static plan keeps it off (`regen tune --sweep` measures 1-3 MTP steps "
        "against it)"
    )


def scheduler_candidates(target: Target, best: Candidate, replay_decode: bool = False) -> list[Candidate]:
    """Candidates that trade the static guarantee for throughput, to be measured by ``regen tune --sweep``.

    Linear-attention hybrids with ``workload.expected_output_tokens`` below ``max_tokens``: the running
    cap sized so the KV cache holds every running request at prompt p99 + the *expected* output (the mean
    context of a running set stays under that while the lengths' squared coefficient of variation is
    below 1), relying on SGLang's own admission (free KV) and retraction for the rare overflow; then the
    same with prefill refills batched (``--min-free-slots-delay``) and prefill graphs sized for them
    (:func:`with_refill_prefill_graphs`). Same choices as ``best``. Empty when
    no expected length is given, and for attention-only models (their recommendation is sized for the
    expected length already). With ``replay_decode``, also the batched one with ReplaySSM decode (opt-in:
    on the H200, 27B hybrid shape, SGLang 0.5.17, it gained nothing at equal batch and its ring costs
    about 9% of the cap; its decode kernel already runs the state at 90% of the copy bandwidth without it).
    """
    workload = target.workload
    if not workload.expected_output_known or not has_state(target.model):
        return []
    chosen, choice = _chosen(best)
    sized_target = target.with_workload(sweep_workload(workload))
    found = best_running(sized_target, choice, MOST_RUNNING)
    if found is None or found.plan.effective_max_running_requests <= best.plan.effective_max_running_requests:
        return []
    n = found.plan.effective_max_running_requests
    sized = Candidate(
        args=found.args,
        plan=found.plan,
        score=found.score,
        reasons=(
            f"--max-running-requests {n}: sized for the expected {workload.expected_output} output tokens "
            f"per request (not max_tokens {workload.max_tokens}); SGLang admits by free KV and retracts "
            "on overflow",
            *found.reasons[1:],
        ),
    )
    refills = with_batched_refills(sized)
    batched = with_refill_prefill_graphs(sized_target, refills)
    if not replay_decode:
        return [sized, batched]
    replay = _replay_candidate(sized_target, chosen, found, refills)
    return [sized, batched, *(with_refill_prefill_graphs(sized_target, c) for c in replay)]


def speculative_args(steps: int, algorithm: str = "NEXTN") -> tuple[str, ...]:
    """SGLang's flags for MTP with ``steps`` draft steps, topk 1 (draft tokens = steps + 1)."""
    return (
        "--speculative-algorithm",
        algorithm,
        "--speculative-num-steps",
        str(steps),
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        str(steps + 1),
    )


def strip_speculative_args(args: list[str]) -> list[str]:
    """``args`` without the speculative flags the MTP candidates set themselves."""
    return strip_flags(args, _SPEC_FLAGS)


def mtp_candidates(target: Target, best: Candidate, steps: tuple[int, ...] = MTP_STEPS) -> list[Candidate]:
    """MTP (NEXTN: SGLang's EAGLE on the model's own MTP layers, topk 1) at each of ``steps``, with the
    running cap re-solved for the speculative memory: per running request SGLang then also holds the
    verify buffers (one state per draft token, ``intermediate_ssm_state_cache``) next to its state slots,
    and the draft model's weights and KV. Same choices as ``best``. Empty when the model has no MTP
    layers. Whether MTP pays off depends on the acceptance and the batch: ``regen tune --sweep`` measures
    them."""
    if target.model.mtp_layers <= 0:
        return []
    _, choice = _chosen(best)
    plain = strip_speculative_args(list(target.base))
    out = []
    for n_steps in steps:
        try:
            found = best_running(target.with_base([*plain, *speculative_args(n_steps)]), choice, MOST_RUNNING)
        except PlanError:  # the draft model's weights and buffers do not fit: no MTP candidate at these steps
            found = None
        if found is None:
            continue
        p = found.plan
        n = p.effective_max_running_requests
        why = (
            f"MTP {n_steps} step{'s' if n_steps > 1 else ''} (NEXTN, topk 1, {n_steps + 1} draft tokens): "
            f"verify buffers {p.spec_scratch_gib:.1f} GiB and draft weights {p.draft_weights_gib:.1f} GiB "
            f"leave room for {n} running requests (to be measured)"
        )
        out.append(Candidate(args=found.args, plan=p, score=found.score, reasons=(why, *found.reasons)))
    return out


def _replay_candidate(
    target: Target, chosen: ServerFlags, sized: Candidate, batched: Candidate
) -> list[Candidate]:
    """``batched`` with SGLang's ReplaySSM decode (``--enable-linear-replayssm``): each decode step reads
    the linear-attention state and appends a small record to a per-slot ring, writing the state back only
    every ``linear_replayssm_cache_len`` steps, instead of reading and writing it every step. The ring
    lives outside SGLang's pool budget, so the memory fraction drops by its share (the runtime slack stays
    as it was) and the cap is re-solved. Empty where SGLang would refuse the flag or it does nothing."""
    # the triton decode backend named: on SM100+ with bf16 state SGLang would default to flashinfer and refuse
    replay = ["--enable-linear-replayssm", "--linear-attn-decode-backend", "triton"]
    flags = replace(chosen, enable_linear_replayssm=True, linear_attn_decode_backend="triton")
    if flags.speculative_algorithm or replay_flag_problems(flags, target.model, target.version):
        return []
    pre_load_gib = target.gpu_mib / 1024 - CUDA_CONTEXT_GIB
    top = round(sized.plan.mem_fraction_static * 1000)
    with_ring = target.with_base([*target.base, *replay])
    choice = Choice.of(chosen)

    def at(thousandths: int) -> Candidate | None:
        """The cap solved at this memory fraction, if the ring it implies fits in the fraction given up."""
        got = best_running(with_ring, replace(choice, mfs=thousandths / 1000), MOST_RUNNING)
        given_up = (top - thousandths) / 1000 * pre_load_gib
        return got if got is not None and got.plan.replay_ring_gib <= given_up else None

    found_at = highest(top - 200, top, at)  # the highest fraction whose cap's ring fits: the slack is kept
    if found_at is None:
        return []
    found = found_at[1]
    mfs, ring_gib = found.plan.mem_fraction_static, found.plan.replay_ring_gib
    n = found.plan.effective_max_running_requests
    delay = batched.args[len(sized.args) :]
    return [
        Candidate(
            args=(*found.args, *delay),
            plan=found.plan,
            score=found.score,
            reasons=(
                f"--max-running-requests {n}: sized for the expected {target.workload.max_tokens} output "
                "tokens per request, as the refill-batched candidate, in the memory the ring leaves",
                "--enable-linear-replayssm: decode reads the linear-attention state and appends to a "
                f"per-slot ring, writing the state back every {flags.linear_replayssm_cache_len} steps "
                "instead of every step (about half the state traffic)",
                f"--mem-fraction-static {mfs:g}: {sized.plan.mem_fraction_static:g} less the ring's "
                f"{ring_gib:.2f} GiB, which SGLang allocates outside its pool budget",
                *batched.reasons[len(sized.reasons) :],
            ),
        )
    ]


def replay_flag_problems(flags: ServerFlags, model: ModelShape, version: str) -> list[str]:
    """Why ``--enable-linear-replayssm`` would do nothing or be refused (server_args
    ``_handle_linear_attn_backend``, 0.5.17 and 0.5.23); empty when it applies."""
    if not flags.enable_linear_replayssm:
        return []
    if not model.is_hybrid:
        return [
            f"--enable-linear-replayssm has no effect: {model.architecture} has no linear-attention layers"
        ]
    out = []
    if flags.decode_backend != "triton":
        out.append(
            "--enable-linear-replayssm requires the triton linear-attention decode backend "
            f"(SGLang refuses --linear-attn-decode-backend {flags.decode_backend})"
        )
    _, strategy = mamba_slots_per_request(model, flags, version)
    if strategy in ("extra_buffer", "extra_buffer_lazy"):
        out.append(
            "--enable-linear-replayssm requires the no_buffer mamba cache strategy (SGLang refuses "
            f"{strategy}, which the radix cache resolves to here); add --disable-radix-cache for unique "
            "prompts"
        )
    if flags.linear_replayssm_cache_len < 1:
        out.append("--linear-replayssm-cache-len must be >= 1 (SGLang refuses it)")
    if flags.linear_attn_decode_backend is None and flags.mamba_ssm_dtype == "bfloat16":
        out.append(
            "--enable-linear-replayssm with --mamba-ssm-dtype bfloat16: on SM100+ GPUs (B200) SGLang then "
            "defaults the decode backend to flashinfer and refuses the flag; add "
            "--linear-attn-decode-backend triton there"
        )
    return out
