"""The workflow on a real multi-node Slurm (.ci/slurm-multinode-up.sh): two slurmd nodes, each in its own
network, UTS and mount namespace, 2 fake GPUs each, journals synced to S3 (SeaweedFS on the bridge).

* A node lost mid-generation (its slurmd and every process in its namespace SIGKILLed; Slurm marks it
  down): its group job is resubmitted by Snakemake (``retries``) and runs on the other node, the lost
  shards' journals come back from S3, the run completes, reconciliation is exact, nothing is duplicated
  and no sample already synced to S3 is sent again. On the way: the GPU group jobs ran on both nodes,
  each started ONE server that its shards reused (counted from the server logs; each member runs in a
  job step of its own, and where the cluster tracks processes by cgroup, the CI default, the server
  lives in the job's batch step through the profile's precommand: regen.serving.slothost), and the CPU
  rules ran on the submit host (they are ``localrules``): the only Slurm jobs are the group jobs.
* The controller lost mid-run (SIGKILL to the main snakemake): the same command, with no ``--unlock``
  (the rerun releases its dead controller's lock), neither duplicates nor orphans the group jobs still
  running: its own jobs wait for their journals (one writer per journal) and replay what they wrote;
  every sample is generated once.

Needs ``REGEN_TEST_SLURM_NODES`` >= 2 (set by .ci/run once the cluster is up) and the S3 test server
(``REGEN_TEST_S3_ENDPOINT``, reachable from the nodes); skipped otherwise. ``measurements/cluster-*.md``
keeps the measured line (``REGEN_CLUSTER_BENCH_OUT`` names a file to append it to).
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest
from support.workflow import copy_parts

from regen.layout.beside import attempt_logs
from regen.serving.procfs import SERVER_START_MARK
from regen.simulated.options import REQUEST_LOG_ENV
from regen.simulated.requestlog import read_request_log
from regen.storage import list_keys, s3_client, split_s3_uri

REPO_ROOT = Path(__file__).resolve().parents[2]
PROFILE = REPO_ROOT / "profiles" / "slurm-ci"
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
REGEN = str(Path(sys.executable).parent / "regen")
UP = REPO_ROOT / ".ci" / "slurm-multinode-up.sh"
PARTS = ("Snakefile", "rules", "scripts", "schemas", "report", "envs", "config", "resources", "data")
EVERY_RECORDS = 4
SHARDS = 4  # K = 2 (profiles/slurm-ci group-components): 2 group jobs, one on each node (CR_LLN)

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module", autouse=True)
def cluster() -> None:
    nodes = int(os.environ.get("REGEN_TEST_SLURM_NODES") or 0)
    if nodes < 2:
        pytest.skip("no multi-node test Slurm: set REGEN_TEST_SLURM_NODES=2 after .ci/slurm-multinode-up.sh")
    if shutil.which("sinfo") is None:
        pytest.skip("REGEN_TEST_SLURM_NODES is set but sinfo is not installed")
    assert len(idle_nodes()) >= 2, f"the cluster is not usable: {node_states()}"


def node_states() -> dict[str, str]:
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=30)
    return dict(line.split() for line in out.stdout.splitlines() if line.strip())


def idle_nodes() -> list[str]:
    return [n for n, st in node_states().items() if re.match(r"idle|mixed|allocated", st)]


def job_nodes() -> dict[str, tuple[str, str]]:
    """Slurm job id -> (state, node) for every job squeue still knows."""
    out = subprocess.run(
        ["squeue", "--states=all", "-h", "-o", "%i|%T|%N"], capture_output=True, text=True, check=True
    ).stdout
    return {i: (st, node) for i, st, node in (ln.split("|") for ln in out.splitlines() if ln)}


def job_times() -> dict[str, tuple[str, float, float]]:
    """Slurm job id -> (state, start, end) in epoch seconds (squeue's local times, second resolution)."""
    out = subprocess.run(
        ["squeue", "--states=all", "-h", "-o", "%i|%T|%S|%e"], capture_output=True, text=True, check=True
    ).stdout

    def epoch(stamp: str) -> float:
        try:
            return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))
        except ValueError:
            return float("nan")

    return {i: (st, epoch(a), epoch(b)) for i, st, a, b in (ln.split("|") for ln in out.splitlines() if ln)}


