"""``regen check``: every problem at once, each naming its config key and path; exit non-zero.
The workflow runs the same checks before any job."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.workflow import copy_workflow, snakemake

from regen.check import Host, check_config, cli, load_config, notes_for, report, speculative_notes

ROOT = Path(__file__).resolve().parents[1]


def demo_config() -> dict:
    return load_config([str(ROOT / "config" / "demo.yaml")])


def fake_host(tmp_path: Path, gpus: int | None = 2, sglang: str | None = "0.5.23") -> Host:
    return Host(
        python="/opt/env/bin/python",
        results_dir=str(tmp_path),
        gpus_present=lambda: gpus,
        sglang_version=lambda python: (sglang, "" if sglang else "No module named 'sglang'"),
        s3_probe=lambda uri: "Could not connect to the endpoint URL",
    )


def test_the_demo_config_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    assert check_config(demo_config(), None, fake_host(tmp_path)) == []


def test_every_problem_at_once_with_key_and_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    no_template = tmp_path / "tok"
    shutil.copytree(ROOT / "resources" / "demo-tokenizer", no_template)
    cfg_path = no_template / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("chat_template", None)
    cfg_path.write_text(json.dumps(cfg))
    config = demo_config()
    config["dataset"]["path"] = str(tmp_path / "missing.jsonl")
    config["tokenizer"] = str(no_template)
    config["server"].update(mode="sglang", model_config=str(tmp_path / "nope" / "config.json"), tp=2)
    config["merge"]["output_prefix"] = "s3://bucket/out/"
    problems = check_config(config, 3, fake_host(tmp_path, gpus=4, sglang=None))
    by_key = {p.key: p for p in problems}
    expected = {"dataset.path", "tokenizer", "server.model_config", "server.model_path", "server.mode",
                "--resources gpu", "merge.output_prefix"}  # fmt: skip
    assert set(by_key) == expected, problems
    assert by_key["dataset.path"].path.endswith("missing.jsonl")
    assert "chat template" in by_key["tokenizer"].message
    assert "No module named 'sglang'" in by_key["server.mode"].message
    assert (
        by_key["server.mode"].path == "/opt/env/bin/python"
        and "pip install sglang==" in by_key["server.mode"].message
    )
    assert "3 slot(s) x server.tp 2 = 6 GPUs, but 4 present" in by_key["--resources gpu"].message
    assert by_key["merge.output_prefix"].path == "s3://bucket/out/"


def test_gpu_count_and_version_mismatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    config = demo_config()
    config["server"].update(mode="sglang", sglang_version="0.5.17", model_path="resources/demo-model")
    keys = [p.key for p in check_config(config, 0, fake_host(tmp_path))]
    assert keys == ["server.sglang_version", "--resources gpu"]
    assert [p.key for p in check_config(config, 2, fake_host(tmp_path, gpus=None, sglang="0.5.17"))] == [
        "--resources gpu"
    ]  # no nvidia-smi: no GPU


def test_cli_exits_non_zero_and_lists_problems(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"dataset: {{path: {tmp_path}/none.jsonl}}\ntokenizer: {tmp_path}/none\n")
    assert cli(["--configfile", str(ROOT / "config" / "demo.yaml"), str(bad)]) == 1
    err = capsys.readouterr().err
    assert "2 problem(s)" in err and "dataset.path" in err and "tokenizer" in err
    out = subprocess.run(
        [sys.executable, "-m", "regen.cli", "check", "--configfile", str(ROOT / "config" / "demo.yaml")],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 0 and "regen check: OK" in out.stdout


def test_the_workflow_checks_first_and_names_every_problem(tmp_path: Path) -> None:
    wd = copy_workflow(tmp_path / "wf")
    (wd / "config" / "bad.yaml").write_text(
        "dataset: {path: data/none.jsonl}\ntokenizer: resources/none\n"
        "server: {model_config: resources/none.json}\n"
    )
    run = snakemake(wd, "--cores", "1", "--configfile", "config/demo.yaml", "config/bad.yaml")
    out = run.stdout + run.stderr
    assert run.returncode != 0
    for needle in ("3 problem(s)", "dataset.path (data/none.jsonl)", "tokenizer (resources/none)",
                   "server.model_config (resources/none.json)"):  # fmt: skip
        assert needle in out, out[-3000:]
    assert not (wd / "results").exists()
    # the dataset exists but the tokenizer does not: the workflow's onstart stops it before any job
    (wd / "config" / "bad.yaml").write_text("tokenizer: resources/none\n")
    run = snakemake(wd, "--cores", "1", "--configfile", "config/demo.yaml", "config/bad.yaml")
    out = run.stdout + run.stderr
    assert run.returncode != 0 and "tokenizer (resources/none)" in out, out[-3000:]
    assert not (wd / "results").exists()


def test_a_seed_sglang_will_not_apply_is_noted_not_fatal() -> None:
    """SGLang applies a request's seed only with --enable-deterministic-inference: a run on real SGLang
    without it gets a note (records keep a seed that did not decide their sampling), not a problem."""
    cfg = demo_config()
    assert notes_for(cfg) == []  # the demo's simulated server
    cfg["server"] = {**cfg["server"], "mode": "sglang", "args": ["--mem-fraction-static", "0.9"]}
    (note,) = notes_for(cfg)
    assert note.startswith("generate.sampling.seed (server.args)")
    assert "--enable-deterministic-inference" in note
    assert report([], [note]) == f"regen check: OK\n  note: {note}"
    cfg["server"]["args"] = ["--enable-deterministic-inference"]
    assert notes_for(cfg) == []


SPEC = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps"]
SEED_SPEC = [*SPEC, "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
MTP1 = [*SPEC, "1"]


def write_pilot(results: Path, rows: list[tuple[str, list[str], float]]) -> None:
    rows_json = [{"label": label, "args": args, "ok": True, "rate_tok_s": rate} for label, args, rate in rows]
    (results / "plan").mkdir(parents=True, exist_ok=True)
    (results / "plan" / "pilot.json").write_text(json.dumps({"candidates": rows_json, "best_index": 0}))


def test_forced_mtp_the_sweep_measured_slower_is_warned(tmp_path: Path) -> None:
    seed = [*SEED_SPEC, "--max-running-requests", "64"]
    config = {"server": {"mode": "sglang", "args": seed}}
    rows = [("recommended", ["--max-running-requests", "350"], 5371.0), ("given", seed, 3803.0)]
    write_pilot(tmp_path, [*rows, ("mtp 1 step", MTP1, 4100.0)])
    (note,) = speculative_notes(config, tmp_path)
    assert note.startswith("server.args force NEXTN with 3 steps: the sweep (")
    assert "measured it at 3803 tok/s (given), slower than no MTP at 5371 tok/s (recommended)" in note
    # the sweep's own MTP candidate at the same steps counts as the same setting (NEXTN is SGLang's EAGLE)
    eagle3 = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3"]
    write_pilot(tmp_path, [("mtp 3 steps", eagle3, 4632.0), ("mtp 1 step", MTP1, 4700.0)])
    (note,) = speculative_notes(config, tmp_path)
    assert "measured it at 4632 tok/s (mtp 3 steps), slower than MTP 1 step at 4700 tok/s" in note


def test_no_speculative_warning_when_it_measured_fastest_or_was_not_measured(tmp_path: Path) -> None:
    config = {"server": {"mode": "sglang", "args": SEED_SPEC}}
    assert speculative_notes(config, tmp_path) == []  # no sweep file
    write_pilot(tmp_path, [("given", SEED_SPEC, 4000.0), ("recommended", [], 3000.0)])
    assert speculative_notes(config, tmp_path) == []  # fastest
    write_pilot(tmp_path, [("recommended", [], 5000.0), ("mtp 1 step", MTP1, 4000.0)])
    assert speculative_notes(config, tmp_path) == []  # these steps were not measured
    assert speculative_notes({"server": {"mode": "sglang", "args": []}}, tmp_path) == []  # nothing forced


def test_regen_check_prints_the_speculative_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(ROOT)
    extra = tmp_path / "spec.yaml"
    extra.write_text(json.dumps({"server": {"args": SEED_SPEC}}))
    write_pilot(tmp_path / "results", [("recommended", [], 5000.0), ("given", SEED_SPEC, 3500.0)])
    cli(
        [
            "--configfile",
            str(ROOT / "config" / "demo.yaml"),
            str(extra),
            "--results",
            str(tmp_path / "results"),
        ]
    )
    captured = capsys.readouterr()
    assert "note: server.args force NEXTN with 3 steps" in captured.out + captured.err


def test_a_wrong_model_path_is_caught_whatever_model_config_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    config = demo_config()
    config["server"].update(mode="sglang", model_config="resources/demo-model/config.json")

    def model_path_problems(model_path: str) -> list:
        config["server"]["model_path"] = model_path
        return [p for p in check_config(config, 2, fake_host(tmp_path)) if p.key == "server.model_path"]

    (wrong,) = model_path_problems(str(tmp_path / "models" / "Qwen3-8b"))
    assert wrong.path.endswith("Qwen3-8b") and "no such directory" in wrong.message
    (tmp_path / "empty").mkdir()
    (no_config,) = model_path_problems(str(tmp_path / "empty"))
    assert no_config.path.endswith("config.json") and "not a model directory" in no_config.message
    assert model_path_problems("resources/demo-model") == []
    # a hub id is fetched by SGLang at server start: a note, unless the hub is offline and it is not cached
    assert model_path_problems("Qwen/Qwen3-8B") == []
    assert any("Qwen/Qwen3-8B" in n and "Hugging Face Hub" in n for n in notes_for(config))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (offline,) = model_path_problems("Qwen/Qwen3-8B")
    assert "HF_HUB_OFFLINE" in offline.message
    (tmp_path / "hub" / "models--Qwen--Qwen3-8B").mkdir(parents=True)
    assert model_path_problems("Qwen/Qwen3-8B") == []
    assert not any("Qwen/Qwen3-8B" in n for n in notes_for(config))


def test_a_config_typo_is_one_line_with_key_file_and_did_you_mean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "run.yaml"
    bad.write_text("generate:\n  max_tokens: 9\n  sampling: {max_token: 8192, top_p: 2}\nshard: {count: 3}\n")
    assert cli(["--configfile", str(ROOT / "config" / "demo.yaml"), str(bad)]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 5, err  # a header and one line per error: no schema dump
    assert "Failed validating" not in err and "'description'" not in err
    expected = [
        f"generate.max_tokens ({bad}): unknown key; did you mean generate.sampling.max_tokens? "
        "(it belongs there)",
        f"generate.sampling.max_token ({bad}): unknown key; did you mean max_tokens?",
        f"generate.sampling.top_p ({bad}): 2 is greater than the maximum of 1",
        f"shard ({bad}): unknown key; did you mean shards?",
    ]
    for line in expected:
        assert f"  - {line}" in lines, err


def test_a_key_no_file_sets_names_every_file_and_a_bad_enum_gets_a_suggestion(tmp_path: Path) -> None:
    from regen.configfile import ConfigFileError, merged, read_layers, validate_config
    from regen.configfile import load_config as load

    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text("tokenizer: resources/demo-tokenizer\n")
    second.write_text("generate: {truncation: dorp}\n")
    with pytest.raises(ConfigFileError) as caught:
        load([first, second])
    assert caught.value.lines == (
        f"generate.truncation ({second}): 'dorp' is not one of 'keep', 'drop', 'retry'; did you mean 'drop'?",
    )
    layers = read_layers([first, second])
    schema = {"type": "object", "required": ["dataset"], "properties": {"dataset": {"type": "object"}}}
    with pytest.raises(ConfigFileError) as caught:
        validate_config(merged(layers), layers, schema)
    assert caught.value.lines == (f"dataset ({first}, {second}): missing: the schema requires it",)


@pytest.mark.parametrize("files", [["config/config.yaml"], ["config/config.yaml", "config/demo.yaml"]])
def test_defaults_are_filled_as_snakemake_fills_them(
    files: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import copy

    from snakemake.utils import validate

    from regen.configfile import merged, read_layers, validate_config

    monkeypatch.chdir(ROOT)
    layers = read_layers(files)
    ours, theirs = merged(layers), merged(layers)
    validate(theirs, str(ROOT / "schemas" / "config.schema.yaml"), set_default=True)
    assert validate_config(ours, layers) == theirs and ours != merged(layers)
    again = copy.deepcopy(ours)
    assert validate_config(again, layers) == ours  # the schema's own defaults were not filled in


def test_fewer_gpu_slots_than_the_node_has_are_warned_naming_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from regen.check import gpu_notes

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    config = demo_config()
    config["server"].update(mode="sglang", tp=1)
    (note,) = gpu_notes(config, 2, fake_host(tmp_path, gpus=8))
    assert note.startswith("--resources gpu=2: 2 GPU slot(s) x server.tp 1 use 2 of the 8 GPUs")
    assert "CUDA_VISIBLE_DEVICES" in note and "give gpu=8" in note
    assert gpu_notes(config, 8, fake_host(tmp_path, gpus=8)) == []
    (from_config,) = gpu_notes(config, None, fake_host(tmp_path, gpus=8))  # server.gpus 2 in the demo
    assert from_config.startswith("server.gpus 2: ")
    config["server"]["mode"] = "simulated"
    assert gpu_notes(config, 2, fake_host(tmp_path, gpus=8)) == []


def test_the_widened_gpu_counter_is_explained_once(tmp_path: Path) -> None:
    """Snakemake prints its job counter (``gpu=Resource("gpu", 4)`` for ``gpu=2``): regen says what it is."""
    wd = copy_workflow(tmp_path / "wf")
    run = snakemake(wd, "-n", "--cores", "2", "--resources", "gpu=2", "--configfile", "config/demo.yaml")
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    lines = [x for x in out.splitlines() if x.startswith("regen: --resources gpu=2: 2 GPU slot(s)")]
    assert len(lines) == 1 and "counts 4 for gpu" in lines[0], out[-3000:]


def test_the_servers_python_is_asked_for_its_sglang_without_importing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Importing sglang took ~20 s on the H200 host before any job ran: the check reads the installed
    version only (a package that raises on import still reports its version)."""
    from regen.check import sglang_version_in

    site = tmp_path / "site"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("raise ImportError('imported')\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    version, why = sglang_version_in(sys.executable)
    assert version is None and "No package metadata was found for sglang" in why  # a folder, no dist
    dist = site / "sglang-9.9.9.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 9.9.9\n")
    assert sglang_version_in(sys.executable) == ("9.9.9", "")
    (site / "sglang" / "__init__.py").unlink()
    (site / "sglang").rmdir()
    assert sglang_version_in(sys.executable) == (None, "No module named sglang")
