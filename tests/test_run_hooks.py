"""The run's lifecycle (regen.run_hooks) with a view of Snakemake's workflow that the test makes: what
each hook does in the main process and in a job's own Snakemake process, and that a dry run of the demo
imports no plotting library (every Snakemake start parses the Snakefile, a group member's too)."""

from __future__ import annotations

import copy
import os
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support.workflow import ROOT, SNAKEMAKE, copy_workflow

from regen.configfile import load_config
from regen.ingest.dataset import DatasetConfig
from regen.layout.names import shard_name
from regen.layout.run import RunLayout
from regen.run_hooks import JOBS_PER_GPU_SLOT, RunHooks, RunRefused, RunSetup
from regen.run_marker import RunMarker, new_marker
from regen.runconfig import RunConfig


@dataclass
class FakeWorkflow:
    """The little of Snakemake's workflow the lifecycle reads, as a test sets it."""

    is_main_process: bool = True
    dryrun: bool = False
    executor: str | None = "local"  # None: not known yet (while the Snakefile is parsed)
    jobs: list[Any] = field(default_factory=list)
    needrun: list[Any] = field(default_factory=list)
    gpu_counter: int | None = None

    def executor_known(self) -> bool:
        return self.executor is not None

    def local_exec(self) -> bool:
        return self.executor == "local"

    def all_jobs(self) -> list[Any]:
        return self.jobs

    def needrun_jobs(self) -> list[Any]:
        return self.needrun

    def set_gpu_counter(self, value: int) -> None:
        self.gpu_counter = value


def job(rule: str, outputs: list[Path], shard: str | None = None) -> SimpleNamespace:
    wildcards = {"shard": shard} if shard else {}
    return SimpleNamespace(rule=SimpleNamespace(name=rule), output=outputs, input=[], wildcards=wildcards)


def demo_config(**changes: Any) -> dict[str, Any]:
    config = load_config([ROOT / "config" / "config.yaml", ROOT / "config" / "demo.yaml"])
    for dotted, value in changes.items():
        *path, last = dotted.split(".")
        section = config
        for key in path:
            section = section[key]
        section[last] = value
    return config


def hooks(
    tmp_path: Path, view: FakeWorkflow, config: dict[str, Any] | None = None, gpus: int | None = None
) -> tuple[RunHooks, list[str]]:
    config = copy.deepcopy(config or demo_config())
    run = RunConfig.from_config(config, gpus)
    count = config["shards"]["count"]
    shards = tuple(shard_name(k) for k in range(count if isinstance(count, int) else run.gpu_slots))
    setup = RunSetup(
        config=config,
        run=run,
        dataset=DatasetConfig.from_dict(config["dataset"]),
        shards=shards,
        requested_gpus=gpus,
        configfiles=("config/demo.yaml",),
    )
    said: list[str] = []
    return RunHooks(setup, view, RunLayout.under(tmp_path), workdir=tmp_path, say=said.append), said


@pytest.fixture(autouse=True)
def _in_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the demo config's paths are the checkout's


def test_a_run_marks_its_start_and_end(tmp_path: Path) -> None:
    remade = tmp_path / "results" / "generations" / "00000.jsonl.zst"
    remade.parent.mkdir(parents=True)
    remade.write_text("an earlier attempt's")
    view = FakeWorkflow(
        dryrun=True,  # no server prestarted
        needrun=[job("generate", [remade], shard="00000")],
    )
    view.jobs = list(view.needrun)
    h, said = hooks(tmp_path, view)
    h.on_start()
    marker = RunMarker.read(h.layout.run_marker)
    assert marker is not None and marker.phase == "running" and marker.outcome is None
    assert marker.config == "demo" and marker.results_of is not None
    assert not remade.exists()  # what the run remakes is removed before it starts
    h.on_success()
    marker = RunMarker.read(h.layout.run_marker)
    assert marker is not None and (marker.phase, marker.outcome) == ("ended", "finished")
    assert not h.layout.failed_run_landing.exists()
    assert not any("NOT READY" in line for line in said)


def test_a_failed_preflight_ends_the_run_failed_with_its_page(tmp_path: Path) -> None:
    config = demo_config(**{"dataset.path": str(tmp_path / "missing.jsonl")})
    h, said = hooks(tmp_path, FakeWorkflow(dryrun=True), config)
    with pytest.raises(Exception, match=r"missing\.jsonl"):
        h.on_start()
    marker = RunMarker.read(h.layout.run_marker)
    assert marker is not None and marker.outcome == "failed"
    assert "NOT READY" in h.layout.failed_run_landing.read_text()
    assert any("NOT READY" in line for line in said)


