"""Any sequence of runs in one checkout keeps every READY dataset and tells the truth about the current run
(issue 47 item 2): a seeded generator draws steps (run config A, B that fails its re-audit, C that fails
its audit; change a deciding key; change an operational key; kill -9 the controller only, or the whole
process group, mid-generate, and rerun; Ctrl-C mid-generate and rerun; kill -9 the controller the moment
a generate job is launched (issue 58 item 8: the orphaned job stops before it starts a server or sends a
request, and says so in its log), and rerun; ``--until shard``;
``snakemake -n``; ``--report``; and ``generate.variants`` changes (issue 52): add a variant, remove one,
change one's temperature, raise or lower one's ``n``, switch one's thinking on/off), and after every step
checks:

- every dataset ever declared READY still exists, unchanged, in place or where the console said it was
  kept (unless the console said it removed that kept copy: ``keep.earlier_runs``), and
  ``regen reconcile --results`` there, with no config (as the console prints it), says ok;
- at most ``keep.earlier_runs`` runs are kept, and no content twice among them (one inode per content);
- a READY in ``results/`` is the current config's; ``regen status`` names the current config's run and
  says it ended (or, right after a kill, that it is dead);
- no request was generated twice (no request fingerprint journaled twice);
- after a successful run nothing is lost (``regen reconcile``: every input id in exactly one place);
- a READY dataset kept elsewhere still holds the records it held when it was declared;
- a READY in ``results/`` holds exactly one record per (sample_id, variant, k) of every configured variant
  and k < n (none of a removed variant, none at k >= n), each variant's records under one settings
  fingerprint of their own whose settings (variant, temperature, thinking) are the variant's current ones;
- across steps between READY datasets, a variant whose deciding settings did not change keeps its
  fingerprint and its completions (same text and seed, none sent to a server during the step: the
  simulated servers log every request), and one whose settings changed has a new fingerprint.

Small (24 conversations the test writes, 2 shards, simulated servers): ``SEQUENCES`` sequences of
``STEPS`` steps (plus, before a drawn ``remove variant`` with none configured, an ``add variant``), a
few minutes on 2 cores. ``REGEN_RUN_SEQUENCES=seed,seed,...`` and
``REGEN_RUN_SEQUENCE_STEPS`` draw others. A failure prints the seed and the steps so far.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from support.soak import phase_started, processes_in, server_processes_in
from support.workflow import ROOT, SNAKEMAKE, copy_workflow, dataset_records, free_port_base, regen, snakemake

from bench.workflow import write_chats
from regen.generate.journal import RECORD, read_heads
from regen.layout.run import RunLayout
from regen.output.kept_runs import KeepConfig, kept_runs
from regen.simulated.options import REQUEST_LOG_ENV

pytestmark = pytest.mark.slow

ROWS = 24
#: CI's seeds: between them they draw every kind of step at least once, and their ``variant n`` steps both
#: raise and lower an n (test_the_generator_draws_every_kind_of_step); in ten steps each, as no pair of seeds
#: below 3,000 draws all 16 kinds in nine
CI_SEEDS = (6, 1822)
CI_STEPS = 10
SEEDS = [int(s) for s in os.environ.get("REGEN_RUN_SEQUENCES", "").split(",") if s.strip()] or list(CI_SEEDS)
STEPS = int(os.environ.get("REGEN_RUN_SEQUENCE_STEPS", str(CI_STEPS)))
KEPT = re.compile(
    r"regen: the earlier (?:READY )?run of (?:config \S+|an earlier config) "
    r"is (?:already )?kept whole(?:, file for file,)? in (\S+) "
)
#: the console line of kept runs pruned to keep.earlier_runs, followed by one "  folder" line each
PRUNED = re.compile(r"\(keep\.earlier_runs\): removed \d+ older kept cop\w+.*\n((?:  \S+\n?)+)")
#: keep.earlier_runs: its default (the workflow's onstart passes the config's to settle_outputs)
KEEP_LAST = KeepConfig.from_dict(None).earlier_runs
GENERATING = re.compile(r"regen: shard \d+: \d+ replayed from the journal, [1-9]\d* to generate")
CONFIG_FILES = {
    "A": (),
    "B": ("config/b_reaudit_fails.yaml",),
    "C": ("config/c_audit_fails.yaml",),
}
STEP_KINDS = (
    "run A",
    "run B",
    "run C",
    "deciding key",
    "operational key",
    "kill controller",
    "kill group",
    "ctrl-c",
    "kill at launch",
    "until shard",
    "dry run",
    "report",
)
VARIANT_KINDS = (
    "add variant",
    "remove variant",
    "variant sampling",
    "variant n",
    "variant thinking",
)
STEP_KINDS += VARIANT_KINDS
KILL_KINDS = ("kill controller", "kill group", "ctrl-c", "kill at launch")
#: how soon after a kill -9 of its controller ``regen status`` says a run is DEAD, and its generate jobs end
STATUS_DEAD_S = 10.0
JOBS_STOP_S = 20.0
#: how often "kill at launch" looks for the run's first generate job (to kill its controller before the
#: job's first line)
LAUNCH_POLL_S = 0.05
#: what a generate job logs when it finds its controller gone before it starts a server or sends a request
#: (``regen.runlog.stop_if_controller_gone``)
STOPPED_BEFORE_WORK = "stopping this job before it starts work"
SAMPLE_IDS = [f"seq-{i:03d}" for i in range(ROWS)]
#: generate.sampling.temperature's schema default, and the demo's non_thinking override (thinking-off requests
#: of a variant without its own temperature send it)
BASE_TEMPERATURE = 0.6
NON_THINKING_TEMPERATURE = 0.7
Completion = tuple[str, str, int]  # (sample_id, variant, k)


@dataclass
class SeqVariant:
    """One entry of ``generate.variants`` as the sequence configured it."""

    name: str
    n: int = 1
    temperature: float | None = None
    thinking: str | None = None  # "on" / "off"; None: generate.thinking's, which is on

    @property
    def mode(self) -> str:
        return self.thinking or "on"

    def decides(self, base: float, seed: int) -> tuple[str, float, str, int]:
        """What decides its completions' answers under generate.sampling's ``base`` temperature and ``seed``
        (``n`` does not: it adds or drops completions)."""
        return (self.name, base if self.temperature is None else self.temperature, self.mode, seed)

    def config(self) -> dict[str, object]:
        own = {"temperature": self.temperature, "thinking": self.thinking}
        return {"name": self.name, "n": self.n, **{k: v for k, v in own.items() if v is not None}}

    def describe(self) -> str:
        own = "" if self.temperature is None else f"@{self.temperature}"
        return f"{self.name}{own}:{self.mode}:n{self.n}"


@dataclass
class Variants:
    """The sequence's ``generate.variants`` (empty: none configured, the one implicit ``default``) and how a
    variant step changes them: deterministically, so :func:`draw` replays the steps it drew to put before
    one what it needs (a variant to remove)."""

    configured: list[SeqVariant] = field(default_factory=list)
    changes: int = 0  # variant steps so far: which variant a step picks, new names and temperatures

    def effective(self) -> list[SeqVariant]:
        return [SeqVariant(**vars(v)) for v in self.configured] or [SeqVariant("default")]

    def key(self) -> str:
        """The variants' part of a config key (what decides the dataset, ``n`` included)."""
        return ",".join(v.describe() for v in self.effective())

    def needs(self, kind: str) -> str | None:
        """The variant step ``kind`` needs first, if any."""
        if kind == "remove variant" and not self.configured:
            return "add variant"
        return None

    def apply(self, kind: str) -> None:
        assert self.needs(kind) is None, kind
        self.changes += 1
        vs = self.effective()
        rotated = vs[self.changes % len(vs) :] + vs[: self.changes % len(vs)]
        pick = rotated[0]
        new_temperature = round(1.0 + 0.01 * self.changes, 2)  # never used before (hot.yaml's are below 1)
        if kind == "add variant":  # with two completions while no other variant has more than one
            n = 1 if any(v.n > 1 for v in vs) else 2
            vs.append(SeqVariant(f"v{self.changes}", n=n, temperature=new_temperature))
        elif kind == "remove variant":  # the last one gone: back to no variants, the implicit default
            vs.remove(pick)
        elif kind == "variant sampling":
            pick.temperature = new_temperature
        elif kind == "variant n":  # one with n above 1 gets one completion fewer, another one more
            lower = next((v for v in rotated if v.n > 1), None)
            raise_ = [v for v in rotated if v is not lower][:1]
            for v in raise_:
                v.n += 1
            if lower is not None:
                lower.n -= 1
        elif kind == "variant thinking":
            pick.thinking = "off" if pick.mode == "on" else "on"
        else:  # pragma: no cover - VARIANT_KINDS lists every kind
            raise AssertionError(kind)
        self.configured = vs


