"""`regen <command>`: the command-line face of each stage; each command lives in its own module."""

from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "audit": (
        "regen.ingest.audit",
        "audit a chat dataset before generating (flags, supervised tokens, gates)",
    ),
    "tune": ("regen.tune.tune", "plan SGLang's memory and flags for a model and GPU"),
    "check": ("regen.check", "preflight: every problem with a config and this machine, before any job"),
    "status": ("regen.observe.status", "per-GPU progress, throughput and ETA of a running workflow"),
    "validate": ("regen.output.validate", "validate one shard's generation records"),
    "reconcile": ("regen.output.reconcile", "check every input id ended in exactly one place"),
    "vocab": (
        "regen.output.vocab",
        "write an EAGLE3 draft vocabulary (SpecForge, speculators) from the export's counts",
    ),
    "report-assets": ("regen.observe.report", "write the report's plots and tables"),
    "serve-simulated": ("regen.simulated.launcher", "run the SGLang-compatible simulated server"),
}


def usage() -> str:
    lines = ["usage: regen <command> [options]", "", "commands:"]
    lines += [f"  {name:<16} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in {"-h", "--help"}:
        print(usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"regen: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.cli(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