def test_on_error_says_how_to_go_on_and_writes_the_page(tmp_path: Path) -> None:
    h, said = hooks(tmp_path, FakeWorkflow(dryrun=True))
    h.begin_run()
    h.on_error("logs/generate/00001.log")
    marker = RunMarker.read(h.layout.run_marker)
    assert marker is not None and marker.outcome == "failed"
    assert "logs/generate/00001.log" in h.layout.failed_run_landing.read_text()
    assert any("rerun" in line.lower() for line in said)


def test_a_jobs_own_snakemake_touches_nothing(tmp_path: Path) -> None:
    view = FakeWorkflow(is_main_process=False)
    h, said = hooks(tmp_path, view, gpus=2)
    h.at_dag()
    h.on_start()
    h.on_error("x.log")
    h.on_success()
    assert view.gpu_counter is None
    assert not h.layout.run_marker.exists() and not h.layout.failed_run_landing.exists()
    assert said == []


def test_a_local_run_widens_the_gpu_counter_a_cluster_run_does_not(tmp_path: Path) -> None:
    local = FakeWorkflow(dryrun=True)
    h, said = hooks(tmp_path, local, gpus=2)
    h.at_dag()
    assert local.gpu_counter == JOBS_PER_GPU_SLOT * 2
    assert any("gpu=" in line for line in said)
    cluster = FakeWorkflow(dryrun=True, executor="slurm")
    hooks(tmp_path, cluster, gpus=2)[0].at_dag()
    assert cluster.gpu_counter is None
    unset = FakeWorkflow(dryrun=True)
    hooks(tmp_path, unset)[0].at_dag()  # no --resources gpu=N: the counter is not Snakemake's to widen
    assert unset.gpu_counter is None


def test_shards_auto_is_refused_on_a_cluster(tmp_path: Path) -> None:
    config = demo_config(**{"shards.count": "auto"})
    with pytest.raises(RunRefused, match="auto"):
        hooks(tmp_path, FakeWorkflow(executor="slurm"), config)[0].at_dag()
    hooks(tmp_path, FakeWorkflow(dryrun=True), config)[0].at_dag()  # one node: settled by the run


def test_a_dead_controllers_lock_is_released_at_dag_time(tmp_path: Path) -> None:
    h, said = hooks(tmp_path, FakeWorkflow(dryrun=True))
    dead = subprocess.Popen(["true"])
    dead.wait()
    marker = new_marker("demo", "id", ["config/demo.yaml"], None, now=1.0)
    replace(marker, pid=dead.pid, pid_started=1.0).write(h.layout.run_marker)
    h.layout.snakemake_locks.mkdir(parents=True)
    lock = h.layout.snakemake_locks / "0.input.lock"
    lock.write_text("")
    os.utime(lock, (1.0, 1.0))  # taken before the dead run's last heartbeat: its own
    h.at_dag()
    assert not lock.exists()
    assert any("released the Snakemake lock" in line for line in said)


def test_a_dry_run_of_the_demo_imports_no_plotting_library(tmp_path: Path) -> None:
    """Nor what only a stage's job uses: the report's modules, the chat template's renderer (jinja2's
    sandbox) and the tokenizer, which every group member's Snakemake start would pay for (issue 58 item 2)."""
    wd = copy_workflow(tmp_path / "wf")
    run = subprocess.run(
        [SNAKEMAKE, "-n", "--configfile", "config/demo.yaml"],
        cwd=wd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"},
    )
    assert run.returncode == 0, "\n".join(x for x in run.stderr.splitlines() if "import time" not in x)
    imported = {
        line.rsplit("|", 1)[1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")
    }
    assert "regen.run_hooks" in imported  # the measurement sees the Snakefile's imports
    plotting = sorted(m for m in imported if m.split(".")[0] in {"matplotlib", "seaborn", "plotly", "altair"})
    assert plotting == [], plotting
    stage_only = sorted(
        m
        for m in imported
        if m.split(".")[0] == "tokenizers" or m == "regen.chat" or m.startswith("regen.observe")
    )
    assert stage_only == [], stage_only