@dataclass
class Snapshot:
    """A READY dataset in results/ after a step: its records by completion, under which variants."""

    records: dict[Completion, dict[str, object]]
    variants: list[SeqVariant]
    base: float
    seed: int


@dataclass
class Ready:
    """One dataset declared READY: by which config, where it is now, and its READY.json."""

    config: str
    where: Path  # a results directory: the checkout's, or a kept earlier run's
    ready: str
    completions: frozenset[Completion]  # its dataset's records, when it was declared
    variants: str  # the generate.variants its run had, as config/variants.yaml said them ("": none)


@dataclass
class Sequence:
    """One checkout and what a user was told in it."""

    wd: Path
    config: str = "A"
    temperature: int = 0  # 0: the demo's; n: config/hot.yaml's n-th new temperature
    seed: int = 0  # generate.sampling.seed (config/hot.yaml's, with a new temperature)
    ops: bool = False
    started: str | None = None  # the config key of the last run that started (not -n, not --report)
    readies: list[Ready] = field(default_factory=list)
    history: list[str] = field(default_factory=list)
    temperatures: int = 0  # how many new temperatures were drawn
    variants: Variants = field(default_factory=Variants)
    snapshot: Snapshot | None = None  # the last READY dataset in results/ a step ended with
    keys: list[str] = field(default_factory=list)  # the config keys of every run that started

    @property
    def requests(self) -> Path:
        """The simulated servers' request log (``REQUEST_LOG_ENV``, set by the test)."""
        return self.wd.parent / "requests.jsonl"

    @property
    def layout(self) -> RunLayout:
        return RunLayout.under(self.wd)

    def key(self) -> str:
        variants = f"+v{self.variants.key()}" if self.variants.configured else ""
        seed = f"s{self.seed}" if self.seed else ""
        return f"{self.config}+t{self.temperature}{seed}{variants}{'+ops' if self.ops else ''}"

    @staticmethod
    def decides(key: str) -> str:
        """A config key less what decides nothing (operational keys; variants that say what no variants
        say: the one default, n 1, generate.sampling's own)."""
        return key.removesuffix("+ops").replace(f"+v{Variants().key()}", "")

    def base_temperature(self) -> float:
        return BASE_TEMPERATURE if self.temperature == 0 else round(0.9 + 0.01 * self.temperature, 2)

    def name(self) -> str:
        return self.name_of(self.key())

    @staticmethod
    def name_of(key: str) -> str:
        """The run's name as the run marker gives it (its config files' stems) for a config key."""
        files = ["demo", "base", *(Path(f).stem for f in CONFIG_FILES[key[0]])]
        files += ["hot"] * ("+t0" not in key) + ["variants"] * ("+v" in key) + ["ops"] * ("+ops" in key)
        return "+".join(files)

    def argv(self) -> list[str]:
        files = ["config/demo.yaml", "config/base.yaml", *CONFIG_FILES[self.config]]
        files += ["config/hot.yaml"] * (self.temperature > 0)
        files += ["config/variants.yaml"] * bool(self.variants.configured) + ["config/ops.yaml"] * self.ops
        return ["--configfile", *files]

    # ------------------------------------------------------------------------------- runs --
    def run(
        self, *extra: str, on_start: Callable[[], None] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """The run in the foreground; ``on_start`` is called the moment its Snakemake process exists."""
        self.started = self.key()
        self.keys.append(self.started)
        if on_start is None:
            done = snakemake(self.wd, "--cores", "2", *self.argv(), *extra, timeout=600)
        else:
            argv = [SNAKEMAKE, "--cores", "2", *self.argv(), *extra]
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            with subprocess.Popen(argv, cwd=self.wd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) as proc:  # fmt: skip
                on_start()
                out, err = proc.communicate(timeout=600)
            done = subprocess.CompletedProcess(argv, proc.returncode, out, err)
        self.saw(done.stderr + done.stdout)
        if done.returncode == 0 and not extra:
            self.declared_ready()
        return done

    def saw(self, console: str) -> None:
        """What the console said was kept whole (the READY in results/ moved there) and which older kept
        copies it said it removed (keep.earlier_runs: no longer followed)."""
        for block in PRUNED.findall(console):
            for folder in ((self.wd / line.strip()).resolve() for line in block.splitlines() if line.strip()):
                assert not folder.exists(), f"the console said {folder} was removed"
                self.readies = [r for r in self.readies if not r.where.is_relative_to(folder)]
        for where in KEPT.findall(console):
            kept = (self.wd / where).resolve()
            for r in self.readies:
                kept_ready = kept / "READY.json"
                if (
                    r.where == self.layout.results.resolve()
                    and kept_ready.is_file()
                    and kept_ready.read_text() == r.ready
                ):
                    r.where = kept

    def declared_ready(self) -> None:
        ready = self.layout.ready
        assert ready.is_file(), "a successful run declares READY"
        text = ready.read_text()
        if not any(r.where == self.layout.results.resolve() and r.ready == text for r in self.readies):
            self.readies = [r for r in self.readies if r.where != self.layout.results.resolve()]
            completions = frozenset(dataset_rows(self.layout.results / "dataset"))
            variants = self.variants_file.read_text() if self.variants.configured else ""
            self.readies.append(Ready(self.key(), self.layout.results.resolve(), text, completions, variants))

    def start(self) -> tuple[subprocess.Popen[bytes], Path]:
        """A run in the background, its console in a file, once it generates."""
        proc, out = self.launch()
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            if phase_started(out, "generate") and GENERATING.search(out.read_text(errors="replace")):
                break  # a generate job said it has answers to generate
            time.sleep(0.2)
        time.sleep(1.0)  # mid-generate
        return proc, out

    def launch(self) -> tuple[subprocess.Popen[bytes], Path]:
        """A run in the background, in a session of its own, its console in a file."""
        self.started = self.key()
        self.keys.append(self.started)
        out = self.wd / f"console-{len(self.history)}.txt"
        with out.open("wb") as fh:
            proc = subprocess.Popen(
                [SNAKEMAKE, "--cores", "2", *self.argv()],
                cwd=self.wd,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        return proc, out

    def await_generate_job(self, proc: subprocess.Popen[bytes], timeout_s: float = 240) -> bool:
        """Whether a generate job's process of the run ``proc`` exists, looked for every ``LAUNCH_POLL_S``
        until it does, the run ends or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and time.monotonic() < deadline:
            if self.generate_jobs():
                return True
            time.sleep(LAUNCH_POLL_S)
        return False

    def new_temperature(self, reseed: bool = False) -> None:
        """A sampling temperature no run here used yet (a deciding key: every answer of a variant without a
        temperature of its own regenerates); ``reseed``: a new base seed too (every answer regenerates)."""
        self.temperatures += 1
        self.temperature = self.temperatures
        self.seed = self.temperature if reseed else self.seed
        seed = f", seed: {self.seed}" if self.seed else ""
        (self.wd / "config" / "hot.yaml").write_text(
            f"generate: {{sampling: {{temperature: {self.base_temperature():.2f}{seed}}}}}\n"
        )

    @property
    def variants_file(self) -> Path:
        return self.wd / "config" / "variants.yaml"

    def change_variants(self, kind: str) -> None:
        self.variants.apply(kind)
        generate = {"variants": [v.config() for v in self.variants.configured]}
        self.variants_file.write_text(yaml.safe_dump({"generate": generate}))

    def generate_jobs(self) -> list[tuple[int, str]]:
        return [(p, a) for p, a in processes_in(self.wd) if "generate.py" in a]

    def requests_mark(self) -> int:
        return self.requests.stat().st_size if self.requests.exists() else 0

    def sent_since(self, mark: int) -> set[Completion]:
        """The completions the servers were asked for since ``mark``, by their request ids (the record's id:
        the sample id alone with one variant of n 1, else ``{sample_id}/{variant}/{k}``)."""
        if not self.requests.exists():
            return set()
        with self.requests.open("rb") as fh:
            fh.seek(mark)
            events = [json.loads(line) for line in fh.read().splitlines() if line.strip()]
        now = self.variants.effective()
        sole = now[0].name if len(now) == 1 and now[0].n == 1 else "default"
        sent: set[Completion] = set()
        for e in events:
            rid = e.get("id")
            if e.get("event") != "received" or not rid:
                continue
            sid, variant, k = rid.rsplit("/", 2) if "/" in rid else (rid, sole, "0")
            sent.add((sid, variant, int(k)))
        return sent


def dataset_rows(dataset: Path) -> dict[Completion, dict[str, object]]:
    """A merged dataset's records by completion (each completion once: a second record fails here)."""
    columns = ("sample_id", "variant", "k", "seed", "temperature", "thinking", "settings_fingerprint")
    rows = dataset_records(dataset, *columns)
    by: dict[Completion, dict[str, object]] = {}
    for r in rows:
        key = (r["sample_id"], r["variant"], r["k"])
        assert key not in by, f"{dataset}: two records of {key}"
        by[key] = r
    return by


def setup_checkout(root: Path) -> Sequence:
    wd = copy_workflow(root / "wf")
    shutil.copytree(ROOT / "profiles", wd / "profiles")  # as a checkout has it: rerun-incomplete, keep-going
    write_chats(
        wd / "data" / "seq.jsonl",
        (
            (
                f"seq-{i:03d}",
                f"Item {i}: explain why {i} + {i + 5} is {2 * i + 5}.",
                f"Because {i} plus {i + 5} makes {2 * i + 5}.",
            )
            for i in range(ROWS)
        ),
    )
    faults = "{error_rate: 0, think_leak_rate: 0, empty_answer_rate: 0, noncanonical_rate: 0}"
    (wd / "config" / "base.yaml").write_text(
        "dataset: {path: data/seq.jsonl}\n"
        "audit: {decontamination: {benchmarks: []}}\n"
        "shards: {count: 2}\n"
        "export: {enabled: true, eval_fraction: 0.1}\n"
        f"server: {{port_base: {free_port_base()}, idle_timeout_s: 30, "
        f"simulated: {{token_rate: 150, max_running_requests: 4, faults: {faults}}}}}\n"
    )
    (wd / "config" / "b_reaudit_fails.yaml").write_text("reaudit: {min_rows: 1000}\n")
    (wd / "config" / "c_audit_fails.yaml").write_text("audit: {context_limit: 8}\n")
    (wd / "config" / "ops.yaml").write_text("generate: {request_timeout_s: 45}\n")
    return Sequence(wd)


# ------------------------------------------------------------------------------------ steps --
def step(seq: Sequence, kind: str) -> None:
    if kind.startswith("run "):
        seq.config = kind[-1]
        done = seq.run()
        assert (done.returncode == 0) == (seq.config == "A"), done.stderr[-3000:]
    elif kind in ("deciding key", "operational key"):
        if kind == "deciding key":
            seq.new_temperature()
        else:
            seq.ops = not seq.ops
        done = seq.run()
        assert (done.returncode == 0) == (seq.config == "A"), done.stderr[-3000:]
    elif kind in VARIANT_KINDS:
        seq.change_variants(kind)
        done = seq.run()
        assert (done.returncode == 0) == (seq.config == "A"), done.stderr[-3000:]
    elif kind in KILL_KINDS:
        seq.config = "A"
        # answers to generate, so there is a generate to stop (a new seed when every variant has a temperature
        # of its own: the new temperature alone would regenerate nothing)
        seq.new_temperature(reseed=all(v.temperature is not None for v in seq.variants.effective()))
        if kind == "kill at launch":
            kill_at_launch(seq)
        else:
            kill_mid_generate(seq, kind)
        # rerunning the same command resumes (a dead controller's lock released with one line); regen status
        # follows the rerun from its start, never the killed run's DEAD (issue 58 item 6)
        done = seq.run(on_start=lambda: status_follows_the_new_run(seq))
        assert done.returncode == 0, done.stderr[-4000:]
        if kind != "ctrl-c":
            assert "regen: released the Snakemake lock left by the run of" in done.stderr, done.stderr[-3000:]
    elif kind == "until shard":
        done = seq.run("--until", "shard")
        assert (done.returncode == 0) == (seq.config != "C"), done.stderr[-3000:]
    elif kind == "dry run":
        done = snakemake(seq.wd, "-n", *seq.argv())
        assert done.returncode == 0 or seq.config == "C", done.stderr[-3000:]
    elif kind == "report":
        if seq.layout.results.is_dir():
            done = snakemake(seq.wd, *seq.argv(), "--report", "results/report.html")
            assert done.returncode == 0, done.stderr[-3000:]
            html = seq.layout.report_html.read_text(errors="replace")
            if not seq.layout.ready.is_file():
                assert "training-ready rows in" not in html
    else:  # pragma: no cover - the table above lists every kind
        raise AssertionError(kind)


def kill_mid_generate(seq: Sequence, kind: str) -> None:
    """``kind`` (kill -9 of the controller or of its process group, or Ctrl-C) once a generate job generates;
    then the run is dead (but for Ctrl-C, which ends it) and its generate jobs stop."""
    proc, out = seq.start()
    if kind == "kill controller":
        os.kill(proc.pid, signal.SIGKILL)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL if kind == "kill group" else signal.SIGINT)
    console = stopped_console(seq, proc, out, kind)
    assert GENERATING.search(console), f"{kind}: stopped before it generated: {console[-3000:]}"
    if kind != "ctrl-c":
        dead_within(seq, STATUS_DEAD_S)
    no_generate_jobs_within(seq, JOBS_STOP_S)


def kill_at_launch(seq: Sequence) -> None:
    """kill -9 of the controller alone the moment a generate job's process exists, before the job's first
    line (issue 58 item 3): the run is dead, its orphaned job stops, says its controller is gone before it
    starts work, and starts no server and sends no request."""
    logged_before = stopped_before_work_lines(seq)
    servers_before = {pid for pid, _ in server_processes_in(seq.wd)}
    proc, out = seq.launch()
    launched = seq.await_generate_job(proc)
    os.kill(proc.pid, signal.SIGKILL)
    mark = seq.requests_mark()
    stopped_console(seq, proc, out, "kill at launch")
    assert launched, f"kill at launch: no generate job started: {out.read_text(errors='replace')[-3000:]}"
    dead_within(seq, STATUS_DEAD_S)
    no_generate_jobs_within(seq, JOBS_STOP_S)
    sent = seq.sent_since(mark)
    assert sent == set(), f"the orphaned job sent {len(sent)} requests after its controller died"
    started = {pid for pid, _ in server_processes_in(seq.wd)} - servers_before
    assert started == set(), f"the orphaned job started servers: {started}"
    told = stopped_before_work_lines(seq) - logged_before
    assert told, f"no generate log says the job stopped before it started work ({STOPPED_BEFORE_WORK!r})"


def stopped_console(seq: Sequence, proc: subprocess.Popen[bytes], out: Path, kind: str) -> str:
    """The killed or interrupted run's console once its Snakemake ended (which ``seq`` is told of)."""
    try:
        proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"{kind}: the run did not stop: {out.read_text()[-3000:]}") from None
    console = out.read_text(errors="replace")
    seq.saw(console)
    return console


