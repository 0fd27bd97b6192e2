"""Launch flags: grouping an argv into flags, the tuner's flags under the user's, the flags regen manages."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from regen.runconfig import ServerConfig
from regen.sglang.config import PlanFile

log = logging.getLogger("regen.serving.launch_args")

#: flags regen sets itself; the same flag in ``server.args`` or the plan is dropped (with a warning)
MANAGED_FLAGS: frozenset[str] = frozenset(
    {"--model-path", "--model", "--host", "--port", "--reasoning-parser", "--enable-metrics"}
)

#: flags a local SGLang launch gets unless ``server.args`` or the plan give one of the flags named beside it.
#: ``--skip-server-warmup``: SGLang 0.5.17/0.5.23 otherwise send their own warm-up ``/generate`` before the
#: server answers (``_wait_and_warmup`` in ``sglang/srt/entrypoints/http_server.py``), holding the
#: scheduler ~7 s on the H200 (issue 37); regen's readiness probe already pays the first request's cost
#: (``regen.serving.probes.one_token_generation``). Not a numerics flag: not among
#: ``regen.fingerprint.SERVER_NUMERICS_KEYS``.
#: SGLang's prefill CUDA graphs are left on: on the H200 (``measurements/known-target-2026-12-02-n800.md``)
#: each small prefill batch between decode steps at a batch of 265 cost 64 ms with them and 141 ms
#: without, so decode ran at 4,026 tok/s with them and 2,969 without; their capture (34.5 s warm, 98 s
#: cold, for all 58 sizes up to the 8192-token chunk) is paid back after ~450 admissions at the full batch.
#: The tuner's plan captures only the sizes up to its refill passes (``--cuda-graph-max-bs-prefill``:
#: ``regen.sglang.alternatives.with_refill_prefill_graphs``); the larger prefills of the initial ramp are
#: compute-bound and gain little from a graph. ``--disable-prefill-cuda-graph`` in ``server.args`` turns
#: them off (the planner then frees their reserve).
LAUNCH_DEFAULT_FLAGS: dict[str, frozenset[str]] = {
    "--skip-server-warmup": frozenset({"--skip-server-warmup"}),
}


def flag_name(token: str) -> str:
    return token.split("=", 1)[0].replace("_", "-")


def split_flags(args: Sequence[str]) -> list[list[str]]:
    """Group a flat argv into ``[flag, value...]`` groups (``--a=1`` stays one token)."""
    groups: list[list[str]] = []
    for token in args:
        if token.startswith("--") or not groups:
            groups.append([token])
        else:
            groups[-1].append(token)
    return groups


def merge_launch_args(plan_args: Sequence[str], user_args: Sequence[str]) -> list[str]:
    """The plan's flags overridden by the user's explicit ones (each override logged)."""
    user_groups = split_flags(user_args)
    user_by_name = {flag_name(g[0]): g for g in user_groups}
    merged: list[str] = []
    for group in split_flags(plan_args):
        name = flag_name(group[0])
        if name in user_by_name:
            if list(user_by_name[name]) != list(group):  # the plan repeats the user's args as given
                log.warning("server.args sets %s; it overrides the tuner's %s", name, " ".join(group))
            continue
        merged.extend(group)
    for group in user_groups:
        merged.extend(group)
    return merged


def _drop_managed(args: Sequence[str], origin: str) -> list[str]:
    kept: list[str] = []
    for group in split_flags(args):
        name = flag_name(group[0])
        if name in MANAGED_FLAGS:
            log.warning("%s sets %s, which regen manages from server config; ignored", origin, name)
            continue
        kept.extend(group)
    return kept


def launch_args_for(cfg: ServerConfig, plan: PlanFile | None) -> list[str]:
    """Extra launch flags: the tuner's (``use_tuner`` and a plan) with the user's ``args`` on top."""
    user = list(cfg.args)
    if cfg.use_tuner and plan is not None:
        plan_args = list(plan.launch_args)
        args = merge_launch_args(_drop_managed(plan_args, "the plan"), user)
    else:
        args = list(user)
    args = _drop_managed(args, "server.args")
    tp = cfg.tp
    names = {flag_name(g[0]) for g in split_flags(args)}
    if tp > 1 and not names & {"--tp-size", "--tp", "--tensor-parallel-size"}:
        args += ["--tp-size", str(tp)]
    return args


def with_launch_defaults(args: Sequence[str]) -> list[str]:
    """``args`` with each of ``LAUNCH_DEFAULT_FLAGS`` appended unless they give one of its flags."""
    names = {flag_name(g[0]) for g in split_flags(args)}
    return [*args, *(f for f, overridden_by in LAUNCH_DEFAULT_FLAGS.items() if not names & overridden_by)]
