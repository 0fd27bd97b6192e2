"""A generate job inside a Slurm job step starts its server's supervisor as a job step of its own
(``srun --overlap``): the member's step ends with the member, and on a cluster tracking processes by
cgroup everything in it dies then. Run for real in tests/workflow/test_slurm_multinode.py."""

from __future__ import annotations

import pytest

from regen.serving import slots
from regen.serving.slots import server_step_prefix, step_env


@pytest.fixture
def srun_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slots.shutil, "which", lambda name: f"/usr/bin/{name}")


def test_a_member_step_starts_the_server_as_an_overlapping_step_with_the_jobs_gpus(
    srun_on_path: None,
) -> None:
    prefix = server_step_prefix({"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURM_GPUS_ON_NODE": "1"}, 0)
    assert prefix[0] == "srun" and "--overlap" in prefix and "--jobid=42" in prefix
    assert "--gres=gpu:1" in prefix and "--ntasks=1" in prefix


@pytest.mark.parametrize(
    "env",
    [
        {},  # not in Slurm: a detached process, as on one node
        {"SLURM_JOB_ID": "42"},  # in the batch script itself: it lives as long as the job
        {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "batch"},
        {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "extern"},
    ],
)
def test_outside_a_job_step_the_supervisor_starts_as_before(srun_on_path: None, env: dict[str, str]) -> None:
    assert server_step_prefix(env, 0) == ()


def test_without_srun_the_supervisor_starts_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slots.shutil, "which", lambda name: None)
    assert server_step_prefix({"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0"}, 0) == ()


def test_the_new_step_does_not_inherit_the_member_steps_description() -> None:
    env = {
        "SLURM_JOB_ID": "42",
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_GPUS": "0",
        "SLURM_SRUN_COMM_PORT": "1",
        "PATH": "/bin",
    }
    assert step_env(env) == {"SLURM_JOB_ID": "42", "PATH": "/bin"}