def dead_within(seq: Sequence, seconds: float) -> None:
    """``regen status`` says the killed run (the current config's) is DEAD within ``seconds``."""
    deadline = time.monotonic() + seconds
    while "DEAD" not in (status := regen(seq.wd, "status").stdout) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "DEAD" in status and f"run: {seq.name()} " in status, status


def no_generate_jobs_within(seq: Sequence, seconds: float) -> None:
    """The stopped run's generate jobs are gone within ``seconds`` (their controller is gone)."""
    deadline = time.monotonic() + seconds
    while seq.generate_jobs() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert seq.generate_jobs() == [], "orphaned generate jobs of the dead run still run"


def stopped_before_work_lines(seq: Sequence) -> set[str]:
    """Every generate log line (rule logs and kept attempt logs; each line timestamped) saying a job found its
    controller gone before it started work."""
    logs = sorted((seq.layout.logs / "generate").glob("*.log"))
    return {line for log in logs for line in log.read_text(errors="replace").splitlines()
            if STOPPED_BEFORE_WORK in line}  # fmt: skip


def status_follows_the_new_run(seq: Sequence) -> None:
    """``regen status`` the moment a rerun's Snakemake exists: a new run starting (or already running)."""
    status = regen(seq.wd, "status").stdout
    assert "DEAD" not in status and ("a new run is starting" in status or ": running" in status), status


