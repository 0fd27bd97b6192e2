"""The drafter loop's serving side (issue 36): the accept length from SGLang's own numbers, the perfect
drafter's ceiling, the sequence's order and resume, the report and its ``loop:`` line, and the dense
target's dataset (original answers) through regen's simulated workflow."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu.known_target import model as kt
from bench.gpu.serverlog import accept_lengths
from bench.loop import accept, report, sequence

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------- SGLang's numbers


def test_accept_length_is_tokens_over_verify_steps_summed_not_averaged() -> None:
    # two requests as SGLang 0.5.17's /generate returns them (_calculate_spec_decoding_metrics' fields)
    metas = [
        {
            "completion_tokens": 30,
            "spec_verify_ct": 10,
            "spec_accept_length": 3.0,
            "finish_reason": {"type": "stop"},
        },
        {
            "completion_tokens": 10,
            "spec_verify_ct": 10,
            "spec_accept_length": 1.0,
            "finish_reason": {"type": "stop"},
        },
        {"completion_tokens": 5, "finish_reason": {"type": "length"}},  # no spec fields: counted, left out
    ]
    got = accept.meta_accept(metas)
    assert got["accept_length"] == pytest.approx(40 / 20)
    assert got["per_request_mean"] == pytest.approx(2.0)
    assert got["requests"] == 3 and got["requests_without_spec"] == 1
    assert got["finish"] == {"stop": 2, "length": 1}
    assert accept.meta_accept([])["accept_length"] is None


def test_accept_lengths_from_dense_decode_lines() -> None:
    line = (
        "[2026-12-02 01:00:0{i}] Decode batch, #running-req: {r}, #token: 9000, token usage: 0.02, "
        "accept len: {a}, accept rate: 0.64, cuda graph: True, gen throughput (token/s): 5000.00, "
        "#queue-req: 0"
    )
    text = "\n".join(line.format(i=i, r=r, a=a) for i, (r, a) in enumerate([(48, 2.9), (48, 3.1), (16, 1.5)]))
    got = accept_lengths(text)
    assert got["lines"] == 3 and got["median"] == pytest.approx(2.9)
    assert got["running_weighted_mean"] == pytest.approx((48 * 2.9 + 48 * 3.1 + 16 * 1.5) / 112)
    assert accept_lengths("Decode batch without spec") is None


# ------------------------------------------------------------------------------------- the ceiling


@pytest.fixture(scope="module")
def dense_chain(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, kt.Chain]:
    out = tmp_path_factory.mktemp("dense")
    kt.build(out, kt.TINY_DENSE, kt.DENSE_CHAIN, [2048])
    return out, kt.Chain.from_json(json.loads((out / "chain.json").read_text()))


def test_ceiling_matches_the_chains_own_verification_simulation(dense_chain: tuple[Path, kt.Chain]) -> None:
    _, chain = dense_chain
    got = accept.ceiling(chain, runs=1500, max_tokens=2048)
    # known_target.mtp_simulated counts every token in a verify step (the log's definition, near ours)
    assert got["log_accept_len"] == pytest.approx(kt.mtp_simulated(chain, runs=1500, steps=3), abs=0.06)
    # meta_info's ratio includes prefill's token: a little above the log's
    assert got["log_accept_len"] < got["accept_length"] < got["log_accept_len"] + 0.1
    assert 1.0 < got["accept_length"] < 4.0 and got["steps"] == 3


def test_ceiling_of_a_certain_chain_is_every_draft_accepted(dense_chain: tuple[Path, kt.Chain]) -> None:
    """A chain whose every state has one successor: each verify step accepts 3 drafts + the bonus."""
    _, chain = dense_chain
    order = sorted(t for t in chain.states if t != chain.eos)
    nxt = {t: order[i + 1] if i + 1 < len(order) else chain.eos for i, t in enumerate(order)}
    states = {
        t: kt.State(t, s.piece, s.role, {nxt[t]: 0.0} if t in nxt else s.succ)
        for t, s in chain.states.items()
    }
    certain = kt.Chain(
        states,
        order[0], order[0], chain.think_close, chain.eos, chain.tool_first, chain.sampling, chain.spec,
    )  # fmt: skip
    got = accept.ceiling(certain, runs=5, max_tokens=4096)
    n = len(order)  # tokens a completion: order[1:] then eos
    verifies = -(-(n - 1) // 4)  # the first from prefill, then 4 a step
    assert got["accept_length"] == pytest.approx(n / verifies)


def test_ceiling_cli_writes_json(dense_chain: tuple[Path, kt.Chain], tmp_path: Path) -> None:
    model, _ = dense_chain
    out = tmp_path / "acc" / "ceiling.json"
    assert (
        accept.main(["--target", str(model), "--ceiling", "--out", str(out), "--max-new-tokens", "2048"]) == 0
    )
    got = json.loads(out.read_text())
    assert got["source"] == "ceiling" and got["accept_length"] > 2


def test_drafter_facts_read_d2t_from_the_safetensors_header(tmp_path: Path) -> None:
    header = {"d2t": {"dtype": "I64", "shape": [32000], "data_offsets": [0, 0]}, "__metadata__": {}}
    raw = json.dumps(header).encode()
    (tmp_path / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw)
    (tmp_path / "config.json").write_text(
        json.dumps(
            {"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 32000, "vocab_size": 151936}
        )
    )
    got = accept.drafter_facts(tmp_path)
    assert got["d2t"] == [32000] and got["t2d"] is None and got["draft_vocab_size"] == 32000


# ------------------------------------------------------------------------------------ the sequence


def stub_python(path: Path, fail_on: str | None = None) -> Path:
    """A stand-in interpreter: records its arguments, fails on a module named ``fail_on``."""
    log = path.with_suffix(".calls")
    body = f'#!/bin/sh\necho "$@" >> {log}\n'
    if fail_on:
        body += f'case "$*" in *{fail_on}*) exit 3;; esac\n'
    path.write_text(body + "exit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_sequence_order_resume_and_a_failed_step_skips_only_what_needs_it(tmp_path: Path) -> None:
    py = stub_python(tmp_path / "py", fail_on="bench.loop.prepare")
    args = ["--root", str(tmp_path / "root"), "--results", str(tmp_path / "res"), "--date", "2026-12-02"]
    args += ["--regen-python", str(py), "--trainer-python", str(py), "--dry", "--n", "40"]
    assert sequence.main(args) == 1
    calls = (tmp_path / "py.calls").read_text().splitlines()
    modules = [c.split()[1] for c in calls]
    # target, workflow, prepare (fails); captures/train/accept need it; the ceiling needs only the target
    assert modules == ["bench.gpu.known_target"] * 2 + ["bench.loop.prepare", "bench.loop.accept"]
    assert [c.split()[2] for c in calls[:2]] == ["model", "run"]
    assert "--tiny" in calls[0] and "--mode simulated" in calls[1] and "--dense" in calls[1]
    steps = json.loads((tmp_path / "root" / "steps.json").read_text())["steps"]
    assert steps["prepare"]["rc"] == 3 and steps["train-regen"]["skipped_for"]
    assert (tmp_path / "res" / "loop-2026-12-02.json").exists()
    # again with prepare working: done steps are skipped, the rest run in the planned order
    py = stub_python(tmp_path / "py")
    (tmp_path / "py.calls").unlink()
    assert sequence.main(args) == 0
    calls = (tmp_path / "py.calls").read_text().splitlines()
    assert [c.split()[1] for c in calls][:1] == ["bench.loop.prepare"]
    names = [c.split("--out ")[1].split()[0].rsplit("/", 1)[1] for c in calls[1:]]
    assert names == [
        "regen-train",
        "regen-eval",
        "original-train",
        "original",
        "regen",
        "regen.json",
        "original.json",
    ]
    trains = [c for c in calls if "bench.loop.train" in c]
    assert all("--reference-loss" in c and "--steps 400" in c and "--seed 0" in c for c in trains)
    assert trains[0].replace("original-train", "X") == trains[1].replace("regen-train", "X").replace(
        "train/regen", "train/original"
    )  # the two runs differ only in their train features (and where they write)
    assert all("--dry" in c for c in calls if "--drafter" in c)


# -------------------------------------------------------------------------------------- the report


def test_report_line_and_markdown_from_the_steps_results(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    (root / "data" / "prepare.json").write_text(json.dumps({"files": {"regen-train": {"rows": 412}}}))
    for name, acc, sim in (("regen", 2.9, 6.6), ("original", 1.25, 1.2)):
        (root / "train" / name).mkdir(parents=True)
        (root / "train" / name / "train.json").write_text(
            json.dumps(
                {
                    "steps": 400,
                    "specforge_eval": {"eval/simulated_acc_len": sim, "eval/avg_acc": 0.5},
                    "predicted_accept_length_3steps": acc,
                }
            )
        )
    (root / "acc").mkdir()
    (root / "acc" / "regen.json").write_text(
        json.dumps({"accept_length": 2.9, "source": "sglang 0.5.17 meta_info"})
    )
    line = report.write(root, tmp_path / "res", "2026-12-02")
    assert line.startswith("loop: trainer=specforge algo=eagle3 rows=412 steps=400 accept_regen=2.9000 ")
    assert "accept_original=na accept_ceiling=na ratio=na " in line  # not measured yet: na, never a guess
    assert line.endswith("specforge_eval_regen=6.6000 specforge_eval_original=1.2000")
    (root / "acc" / "original.json").write_text(json.dumps({"accept_length": 1.45, "source": "s"}))
    (root / "acc" / "ceiling.json").write_text(json.dumps({"accept_length": 2.97, "source": "ceiling"}))
    line = report.write(root, tmp_path / "res", "2026-12-02")
    assert f"ratio={2.9 / 1.45:.4f}" in line and "accept_ceiling=2.9700" in line
    md = (tmp_path / "res" / "loop-2026-12-02.md").read_text()
    assert line in md and "eval/simulated_acc_len" in md
    got = json.loads((tmp_path / "res" / "loop-2026-12-02.json").read_text())
    assert got["line"] == line and got["headline"]["accept_source"]["regen"] == "sglang 0.5.17 meta_info"
    assert report.main(["--root", str(root), "--results", str(tmp_path / "res2")]) == 0


# -------------------------------------------------------------- the dense dataset through the workflow


def test_dense_rows_with_original_answers_through_the_simulated_workflow(tmp_path: Path) -> None:
    work, model = tmp_path / "work", tmp_path / "model"
    cmd = [sys.executable, "-m", "bench.gpu.known_target", "run", "--model", str(model), "--work", str(work)]
    cmd += ["--dense", "--n", "40", "--max-tokens", "2048", "--eval-fraction", "0.2", "--no-projection"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Qwen3ForCausalLM" in (model / "config.json").read_text()  # built dense when absent
    rows = [json.loads(x) for x in (work / "dataset.jsonl").read_text().splitlines()]
    assert all([m["role"] for m in r["messages"]] == ["user", "assistant"] and "tools" not in r for r in rows)
    answers = [r["messages"][1]["content"] for r in rows]
    assert len(set(answers)) == len(answers) and all(a.endswith(".") for a in answers)
    import yaml

    cfg = yaml.safe_load((work / "config.yaml").read_text())
    assert cfg["export"]["eval_fraction"] == 0.2 and "args" not in cfg["server"]
    assert json.loads((work / "full-shape-config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    export = work / "run" / "results" / "export"
    train = export.joinpath("tokenized.jsonl").read_text().splitlines()
    evals = export.joinpath("tokenized.eval.jsonl").read_text().splitlines()
    assert len(train) + len(evals) == 40 and evals  # every row finished inside the window, an eval split
    measured = json.loads((work / "known_target_measured.json").read_text())
    assert measured["chain_steps_valid"] == 1.0 and measured["tool_rows"] == 0
