"""Kill-anywhere soak: SIGKILL the whole workflow at random moments, rerun, and prove nothing is lost.

A *campaign* copies the workflow (Snakefile, rules, scripts, schemas, report, envs, config,
resources, data/demo) into a fresh directory and runs
``snakemake --cores N --configfile config/demo.yaml config/soak.yaml --rerun-incomplete --keep-going``
in a new process session. ``config/soak.yaml`` slows the simulated servers down (``token_rate``) so
generation takes seconds, injects server faults (HTTP 5xx, ``crash_after``, and stalls: a server that
stays up and generates nothing after ``stall_after_tokens``, which its supervisor must catch within
``server.stall_timeout_s``) and gives the job enough retries to ride out a server restart. Every
server appends to one request log (``REGEN_SIM_REQUEST_LOG``, see ``regen.simulated``) across
all its lifetimes.

A *round* is one Snakemake run: the harness picks (seeded RNG) a phase (generate, validate or
merge) and a delay, waits until Snakemake starts a job of that phase (or a later one), sleeps the
delay and sends SIGKILL to the whole process group (``os.killpg``). After every kill it checks that
every visible output file under ``results/`` is complete (Parquet opens, JSON/JSONL parse). The
next round unlocks and reruns. A run that completes before the kill ends the campaign; when rounds
remain, a new campaign starts.

Each campaign is then run to completion and checked:

- ``lost`` / ``duplicated``: every input id in exactly one bucket (``regen.output.reconcile``), and
  ``results/reconcile.json`` says ok;
- ``resent``: a chat request received for an id that was already in a journal before that run
  started (completed requests must never be sent again);
- no server process (supervisor or simulated server) is left running from the campaign directory
  once the supervisors' idle timeout has passed;
- ``stalls`` / ``stall_detect_max_s``: every stall injected and restarted by its supervisor, caught
  within ``server.stall_timeout_s`` plus one supervisor poll (``STALL_DETECT_SLACK_S`` more for a busy
  machine's scheduling), measured from the server's ``fault:stall`` event to its supervisor's restart
  record (``gpu{k}.restarts.jsonl``). A stalled server stopped for another reason first (its Snakemake
  killed) is counted but has no detection time.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

if __name__ == "__main__":  # run as a script (tests/support/soak.py): the checkout's bench is importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.workflow import copy_workflow, free_port_base
from regen.generate.journal import read_journal_entries
from regen.io import open_lines
from regen.layout.run import RunLayout
from regen.simulated.options import REQUEST_LOG_ENV
from regen.simulated.requestlog import read_request_log

REPO_ROOT = Path(__file__).resolve().parents[2]  # tests/support/soak.py
PHASES: tuple[str, ...] = ("generate", "validate", "merge")
RULE_LINE = re.compile(r"^(?:local)?rule (\w+):", re.MULTILINE)
REQUEST_LOG_NAME = "soak-requests.jsonl"
#: the supervisor looks at its server every 0.5 s (``regen.serving.supervisor --poll``)
SUPERVISOR_POLL_S = 0.5
#: scheduling slack on a loaded machine, beyond the stall timeout and one poll
STALL_DETECT_SLACK_S = 1.0
#: fake secrets put in every run's environment; no file the workflow writes may contain them
API_KEY_ENV = "REGEN_SOAK_API_KEY"
FAKE_SECRETS: dict[str, str] = {
    API_KEY_ENV: "sk-soak-FAKE-API-KEY-0c9b8a7d",
    "AWS_SECRET_ACCESS_KEY": "soak-FAKE-AWS-SECRET-1e2f3a4b",
}


@dataclass(frozen=True, slots=True)
class SoakOptions:
    """How hard and how long to soak."""

    rounds: int = 3
    seed: int = 0
    cores: int = 2
    base_dir: Path | None = None  # campaigns go here (a temp dir when None)
    source: Path = REPO_ROOT  # where the workflow is copied from
    token_rate: float = 150.0  # simulated decode tokens/s per request: generation takes seconds
    max_running_requests: int = 16
    error_rate: float = 0.03
    crash_after: int | None = 60  # completions per server lifetime before it exits
    #: tokens per server lifetime before it stalls: a little less than crash_after's 60 answers take, so
    #: most lifetimes that run long end in a stall, some (long answers) in a crash
    stall_after_tokens: int | None = 7000
    #: above the simulated server's 5 s decode-line interval, so only injected stalls are caught
    stall_timeout_s: float = 6.0
    idle_timeout_s: float = 8.0
    max_restarts: int = 50
    kill_delay_s: dict[str, float] = field(
        default_factory=lambda: {"generate": 4.0, "validate": 0.6, "merge": 0.6}
    )
    #: how often each phase is aimed at: generation holds the state that matters most (journals,
    #: servers), and a kill aimed at it lands later anyway once a campaign's generation is done
    phase_weights: dict[str, float] = field(
        default_factory=lambda: {"generate": 3.0, "validate": 1.0, "merge": 1.0}
    )
    run_timeout_s: float = 300.0
    finish_attempts: int = 4
    keep: bool = False  # keep campaign directories


@dataclass(slots=True)
class RoundResult:
    campaign: int
    phase: str
    delay_s: float
    killed: bool
    returncode: int | None
    resent: int
    half_written: list[str]
    wall_s: float


@dataclass(slots=True)
class CampaignResult:
    index: int
    directory: str
    rounds: list[RoundResult] = field(default_factory=list)
    input_count: int = 0
    lost: int = 0
    duplicated: int = 0
    unknown: int = 0
    resent: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    stalls: int = 0
    stall_detect_s: list[float] = field(default_factory=list)
    half_written: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


@dataclass(slots=True)
class SoakResult:
    campaigns: list[CampaignResult]

    @property
    def rounds(self) -> int:
        return sum(len(c.rounds) for c in self.campaigns)

    @property
    def kills(self) -> int:
        return sum(r.killed for c in self.campaigns for r in c.rounds)

    @property
    def lost(self) -> int:
        return sum(c.lost for c in self.campaigns)

    @property
    def duplicated(self) -> int:
        return sum(c.duplicated for c in self.campaigns)

    @property
    def resent(self) -> int:
        return sum(c.resent for c in self.campaigns)

    @property
    def faults(self) -> int:
        return sum(sum(c.faults.values()) for c in self.campaigns)

    @property
    def stalls(self) -> int:
        return sum(c.stalls for c in self.campaigns)

    @property
    def stall_detect_max_s(self) -> float | None:
        times = [t for c in self.campaigns for t in c.stall_detect_s]
        return max(times) if times else None

    @property
    def problems(self) -> list[str]:
        out = []
        for c in self.campaigns:
            out += [f"campaign {c.index}: {p}" for p in c.problems]
            out += [f"campaign {c.index}: half-written file taken as complete: {h}" for h in c.half_written]
            out += [f"campaign {c.index}: orphaned process: {o}" for o in c.orphans]
            if c.unknown:
                out.append(f"campaign {c.index}: {c.unknown} output ids not in the input")
        return out

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.resent or self.problems)

    def line(self) -> str:
        return (
            f"soak: {self.rounds} rounds, {self.lost} lost, {self.duplicated} duplicated, "
            f"{self.resent} resent, faults={self.faults} kills={self.kills} stalls={self.stalls} "
            f"stall_detect_max_s={'-' if (m := self.stall_detect_max_s) is None else f'{m:.1f}'}"
        )


# ------------------------------------------------------------------------------------- setup


def soak_config(opts: SoakOptions, port_base: int) -> dict[str, Any]:
    """The override config layered on config/demo.yaml."""
    faults: dict[str, Any] = {"error_rate": opts.error_rate, "seed": 7}
    if opts.crash_after:
        faults["crash_after"] = opts.crash_after
    if opts.stall_after_tokens:
        faults["stall_after_tokens"] = opts.stall_after_tokens
    return {
        "generate": {"max_attempts": 8, "backoff_base_s": 0.25, "request_timeout_s": 60},
        "server": {
            "api_key_env": API_KEY_ENV,
            "port_base": port_base,
            "idle_timeout_s": opts.idle_timeout_s,
            "max_restarts": opts.max_restarts,
            "stall_timeout_s": opts.stall_timeout_s,
            "simulated": {
                "token_rate": opts.token_rate,
                "max_running_requests": opts.max_running_requests,
                "startup_delay_s": 0.2,
                "faults": faults,
            },
        },
    }


class Campaign:
    """One copy of the workflow, run (and killed) until complete."""

    def __init__(self, index: int, root: Path, opts: SoakOptions, rng: random.Random) -> None:
        self.index = index
        self.root = root
        self.opts = opts
        self.rng = rng
        self.request_log = root / "work" / REQUEST_LOG_NAME
        self.result = CampaignResult(index=index, directory=str(root))
        copy_workflow(opts.source, root)
        (root / "config" / "soak.yaml").write_text(
            yaml.safe_dump(soak_config(opts, free_port_base(4, rng)), sort_keys=True)
        )
        self.env = dict(os.environ)
        bin_dir = str(Path(sys.executable).parent)
        self.env["PATH"] = bin_dir + os.pathsep + self.env.get("PATH", "")
        self.env[REQUEST_LOG_ENV] = str(self.request_log)
        self.env.update(FAKE_SECRETS)
        self.env.pop("CUDA_VISIBLE_DEVICES", None)
        self.run_no = 0
        self.last_returncode: int | None = None

    def snakemake_argv(self, *extra: str) -> list[str]:
        exe = Path(sys.executable).parent / "snakemake"
        return [
            str(exe) if exe.exists() else "snakemake",
            "--cores",
            str(self.opts.cores),
            "--configfile",
            "config/demo.yaml",
            "config/soak.yaml",
            *extra,
        ]

    def unlock(self) -> None:
        locks = self.root / ".snakemake" / "locks"
        if locks.is_dir() and any(locks.iterdir()):
            subprocess.run(
                self.snakemake_argv("--unlock"),
                cwd=self.root,
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=True,
                timeout=120,
            )

    # ------------------------------------------------------------------------- one run
    def run(self, phase: str | None, delay_s: float) -> RoundResult:
        """One Snakemake run; SIGKILL its process group ``delay_s`` after ``phase`` (or later) starts."""
        self.unlock()
        self.run_no += 1
        finished_before = journaled_ids(self.root / "work" / "journal")
        log_offset = self.request_log.stat().st_size if self.request_log.exists() else 0
        out_path = self.root / "logs" / f"soak-run{self.run_no:03d}.txt"
        out_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        killed = False
        with open(out_path, "wb") as out:
            proc = subprocess.Popen(
                self.snakemake_argv("--rerun-incomplete", "--keep-going"),
                cwd=self.root,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                kill_at: float | None = None
                deadline = t0 + self.opts.run_timeout_s
                while proc.poll() is None:
                    now = time.monotonic()
                    if phase is not None and kill_at is None and phase_started(out_path, phase):
                        kill_at = now + delay_s
                    if kill_at is not None and now >= kill_at:
                        kill_group(proc)
                        killed = True
                        break
                    if now > deadline:
                        kill_group(proc)
                        raise TimeoutError(f"soak: run {self.run_no} in {self.root} took over the limit")
                    time.sleep(0.02)
            finally:
                if proc.poll() is None:
                    kill_group(proc)
        if killed:  # the supervisors must notice that their owner is gone and exit on their own
            self.result.orphans += wait_no_servers(self.root, self.opts.idle_timeout_s + 15)
            self.result.orphans += [f"{p}: {a}" for p, a in processes_in(self.root)]
        resent = count_resent(self.request_log, log_offset, finished_before)
        half = incomplete_outputs(self.root / "results")
        result = RoundResult(
            campaign=self.index,
            phase=phase or "none",
            delay_s=round(delay_s, 3),
            killed=killed,
            returncode=None if killed else proc.returncode,
            resent=resent,
            half_written=half,
            wall_s=round(time.monotonic() - t0, 2),
        )
        self.result.resent += resent
        self.result.half_written += half
        return result

    def completed(self) -> bool:
        """The last run exited 0 on its own (every target done) and reconciled."""
        return self.last_returncode == 0 and (self.root / "results" / "reconcile.json").exists()

    # ------------------------------------------------------------------------- the end
    def finish(self) -> None:
        """Run to completion (a few plain reruns at most; they are not kill rounds), then check."""
        attempts = 0
        while not self.completed():
            if attempts >= self.opts.finish_attempts:
                self.result.problems.append(
                    f"the workflow did not complete in {attempts} final runs; "
                    f"see {self.root}/logs/soak-run*.txt"
                )
                break
            attempts += 1
            self.last_returncode = self.run(None, 0.0).returncode
        self.check()

    def check(self) -> None:
        from regen.output.reconcile import reconcile

        res = self.result
        results = self.root / "results"
        if (results / "audit" / "flags.parquet").exists() and (results / "dataset").is_dir():
            rec = reconcile(
                results / "audit" / "flags.parquet",
                results / "audit" / "excluded.jsonl"
                if (results / "audit" / "excluded.jsonl").exists()
                else None,
                sorted((results / "generations").glob("*.failed.jsonl")),
                RunLayout(results=results).quarantine_files(),
                results / "dataset",
                strict=False,
            )
            res.input_count = rec.input_count
            res.lost = len(rec.lost)
            res.duplicated = len(rec.duplicated)
            res.unknown = len(rec.unknown)
            if rec.input_duplicates:
                res.problems.append(f"duplicate input ids: {list(rec.input_duplicates[:5])}")
            res.duplicated += dataset_duplicate_ids(results / "dataset")
            table = results / "reconcile.json"
            if not table.exists() or not orjson.loads(table.read_bytes()).get("ok"):
                res.problems.append("results/reconcile.json is missing or not ok")
        else:
            res.problems.append("no audit flags or dataset: nothing to reconcile")
        res.half_written += incomplete_outputs(results)
        res.half_written = sorted(set(res.half_written))
        res.faults = count_faults(self.request_log)
        res.stalls, res.stall_detect_s = stall_detections(self.request_log, self.root / "work" / "servers")
        bound = self.opts.stall_timeout_s + SUPERVISOR_POLL_S + STALL_DETECT_SLACK_S
        late = [t for t in res.stall_detect_s if t > bound]
        res.problems += [f"a stall was caught after {t:.1f} s (bound {bound:.1f} s)" for t in late]
        res.orphans += wait_no_servers(self.root, self.opts.idle_timeout_s + 15)
        res.orphans += [f"{p}: {c}" for p, c in processes_in(self.root)]
        res.problems += [f"a secret leaked into {path}" for path in files_with_secrets(self.root)]


# ---------------------------------------------------------------------------------- checks


def phase_started(snakemake_out: Path, phase: str) -> bool:
    """True once Snakemake printed the start of a job of ``phase`` or of any later phase."""
    try:
        text = snakemake_out.read_text(errors="replace")
    except OSError:
        return False
    later = set(PHASES[PHASES.index(phase) :]) | {"reaudit", "reconcile", "report_assets"}
    return any(m in later for m in RULE_LINE.findall(text))


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the whole process group of ``proc`` (Snakemake and its jobs) and reap the leader."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _group_alive(proc.pid):
        time.sleep(0.02)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def journaled_ids(journal_dir: Path) -> set[str]:
    """Ids with a complete journal line (record or failure) in any shard journal."""
    ids: set[str] = set()
    for path in sorted(journal_dir.glob("*.jsonl")):
        ids.update(entry["id"] for entry in read_journal_entries(path))
    return ids


def count_resent(request_log: Path, offset: int, finished_before: set[str]) -> int:
    """Requests received after ``offset`` for ids that were already journaled before the run."""
    if not request_log.exists():
        return 0
    with open(request_log, "rb") as fh:
        fh.seek(offset)
        data = fh.read()
    n = 0
    for raw in data.splitlines():
        try:
            ev = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if ev.get("event") == "received" and ev.get("id") in finished_before:
            n += 1
    return n


def count_faults(request_log: Path) -> dict[str, int]:
    """Faults injected by every simulated server of a campaign, by kind."""
    counts: Counter[str] = Counter()
    for ev in read_request_log(request_log):
        event = str(ev.get("event", ""))
        if event.startswith("fault:"):
            counts[event.split(":", 1)[1]] += 1
    return dict(counts)


def stall_detections(request_log: Path, servers_dir: Path) -> tuple[int, list[float]]:
    """Stalls injected (``fault:stall`` events) and, for each one its supervisor restarted the server
    for, the seconds from the stall to the restart record (``regen.serving.progress``)."""
    from regen.layout.slots import restart_files
    from regen.serving.progress import read_restarts

    caught = {
        entry["server_pid"]: float(entry["at"])
        for path in restart_files(servers_dir)
        for entry in read_restarts(path)
        if "stalled" in str(entry.get("cause")) and entry.get("server_pid")
    }
    stalls = [ev for ev in read_request_log(request_log) if ev.get("event") == "fault:stall"]
    return len(stalls), [caught[ev["pid"]] - float(ev["t"]) for ev in stalls if ev.get("pid") in caught]


def incomplete_outputs(results: Path) -> list[str]:
    """Visible output files under ``results`` that do not read back completely."""
    import pyarrow.parquet as pq

    bad: list[str] = []
    if not results.is_dir():
        return bad
    for path in sorted(results.rglob("*")):
        if not path.is_file() or any(part.startswith(".") for part in path.relative_to(results).parts):
            continue
        try:
            if path.suffix == ".parquet":
                pq.read_table(path)
            elif path.name.endswith((".jsonl", ".jsonl.zst")):
                with open_lines(path) as lines:  # a torn compressed file fails to read back
                    data = b"".join(lines)
                if data and not data.endswith(b"\n"):
                    raise ValueError("no newline at the end")
                for line in data.splitlines():
                    if line.strip():
                        orjson.loads(line)
            elif path.suffix == ".json":
                orjson.loads(path.read_bytes())
        except Exception as exc:  # any failure to read back is what we are looking for
            bad.append(f"{path.relative_to(results)} ({type(exc).__name__}: {exc})"[:300])
    return bad


def files_with_secrets(root: Path) -> list[str]:
    """Files written by the workflow (results, logs, work, .snakemake) that contain a fake secret."""
    needles = [v.encode() for v in FAKE_SECRETS.values()]
    found = []
    for sub in ("results", "logs", "work", ".snakemake", "benchmarks"):
        base = root / sub
        if not base.is_dir():
            continue
        for path in base.rglob("*"):
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                if any(n in data for n in needles):
                    found.append(str(path.relative_to(root)))
    return sorted(found)


def dataset_duplicate_ids(dataset_dir: Path) -> int:
    """Ids present more than once in the merged dataset."""
    from regen.output.reconcile import read_output_ids

    counts = Counter(read_output_ids(dataset_dir))
    return sum(1 for n in counts.values() if n > 1)


def processes_in(root: Path) -> list[tuple[int, str]]:
    """(pid, argv) of live processes whose cwd or argv lies in ``root`` (a /proc scan)."""
    root_s = str(root.resolve())
    found: list[tuple[int, str]] = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if not argv or stat[stat.rindex(")") + 2] in "ZX":
            continue
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            cwd = ""
        if cwd == root_s or cwd.startswith(root_s + "/") or root_s in argv:
            found.append((pid, argv.strip()[:200]))
    return found


def server_processes_in(root: Path) -> list[tuple[int, str]]:
    """Supervisors and simulated servers started from ``root``."""
    return [(p, a) for p, a in processes_in(root) if "regen.sglang." in a]


def wait_no_servers(root: Path, timeout_s: float) -> list[str]:
    """Wait until no supervisor/server from ``root`` runs; what is left after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    left = server_processes_in(root)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = server_processes_in(root)
    return [f"{p}: {a}" for p, a in left]


