"""Every file the report reads (:class:`ReportInputs`): the report rule's declared inputs, or a run's
layout as it is now."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from regen.layout.run import RunLayout


@dataclass(frozen=True, slots=True)
class ReportInputs:
    """Every file the report reads: in the workflow the report rule's declared inputs
    (``scripts/report_assets.py``), from the command line a run's layout (:meth:`of`).

    The GPU slots' ``realized`` and ``restarts`` files belong to the long-lived servers, not to a
    job: the rule names their root (``RunLayout.servers_root``) and they are listed when the report runs.
    """

    dataset: Path
    reconcile: Path
    audit: Path
    audit_verdict: Path
    reaudit: Path
    reaudit_verdict: Path
    ready: Path
    plan: Path
    #: ``regen tune --sweep``'s pilot (None: none was run)
    pilot: Path | None
    records: tuple[Path, ...]
    failed: tuple[Path, ...]
    quarantine: tuple[Path, ...]
    realized: tuple[Path, ...]
    restarts: tuple[Path, ...]

    @classmethod
    def of(cls, layout: RunLayout) -> ReportInputs:
        """The files of the run laid out by ``layout``, as they are now."""
        return cls(
            dataset=layout.dataset_dir,
            reconcile=layout.reconcile,
            audit=layout.audit_summary,
            audit_verdict=layout.verdict("audit"),
            reaudit=layout.reaudit_summary,
            reaudit_verdict=layout.verdict("reaudit"),
            ready=layout.ready,
            plan=layout.server_plan,
            pilot=layout.pilot,
            records=tuple(layout.record_files()),
            failed=tuple(layout.failed_files()),
            quarantine=tuple(layout.quarantine_files()),
            realized=tuple(layout.realized_files()),  # per node and per Slurm job
            restarts=tuple(layout.restart_files()),
        )
