"""Issue 14: every input row ends in exactly one bucket with a named reason, and nothing a row said is
dropped silently - audited through the real chat template and tokenizer (the demo's Qwen3 one)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import shutil
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

from regen.chat import ChatTemplate
from regen.ingest.audit import AuditConfig, AuditGateError, NothingToGenerateError, cli, run_audit
from regen.ingest.dataset import DatasetConfig, iter_samples
from regen.ingest.shards import make_shards, read_shard

BAD_DIR = Path(__file__).parents[1] / "data" / "bad"
_spec = importlib.util.spec_from_file_location("make_bad", BAD_DIR / "make_bad.py")
assert _spec and _spec.loader
make_bad = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_bad)


def _flags(out: Path) -> list[dict[str, Any]]:
    return pq.read_table(out / "flags.parquet").to_pylist()


def _audit(path: Path, out: Path, tokenizer: Path, **cfg: Any) -> list[dict[str, Any]]:
    run_audit(
        path,
        out,
        AuditConfig.from_dict({"override_gates": True, **cfg}),
        tokenizer,
        DatasetConfig.from_dict({"path": str(path), "id_column": "id"}),
    )
    return _flags(out)


def _shard(path: Path, out: Path, tokenizer: Path) -> dict[int, Any]:
    shards = [out / f"{k:05d}.parquet" for k in range(2)]
    make_shards(path, out / "excluded.jsonl", shards, "auto", "id", "skip", tokenizer)
    return {s.source["row"]: s for p in shards for s in read_shard(p)}


# ------------------------------------------------------------------------------ every byte accounted


def test_truncated_gzip_fails_the_audit_saying_how_much_was_read(
    tmp_path: Path, demo_tokenizer_dir: Path
) -> None:
    path = BAD_DIR / "truncated_gzip.jsonl.gz"
    complete = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(path.read_bytes()).count(b"\n")
    assert complete == make_bad.TRUNCATED_GZIP_ROWS  # every complete line before the cut is read
    with pytest.raises(AuditGateError) as err:
        run_audit(
            path,
            tmp_path / "audit",
            AuditConfig.from_dict({}),
            demo_tokenizer_dir,
            DatasetConfig.from_dict({"path": str(path), "id_column": "id"}),
        )
    message = str(err.value)
    assert "max_unread_tail_files" in message and "cut off" in message
    assert f"rows 0-{complete - 1}" in message and str(path) in message
    summary = orjson.loads((tmp_path / "audit" / "summary.json").read_bytes())
    assert summary["gates"]["max_unread_tail_files"] == {"limit": 0, "value": 1.0, "passed": False}
    assert len(summary["unread_tails"]) == 1
    # an explicit allowance lets the readable part go on
    run_audit(
        path,
        tmp_path / "ok",
        AuditConfig.from_dict({"gates": {"max_unread_tail_files": 1}}),
        demo_tokenizer_dir,
        DatasetConfig.from_dict({"path": str(path), "id_column": "id"}),
    )


def test_io_error_mid_file_is_an_unread_tail_with_byte_counts(tmp_path: Path) -> None:
    """A file that stops being readable part-way (here: the compressed stream is corrupt in the middle)."""
    rows = make_bad.lines(make_bad.tail_rows(300))
    whole = bytearray(gzip.compress(rows, mtime=0))
    whole[len(whole) // 2 : len(whole) // 2 + 40] = b"\xff" * 40
    path = tmp_path / "corrupt.jsonl.gz"
    path.write_bytes(bytes(whole))
    bad: list[Any] = []
    samples = list(iter_samples(path, "auto", "id", "skip", bad_rows=bad))
    assert len(bad) == 1 and bad[0].unread_tail and bad[0].row == len(samples)
    assert "gzip" in bad[0].problem and "bytes" in bad[0].problem


def test_directory_named_like_a_dataset_is_explained(
    tmp_path: Path, demo_tokenizer_dir: Path, capsys
) -> None:
    folder = tmp_path / "x.jsonl"
    folder.mkdir()
    (folder / "notes.txt").write_text("{}\n")  # holds no dataset file
    with pytest.raises(IsADirectoryError, match=r"no dataset file in it.*notes\.txt"):
        iter_samples(folder, "auto", None, "skip")
    assert cli([str(folder), "--tokenizer", str(demo_tokenizer_dir), "--out", str(tmp_path / "o")]) == 2
    assert "no dataset file" in capsys.readouterr().err


def test_zero_row_parquet_stops_before_any_server(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    with pytest.raises(NothingToGenerateError, match=r"has no rows.*before any server starts"):
        run_audit(
            BAD_DIR / "zero_rows.parquet",
            tmp_path / "a",
            AuditConfig.from_dict({"override_gates": True}),
            demo_tokenizer_dir,
            DatasetConfig.from_dict({"path": str(BAD_DIR / "zero_rows.parquet")}),
        )


def test_all_rows_excluded_stops_naming_the_reasons(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    path = tmp_path / "all_bad.jsonl"
    path.write_text('{"messages": []}\nnot json\n')
    with pytest.raises(
        NothingToGenerateError, match=r"all 2 rows are excluded \(bad_row=1, structure_error=1\)"
    ):
        run_audit(
            path,
            tmp_path / "a",
            AuditConfig.from_dict({"override_gates": True}),
            demo_tokenizer_dir,
            DatasetConfig.from_dict({"path": str(path)}),
        )


# ------------------------------------------------------------------------------ faithful or named


def test_content_parts_are_joined_as_sglang_does(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    path = BAD_DIR / "content_parts.jsonl"
    flags = _audit(path, tmp_path, demo_tokenizer_dir)
    assert all(not f["excluded"] for f in flags)
    shards = _shard(path, tmp_path, demo_tokenizer_dir)
    assert shards[1].messages[0].content == "Describe a cat."  # SGLang: " ".join(text parts)


def test_non_text_parts_are_excluded_naming_the_part_types(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    flags = _audit(BAD_DIR / "non_string_content.jsonl", tmp_path, demo_tokenizer_dir)
    row = next(f for f in flags if f["row"] == 1)
    assert row["exclude_reason"] == "structure_error"
    assert "image_url" in row["detail"] and "only text parts are read" in row["detail"]


def test_developer_becomes_system_for_a_template_without_it(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    assert ChatTemplate.from_dir(demo_tokenizer_dir).developer_role == "system"
    path = BAD_DIR / "developer_role.jsonl"
    flags = _audit(path, tmp_path, demo_tokenizer_dir)
    assert all(not f["excluded"] for f in flags)
    sample = _shard(path, tmp_path, demo_tokenizer_dir)[1]
    assert [m.role for m in sample.messages] == ["system", "user", "assistant"]
    assert sample.messages[0].content == "Answer in French."


def test_developer_is_kept_for_a_template_that_renders_it(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    tok = tmp_path / "tok"
    shutil.copytree(demo_tokenizer_dir, tok)
    cfg = json.loads((tok / "tokenizer_config.json").read_text())
    cfg["chat_template"] = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    (tok / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert ChatTemplate.from_dir(tok).developer_role == "developer"
    flags = _audit(BAD_DIR / "developer_role.jsonl", tmp_path / "a", tok)
    assert all(not f["excluded"] for f in flags)
    sample = _shard(BAD_DIR / "developer_role.jsonl", tmp_path / "a", tok)[1]
    assert sample.messages[0].role == "developer"


def test_a_final_user_turn_is_the_prompt_end(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    """[user, assistant, user]: the prompt is all three turns (plus the generation prompt)."""
    chat = ChatTemplate.from_dir(demo_tokenizer_dir)
    flags = _audit(BAD_DIR / "ends_with_user.jsonl", tmp_path, demo_tokenizer_dir)
    row = next(f for f in flags if f["row"] == 1)
    turns = [json.loads(line) for line in (BAD_DIR / "ends_with_user.jsonl").read_text().splitlines()][1][
        "messages"
    ]
    whole = chat.render_dicts(turns, add_generation_prompt=True, use_jinja=True)
    assert row["prompt_tokens"] == len(chat.tokenizer.encode(whole, add_special_tokens=False).ids)
    assert chat.prompt_messages(turns) == turns


def test_tool_calls_reach_the_template_and_the_shard(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    path = BAD_DIR / "tool_calls.jsonl"
    row = json.loads(path.read_text().splitlines()[1])
    flags = _audit(path, tmp_path, demo_tokenizer_dir)
    verdict = next(f for f in flags if f["row"] == 1)
    assert not verdict["excluded"], verdict
    chat = ChatTemplate.from_dir(demo_tokenizer_dir)
    prompt = [dict(m, content=m["content"] or "") for m in row["messages"][:3]]
    text = chat.render_dicts(prompt, add_generation_prompt=True, tools=row["tools"])
    assert (
        "<tools>" in text and "<tool_call>" in text and "get_weather" in text
    )  # the real template rendered them
    assert verdict["prompt_tokens"] == len(chat.tokenizer.encode(text, add_special_tokens=False).ids)
    sample = _shard(path, tmp_path, demo_tokenizer_dir)[1]
    assert list(sample.tools or ()) == row["tools"]
    assert list(sample.messages[1].tool_calls or ()) == row["messages"][1]["tool_calls"]
    assert sample.messages[1].content == ""  # content: null beside tool calls means no text
    assert sample.messages[2].tool_call_id == "call_1"


def test_whitespace_variant_prompts_are_flagged_and_can_be_excluded(
    tmp_path: Path, demo_tokenizer_dir: Path
) -> None:
    path = BAD_DIR / "whitespace_duplicate.jsonl"
    flags = _audit(path, tmp_path / "a", demo_tokenizer_dir)
    assert [f["flags"] for f in flags] == [[], ["whitespace_duplicate_prompt"], []]
    assert not any(f["excluded"] for f in flags)
    flags = _audit(
        path, tmp_path / "b", demo_tokenizer_dir,
        exclude=["structure_error", "bad_row", "duplicate_prompt", "whitespace_duplicate_prompt"],
    )  # fmt: skip
    assert [f["exclude_reason"] for f in flags] == [None, "whitespace_duplicate_prompt", None]


def test_wide_integer_ids_keep_every_digit(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    flags = _audit(BAD_DIR / "bigint_id.jsonl", tmp_path, demo_tokenizer_dir)
    assert flags[1]["id"] == flags[1]["id_json"] == "123456789012345678901234567890"
    assert not flags[1]["excluded"]


# ------------------------------------------------------------------------------ bounded memory

MEMORY_SCRIPT = """
import resource, sys
from regen.ingest.audit import AuditConfig, run_audit
from regen.ingest.dataset import DatasetConfig
config = AuditConfig.from_dict({"override_gates": True})
rows = DatasetConfig.from_dict({"path": sys.argv[1], "id_column": "id"})
s = run_audit(sys.argv[1], sys.argv[2], config, sys.argv[3], rows)
print(s.flag_counts.get("over_length", 0), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def test_a_50_mb_line_audits_in_bounded_memory(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    path = tmp_path / "huge.jsonl"
    giant = {"id": "g", "messages": [{"role": "user", "content": "word " * 10_000_000}]}
    with open(path, "wb") as fh:
        fh.write(orjson.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"}]}) + b"\n")
        fh.write(orjson.dumps(giant) + b"\n")
    assert path.stat().st_size > 50_000_000
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_SCRIPT, str(path), str(tmp_path / "audit"), str(demo_tokenizer_dir)],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    over_length, peak_mib = int(out[0]), int(out[1])
    assert over_length == 1 and peak_mib < 1024, peak_mib
    detail = next(f for f in _flags(tmp_path / "audit") if f["id"] == "g")["detail"]
    assert "not tokenized" in detail


# ------------------------------------------------------------------------------ tool calls end to end


def test_tool_calls_survive_generation_validation_and_merge(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    """tool_calls.jsonl row 1 through shard -> simulated SGLang -> record -> valid Parquet -> dataset."""
    from regen.generate.client import Endpoint, ShardJob, generate_shard
    from regen.ingest.shards import read_shard
    from regen.output.merge import MergeConfig, iter_dataset_samples, merge
    from regen.output.validate import ValidateConfig, validate_shard
    from regen.runconfig import GenerateConfig
    from regen.simulated.launcher import start_simulated_server

    path = BAD_DIR / "tool_calls.jsonl"
    row = json.loads(path.read_text().splitlines()[1])
    _audit(path, tmp_path, demo_tokenizer_dir)
    shard = tmp_path / "00000.parquet"
    make_shards(path, tmp_path / "excluded.jsonl", [shard], "auto", "id", "skip", demo_tokenizer_dir)
    url, stop = start_simulated_server(inline=True, mean_answer_tokens=8, mean_reasoning_tokens=8)
    records = tmp_path / "gen" / "00000.jsonl"
    try:
        generate_shard(ShardJob(
            read_shard(shard), tmp_path / "journal.jsonl", records, tmp_path / "gen" / "00000.failed.jsonl",
            GenerateConfig.from_dict({"request_timeout_s": 30}), Endpoint(url, "gpu0"), "00000",
        ))  # fmt: skip
    finally:
        stop()
    rec = next(r for r in map(orjson.loads, records.read_bytes().splitlines()) if r["id"] == "b1")
    assert rec["tools"] == row["tools"]
    assert rec["messages"][1]["tool_calls"] == row["messages"][1]["tool_calls"]
    assert rec["messages"][2]["tool_call_id"] == "call_1"
    stats = validate_shard(
        records, tmp_path / "valid.parquet", tmp_path / "q.jsonl", ValidateConfig.from_dict({})
    )
    assert stats.quarantined == 0, (tmp_path / "q.jsonl").read_text()
    merge([tmp_path / "valid.parquet"], tmp_path / "dataset", MergeConfig.from_dict({}), {})
    out = {s.id: s for s in iter_dataset_samples(tmp_path / "dataset")}["b1"]
    assert [m.role for m in out.messages] == ["user", "assistant", "tool", "assistant"]
    assert list(out.messages[1].tool_calls or ()) == row["messages"][1]["tool_calls"]
    assert out.messages[2].tool_call_id == "call_1"
    table = pq.read_table(tmp_path / "dataset").to_pylist()
    assert json.loads(next(t for t in table if t["id"] == "b1")["tools_json"]) == row["tools"]


# ------------------------------------------------------------------------------ through Snakemake


def test_workflow_stops_on_an_empty_dataset_before_any_server(tmp_path: Path) -> None:
    """The zero-row Parquet through the real workflow: the audit fails, no generate job, no server."""
    from support.workflow import copy_workflow, snakemake  # tests/ is on sys.path (conftest)

    wd = copy_workflow(tmp_path / "wf")
    shutil.copy2(BAD_DIR / "zero_rows.parquet", wd / "data" / "empty.parquet")
    (wd / "config" / "empty.yaml").write_text("dataset: {path: data/empty.parquet}\n")
    run = snakemake(wd, "--cores", "1", "--configfile", "config/demo.yaml", "config/empty.yaml")
    assert run.returncode != 0
    # stopped by the preflight (regen check, before any job) or, past it, by the audit
    audit_log = wd / "logs" / "audit.log"
    said = (audit_log.read_text() if audit_log.exists() else "") + run.stdout + run.stderr
    assert "has no rows" in said and ("before any server starts" in said or "before any job ran" in said), (
        said
    )
    assert not (wd / "results" / "generations").exists()
    assert not list((wd / "logs").glob("servers/*.log")) and not (wd / "work" / "servers").exists()
