"""Empty old answers judged by fate (issue 28): the gate ``max_empty_response_fraction`` counts only the
empty answers that stay in the training data as context; those the run regenerates are reported in
plain words and never block. Datasets are made here; the 87% ShareGPT case is the one regen exists for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from support.workflow import copy_workflow, snakemake

from regen.chat import ChatTemplate
from regen.ingest.audit import AuditConfig, AuditGateError, audit_records, cli, run_audit
from regen.ingest.dataset import DatasetConfig
from regen.layout.run import RunLayout
from regen.observe.report import ReportInputs, RunFacts, audit_page_html, landing_rst, readiness
from regen.types import Message, Sample

#: the template's empty think block; the renderer adds end-of-turn. The second form spells end-of-turn
#: out, as datasets exported from rendered text do: both are scaffolding only.
EMPTY_ANSWERS = ("<think>\n\n</think>\n\n", "<think>\n\n</think>\n\n<|im_end|>")


def sharegpt_rows(n: int, empty_percent: int) -> list[dict[str, Any]]:
    """``n`` one-exchange ShareGPT conversations; ``empty_percent`` of every 100 answer with scaffolding."""
    rows = []
    for i in range(n):
        empty = i % 100 < empty_percent
        answer = EMPTY_ANSWERS[i % 2] if empty else f"The sum is {i + 7}, since {i} plus 7 is {i + 7}."
        rows.append(
            {
                "id": f"sg-{i:05d}",
                "conversations": [
                    {"from": "human", "value": f"Question {i}: what is {i} plus 7?"},
                    {"from": "gpt", "value": answer},
                ],
            }
        )
    return rows


def context_rows(n: int, empty_percent: int) -> list[dict[str, Any]]:
    """Two-exchange conversations whose *first* answer is empty in ``empty_percent`` of every 100 rows;
    the final answer is real. Under ``regenerate: last`` the first answer stays as context."""
    rows = []
    for i in range(n):
        first = EMPTY_ANSWERS[0] if i % 100 < empty_percent else f"First answer {i}."
        rows.append(
            {
                "id": f"ctx-{i:05d}",
                "messages": [
                    {"role": "user", "content": f"first question {i}"},
                    {"role": "assistant", "content": first},
                    {"role": "user", "content": f"follow-up question {i}"},
                    {"role": "assistant", "content": f"Final answer {i}."},
                ],
            }
        )
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def summary_of(out: Path) -> dict[str, Any]:
    return orjson.loads((out / "summary.json").read_bytes())


# --------------------------------------------------------------------------------------------- gate


def test_87_percent_empty_answers_all_regenerated_pass_the_default_gate(
    tmp_path: Path, demo_tokenizer_dir: Path
) -> None:
    data = write_jsonl(tmp_path / "sharegpt.jsonl", sharegpt_rows(1000, 87))
    out = tmp_path / "audit"
    summary = run_audit(
        data,
        out,
        AuditConfig.from_dict({}, "last"),
        demo_tokenizer_dir,
        DatasetConfig.from_dict({"path": str(data), "id_column": "id"}),
    )
    s = summary_of(out)
    assert s["flagged_empty_response_fraction"] == pytest.approx(0.87)  # measured exactly, still reported
    empty = s["empty_old_answers"]
    assert empty | {"in_words": None} == {
        "regenerate": "last",
        "regenerate_assumed": False,
        "old_answers": 1000,
        "empty": 870,
        "regenerated": 870,
        "context": 0,
        "excluded": 0,
        "samples_with_empty_context": 0,
        "in_words": None,
    }
    assert empty["in_words"].startswith("87% of old answers are empty (870 of 1,000")
    assert "all of them are regenerated (generate.regenerate: last)" in empty["in_words"]
    gate = s["gates"]["max_empty_response_fraction"]
    assert gate == {"limit": 0.5, "value": 0.0, "passed": True}  # the schema default, no override
    assert summary.passed and s["overridden"] is False


def test_empty_context_answers_under_last_fail_and_name_regenerate_all(
    tmp_path: Path, demo_tokenizer_dir: Path
) -> None:
    data = write_jsonl(tmp_path / "context.jsonl", context_rows(200, 60))
    out = tmp_path / "audit"
    with pytest.raises(AuditGateError) as err:
        run_audit(
            data,
            out,
            AuditConfig.from_dict({}, "last"),
            demo_tokenizer_dir,
            DatasetConfig.from_dict({"path": str(data), "id_column": "id"}),
        )
    message = str(err.value)
    assert "audit.gates.max_empty_response_fraction: value 0.6000 > limit 0.5000" in message
    assert "120 kept as context in 120 samples" in message
    assert "set generate.regenerate: all" in message
    s = summary_of(out)
    assert s["flagged_empty_response"] == 0  # no sample is empty throughout: the old gate saw nothing
    assert s["empty_old_answers"]["context"] == 120 and s["empty_old_answers"]["regenerated"] == 0

    # the same data under regenerate: all: every old answer is replaced, nothing blocks
    summary = run_audit(
        data,
        tmp_path / "all",
        AuditConfig.from_dict({}, "all"),
        demo_tokenizer_dir,
        DatasetConfig.from_dict({"path": str(data), "id_column": "id"}),
    )
    empty = summary.empty_answers
    assert (empty.regenerated, empty.context, empty.samples_with_empty_context) == (120, 0, 0)
    assert summary.passed


def test_a_conversation_ending_with_a_prompt_keeps_every_old_answer_under_last(
    demo_tokenizer_dir: Path,
) -> None:
    chat = ChatTemplate.from_dir(demo_tokenizer_dir)
    empty = EMPTY_ANSWERS[0]
    samples = [
        # ends with a user turn: it gets a new answer, both old ones stay as context
        Sample("open", (Message("user", "a"), Message("assistant", empty), Message("user", "b"))),
        # ends with an (empty) answer: that one is replaced, the earlier empty one stays
        Sample(
            "closed",
            (
                Message("user", "c"),
                Message("assistant", empty),
                Message("user", "d"),
                Message("assistant", ""),
            ),
        ),
        Sample("fine", (Message("user", "e"), Message("assistant", "a real answer"))),
    ]
    _, last = audit_records(samples, AuditConfig.from_dict({}, "last"), chat)
    e = last.empty_answers
    assert (e.old_answers, e.empty, e.regenerated, e.context, e.samples_with_empty_context) == (4, 3, 1, 2, 2)
    assert last.gates[0].name == "max_empty_response_fraction" and last.gates[0].value == pytest.approx(2 / 3)
    _, every = audit_records(samples, AuditConfig.from_dict({}, "all"), chat)
    assert (every.empty_answers.regenerated, every.empty_answers.context) == (3, 0)
    assert every.gates[0].value == 0.0


def test_empty_answers_of_excluded_samples_never_count_for_the_gate(demo_tokenizer_dir: Path) -> None:
    chat = ChatTemplate.from_dir(demo_tokenizer_dir)
    empty = Message("assistant", EMPTY_ANSWERS[0])
    samples = [
        Sample("kept", (Message("user", "q"), empty, Message("user", "again"), Message("assistant", "ok"))),
        # the same prompt again: excluded as a duplicate, its empty context answer leaves with it
        Sample("dup", (Message("user", "q"), empty, Message("user", "again"), Message("assistant", "ok"))),
    ]
    audits, summary = audit_records(samples, AuditConfig.from_dict({}, "last"), chat)
    assert [a.excluded for a in audits] == [False, True]
    e = summary.empty_answers
    assert (e.empty, e.context, e.excluded, e.samples_with_empty_context) == (2, 1, 1, 1)
    assert "1 in excluded samples" in e.in_words()


def test_a_tokenized_row_whose_mask_is_empty_has_every_old_answer_empty(demo_tokenizer_dir: Path) -> None:
    """A tokenized row's own loss mask rules: at most ``scaffolding_max_tokens`` supervised means every
    answer of it is empty, whatever the decoded text says."""
    chat = ChatTemplate.from_dir(demo_tokenizer_dir)

    def turns(q: str) -> tuple[Message, ...]:
        return (
            Message("user", q),
            Message("assistant", "Yes."),
            Message("user", "and?"),
            Message("assistant", "No."),
        )

    samples = [
        Sample("masked-out", turns("q1"), {"format": "tokenized", "mask_supervised_tokens": 3}),
        Sample("real", turns("q2"), {"format": "tokenized", "mask_supervised_tokens": 40}),
    ]
    audits, summary = audit_records(samples, AuditConfig.from_dict({}, "last"), chat)
    assert [a.flags for a in audits] == [("empty_response",), ()]
    e = summary.empty_answers
    assert (e.old_answers, e.empty, e.regenerated, e.context) == (4, 2, 1, 1)


# ----------------------------------------------------------------------------------------- the CLI


def test_cli_says_which_regenerate_mode_it_assumed_and_takes_the_flag(
    tmp_path: Path, demo_tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_jsonl(tmp_path / "sharegpt.jsonl", sharegpt_rows(1000, 87))
    base = [str(data), "--tokenizer", str(demo_tokenizer_dir), "--id-column", "id"]
    assert cli([*base, "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "regenerate: last (assumed: no workflow config; choose with --regenerate last|all)" in out
    assert "87% of old answers are empty (870 of 1,000" in out
    assert "all of them are regenerated (regenerate: last, assumed)" in out
    assert summary_of(tmp_path / "a")["empty_old_answers"]["regenerate_assumed"] is True

    context = write_jsonl(tmp_path / "context.jsonl", context_rows(100, 60))
    base = [str(context), "--tokenizer", str(demo_tokenizer_dir), "--id-column", "id"]
    assert cli([*base, "--out", str(tmp_path / "b")]) == 1  # assumed last: 60 samples keep an empty answer
    captured = capsys.readouterr()
    assert "max_empty_response_fraction    value 0.6000  limit 0.5000  FAILED" in captured.out
    assert "set generate.regenerate: all (regen audit --regenerate all)" in captured.err
    assert cli([*base, "--regenerate", "all", "--out", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "regenerate: all (the run's generate.regenerate)" in out
    assert "all of them are regenerated (generate.regenerate: all)" in out


# -------------------------------------------------------------------------------------- the report


def test_audit_page_and_landing_page_say_it_in_plain_words(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    results, logs = tmp_path / "results", tmp_path / "logs"
    data = write_jsonl(tmp_path / "sharegpt.jsonl", sharegpt_rows(300, 87))
    run_audit(
        data,
        results / "audit",
        AuditConfig.from_dict({}, "last"),
        demo_tokenizer_dir,
        DatasetConfig.from_dict({"path": str(data), "id_column": "id"}),
    )
    words = summary_of(results / "audit")["empty_old_answers"]["in_words"]
    page = audit_page_html(results / "audit" / "summary.json", logs / "audit.verdict.json")
    assert "Empty old answers: 87% of old answers are empty (261 of 300" in page
    assert "kept as context (not regenerated: the gate judges these)" in page
    landing = landing_rst(readiness(ReportInputs.of(RunLayout.under(tmp_path))), RunFacts(), None)
    stage = next(line for line in landing.splitlines() if "`1. Input audit`_" in line)
    assert stage.startswith("- `1. Input audit`_: PASSED: 300 samples, 0 excluded; 87% of old answers")
    assert words.split(";")[1].strip() in stage  # "all of them are regenerated ... training data"


# ------------------------------------------------------------------------------------ the workflow


def test_the_87_percent_dataset_runs_through_the_workflow_without_override(tmp_path: Path) -> None:
    """The demo's machinery (simulated servers, the demo tokenizer) with the default gates and no
    override, on 1,000 ShareGPT conversations whose old answers are 87% scaffolding: READY, and the
    landing page says why the 87% is fine."""
    wd = copy_workflow(tmp_path / "wf")
    write_jsonl(wd / "data" / "sharegpt.jsonl", sharegpt_rows(1000, 87))
    (wd / "config" / "sharegpt.yaml").write_text("dataset: {path: data/sharegpt.jsonl}\nshards: {count: 2}\n")
    configs = ("--configfile", "config/demo.yaml", "config/sharegpt.yaml")
    run = snakemake(wd, "--cores", "2", *configs)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    audit = json.loads((wd / "results" / "audit" / "summary.json").read_text())
    assert audit["flagged_empty_response_fraction"] == pytest.approx(0.87)
    assert audit["gates"]["max_empty_response_fraction"] == {"limit": 0.5, "value": 0.0, "passed": True}
    assert audit["overridden"] is False
    assert json.loads((wd / "results" / "READY.json").read_text())["ready"] is True
    landing = (wd / "results" / "report" / "landing.rst").read_text()
    assert landing.startswith("**READY**")
    assert (
        "`1. Input audit`_: PASSED: 1000 samples, 0 excluded; 87% of old answers are empty (870 of 1,000, "
        "template scaffolding only); all of them are regenerated (generate.regenerate: last), so none stays "
        "in the training data" in landing
    )
    report = snakemake(wd, *configs, "--report", "report.html")
    assert report.returncode == 0, (report.stdout + report.stderr)[-3000:]
    assert "all of them are regenerated (generate.regenerate: last)" in (wd / "report.html").read_text()
