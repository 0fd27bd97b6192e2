"""Workflows through a real Slurm (.ci/slurm-multinode-up.sh, or the single-node .ci/slurm-up.sh) with
profiles/slurm-ci.

Needs ``REGEN_TEST_SLURM=1`` and a running cluster (``sinfo``); skipped otherwise. Each snakemake run
is wrapped in ``timeout -s KILL``: a Slurm status query that never succeeds would hang it for good.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.workflow import copy_parts

REPO_ROOT = Path(__file__).resolve().parents[2]
PROFILE = REPO_ROOT / "profiles" / "slurm-ci"
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module", autouse=True)
def slurm_cluster() -> None:
    if os.environ.get("REGEN_TEST_SLURM") != "1":
        pytest.skip("no test Slurm cluster: set REGEN_TEST_SLURM=1 after .ci/slurm-up.sh")
    if shutil.which("sinfo") is None:
        pytest.skip("REGEN_TEST_SLURM=1 but sinfo is not installed (run .ci/slurm-up.sh)")
    state = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    assert state.returncode == 0 and re.search(r"idle|mixed|allocated", state.stdout), (
        f"REGEN_TEST_SLURM=1 but the cluster is not usable: {state.stdout!r} {state.stderr!r}"
    )


def run_snakemake(workdir: Path, *args: str, kill_after_s: int) -> subprocess.CompletedProcess[str]:
    cmd = ["timeout", "-s", "KILL", str(kill_after_s), SNAKEMAKE, "--profile", str(PROFILE), *args]
    # as from regen's activated environment: the profile's precommand (the slot host) runs its `python`,
    # and stops the job when that is not regen's
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, env=env)


def slurm_jobs() -> dict[str, tuple[str, str]]:
    """Job id -> (name, state) for every job squeue still knows (finished ones for MinJobAge)."""
    out = subprocess.run(
        ["squeue", "--states=all", "-h", "-o", "%i|%j|%T"], capture_output=True, text=True, check=True
    ).stdout
    return {i: (name, st) for i, name, st in (line.split("|") for line in out.splitlines() if line)}


def job_gpus(job_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout
    m = re.search(r"TresPerJob=(\S+)", out)
    return m.group(1) if m else out


GROUP_SNAKEFILE = textwrap.dedent(
    """
    rule all:
        input: "out/collect.txt"

    rule generate:
        output: "out/gen{i}.txt"
        group: "gpu"
        resources: gpu=1
        shell: "echo $SLURM_JOB_ID $CUDA_VISIBLE_DEVICES > {output}"

    rule collect:
        input: expand("out/gen{i}.txt", i=range(2))
        output: "out/collect.txt"
        shell: "cat {input} > {output}; echo collect $SLURM_JOB_ID >> {output}"
    """
)


def test_two_gpu_shards_form_one_slurm_group_job_with_one_gpu(tmp_path: Path) -> None:
    (tmp_path / "Snakefile").write_text(GROUP_SNAKEFILE)
    proc = run_snakemake(tmp_path, kill_after_s=300)
    assert proc.returncode == 0, proc.stderr[-4000:]

    lines = (tmp_path / "out" / "collect.txt").read_text().split("\n")
    (job_a, gpu_a), (job_b, gpu_b) = (ln.split() for ln in lines[:2])
    collect_job = lines[2].split()[1]
    assert job_a == job_b, "both shards should run inside one Slurm group job"
    assert gpu_a == gpu_b and gpu_a in {"0", "1"}, "the group job holds exactly one GPU"
    assert collect_job != job_a
    jobs = slurm_jobs()
    assert jobs[job_a][1] == "COMPLETED" and jobs[collect_job][1] == "COMPLETED"
    assert "gpu:1" in job_gpus(job_a)  # sbatch --gpus=1, not the group's sum


DEMO_FILES = ("Snakefile", "rules", "scripts", "config", "schemas", "envs", "resources", "data", "regen")


def copy_demo(work: Path) -> Path:
    """The demo workflow's files, copied into ``work``."""
    return copy_parts(work, DEMO_FILES, missing_ok=True)


@pytest.mark.timeout(700)
def test_demo_workflow_runs_its_gpu_jobs_as_slurm_jobs(tmp_path: Path) -> None:
    missing = [name for name in (*DEMO_FILES[:3], "config/demo.yaml") if not (REPO_ROOT / name).exists()]
    if missing:
        pytest.skip(f"the demo workflow is not in the tree yet: missing {missing}")
    work = copy_demo(tmp_path / "regen")

    proc = run_snakemake(work, "--configfile", "config/demo.yaml", kill_after_s=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert (work / "results" / "READY.json").is_file()
    assert (work / "results" / "dataset" / "_manifest.json").is_file()

    submitted = re.findall(r"has been submitted with SLURM jobid (\d+)", proc.stderr)
    jobs = slurm_jobs()
    gpu_jobs = [j for j in set(submitted) if j in jobs and "gpu" in job_gpus(j)]
    assert gpu_jobs, f"no GPU Slurm job among {sorted(set(submitted))}: {proc.stderr[-3000:]}"
    assert all(jobs[j][1] == "COMPLETED" for j in gpu_jobs), {j: jobs[j] for j in gpu_jobs}
    shards = list((work / "results" / "generations").glob("*.jsonl"))
    assert shards, "no generation outputs"


@pytest.mark.timeout(300)
def test_auto_shard_count_is_refused_under_the_slurm_executor_before_any_job(tmp_path: Path) -> None:
    """``shards.count: auto`` takes one shard per GPU of one node; under the Slurm executor there is no
    such count, so the run stops while the DAG is built, before a job is submitted or a count written."""
    work = copy_demo(tmp_path / "regen")
    proc = run_snakemake(
        work, "--configfile", "config/demo.yaml", "--config", "shards={'count': 'auto'}", kill_after_s=240
    )
    assert proc.returncode != 0
    assert "on a cluster set shards.count to a number" in proc.stderr, proc.stderr[-3000:]
    assert "has been submitted with SLURM jobid" not in proc.stderr
    assert not (work / "work" / "plan" / "shards.json").exists()
