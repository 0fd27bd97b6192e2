"""Any sequence of runs in one checkout keeps every READY dataset and tells the truth about the current run
(issue 47 item 2): a seeded generator draws steps (run config A, B that fails its re-audit, C that fails
its audit; change a deciding key; change an operational key; kill -9 the controller only, or the whole
process group, mid-generate, and rerun; Ctrl-C mid-generate and rerun; ``--until shard``;
``snakemake -n``; ``--report``), and after every step checks:

- every dataset ever declared READY still exists, unchanged, in place or where the console said it was
  kept, and ``regen reconcile --results`` there says ok;
- a READY in ``results/`` is the current config's; ``regen status`` names the current config's run and
  says it ended (or, right after a kill, that it is dead);
- no request was generated twice (no request fingerprint journaled twice);
- after a successful run nothing is lost (``regen reconcile``: every input id in exactly one place).

Small (24 conversations the test writes, 2 shards, simulated servers): ``SEQUENCES`` sequences of
``STEPS`` steps, a few minutes on 2 cores. ``REGEN_RUN_SEQUENCES=seed,seed,...`` and
``REGEN_RUN_SEQUENCE_STEPS`` draw others. A failure prints the seed and the steps so far.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support.soak import phase_started, processes_in
from support.workflow import ROOT, SNAKEMAKE, copy_workflow, free_port_base, regen, snakemake

from bench.workflow import write_chats
from regen.generate.journal import RECORD, read_heads
from regen.layout import RunLayout

pytestmark = pytest.mark.slow

ROWS = 24
SEEDS = [int(s) for s in os.environ.get("REGEN_RUN_SEQUENCES", "3,263").split(",") if s.strip()]
STEPS = int(os.environ.get("REGEN_RUN_SEQUENCE_STEPS", "7"))
KEPT = re.compile(
    r"regen: the earlier (?:READY )?run of (?:config \S+|an earlier config) is kept whole in (\S+) "
)
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
    "until shard",
    "dry run",
    "report",
)


@dataclass
class Ready:
    """One dataset declared READY: by which config, where it is now, and its READY.json."""

    config: str
    where: Path  # a results directory: the checkout's, or a kept earlier run's
    ready: str


@dataclass
class Sequence:
    """One checkout and what a user was told in it."""

    wd: Path
    config: str = "A"
    temperature: int = 0  # 0: the demo's; n: config/hot.yaml's n-th new temperature
    ops: bool = False
    started: str | None = None  # the config key of the last run that started (not -n, not --report)
    readies: list[Ready] = field(default_factory=list)
    history: list[str] = field(default_factory=list)
    temperatures: int = 0  # how many new temperatures were drawn

    @property
    def layout(self) -> RunLayout:
        return RunLayout.under(self.wd)

    def key(self) -> str:
        return f"{self.config}+t{self.temperature}{'+ops' if self.ops else ''}"

    def name(self) -> str:
        return self.name_of(self.key())

    @staticmethod
    def name_of(key: str) -> str:
        """The run's name as the run marker gives it (its config files' stems) for a config key."""
        files = ["demo", "base", *(Path(f).stem for f in CONFIG_FILES[key[0]])]
        files += ["hot"] * ("+t0" not in key) + ["ops"] * ("+ops" in key)
        return "+".join(files)

    def argv(self) -> list[str]:
        files = ["config/demo.yaml", "config/base.yaml", *CONFIG_FILES[self.config]]
        files += ["config/hot.yaml"] * (self.temperature > 0) + ["config/ops.yaml"] * self.ops
        return ["--configfile", *files]

    # ------------------------------------------------------------------------------- runs --
    def run(self, *extra: str) -> subprocess.CompletedProcess[str]:
        self.started = self.key()
        done = snakemake(self.wd, "--cores", "2", *self.argv(), *extra, timeout=600)
        self.saw(done.stderr + done.stdout)
        if done.returncode == 0 and not extra:
            self.declared_ready()
        return done

    def saw(self, console: str) -> None:
        """What the console said was kept whole: the READY in results/ moved there."""
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
            self.readies.append(Ready(self.key(), self.layout.results.resolve(), text))

    def start(self) -> tuple[subprocess.Popen[bytes], Path]:
        """A run in the background, its console in a file, once it generates."""
        self.started = self.key()
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
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            if phase_started(out, "generate") and GENERATING.search(out.read_text(errors="replace")):
                break  # a generate job said it has answers to generate
            time.sleep(0.2)
        time.sleep(1.0)  # mid-generate
        return proc, out

    def new_temperature(self) -> None:
        """A sampling temperature no run here used yet (a deciding key: every answer regenerates)."""
        self.temperatures += 1
        self.temperature = self.temperatures
        value = 0.9 + 0.01 * self.temperature
        (self.wd / "config" / "hot.yaml").write_text(
            f"generate: {{sampling: {{temperature: {value:.2f}}}}}\n"
        )

    def generate_jobs(self) -> list[tuple[int, str]]:
        return [(p, a) for p, a in processes_in(self.wd) if "generate.py" in a]


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
    elif kind in ("kill controller", "kill group", "ctrl-c"):
        seq.config = "A"
        seq.new_temperature()  # answers to generate, so there is a generate to stop
        proc, out = seq.start()
        if kind == "kill controller":
            os.kill(proc.pid, signal.SIGKILL)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL if kind == "kill group" else signal.SIGINT)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise AssertionError(f"{kind}: the run did not stop: {out.read_text()[-3000:]}") from None
        console = out.read_text(errors="replace")
        seq.saw(console)
        assert GENERATING.search(console), f"{kind}: stopped before it generated: {console[-3000:]}"
        if kind != "ctrl-c":
            # dead within 10 s, and the dead run's generate jobs stop (their controller is gone)
            deadline = time.monotonic() + 10
            while "DEAD" not in (status := regen(seq.wd, "status").stdout) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert "DEAD" in status and f"run: {seq.name()} " in status, status
        deadline = time.monotonic() + 20
        while seq.generate_jobs() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert seq.generate_jobs() == [], "orphaned generate jobs of the dead run still run"
        # rerunning the same command resumes (a dead controller's lock released with one line)
        done = seq.run()
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


def check(seq: Sequence, reconciled: set[tuple[Path, str]]) -> None:
    """The invariants, after every step."""
    for r in seq.readies:
        ready = r.where / "READY.json"
        assert ready.is_file(), f"READY of {r.config} lost: not at {r.where} and no console line said where"
        assert ready.read_text() == r.ready, f"READY of {r.config} at {r.where} changed"
        if (r.where, r.ready) not in reconciled:
            rec = regen(seq.wd, "reconcile", "--results", str(r.where), "--json")
            assert rec.returncode == 0 and json.loads(rec.stdout)["ok"], (
                rec.stdout[-2000:] + rec.stderr[-2000:]
            )
            assert json.loads(rec.stdout)["input"] == ROWS, "nothing lost"
            reconciled.add((r.where, r.ready))
    live = seq.layout.ready
    if live.is_file():
        # operational keys decide nothing: a READY made before one changed is the current config's
        owners = [r.config for r in seq.readies if r.where == seq.layout.results.resolve()]
        assert [o.removesuffix("+ops") for o in owners] == [seq.started.removesuffix("+ops")], (
            f"results/READY.json is {owners}'s, the current config is {seq.started}"
        )
    if seq.started is not None:
        status = regen(seq.wd, "status").stdout
        # a run with nothing to do (an operational key changed after a READY run) never reaches onstart and
        # writes no run marker: status then names the last run that did, of the same deciding keys
        names = {seq.name_of(seq.started), seq.name_of(seq.started.removesuffix("+ops"))}
        assert any(f"run: {n} " in status for n in names) and ": ended " in status, status
    fingerprints: Counter[tuple[str, str | None]] = Counter()
    for journal in seq.layout.journal_files():
        fingerprints.update((h.id, h.fingerprint) for h in read_heads(journal).heads if h.kind == RECORD)
    twice = [k for k, n in fingerprints.items() if n > 1]
    assert twice == [], f"generated twice: {twice[:5]}"


def draw(seed: int, steps: int) -> list[str]:
    """A sequence that starts with a READY run of A (something to keep), then ``steps - 1`` steps drawn from a
    seeded shuffle of every kind (each kind once before any repeats, so a few seeds cover them all: CI's two,
    3 and 263, draw every kind between them)."""
    rng = random.Random(seed)
    kinds = list(STEP_KINDS)
    rng.shuffle(kinds)
    return ["run A", *(kinds * steps)[: steps - 1]]


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("seed", SEEDS)
def test_any_sequence_of_runs_keeps_every_ready_dataset_and_tells_the_truth(
    tmp_path: Path, seed: int
) -> None:
    seq = setup_checkout(tmp_path)
    reconciled: set[tuple[Path, str]] = set()
    for kind in draw(seed, STEPS):
        seq.history.append(kind)
        try:
            step(seq, kind)
            check(seq, reconciled)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}, steps {seq.history}: {exc}") from exc
    assert seq.readies, "the sequence declared a dataset READY"


def test_the_generator_draws_every_kind_of_step() -> None:
    drawn = {kind for seed in range(40) for kind in draw(seed, STEPS)}
    assert drawn == set(STEP_KINDS)
    in_ci = {kind for seed in (3, 263) for kind in draw(seed, 7)[1:]}
    assert in_ci == set(STEP_KINDS), f"CI's seeds leave out {set(STEP_KINDS) - in_ci}"
    assert draw(3, STEPS) == draw(3, STEPS) and draw(3, STEPS)[0] == "run A"
