"""SGLang flag spellings per version and an exact-name flag check.

argparse's prefix matching (``allow_abbrev``) silently accepts ``--tp`` for ``--tp-size``; the check here
compares every ``--flag`` against the exact option strings first, then lets SGLang's own parser judge values.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
from dataclasses import dataclass
from functools import cache
from pathlib import Path

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
    for name in _flag_names(argv):
        if name in table:
            new, how = table[name]
            out.append(f"{name} is {how} {new} in SGLang {version}" if "of" in how else
                       f"{name} is {how} in SGLang {version}: use {new}")  # fmt: skip
    return out


@cache
def bundled_flags(version: str = DEFAULT_VERSION) -> frozenset[str]:
    path = _BUNDLED.get(version)
    if path is None:
        raise FlagError("--sglang-version", f"no bundled flag list for SGLang {version}", "0.5.23")
    lines = path.read_text().splitlines()
    return frozenset(line.strip() for line in lines if line.startswith("--"))


def _flag_names(argv: list[str]) -> list[str]:
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
    for name in _flag_names(argv):
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
        full = argv if "--model-path" in _flag_names(argv) else ["--model-path", "/dev/null", *argv]
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                parser.parse_args(full)
        except (SystemExit, argparse.ArgumentError) as exc:
            message = str(exc) if isinstance(exc, argparse.ArgumentError) else err.getvalue().strip()
            flag = next((n for n in _flag_names(argv) if n in message), "argv")
            raise FlagError(flag, f"rejected by SGLang's parser: {message}") from exc
    return FlagCheck(method=method, flags=tuple(_flag_names(argv)))