def check(seq: Sequence, reconciled: set[tuple[Path, str]], sent: set[Completion]) -> None:
    """The invariants, after every step (``sent``: the completions the servers were asked for in it)."""
    for r in seq.readies:
        ready = r.where / "READY.json"
        assert ready.is_file(), f"READY of {r.config} lost: not at {r.where} and no console line said where"
        assert ready.read_text() == r.ready, f"READY of {r.config} at {r.where} changed"
        if r.where != seq.layout.results.resolve():
            kept = set(dataset_rows(r.where / "dataset"))
            assert kept == r.completions, f"the dataset of {r.config} kept at {r.where} lost records"
        if (r.where, r.ready) not in reconciled:
            # as the console prints it, no config: the dataset's manifest says the variants it was made with
            rec = regen(seq.wd, "reconcile", "--results", str(r.where), "--json")
            assert rec.returncode == 0 and json.loads(rec.stdout)["ok"], (
                rec.stdout[-2000:] + rec.stderr[-2000:]
            )
            per_sample = (
                sum(v["n"] for v in yaml.safe_load(r.variants)["generate"]["variants"]) if r.variants else 1
            )
            assert json.loads(rec.stdout)["input"] == ROWS * per_sample, "nothing lost"
            reconciled.add((r.where, r.ready))
    check_kept_runs(seq.layout)
    live = seq.layout.ready
    if live.is_file():
        # operational keys decide nothing: a READY made before one changed is the current config's
        owners = [r.config for r in seq.readies if r.where == seq.layout.results.resolve()]
        assert [seq.decides(o) for o in owners] == [seq.decides(seq.started)], (
            f"results/READY.json is {owners}'s, the current config is {seq.started}"
        )
        check_variants(seq, sent)
    if seq.started is not None:
        status = regen(seq.wd, "status").stdout
        # a run with nothing to do (an operational key changed after a READY run) never reaches onstart and
        # writes no run marker: status then names the last run that did, of the same deciding keys
        names = {seq.name_of(seq.started), seq.name_of(seq.started.removesuffix("+ops"))}
        names |= {seq.name_of(k) for k in seq.keys if seq.decides(k) == seq.decides(seq.started)}
        assert any(f"run: {n} " in status for n in names) and ": ended " in status, status
    fingerprints: Counter[tuple[str, str | None]] = Counter()
    for journal in seq.layout.journal_files():
        fingerprints.update((h.id, h.fingerprint) for h in read_heads(journal).heads if h.kind == RECORD)
    twice = [k for k, n in fingerprints.items() if n > 1]
    assert twice == [], f"generated twice: {twice[:5]}"


