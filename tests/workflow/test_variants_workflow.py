"""Sampling variants through Snakemake itself (issue 52 items 1-2), on the simulated server and an
eight-prompt dataset: adding a variant generates only its completions (the answers made before
variants replay under their new ids), changing one regenerates only its own, removing one takes its
records out of the dataset (the earlier run's outputs kept whole), ``n`` gives that many records a
prompt with their own seeds, and the dry run and each generate job's first line say it per variant.

The runs stop at the merged dataset (``merge``): what comes after it reads the records' variants on
its own terms (the re-audit, the reconciliation, the exports)."""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pyarrow.dataset as ds
import pytest
import yaml
from support.workflow import SNAKEMAKE, copy_workflow, dataset_records, free_port_base

from bench.workflow import write_chats
from regen.simulated.options import REQUEST_LOG_ENV

PROMPTS = [f"t{i}" for i in range(8)]
TARGET = "merge"
#: the demo's faults, off (a config file's mapping merges into the demo's, key by key)
NO_FAULTS = {"error_rate": 0, "think_leak_rate": 0, "empty_answer_rate": 0, "noncanonical_rate": 0}


class Run:
    """A workflow copy with a tiny dataset; each step writes its own config file (so each step is a config
    of its own, as a user's edited file is) and runs Snakemake, its servers logging every request."""

    def __init__(self, tmp_path: Path) -> None:
        self.wd = copy_workflow(tmp_path / "wf")
        rows = [
            (sid, f"Question {sid}: what is {i} plus {i}?", f"It is {2 * i}.")
            for i, sid in enumerate(PROMPTS)
        ]
        write_chats(self.wd / "data" / "tiny.jsonl", rows)
        tiny = {
            "dataset": {"path": "data/tiny.jsonl"},
            "shards": {"count": 1},
            "export": {"enabled": False},
            "server": {"gpus": 1, "port_base": free_port_base(1), "simulated": {"faults": NO_FAULTS}},
        }
        (self.wd / "config" / "tiny.yaml").write_text(yaml.safe_dump(tiny))
        self.requests = tmp_path / "requests.jsonl"
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", REQUEST_LOG_ENV: str(self.requests)}
        self.env.pop("CUDA_VISIBLE_DEVICES", None)

    def config(self, name: str, generate: dict[str, Any] | None) -> tuple[str, ...]:
        files = ["config/demo.yaml", "config/tiny.yaml"]
        if generate is not None:
            (self.wd / "config" / f"{name}.yaml").write_text(yaml.safe_dump({"generate": generate}))
            files.append(f"config/{name}.yaml")
        return ("--configfile", *files)

    def snakemake(self, *args: str) -> str:
        done = subprocess.run(
            [SNAKEMAKE, *args], cwd=self.wd, env=self.env, capture_output=True, text=True, timeout=300
        )
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-4000:]
        return out

    def run(self, config: tuple[str, ...]) -> tuple[str, Counter[str]]:
        """One run to the merged dataset: its console, and the record ids the servers answered."""
        start = self.requests.stat().st_size if self.requests.exists() else 0
        out = self.snakemake("--cores", "2", TARGET, *config)
        with open(self.requests, "rb") as fh:
            fh.seek(start)
            events = [orjson.loads(line) for line in fh.read().splitlines()]
        return out, Counter(e["id"] for e in events if e.get("event") == "completed" and e.get("id"))

    def dry(self, config: tuple[str, ...]) -> str:
        """The dry run of the whole workflow (its replay preview is printed while the final targets are
        planned)."""
        return self.snakemake("-n", *config)

    def rows(self) -> dict[str, dict[str, Any]]:
        columns = (
            "id",
            "sample_id",
            "variant",
            "k",
            "seed",
            "temperature",
            "thinking",
            "settings_fingerprint",
        )
        return {r["id"]: r for r in dataset_records(self.wd / "results" / "dataset", *columns)}


