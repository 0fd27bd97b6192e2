"""The H200 truth bench as ``truth.sh`` runs it: ``planner_truth``'s startup check of every target, then
``hold``'s phase that holds regen's recommended server at its planned batch (issue 49: a plan is true only
once its server ran at the batch it plans), :data:`hold.HOLD_S` seconds unless ``--hold-s`` says otherwise
(``--hold-s 0``: startups only).

The top of the two: ``hold`` builds on ``planner_truth`` (its targets, servers and plans), and this module
hands ``hold.with_hold`` to ``planner_truth.main``, so neither imports the other back.
"""

from __future__ import annotations

from bench.gpu import hold, planner_truth


def main(argv: list[str] | None = None) -> int:
    return planner_truth.main(argv, hold_phase=hold.with_hold, default_hold_s=hold.HOLD_S)


if __name__ == "__main__":
    raise SystemExit(main())
