"""Every attempt's log is kept (issue 58 item 7): Snakemake removes a job's log before it runs the job again
(a retry after a lost Slurm node), so ``regen.runlog.log_to`` gives each attempt a second name for its log
and drops it when the attempt finishes. Run through real Snakemake with ``retries: 2``: attempt 1 is killed
(as a lost node's job), attempt 2 fails, attempt 3 finishes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from regen.layout.beside import attempt_log, attempt_logs

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))

SNAKEFILE = """
rule job:
    output: "out.txt"
    log: "logs/generate/00003.log"
    retries: 2
    script: "job.py"
"""

JOB = """
import os, signal
from pathlib import Path
from regen.runlog import log_to
counter = Path("attempts.txt")
n = int(counter.read_text()) + 1 if counter.exists() else 1
counter.write_text(str(n))
log = log_to(snakemake.log[0])
log.info("attempt %d says hello", n)
if n == 1:
    os.kill(os.getpid(), signal.SIGKILL)  # as a job on a lost node: no exit code runs
if n == 2:
    raise RuntimeError("attempt 2 fails")
Path(snakemake.output[0]).write_text("done")
"""


def test_each_attempt_s_log_is_kept_and_the_last_names_them(tmp_path: Path) -> None:
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    (tmp_path / "job.py").write_text(JOB)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [SNAKEMAKE, "--cores", "1", "-q"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-3000:]
    log = tmp_path / "logs" / "generate" / "00003.log"
    kept = attempt_logs(log)
    assert list(kept) == [1, 2], sorted(p.name for p in log.parent.iterdir())
    assert kept[1] == attempt_log(log, 1) and kept[1].name == "00003.attempt-1.log"
    assert "attempt 1 says hello" in kept[1].read_text()
    second = kept[2].read_text()
    assert "attempt 2 says hello" in second and "RuntimeError: attempt 2 fails" in second
    last = log.read_text()
    assert "attempt 3 says hello" in last and "attempt 2" not in last.replace("attempt-2", "")
    assert "earlier attempts of this job did not finish" in last
    assert str(Path("logs/generate/00003.attempt-1.log")) in last and "00003.attempt-2.log" in last
    # the finished attempt drops its second name: the rule's log is its one name
    assert os.stat(log).st_nlink == 1