@pytest.mark.timeout(600)
def test_adding_changing_and_removing_a_variant_touches_only_its_records(tmp_path: Path) -> None:
    run = Run(tmp_path)
    # before variants: one record a prompt, under the sample id
    _, sent = run.run(run.config("plain", None))
    assert set(sent) == set(PROMPTS)
    plain = run.rows()
    assert set(plain) == set(PROMPTS) and {(r["variant"], r["k"]) for r in plain.values()} == {("default", 0)}

    # add a variant: the dry run says per variant; the run sends only its completions
    two = run.config("two", {"variants": [{"name": "default"}, {"name": "hot", "temperature": 1.0}]})
    dry = run.dry(two)
    assert "8 samples x 2 variants = 16 completions: 8 replayed from the journals, 8 to generate" in dry, dry
    assert (
        "variant default: 8 replayed, 0 to generate" in dry
        and "variant hot: 0 replayed, 8 to generate" in dry
    )
    out, sent = run.run(two)
    assert set(sent) == {f"{p}/hot/0" for p in PROMPTS} and max(sent.values()) == 1, sent
    assert (
        "variant default: 8 replayed, 0 to generate" in out
        and "variant hot: 0 replayed, 8 to generate" in out
    )
    both = run.rows()
    assert set(both) == {f"{p}/{v}/0" for p in PROMPTS for v in ("default", "hot")}
    for p in PROMPTS:  # the answers made before variants, under their new ids
        assert both[f"{p}/default/0"]["answer"] == plain[p]["answer"]
        assert both[f"{p}/default/0"]["sample_id"] == p and both[f"{p}/hot/0"]["temperature"] == 1.0
    assert len({r["settings_fingerprint"] for r in both.values()}) == 2

    # change one: only its records are sent again
    changed = run.config("changed", {"variants": [{"name": "default"}, {"name": "hot", "temperature": 1.3}]})
    dry = run.dry(changed)
    assert "variant hot: 0 replayed, 8 to generate" in dry and "temperature 1.0→1.3" in dry, dry
    _, sent = run.run(changed)
    assert set(sent) == {f"{p}/hot/0" for p in PROMPTS}, sent
    after = run.rows()
    assert all(after[f"{p}/default/0"]["answer"] == plain[p]["answer"] for p in PROMPTS)
    assert {after[f"{p}/hot/0"]["temperature"] for p in PROMPTS} == {1.3}

    # remove one: nothing is sent, its records leave the dataset, the console says which, and the
    # earlier run's dataset (with them) is kept whole
    removed = run.config("removed", {"variants": [{"name": "default"}]})
    dry = run.dry(removed)
    assert "variant hot: no longer configured: its 8 journaled records leave the dataset" in dry, dry
    out, sent = run.run(removed)
    assert not sent, sent
    assert "variant hot is no longer configured: its 8 records leave the dataset" in out, out[-4000:]
    assert "is kept whole in work/earlier-runs/" in out
    only = run.rows()
    assert set(only) == set(PROMPTS) and {r["variant"] for r in only.values()} == {"default"}
    assert all(only[p]["answer"] == plain[p]["answer"] for p in PROMPTS)
    kept = [
        d for d in (run.wd / "work" / "earlier-runs").glob("*/results/dataset") if "hot" in _variants_in(d)
    ]
    assert kept, "the run with the hot variant is not kept"


def _variants_in(dataset_dir: Path) -> set[str]:
    table = ds.dataset(str(dataset_dir), format="parquet").to_table(columns=["variant"])
    return set(table.column("variant").to_pylist())


@pytest.mark.timeout(300)
def test_n_completions_each_get_a_record_and_their_own_seed(tmp_path: Path) -> None:
    run = Run(tmp_path)
    config = run.config(
        "three", {"variants": [{"name": "default", "n": 3}, {"name": "quiet", "thinking": "off"}]}
    )
    dry = run.dry(config)
    assert "8 samples x 2 variants = 32 completions: 0 replayed from the journals, 32 to generate" in dry, dry
    assert (
        "variant default: 0 replayed, 24 to generate" in dry
        and "variant quiet: 0 replayed, 8 to generate" in dry
    )
    _, sent = run.run(config)
    assert len(sent) == 32 and max(sent.values()) == 1
    rows = run.rows()
    per_prompt = Counter(r["sample_id"] for r in rows.values())
    assert per_prompt == dict.fromkeys(PROMPTS, 4), per_prompt
    for p in PROMPTS:
        three = [rows[f"{p}/default/{k}"] for k in range(3)]
        assert len({r["seed"] for r in three}) == 3 and len({r["answer"] for r in three}) == 3, three
        assert [r["k"] for r in three] == [0, 1, 2] and all(r["thinking"] for r in three)
        assert rows[f"{p}/quiet/0"]["thinking"] is False
    assert len({r["seed"] for r in rows.values()}) == 32
