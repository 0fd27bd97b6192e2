"""The demo as a user runs it, with the GPU servers prestarted while the data is audited
(regen.tune.prestart): started before the audit ends, adopted by the tune rule, one start per slot, the
same records as a run without it; a first pass that misleads is not adopted and the run still completes;
a dry run starts nothing; a resumed run prestarts with its current plan's flags."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

from support.workflow import copy_workflow, snakemake

from regen.io import open_lines
from regen.layout.run import RunLayout
from regen.serving.procfs import SERVER_START_MARK
from regen.sglang.config import PlanFile

FIRST_TWO = ("results/generations/00000.jsonl.zst", "results/generations/00001.jsonl.zst")


def demo(tmp_path: Path, name: str, prestart_rows: int, extra: str = "") -> Path:
    """The demo workflow with its own ports, servers that wait long enough for their first job."""
    wd = copy_workflow(tmp_path / name)
    port = random.randrange(20000, 32000, 2)
    (wd / "config" / "pre.yaml").write_text(
        f"server: {{prestart_rows: {prestart_rows}, idle_timeout_s: 120, port_base: {port}}}\n{extra}"
    )
    return wd


def run(wd: Path, *targets: str) -> None:
    done = snakemake(wd, *targets, "--cores", "2", "--configfile", "config/demo.yaml", "config/pre.yaml")
    assert done.returncode == 0, done.stderr[-3000:]


def server_starts(wd: Path) -> dict[str, list[float]]:
    """Per slot log: the time of each server start (the supervisor's own stamp, local time, whole seconds)."""
    starts: dict[str, list[float]] = {}
    for log in sorted((wd / "logs" / "servers").glob("gpu*.log")):
        stamps = [
            line.split("] ", 1)[0].rsplit(" ", 2)[-2:]
            for line in log.read_text().splitlines()
            if SERVER_START_MARK in line
        ]
        starts[log.stem] = [time.mktime(time.strptime(" ".join(s), "%Y-%m-%d %H:%M:%S")) for s in stamps]
    return starts


def records(wd: Path) -> dict[str, tuple[str, str]]:
    """id -> (fingerprint, settings fingerprint) of every generation record."""
    found: dict[str, tuple[str, str]] = {}
    for path in RunLayout.under(wd).record_files():
        with open_lines(path) as lines:
            for line in lines:
                rec = json.loads(line)
                found[rec["id"]] = (rec["fingerprint"], rec["settings_fingerprint"])
    return found


def plan(wd: Path) -> dict[str, Any]:
    return json.loads((wd / "results" / "plan" / "server.json").read_text())


def no_drift(wd: Path) -> bool:
    return all(not json.loads(p.read_text())["drift"] for p in RunLayout.under(wd).realized_files())


def test_servers_start_during_the_audit_are_adopted_and_a_resume_uses_its_plan(tmp_path: Path) -> None:
    plain = demo(tmp_path, "plain", 0)
    run(plain, *FIRST_TWO)
    assert not (plain / "logs" / "prestart.log").exists()

    wd = demo(tmp_path, "prestarted", 50)
    dry = snakemake(wd, "-n", "--configfile", "config/demo.yaml", "config/pre.yaml")
    assert dry.returncode == 0, dry.stderr[-3000:]
    layout = RunLayout.under(wd)
    assert not layout.prestart_log.exists() and not layout.prestart_request.exists(), "a dry run prestarted"

    run(wd, *FIRST_TWO)
    starts = server_starts(wd)
    assert sorted(starts) == ["gpu0", "gpu1"] and all(len(s) == 1 for s in starts.values()), starts
    audit_end = (wd / "results" / "audit" / "summary.json").stat().st_mtime
    assert all(s[0] <= audit_end for s in starts.values()), (starts, audit_end)
    first = plan(wd)
    assert first["prestart"]["adopted"] is True, first["prestart"]
    assert "first 50 rows" in first["prestart"]["source"]
    assert "prestarted server adopted" in (wd / "logs" / "tune.log").read_text()
    assert no_drift(wd)
    assert records(wd) == records(plain)  # the same samples, the same fingerprints and settings

    run(wd)  # the rest: the plan is current, the servers start with its very flags
    provisional = json.loads(RunLayout.under(wd).provisional_plan.read_text())
    assert provisional["source"].startswith("current plan file")
    assert PlanFile.from_json(provisional["plan"]) == PlanFile.from_json(plan(wd))
    assert all(len(s) == 2 for s in server_starts(wd).values())  # one more start per slot, none by a job
    assert no_drift(wd) and (wd / "results" / "READY.json").exists()


def long_prompts_after_short_ones(path: Path, short: int, long: int) -> None:
    words = ["the", "model", "reads", "a", "long", "careful", "question", "about", "energy"]
    rows = []
    for i in range(short + long):
        size = 3 if i < short else 1500
        prompt = " ".join(words[j % len(words)] for j in range(size)) + f" (question {i})?"
        answer = " ".join(words[(j + i) % len(words)] for j in range(60)) + "."
        turns = [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
        rows.append({"id": f"row-{i:04d}", "messages": turns})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_misleading_first_pass_is_not_adopted_and_the_run_completes(tmp_path: Path) -> None:
    short = 10
    wd = demo(
        tmp_path,
        "mismatch",
        short,
        "dataset: {path: data/long_after_short.jsonl}\naudit: {decontamination: {benchmarks: []}}\n"
        "shards: {count: 2}\nexport: {enabled: false}\n",
    )
    long_prompts_after_short_ones(wd / "data" / "long_after_short.jsonl", short, 40)
    run(wd)
    written = plan(wd)
    assert written["prestart"]["adopted"] is False, written["prestart"]
    assert "--" in written["prestart"]["reason"]  # the flag that differs, named
    tune_log = (wd / "logs" / "tune.log").read_text()
    assert "prestarted server not adopted" in tune_log and "2 supervisor(s) stopped" in tune_log
    provisional = json.loads(RunLayout.under(wd).provisional_plan.read_text())
    assert provisional["plan"]["launch_args"] != written["launch_args"]
    # the provisional server stopped, the generate job started one with the audit's flags
    assert all(len(s) == 2 for s in server_starts(wd).values()), server_starts(wd)
    cap = PlanFile.from_json(written).launched_section["effective_max_running_requests"]  # type: ignore[union-attr]
    last_start = [
        x for x in (wd / "logs/servers/gpu0.log").read_text().splitlines() if SERVER_START_MARK in x
    ][-1]
    assert f"--max-running-requests {cap} " in last_start
    assert no_drift(wd) and (wd / "results" / "READY.json").exists()
