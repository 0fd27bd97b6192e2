"""``python -m bench.gpu.known_target STEP ARGS``: the campaign's one entry (STEP: a module of this package).
A step's module is imported only when named: ``check`` runs where regen's dependencies are not."""

from __future__ import annotations

import importlib
import sys

STEPS = ("model", "check", "run", "baselines", "device")


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in STEPS:
        raise SystemExit(f"usage: python -m bench.gpu.known_target {{{'|'.join(STEPS)}}} ARGS")
    sys.argv[0] = f"python -m bench.gpu.known_target {argv[0]}"  # argparse's prog
    return importlib.import_module(f"bench.gpu.known_target.{argv[0]}").main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
