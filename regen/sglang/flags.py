"""SGLang flag spellings per version and an exact-name flag check.

argparse's prefix matching (``allow_abbrev``) silently accepts ``--tp`` for ``--tp-size``; the check here
compares every ``--flag`` against the exact option strings first, then lets SGLang's own parser judge values.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

DEFAULT_VERSION = "0.5.23"
_BUNDLED = {"0.5.23": Path(__file__).with_name("sglang_0_5_23_flags.txt")}

# old spelling -> (new spelling, note). Sources: 0.5.23 server_args / arg_groups deprecations.
RENAMES_0_5_23: dict[str, tuple[str, str]] = {
    "--mamba-scheduler-strategy": ("--mamba-radix-cache-strategy", "renamed"),
    "--cuda-graph-max-bs": ("--cuda-graph-max-bs-decode", "split into -decode/-prefill"),
    "--enable-dp-attention": ("--attn-dp-size", "replaced"),
    "--grpc-mode": ("--smg-grpc-mode", "renamed"),
    "--disable-cuda-graph": (
        "--cuda-graph-backend-decode disabled --cuda-graph-backend-prefill disabled",
        "deprecated",
    ),
    "--enable-piecewise-cuda-graph": ("--cuda-graph-backend-prefill", "removed"),
    "--tp": ("--tp-size", "prefix of"),
}
# In 0.5.17 --mamba-scheduler-strategy and --cuda-graph-max-bs are still accepted deprecated aliases
# (server_args.py DeprecatedAliasStoreAction), so only prefixes are flagged there.
RENAMES_0_5_17: dict[str, tuple[str, str]] = {
    "--mamba-scheduler-strategy": ("--mamba-radix-cache-strategy", "deprecated alias of"),
    "--cuda-graph-max-bs": ("--cuda-graph-max-bs-decode", "deprecated alias of"),
    "--tp": ("--tp-size", "prefix of"),
}
RENAMES: dict[str, dict[str, tuple[str, str]]] = {"0.5.23": RENAMES_0_5_23, "0.5.17": RENAMES_0_5_17}


class FlagError(ValueError):
    """A launch flag SGLang would reject or silently reinterpret."""

    def __init__(self, flag: str, message: str, suggestion: str | None = None) -> None:
        self.flag = flag
        self.suggestion = suggestion
        text = f"{flag}: {message}"
        if suggestion:
            text += f"; use {suggestion}"
        super().__init__(text)


@dataclass(frozen=True, slots=True)
class FlagCheck:
    """Which check ran: 'sglang-parser' (real ServerArgs parser) or 'bundled-list-<version>'."""

    method: str
    flags: tuple[str, ...]


def cuda_graph_max_bs_flag(version: str = DEFAULT_VERSION) -> str:
    """Canonical decode-graph max batch flag; 0.5.17 also accepts its deprecated alias --cuda-graph-max-bs."""
    return "--cuda-graph-max-bs-decode"


def renamed_flag_warnings(argv: list[str], version: str = DEFAULT_VERSION) -> list[str]:
    table = RENAMES.get(version, RENAMES_0_5_23)
    out = []
    for name in flag_names(argv):
        if name in table:
            new, how = table[name]
            out.append(
                f"{name} is {how} {new} in SGLang {version}"
                if "of" in how
                else f"{name} is {how} in SGLang {version}: use {new}"
            )
    return out


@cache
def bundled_flags(version: str = DEFAULT_VERSION) -> frozenset[str]:
    path = _BUNDLED.get(version)
    if path is None:
        raise FlagError("--sglang-version", f"no bundled flag list for SGLang {version}", "0.5.23")
    lines = path.read_text().splitlines()
    return frozenset(line.strip() for line in lines if line.startswith("--"))


def flag_names(argv: Sequence[str]) -> list[str]:
    """The ``--flag`` names of an argv (``--a=1`` is ``--a``)."""
    return [a.split("=", 1)[0] for a in argv if a.startswith("--")]


def _suggest(name: str, known: frozenset[str], version: str) -> str | None:
    table = RENAMES.get(version, {})
    if name in table:
        return table[name][0]
    prefixed = sorted(k for k in known if k.startswith(name))
    if len(prefixed) == 1:
        return prefixed[0]
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
    return close[0] if close else None


def _real_parser() -> argparse.ArgumentParser | None:
    try:
        from sglang.srt.server_args import ServerArgs  # type: ignore[import-not-found]
    except Exception:
        return None
    parser = argparse.ArgumentParser(prog="sglang.launch_server", allow_abbrev=False, exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    return parser


def check_flags(argv: list[str], strict: bool = True, version: str = DEFAULT_VERSION) -> FlagCheck:
    """Reject unknown, renamed or abbreviated flags, then bad values via SGLang's parser when present.

    With strict=False, unknown names are tolerated (only renames and abbreviations are errors).
    """
    parser = _real_parser() if version == DEFAULT_VERSION else None
    if parser is not None:
        known = frozenset(o for a in parser._actions for o in a.option_strings if o.startswith("--"))
        method = "sglang-parser"
    else:
        known = bundled_flags(version)
        method = f"bundled-list-{version}"
    for name in flag_names(argv):
        if name in known and name not in RENAMES.get(version, {}):
            continue
        suggestion = _suggest(name, known, version)
        if name in RENAMES.get(version, {}) and name in known:
            continue  # still an accepted alias in this version
        if name in RENAMES.get(version, {}) or (suggestion is not None and suggestion.startswith(name)):
            raise FlagError(name, f"not an SGLang {version} option name", suggestion)
        if strict:
            raise FlagError(name, f"unknown SGLang {version} option", suggestion)
    if parser is not None:
        full = argv if "--model-path" in flag_names(argv) else ["--model-path", "/dev/null", *argv]
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                parser.parse_args(full)
        except (SystemExit, argparse.ArgumentError) as exc:
            message = str(exc) if isinstance(exc, argparse.ArgumentError) else err.getvalue().strip()
            flag = next((n for n in flag_names(argv) if n in message), "argv")
            raise FlagError(flag, f"rejected by SGLang's parser: {message}") from exc
    return FlagCheck(method=method, flags=tuple(flag_names(argv)))


# ------------------------------------------------------- the flags the planner reads --
#: ServerArgs.linear_replayssm_cache_len default: decode steps between the ReplaySSM ring's state flushes
REPLAY_RING_LEN = 16


@dataclass(frozen=True, slots=True)
class ServerFlags:
    """The subset of SGLang launch flags the planner understands, with SGLang's defaults (None = auto)."""

    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    max_mamba_cache_size: int | None = None
    mamba_full_memory_ratio: float | None = None
    mamba_radix_cache_strategy: str = "auto"
    mamba_ssm_dtype: str | None = None
    disable_radix_cache: bool = False
    disable_overlap_schedule: bool = False
    kv_cache_dtype: str = "auto"
    max_total_tokens: int | None = None
    chunked_prefill_size: int | None = None
    context_length: int | None = None
    cuda_graph_max_bs: int | None = None
    #: decode graphs off (``--disable-cuda-graph`` or ``--disable-decode-cuda-graph``)
    disable_cuda_graph: bool = False
    #: prefill graphs off by a switch (``--disable-cuda-graph`` or ``--disable-prefill-cuda-graph``)
    disable_prefill_cuda_graph: bool = False
    cuda_graph_backend_prefill: str | None = None
    cuda_graph_max_bs_prefill: int | None = None
    speculative_algorithm: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    speculative_draft_model_path: str | None = None
    #: draft steps chosen per batch size at run time (``--speculative-adaptive``, its ``-config`` JSON)
    speculative_adaptive: bool = False
    speculative_adaptive_config: str | None = None
    page_size: int = 1
    tp: int | None = None
    num_continuous_decode_steps: int | None = None
    #: freed slots prefilled together (``--min-free-slots-delay``, as given; SGLang caps it)
    min_free_slots_delay: int | None = None
    enable_linear_replayssm: bool = False
    linear_replayssm_cache_len: int = REPLAY_RING_LEN
    linear_attn_backend: str = "triton"
    linear_attn_decode_backend: str | None = None
    swa_full_tokens_ratio: float = 0.8  # ServerArgs.swa_full_tokens_ratio (0.5.17 and 0.5.23)

    @property
    def prefill_graphs_off(self) -> bool:
        """SGLang's prefill phase backend is DISABLED: an explicit ``--cuda-graph-backend-prefill`` wins
        over the off-switches (``ServerArgs._resolve_cuda_graph_config`` in 0.5.17, ``cuda_graph_hook`` in
        0.5.23)."""
        if self.cuda_graph_backend_prefill is not None:
            return self.cuda_graph_backend_prefill == "disabled"
        return self.disable_prefill_cuda_graph

    @property
    def decode_backend(self) -> str:
        """``--linear-attn-decode-backend``, else ``--linear-attn-backend`` (server_args, 0.5.17/0.5.23)."""
        return self.linear_attn_decode_backend or self.linear_attn_backend