def cleanup(root: Path) -> None:
    """SIGKILL whatever still runs from ``root`` (after a failed soak) and remove nothing else."""
    for pid, _ in processes_in(root):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


# ------------------------------------------------------------------------------------ driver


def run_soak(opts: SoakOptions, say: Any = None) -> SoakResult:
    """Run ``opts.rounds`` kill rounds over as many campaigns as needed; check each campaign."""
    import tempfile

    say = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
    rng = random.Random(opts.seed)
    own_base = opts.base_dir is None
    base = Path(tempfile.mkdtemp(prefix="regen-soak-")) if own_base else Path(opts.base_dir)  # type: ignore[arg-type]
    base.mkdir(parents=True, exist_ok=True)
    campaigns: list[CampaignResult] = []
    rounds = 0
    try:
        while rounds < opts.rounds:
            camp = Campaign(len(campaigns), base / f"campaign{len(campaigns):02d}", opts, rng)
            try:
                while rounds < opts.rounds:
                    phase = rng.choices(PHASES, weights=[opts.phase_weights[p] for p in PHASES])[0]
                    delay = rng.uniform(0.0, opts.kill_delay_s.get(phase, 1.0))
                    r = camp.run(phase, delay)
                    camp.last_returncode = r.returncode
                    camp.result.rounds.append(r)
                    rounds += 1
                    how = f"killed in {r.phase} +{r.delay_s:.2f}s" if r.killed else f"exit {r.returncode}"
                    say(
                        f"soak round {rounds}: campaign {camp.index} run {camp.run_no} {how} "
                        f"({r.wall_s:.1f}s, resent {r.resent}, half-written {len(r.half_written)})"
                    )
                    if not r.killed and r.returncode == 0 and camp.completed():
                        break
                camp.finish()
            finally:
                cleanup(camp.root)
            c = camp.result
            say(
                f"soak campaign {c.index}: {c.input_count} input ids, {c.lost} lost, "
                f"{c.duplicated} duplicated, {c.resent} resent, faults {c.faults}, "
                f"orphans {len(c.orphans)}, problems {c.problems}"
            )
            campaigns.append(c)
            if not opts.keep and not camp.result.problems and not c.lost and not c.duplicated:
                shutil.rmtree(camp.root, ignore_errors=True)
    finally:
        if own_base and not opts.keep:
            with contextlib.suppress(OSError):
                base.rmdir()  # only when every campaign was removed
    return SoakResult(campaigns)


