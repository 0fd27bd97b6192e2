"""The Slurm profiles' precommand fails loudly when `python` is not regen's (issue 58 item 7): it runs in each
group job's batch step before the job's own snakemake (joined by ``&&``, as the executor joins them), so a
`python` without regen stops the job with "No module named regen" in its Slurm log instead of letting it
run on with one model load per member; with regen's `python`, outside a Slurm job, it does nothing and the
job runs. Without Slurm: the precommand text from each profile, run by ``sh`` as the batch script would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PROFILES = sorted(ROOT.glob("profiles/*/config.v8+.yaml"))


def precommand(profile: Path) -> str:
    text = yaml.safe_load(profile.read_text()).get("precommand")
    assert text, f"{profile}: no precommand"
    return str(text)


def batch_step(
    command: str, python_dir: Path, cwd: Path, pythonpath: str | None
) -> subprocess.CompletedProcess[str]:
    """``PRECOMMAND && echo the job snakemake runs``, with ``python_dir`` first on PATH and no Slurm job."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "PYTHONPATH"}
    env["PATH"] = f"{python_dir}{os.pathsep}{env.get('PATH', '')}"
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    script = f"{command} && echo the job snakemake runs"
    return subprocess.run(["sh", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def other_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `python` that is not regen's: a fresh venv of the same interpreter, without regen."""
    venv = tmp_path_factory.mktemp("other") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    return venv / "bin"


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.parent.name)
def test_a_python_that_is_not_regen_s_stops_the_job_loudly(
    profile: Path, other_python: Path, tmp_path: Path
) -> None:
    run = batch_step(precommand(profile), other_python, tmp_path, None)
    assert run.returncode != 0 and "the job snakemake runs" not in run.stdout
    assert "No module named" in run.stderr and "regen" in run.stderr, run.stderr


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.parent.name)
def test_regen_s_python_outside_a_slurm_job_lets_the_job_run(profile: Path, tmp_path: Path) -> None:
    run = batch_step(precommand(profile), Path(sys.executable).parent, tmp_path, str(ROOT))
    assert run.returncode == 0, run.stderr
    assert "the job snakemake runs" in run.stdout and "not in a Slurm job" in run.stderr