VALUE_FLAGS: dict[str, tuple[str, type]] = {
    "--mem-fraction-static": ("mem_fraction_static", float),
    "--max-running-requests": ("max_running_requests", int),
    "--max-mamba-cache-size": ("max_mamba_cache_size", int),
    "--mamba-full-memory-ratio": ("mamba_full_memory_ratio", float),
    "--mamba-radix-cache-strategy": ("mamba_radix_cache_strategy", str),
    "--mamba-scheduler-strategy": ("mamba_radix_cache_strategy", str),
    "--mamba-ssm-dtype": ("mamba_ssm_dtype", str),
    "--kv-cache-dtype": ("kv_cache_dtype", str),
    "--max-total-tokens": ("max_total_tokens", int),
    "--chunked-prefill-size": ("chunked_prefill_size", int),
    "--context-length": ("context_length", int),
    "--cuda-graph-max-bs": ("cuda_graph_max_bs", int),
    "--cuda-graph-max-bs-decode": ("cuda_graph_max_bs", int),
    "--cuda-graph-max-bs-prefill": ("cuda_graph_max_bs_prefill", int),
    "--cuda-graph-backend-prefill": ("cuda_graph_backend_prefill", str),
    "--speculative-algorithm": ("speculative_algorithm", str),
    "--speculative-num-steps": ("speculative_num_steps", int),
    "--speculative-eagle-topk": ("speculative_eagle_topk", int),
    "--speculative-num-draft-tokens": ("speculative_num_draft_tokens", int),
    "--speculative-draft-model-path": ("speculative_draft_model_path", str),
    "--speculative-adaptive-config": ("speculative_adaptive_config", str),
    "--page-size": ("page_size", int),
    "--tp-size": ("tp", int),
    "--tp": ("tp", int),
    "--tensor-parallel-size": ("tp", int),
    "--num-continuous-decode-steps": ("num_continuous_decode_steps", int),
    "--min-free-slots-delay": ("min_free_slots_delay", int),
    "--linear-replayssm-cache-len": ("linear_replayssm_cache_len", int),
    "--linear-attn-backend": ("linear_attn_backend", str),
    "--linear-attn-decode-backend": ("linear_attn_decode_backend", str),
    "--swa-full-tokens-ratio": ("swa_full_tokens_ratio", float),
    # 0.5.17's deprecated alias of --cuda-graph-max-bs-prefill (DeprecatedAliasStoreAction)
    "--piecewise-cuda-graph-max-tokens": ("cuda_graph_max_bs_prefill", int),
}