def workdir(path: Path, prefix: str, token_rate: int) -> Path:
    copy_parts(path, PARTS, missing_ok=True)
    (path / "config" / "cluster.yaml").write_text(
        f"""
shards: {{count: {SHARDS}}}
generate:
  journal_sync: {{s3_prefix: "{prefix}/run", every_records: {EVERY_RECORDS}, every_seconds: 0.5}}
server:
  simulated: {{token_rate: {token_rate}, faults: {{enabled: false}}}}  # not {{}}: merged into demo's rates
"""
    )
    return path


def snakemake_cmd(kill_after_s: int) -> list[str]:
    return [
        "timeout", "-s", "KILL", str(kill_after_s), SNAKEMAKE, "--profile", str(PROFILE),
        "--configfile", "config/demo.yaml", "config/cluster.yaml",
    ]  # fmt: skip


def synced_ids(prefix: str, shard: str | None = None) -> set[str]:
    """Sample ids in the S3 journal batches (of one shard, or all)."""
    client = s3_client()
    bucket = split_s3_uri(prefix)[0]
    ids: set[str] = set()
    where = f"{prefix}/run/journal" + (f"/{shard}" if shard else "")
    for key in list_keys(where):
        for line in client.get_object(Bucket=bucket, Key=key)["Body"].read().splitlines():
            try:
                ids.add(orjson.loads(line)["id"])
            except (orjson.JSONDecodeError, KeyError):
                continue
    return ids


def journal_holders(work: Path) -> dict[str, str]:
    """Shard -> host of the generate job that claimed its journal (the lock file names it)."""
    out = {}
    for lock in (work / "work" / "journal").glob("*.jsonl.lock"):
        try:
            out[lock.name.removesuffix(".jsonl.lock")] = orjson.loads(lock.read_bytes())["host"]
        except (OSError, orjson.JSONDecodeError, KeyError):
            continue
    return out


def server_starts(work: Path) -> dict[str, int]:
    """Slurm job -> server starts written in its server logs (``logs/servers/slurm-{job}/gpu*.log``)."""
    return {
        d.name.removeprefix("slurm-"): sum(
            log.read_text().count(SERVER_START_MARK) for log in d.glob("gpu*.log")
        )
        for d in (work / "logs" / "servers").glob("slurm-*")
    }


def server_pids(work: Path, job: str) -> set[int]:
    """The PIDs of the servers Slurm job ``job``'s supervisors started (its server logs)."""
    logs = (work / "logs" / "servers" / f"slurm-{job}").glob("gpu*.log")
    return {int(pid) for log in logs for pid in re.findall(r"\] server PID (\d+)", log.read_text())}


def shards_served(work: Path) -> dict[str, set[str]]:
    """Slurm job -> the shards whose generate job used its server (started or reused it): each supervisor
    PID's job from its server log, each shard's supervisor PIDs from its generate logs (a retried shard's
    log names both jobs' servers; a lost attempt's log, ``{shard}.attempt-N.log``, counts for its shard)."""
    job_of = {
        pid: d.name.removeprefix("slurm-")
        for d in (work / "logs" / "servers").glob("slurm-*")
        for log in d.glob("gpu*.log")
        for pid in re.findall(r"\[regen-supervisor gpu\d+ pid (\d+) ", log.read_text())
    }
    served: dict[str, set[str]] = {}
    for log in (work / "logs" / "generate").glob("*.log"):
        for pid in set(re.findall(r"server supervisor PID (\d+)", log.read_text())):
            if pid in job_of:
                served.setdefault(job_of[pid], set()).add(log.name.split(".")[0])
    return served


def restarts(work: Path) -> list[dict[str, object]]:
    found = []
    for f in (work / "work" / "servers").glob("slurm-*/gpu*.restarts.jsonl"):
        found += [orjson.loads(line) for line in f.read_bytes().splitlines() if line.strip()]
    return found


def shard_ids(work: Path, shard: str) -> set[str]:
    return set(
        pq.read_table(work / "results" / "shards" / f"{shard}.parquet", columns=["id"])
        .column("id")
        .to_pylist()
    )


def submitted_jobs(stderr: str) -> list[str]:
    return re.findall(r"has been submitted with SLURM jobid (\d+)", stderr)