def cli(argv: list[str]) -> int:
    """``python tests/support/soak.py --rounds 20 [--seed 0] [--keep --dir /tmp/soak]``: kill the demo
    workflow anywhere N times.

    Prints one line per round and campaign on stderr, then the summary on stdout, ending with exactly
    ``soak: N rounds, L lost, D duplicated, R resent, faults=F kills=K stalls=S stall_detect_max_s=T``
    (stalls injected; the longest time from a stall to its supervisor's restart). Exit status 1 if anything
    was lost, duplicated, re-sent after completion, half-written, leaked or left running."""
    p = argparse.ArgumentParser(prog="tests/support/soak.py", description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="Snakemake runs to kill (default 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the kill times and faults (default 0)")
    p.add_argument("--cores", type=int, default=2, help="snakemake --cores for each round (default 2)")
    p.add_argument("--dir", type=Path, default=None, help="where campaigns go (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep campaign directories")
    p.add_argument(
        "--token-rate",
        type=float,
        default=SoakOptions().token_rate,
        help="simulated decode tokens/s per request",
    )
    p.add_argument(
        "--error-rate",
        type=float,
        default=SoakOptions().error_rate,
        help="share of requests the simulated server answers with a 5xx",
    )
    p.add_argument(
        "--crash-after",
        type=int,
        default=SoakOptions().crash_after,
        help="the simulated server crashes after this many requests",
    )
    p.add_argument(
        "--stall-after-tokens",
        type=int,
        default=SoakOptions().stall_after_tokens,
        help="the simulated server stalls after generating this many tokens (0: never)",
    )
    p.add_argument(
        "--stall-timeout",
        type=float,
        default=SoakOptions().stall_timeout_s,
        help="server.stall_timeout_s: seconds without progress before a stalled server is restarted",
    )
    a = p.parse_args(argv)
    opts = SoakOptions(
        rounds=a.rounds,
        seed=a.seed,
        cores=a.cores,
        base_dir=a.dir,
        keep=a.keep,
        token_rate=a.token_rate,
        error_rate=a.error_rate,
        crash_after=a.crash_after or None,
        stall_after_tokens=a.stall_after_tokens or None,
        stall_timeout_s=a.stall_timeout,
    )
    result = run_soak(opts)
    for problem in result.problems:
        print(problem, file=sys.stderr)
    print(result.line())
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(cli(sys.argv[1:]))