#: flags that store a constant (0.5.17's ``DeprecatedStoreConstAction`` aliases)
CONST_FLAGS: dict[str, tuple[str, str]] = {
    "--disable-piecewise-cuda-graph": ("cuda_graph_backend_prefill", "disabled"),
}


BOOL_FLAGS: dict[str, str] = {
    "--disable-radix-cache": "disable_radix_cache",
    "--disable-overlap-schedule": "disable_overlap_schedule",
    "--disable-cuda-graph": "disable_cuda_graph",
    "--disable-decode-cuda-graph": "disable_cuda_graph",
    "--disable-prefill-cuda-graph": "disable_prefill_cuda_graph",
    "--enable-linear-replayssm": "enable_linear_replayssm",
    "--speculative-adaptive": "speculative_adaptive",
}


def parse_flags(args: list[str]) -> ServerFlags:
    """Read the flags the planner understands from an SGLang argv; other flags are skipped."""
    values: dict[str, Any] = {}
    i = 0
    while i < len(args):
        token = args[i]
        name, eq, inline = token.partition("=")
        if name in BOOL_FLAGS:
            values[BOOL_FLAGS[name]] = True
            if name == "--disable-cuda-graph":  # both phases (the legacy global switch)
                values["disable_prefill_cuda_graph"] = True
        elif name in CONST_FLAGS:
            attr, const = CONST_FLAGS[name]
            values[attr] = const
        elif name in VALUE_FLAGS:
            attr, kind = VALUE_FLAGS[name]
            if eq:
                raw = inline
            elif i + 1 < len(args):
                i += 1
                raw = args[i]
            else:
                raise FlagError(name, "needs a value")
            try:
                values[attr] = kind(raw)
            except ValueError as exc:
                raise FlagError(name, f"{raw!r} is not a valid {kind.__name__}") from exc
        i += 1
    return ServerFlags(**values)


def strip_flags(args: list[str], names: Collection[str]) -> list[str]:
    """``args`` without the flags in ``names`` (and their values: the value flags the planner reads take
    the next argument unless written ``--flag=value``)."""
    out: list[str] = []
    i = 0
    while i < len(args):
        name, eq, _ = args[i].partition("=")
        if name in names:
            i += 2 if name in VALUE_FLAGS and not eq else 1
            continue
        out.append(args[i])
        i += 1
    return out