def check_completed(work: Path) -> dict[str, object]:
    reconcile = orjson.loads((work / "results" / "reconcile.json").read_bytes())
    assert reconcile["ok"] and reconcile["lost_count"] == 0 and reconcile["duplicated_count"] == 0, reconcile
    cmd = [REGEN, "reconcile", "--results", "results", "--json"]
    cli = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stdout[-2000:] + cli.stderr[-2000:]
    assert orjson.loads(cli.stdout)["ok"]
    return reconcile


def regen_env(tmp_path: Path) -> dict[str, str]:
    """As from regen's activated environment (the profile's precommand, the slot host, runs its `python`),
    the simulated servers logging every request."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {
        **os.environ,
        REQUEST_LOG_ENV: str(tmp_path / "requests.jsonl"),
        "PYTHONUNBUFFERED": "1",
        "PATH": path,
    }


@pytest.fixture
def env(s3_prefix: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    yield regen_env(tmp_path)


def kill_node(node: str) -> float:
    """SIGKILL every process in the node's network namespace (its slurmd, jobs, servers); the time."""
    pids = subprocess.run(
        ["ip", "netns", "pids", f"regen-{node}"], capture_output=True, text=True
    ).stdout.split()
    t = time.time()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            continue
    return t


@pytest.fixture
def restore_nodes() -> Iterator[None]:
    yield
    subprocess.run(["bash", str(UP)], capture_output=True, timeout=120)  # slurmd again on the lost node


@pytest.mark.timeout(480)
def test_a_node_lost_mid_generation_costs_at_most_one_batch_per_shard(
    s3_prefix: str, tmp_path: Path, env: dict[str, str], restore_nodes: None
) -> None:
    work = workdir(tmp_path / "regen", s3_prefix, token_rate=250)
    started = time.time()
    with open(tmp_path / "snakemake.err", "w") as err_fh:
        proc = subprocess.Popen(
            snakemake_cmd(420), cwd=work, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
            stderr=err_fh,
        )  # fmt: skip
    # kill n1 once a shard of its own has two batches in S3
    lost: list[str] = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        on_n1 = [s for s, host in journal_holders(work).items() if host == "n1"]
        if on_n1 and len(synced_ids(s3_prefix, on_n1[0])) >= 2 * EVERY_RECORDS:
            lost = on_n1
            break
        time.sleep(0.5)
    assert lost, f"no shard of n1 got two batches into S3: {journal_holders(work)}"
    killed_at = kill_node("n1")
    # the node's own disk writes die with it: take the worst case, nothing of its journals survives
    for shard in lost:
        for f in (work / "work" / "journal").glob(f"{shard}.jsonl*"):
            f.unlink()
    time.sleep(1.0)  # an upload in flight at the kill may still land: count what S3 holds now
    synced = {s: synced_ids(s3_prefix, s) for s in lost}

    rc = proc.wait(timeout=420)
    err = (tmp_path / "snakemake.err").read_text()
    assert rc == 0, err[-6000:]
    reconcile = check_completed(work)
    assert node_states().get("n1", "").startswith("down"), node_states()

    events = read_request_log(tmp_path / "requests.jsonl")
    lost_ids = set().union(*(shard_ids(work, s) for s in lost))
    before = {e["id"] for e in events if e["t"] <= killed_at and e["event"] == "completed"} & lost_ids
    again = {e["id"] for e in events if e["t"] > killed_at and e["event"] == "received"} & lost_ids
    resent_synced = again & set().union(*synced.values())
    regenerated = before & again
    assert not resent_synced, f"{len(resent_synced)} samples synced to S3 before the loss were sent again"
    assert len(regenerated) <= EVERY_RECORDS * len(lost), (len(regenerated), lost)
    for shard in lost:  # the retried job put the lost journal together again from S3 alone
        restored = re.findall(r"restored from \S+: (\d+) batches, (\d+) lines added",
                              (work / "logs" / "generate" / f"{shard}.log").read_text())  # fmt: skip
        assert restored and int(restored[-1][1]) >= len(synced[shard]), (shard, restored)
        # the lost attempt's log is kept beside the retry's, which names it (Snakemake removed the rule's log)
        log = work / "logs" / "generate" / f"{shard}.log"
        kept_logs = attempt_logs(log)
        assert kept_logs and all(p.stat().st_size > 0 for p in kept_logs.values()), (shard, kept_logs)
        assert f"{shard}.attempt-1.log" in log.read_text(), log.read_text()[:2000]
    # one server start per group job (each ran 2 shards, the lost one fewer), on both nodes
    starts = server_starts(work)
    jobs = job_nodes()
    assert {jobs[j][1] for j in starts} == {"n1", "n2"}, {j: jobs[j] for j in starts}
    assert [jobs[j][0] for j in starts].count("NODE_FAIL") == 1, {j: jobs[j] for j in starts}
    assert sum(starts.values()) == len(starts) + len(restarts(work)), (starts, restarts(work))
    served = shards_served(work)  # K = 2: each group job that ran to the end served both its shards
    assert all(len(served.get(j, ())) == 2 for j in starts if jobs[j][0] == "COMPLETED"), (served, jobs)
    # CPU rules are localrules: the only Slurm jobs are the group jobs
    assert set(submitted_jobs(err)) == set(starts), (submitted_jobs(err), starts)
    # where the recovery time goes: Slurm calling the node down, then the resubmitted job's start
    times = {j: job_times()[j] for j in starts if j in job_times()}
    failed_at = min(end for st, _, end in times.values() if st == "NODE_FAIL")
    retry_at = min(start for _, start, _ in times.values() if start > killed_at)
    # served again: the first answer of a server of a group job started after the loss (the retry's; not
    # the other node's server, whose first answer can fall just after the loss)
    retried = {pid for j, (_, start, _) in times.items() if start > killed_at for pid in server_pids(work, j)}
    served_again = min(e["t"] for e in events if e["t"] > killed_at and e["event"] == "completed"
                       and e["id"] is not None and e["pid"] in retried)  # fmt: skip
    line = (
        f"cluster: nodes=2 shards={SHARDS} group_jobs={len(starts)} server_starts={sum(starts.values())} "
        f"node_lost_at_s={killed_at - started:.1f} recovered_s={served_again - killed_at:.1f} "
        f"node_fail_s={failed_at - killed_at:.0f} retry_started_s={retry_at - killed_at:.0f} "
        f"regenerated={len(regenerated)} lost={reconcile['lost_count']} "
        f"duplicated={reconcile['duplicated_count']}"
    )
    say_cluster_line(line)


