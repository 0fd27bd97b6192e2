"""The prestart's decisions without a workflow: adopt or refuse a running server for the audit's plan,
when a run prestarts at all, the adopted plan's numbers, the provisional record read back."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from regen.ingest.audit_config import AuditConfig
from regen.ingest.audit_run import first_pass_summary, run_audit
from regen.ingest.dataset import DatasetConfig
from regen.runconfig import ServerConfig
from regen.sglang.config import PlanFile
from regen.tune.prestart import (
    CAP_TOLERANCE,
    ProvisionalPlan,
    adopted_plan,
    adoption_verdict,
    prestart_skip_reason,
)

BASE = ["python", "-m", "sglang.launch_server", "--model-path", "m", "--mem-fraction-static", "0.92"]


def test_identical_flags_are_adopted() -> None:
    verdict = adoption_verdict(
        [*BASE, "--max-running-requests", "265"], [*BASE, "--max-running-requests", "265"]
    )
    assert verdict.adopted and verdict.reason == "every launch flag identical"


@pytest.mark.parametrize(
    ("running", "planned", "adopted"), [(265, 290, True), (265, 320, False), (300, 271, True)]
)
def test_a_cap_is_adopted_within_the_tolerance_only(running: int, planned: int, adopted: bool) -> None:
    verdict = adoption_verdict(
        [*BASE, "--cuda-graph-max-bs-decode", str(running)],
        [*BASE, "--cuda-graph-max-bs-decode", str(planned)],
    )
    assert verdict.adopted is adopted
    assert f"--cuda-graph-max-bs-decode {running} → {planned}" in verdict.reason
    if not adopted:
        assert verdict.reason.endswith(f"> {CAP_TOLERANCE:.0%}") and "+21%" in verdict.reason


@pytest.mark.parametrize(
    ("running", "planned", "adopted"),
    [(None, "1280", True), ("1536", "1280", True), ("1280", "1280", True), ("1280", "1536", False),
     ("1280", None, False)],
)  # fmt: skip
def test_prefill_graphs_are_adopted_where_the_running_ones_cover_the_plans(
    running: str | None, planned: str | None, adopted: bool
) -> None:
    """The prefill graphs follow the prompt p99 (the refill passes): a first pass's p99 a little off must
    not restart a server whose graphs already cover the audit's refills (absent: SGLang's default, all)."""
    flag = "--cuda-graph-max-bs-prefill"
    verdict = adoption_verdict(
        [*BASE, *([flag, running] if running else [])], [*BASE, *([flag, planned] if planned else [])]
    )
    assert verdict.adopted is adopted
    if running != planned:
        assert flag in verdict.reason
    if running == "1280" and planned == "1536":
        assert verdict.reason.endswith(f"+20% > {CAP_TOLERANCE:.0%}")


def test_another_flag_or_a_cap_given_once_is_refused() -> None:
    other = adoption_verdict(
        [*BASE, "--chunked-prefill-size", "8192"], [*BASE, "--chunked-prefill-size", "4096"]
    )
    assert not other.adopted and "--chunked-prefill-size 8192 → 4096" in other.reason
    once = adoption_verdict(BASE, [*BASE, "--max-running-requests", "64"])
    assert not once.adopted and "--max-running-requests absent → 64" in once.reason


def test_a_numerics_flag_refuses_even_beside_a_cap_within_tolerance() -> None:
    verdict = adoption_verdict(
        [*BASE, "--kv-cache-dtype", "fp8_e4m3", "--max-running-requests", "100"],
        [*BASE, "--max-running-requests", "101"],
    )
    assert not verdict.adopted and verdict.reason.startswith("a numerics flag differs (--kv-cache-dtype")


def test_the_adopted_plan_keeps_the_running_flags_and_the_lower_in_flight_count() -> None:
    running = PlanFile(("--max-running-requests", "265"), "recommended", {}, {"client_concurrency": 265})
    audit = PlanFile(("--max-running-requests", "280"), "recommended", {}, {"client_concurrency": 280})
    plan = adopted_plan(running, audit, {"adopted": True})
    assert plan.launch_args == running.launch_args and plan.client_concurrency == 265
    assert plan.prestart == {"adopted": True}
    shorter = dataclasses.replace(audit, recommended={"client_concurrency": 200})
    assert adopted_plan(running, shorter, {}).client_concurrency == 200


def test_the_provisional_record_reads_back(tmp_path: Path) -> None:
    plan = PlanFile(("--max-running-requests", "8"), "recommended", {}, {"client_concurrency": 8})
    record = ProvisionalPlan(
        plan, "first pass over the dataset's first 5 rows", {"prompt_p50": 9}, 123, (0, 1)
    )
    record.write(tmp_path / "p.json")
    assert ProvisionalPlan.read(tmp_path / "p.json") == record
    assert ProvisionalPlan.read(tmp_path / "none.json") is None


@pytest.mark.parametrize(
    ("mode", "local", "dry_run", "shards", "rows", "skipped"),
    [
        ("simulated", True, False, 2, 10, None),
        ("sglang", True, False, 2, 10, None),
        ("simulated", False, False, 2, 10, "not a local run"),
        ("simulated", True, True, 2, 10, "a dry run"),
        ("external", True, False, 2, 10, "launches no server"),
        ("simulated", True, False, 0, 10, "no shard left"),
        ("simulated", True, False, 2, 0, "prestart_rows is 0"),
    ],
)
def test_only_a_local_run_of_a_launching_mode_with_work_left_prestarts(
    tmp_path: Path, mode: str, local: bool, dry_run: bool, shards: int, rows: int, skipped: str | None
) -> None:
    dataset = tmp_path / "d.jsonl"
    dataset.write_text("{}\n")
    cfg = ServerConfig.from_mapping(
        {
            "mode": mode,
            "model_path": "m",
            "prestart_rows": rows,
            **({"url": "http://h:1"} if mode == "external" else {}),
        }
    )
    reason = prestart_skip_reason(
        cfg, local=local, dry_run=dry_run, shards_to_generate=shards, dataset_path=str(dataset)
    )
    assert reason is None if skipped is None else skipped in str(reason)


def test_a_dataset_not_yet_fetched_prestarts_nothing() -> None:
    cfg = ServerConfig.from_mapping({"mode": "simulated", "model_path": "m", "prestart_rows": 1000})
    reason = prestart_skip_reason(
        cfg, local=True, dry_run=False, shards_to_generate=2, dataset_path="s3://b/d.jsonl"
    )
    assert reason is not None and "not a local file" in reason


def test_prestart_is_on_by_default_and_0_turns_it_off() -> None:
    cfg = ServerConfig.from_mapping({"mode": "simulated", "model_path": "m"})
    assert cfg.prestart_rows == 1000
    on = prestart_skip_reason(cfg, local=True, dry_run=False, shards_to_generate=2, dataset_path=__file__)
    assert on is None
    off = ServerConfig.from_mapping({"mode": "simulated", "model_path": "m", "prestart_rows": 0})
    assert "prestart_rows is 0" in str(
        prestart_skip_reason(off, local=True, dry_run=False, shards_to_generate=2, dataset_path=__file__)
    )


def test_a_first_pass_over_every_row_gives_the_audits_own_numbers(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    demo = yaml.safe_load((root / "config" / "demo.yaml").read_text())
    audit = AuditConfig.from_dict(demo["audit"] | {"decontamination": {"benchmarks": []}}, "last")
    dataset = DatasetConfig.from_dict(demo["dataset"])
    path, tokenizer = root / demo["dataset"]["path"], root / demo["tokenizer"]
    run_audit(path, tmp_path, dataset=dataset, config=audit, tokenizer_dir=tokenizer, progress=None)
    full = json.loads((tmp_path / "summary.json").read_text())
    every = first_pass_summary(path, audit, tokenizer, dataset, 1_000_000)
    few = first_pass_summary(path, audit, tokenizer, dataset, 20)
    for key in ("prompt_tokens_p50", "prompt_tokens_p99", "histograms", "total"):
        assert every[key] == full[key], key
    assert few["total"] < full["total"]
    assert few["histograms"] != full["histograms"]


def test_the_prestart_waits_until_its_supervisor_is_recorded(tmp_path: Path) -> None:
    """The prestart lock goes only once a started supervisor's pid is in the slot's url file (else a
    generate job finding no url file starts a second supervisor on the slot), or once it has exited."""
    import subprocess
    import sys
    import time

    from regen.layout.slots import SlotFiles
    from regen.serving.lifecycle import wait_until_recorded
    from regen.serving.procfs import UrlState, write_url_state

    files = SlotFiles.of(0, tmp_path, tmp_path)
    gone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    t = time.monotonic()
    wait_until_recorded(files, gone)  # never recorded: returns when it exits, not after the full wait
    assert gone.poll() is not None and time.monotonic() - t < 30
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        write_url_state(files.url, UrlState(alive.pid))
        t = time.monotonic()
        wait_until_recorded(files, alive)
        assert alive.poll() is None and time.monotonic() - t < 5
    finally:
        alive.kill()
        alive.wait()


def test_servers_started_for_the_plan_are_kept_where_the_run_is_small(tmp_path: Path) -> None:
    """A run too small for regen's plan keeps SGLang's defaults (regen.sglang.run_size), but servers this
    run already started with the plan have spent their start: the tune rule keeps them for it."""
    import os

    from regen.layout.run import RunLayout
    from regen.layout.slots import slurm_job_id
    from regen.tune.prestart import confirm_prestarted

    layout = RunLayout.under(tmp_path)
    layout.prestart_lock(slurm_job_id()).parent.mkdir(parents=True, exist_ok=True)
    layout.prestart_lock(slurm_job_id()).touch()
    full = PlanFile(("--disable-radix-cache", "--max-running-requests", "600"), "recommended", {}, {})
    record = ProvisionalPlan(full, "first pass over the dataset's first 50 rows", {}, os.getppid(), (0,))
    layout.provisional_plan.parent.mkdir(parents=True, exist_ok=True)
    record.write(layout.provisional_plan)
    defaults = PlanFile(("--enable-cache-report",), "recommended", {}, {})
    cfg = ServerConfig.from_mapping({"mode": "sglang", "model_path": "m", "args": []})
    stopped = confirm_prestarted(defaults, cfg, layout)
    assert stopped.prestart is not None and stopped.prestart["adopted"] is False
    assert stopped.launch_args == defaults.launch_args
    replanned = PlanFile(("--disable-radix-cache", "--max-running-requests", "620"), "recommended", {}, {})
    kept = confirm_prestarted(defaults, cfg, layout, started_plan=replanned)
    assert kept.prestart is not None and kept.prestart["adopted"] is True
    assert "spent their start" in kept.prestart["reason"] and kept.launch_args == full.launch_args