def check_kept_runs(layout: RunLayout) -> None:
    """At most keep.earlier_runs kept runs, and no content kept twice: every kept file (as kept: not one
    ``regen reconcile --results`` rewrote there since) whose bytes equal another's is the same inode (the
    disk grows by what changed, not by a copy a config switch)."""
    runs = kept_runs(layout)
    assert len(runs) <= KEEP_LAST, f"{len(runs)} kept runs, keep.earlier_runs is {KEEP_LAST}: {runs}"
    inodes: dict[tuple[int, str], set[int]] = {}
    for run in runs:
        for rel in run.unchanged():
            f = run.results / rel
            if f.is_file() and not f.is_symlink():
                data = f.read_bytes()
                inodes.setdefault((len(data), hashlib.sha256(data).hexdigest()), set()).add(f.stat().st_ino)
    copies = {k: v for k, v in inodes.items() if len(v) > 1}
    assert not copies, f"{len(copies)} contents kept more than once among {[r.folder for r in runs]}"


def check_variants(seq: Sequence, sent: set[Completion]) -> None:
    """The READY dataset in results/ against the configured variants, and against the last one a step ended
    with: unchanged variants kept their completions, changed ones have new settings."""
    rows = dataset_rows(seq.layout.results / "dataset")
    now, base = seq.variants.effective(), seq.base_temperature()
    want = {(s, v.name, k) for s in SAMPLE_IDS for v in now for k in range(v.n)}
    assert set(rows) == want, (
        f"records of {seq.variants.key()}: missing {sorted(want - set(rows))[:4]}, "
        f"not configured {sorted(set(rows) - want)[:4]}"
    )
    # the settings each variant's records were generated under, as the merge read them from the records
    manifest = json.loads((seq.layout.results / "dataset" / "_manifest.json").read_text())
    provenance = manifest["provenance"]["variants"]
    assert set(provenance) == {v.name for v in now}, f"provenance names {sorted(provenance)}"
    fingerprints: dict[str, str] = {}
    for v in now:
        mine = [r for (_, name, _), r in rows.items() if name == v.name]
        assert len({r["settings_fingerprint"] for r in mine}) == 1, f"{v.name}: several settings fingerprints"
        fingerprints[v.name] = str(mine[0]["settings_fingerprint"])
        told, settings = provenance[v.name], provenance[v.name]["settings"]
        assert told["settings_fingerprint"] == fingerprints[v.name] and told["rows"] == ROWS * v.n, told
        own = base if v.temperature is None else v.temperature
        assert settings.get("variant", "default") == v.name, (v, settings)
        decided = (settings["temperature"], settings["thinking"], settings["seed"])
        assert decided == (own, v.mode, seq.seed), (v, settings)
        sent_t = own if v.temperature is not None or v.mode == "on" else NON_THINKING_TEMPERATURE
        assert {(r["temperature"], r["thinking"]) for r in mine} == {(sent_t, v.mode == "on")}, v
    assert len(set(fingerprints.values())) == len(now), f"variants share a fingerprint: {fingerprints}"
    prev = seq.snapshot
    if prev is not None:
        before = {v.name: v.decides(prev.base, prev.seed) for v in prev.variants}
        prev_fingerprints = {c[1]: r["settings_fingerprint"] for c, r in prev.records.items()}
        for v in now:
            if v.name not in before:
                continue
            if before[v.name] != v.decides(base, seq.seed):
                assert fingerprints[v.name] != prev_fingerprints[v.name], (
                    f"{v.name} changed, not its fingerprint"
                )
                continue
            assert fingerprints[v.name] == prev_fingerprints[v.name], (
                f"{v.name} unchanged, its fingerprint not"
            )
            kept = [c for c in rows if c[1] == v.name and c in prev.records]
            again = sorted(set(kept) & sent)
            assert again == [], (
                f"{v.name} is unchanged, yet {len(again)} of its completions were sent: {again[:4]}"
            )
            for c in kept:
                old, new = prev.records[c], rows[c]
                assert (old["answer"], old["seed"]) == (new["answer"], new["seed"]), f"{c} regenerated"
    seq.snapshot = Snapshot(rows, now, base, seq.seed)