@pytest.mark.timeout(480)
def test_the_controller_lost_mid_run_neither_duplicates_nor_orphans_running_jobs(
    s3_prefix: str, tmp_path: Path, env: dict[str, str]
) -> None:
    work = workdir(tmp_path / "regen", s3_prefix, token_rate=250)
    cmd = snakemake_cmd(420)[4:]  # SIGKILL goes to snakemake itself, not to a timeout wrapper
    with open(tmp_path / "first.err", "w") as err_fh:
        first = subprocess.Popen(cmd, cwd=work, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                                 stderr=err_fh)  # fmt: skip
    deadline = time.monotonic() + 240
    while (
        time.monotonic() < deadline
        and first.poll() is None
        and len(synced_ids(s3_prefix)) < 4 * EVERY_RECORDS
    ):
        time.sleep(0.5)
    assert first.poll() is None, "the first run ended before it could be killed mid-generation"
    first.send_signal(signal.SIGKILL)
    first.wait()
    err = (tmp_path / "first.err").read_text()
    left_running = {j for j in submitted_jobs(err) if job_nodes().get(j, ("",))[0] in {"RUNNING", "PENDING"}}
    assert left_running, "no group job was running when the controller was lost"

    # no --unlock: the rerun releases the lock of its provably dead controller (regen.run_marker)
    rerun = subprocess.run(snakemake_cmd(420), cwd=work, env=env, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr[-6000:]
    assert "released the Snakemake lock left by the run of" in rerun.stderr, rerun.stderr[-3000:]
    check_completed(work)

    jobs = job_nodes()
    assert all(jobs[j][0] == "COMPLETED" for j in left_running), {j: jobs[j] for j in left_running}
    ours = set(submitted_jobs(err)) | set(submitted_jobs(rerun.stderr))
    assert not {j for j in ours if jobs.get(j, ("",))[0] in {"RUNNING", "PENDING"}}, (
        "a group job outlived the run"
    )
    completed: dict[str, int] = {}
    for e in read_request_log(tmp_path / "requests.jsonl"):
        if e["event"] == "completed" and e["id"] is not None:  # None: the servers' readiness probes
            completed[e["id"]] = completed.get(e["id"], 0) + 1
    twice = {i for i, n in completed.items() if n > 1}
    assert not twice, f"{len(twice)} samples were generated twice"
    print(
        f"controller-lost: left_running={len(left_running)} "
        f"rerun_jobs={len(set(submitted_jobs(rerun.stderr)))} generated={len(completed)} twice=0"
    )


#: the demo's shards in group jobs of 3 (issue 58 item 2): 3 group jobs of 3, 3 and 2 members
GROUPED_SHARDS, PER_GROUP_JOB = 8, 3
#: the longest median gap between two members of a group job (the next member's first log line after the
#: previous one's last): the next member's srun, Snakemake start and generate script start
MEMBER_GAP_S = 5.0


def log_span(log: Path) -> tuple[float, float]:
    """Epoch seconds of a generate log's first and last stamped lines (``2026-12-05 13:04:10,328 ...``)."""
    stamps = [
        time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")) + int(line[20:23]) / 1000
        for line in log.read_text().splitlines()
        if re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", line)
    ]
    return stamps[0], stamps[-1]


def member_gaps(work: Path) -> dict[str, list[float]]:
    """Slurm job -> the gaps between its consecutive members, in the order they ran."""
    gaps = {}
    for job, shards in shards_served(work).items():
        spans = sorted(log_span(work / "logs" / "generate" / f"{s}.log") for s in shards)
        gaps[job] = [round(nxt[0] - prev[1], 2) for prev, nxt in itertools.pairwise(spans)]
    return gaps


@pytest.mark.timeout(300)
def test_the_demo_as_shipped_starts_one_server_per_group_job_and_its_members_back_to_back(
    tmp_path: Path,
) -> None:
    """8 shards, 3 per group job, the demo's own idle timeout (20 s) and faults: a group job's server lives
    until its last member is done (the supervisor watches the job's slurmstepd), so server starts equal
    group jobs; the next member starts within seconds of the last one's end."""
    work = copy_parts(tmp_path / "regen", PARTS, missing_ok=True)
    (work / "config" / "cluster.yaml").write_text(f"shards: {{count: {GROUPED_SHARDS}}}\n")
    profile = shutil.copytree(PROFILE, tmp_path / "profile")
    settings = profile / "config.v8+.yaml"
    text = settings.read_text()
    assert "group-components:\n  gpu: 2\n" in text, "the CI profile's group size moved: update this test"
    settings.write_text(
        text.replace("group-components:\n  gpu: 2\n", f"group-components:\n  gpu: {PER_GROUP_JOB}\n")
    )
    # both "nodes" share this machine's cores: the gap is only a cluster's where nothing else loads them
    load_before = os.getloadavg()[0]
    cmd = [SNAKEMAKE, "--profile", str(profile), "--configfile", "config/demo.yaml", "config/cluster.yaml"]
    run = subprocess.run(
        ["timeout", "-s", "KILL", "280", *cmd],
        cwd=work,
        env=regen_env(tmp_path),
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-6000:]
    check_completed(work)

    group_jobs = submitted_jobs(run.stderr)
    starts = server_starts(work)
    gaps = member_gaps(work)
    every_gap = sorted(g for job_gaps in gaps.values() for g in job_gaps)
    median = statistics.median(every_gap)
    line = (
        f"group-jobs: nodes=2 shards={GROUPED_SHARDS} per_group_job={PER_GROUP_JOB} "
        f"group_jobs={len(group_jobs)} "
        f"server_starts={sum(starts.values())} member_gaps_s={','.join(map(str, every_gap))} "
        f"median_gap_s={median:.2f} load_before={load_before:.1f}"
    )
    say_cluster_line(line)
    assert len(group_jobs) == -(-GROUPED_SHARDS // PER_GROUP_JOB), group_jobs
    assert set(starts) == set(group_jobs) and sum(starts.values()) == len(group_jobs), (starts, group_jobs)
    assert sorted(len(s) for s in shards_served(work).values()) == [2, 3, 3], shards_served(work)
    assert len(every_gap) == GROUPED_SHARDS - len(group_jobs), gaps
    if load_before < (os.cpu_count() or 1) / 2:  # else CPU starvation, not regen: measured, not asserted
        assert median <= MEMBER_GAP_S, line


def say_cluster_line(line: str) -> None:
    """A cluster test's measured line: printed, and appended to ``$REGEN_CLUSTER_BENCH_OUT`` when set."""
    print(line)
    out = os.environ.get("REGEN_CLUSTER_BENCH_OUT")
    if out:
        with open(out, "a") as fh:
            fh.write(line + "\n")