def draw(seed: int, steps: int) -> list[str]:
    """A sequence that starts with a READY run of A (something to keep), then ``steps - 1`` steps drawn from a
    seeded shuffle of every kind (each kind once before any repeats, so a few seeds cover them all: CI's two
    draw every kind between them), each variant step led by what it needs first."""
    rng = random.Random(seed)
    kinds = list(STEP_KINDS)
    rng.shuffle(kinds)
    variants = Variants()
    out = ["run A"]
    for kind in (kinds * steps)[: steps - 1]:
        if kind in VARIANT_KINDS:
            if (first := variants.needs(kind)) is not None:
                variants.apply(first)
                out.append(first)
            variants.apply(kind)
        out.append(kind)
    return out


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("seed", SEEDS)
def test_any_sequence_of_runs_keeps_every_ready_dataset_and_tells_the_truth(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    seq = setup_checkout(tmp_path)
    monkeypatch.setenv(REQUEST_LOG_ENV, str(seq.requests))  # every server the runs start logs its requests
    reconciled: set[tuple[Path, str]] = set()
    for kind in draw(seed, STEPS):
        seq.history.append(kind)
        mark = seq.requests_mark()
        try:
            step(seq, kind)
            check(seq, reconciled, seq.sent_since(mark))
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}, steps {seq.history}: {exc}") from exc
    assert seq.readies, "the sequence declared a dataset READY"


def test_the_generator_draws_every_kind_of_step() -> None:
    drawn = {kind for seed in range(40) for kind in draw(seed, STEPS)}
    assert drawn == set(STEP_KINDS)
    in_ci = {kind for seed in CI_SEEDS for kind in draw(seed, CI_STEPS)[1:]}
    assert in_ci == set(STEP_KINDS), f"CI's seeds leave out {set(STEP_KINDS) - in_ci}"
    assert draw(3, STEPS) == draw(3, STEPS) and draw(3, STEPS)[0] == "run A"
    # CI's variant n steps raise an n and lower one
    moved: set[str] = set()
    for seed in CI_SEEDS:
        variants = Variants()
        for kind in (k for k in draw(seed, CI_STEPS) if k in VARIANT_KINDS):
            before = {v.name: v.n for v in variants.effective()}
            variants.apply(kind)
            after = {v.name: v.n for v in variants.effective() if v.name in before}
            if kind == "variant n":
                moved |= {
                    "up" if n > before[name] else "down" for name, n in after.items() if n != before[name]
                }
    assert moved == {"up", "down"}, moved
