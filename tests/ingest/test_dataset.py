"""Ingest (regen.ingest.dataset), the demo tokenizer and the demo datasets (tests/support/demo_assets.py)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.demo_assets import DEMO_CONTEXT_LIMIT, IM_END, build_demo_dataset, build_demo_tokenizer
from tokenizers import Tokenizer

from regen.chat import ChatTemplate, hf_template_env
from regen.ingest import jsonscan, tokenized
from regen.ingest.dataset import detect_format, iter_samples
from regen.ingest.rows import content_id
from regen.types import BadInputError, BadRow, Message, Sample

REPO = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def _write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def _samples(
    path: Path, fmt: str = "auto", id_column: str | None = None, on_bad_row: str = "skip", **kw: Any
) -> Iterator[Sample]:
    """``iter_samples`` with the dataset section's schema defaults unless a test says otherwise."""
    return iter_samples(path, fmt, id_column, on_bad_row, **kw)


def _read(path: Path, **kw: Any) -> tuple[list[Sample], list[BadRow]]:
    bad: list[BadRow] = []
    samples = list(_samples(path, bad_rows=bad, **kw))
    return samples, bad


def _template(tokenizer_dir: Path) -> Any:
    cfg = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    return hf_template_env().from_string(cfg["chat_template"])


def _conv(*turns: tuple[str, Any] | tuple[str, Any, str | None]) -> list[dict[str, Any]]:
    out = []
    for t in turns:
        d: dict[str, Any] = {"role": t[0], "content": t[1]}
        if len(t) > 2 and t[2] is not None:
            d["reasoning_content"] = t[2]
        out.append(d)
    return out


GOOD = _conv(("system", "Be brief."), ("user", "What is 2+2?"), ("assistant", "4", "Two plus two."))


# --------------------------------------------------------------------------------------
# demo tokenizer
# --------------------------------------------------------------------------------------


def test_demo_tokenizer_loads_with_atomic_markers(demo_tokenizer_dir: Path) -> None:
    tok = Tokenizer.from_file(str(demo_tokenizer_dir / "tokenizer.json"))
    cfg = json.loads((demo_tokenizer_dir / "tokenizer_config.json").read_text())
    assert 3000 <= tok.get_vocab_size() <= 5000
    assert cfg["eos_token"] == "<|im_end|>"
    assert cfg["pad_token"] == "<|endoftext|>"
    assert cfg["bos_token"] is None
    assert isinstance(cfg["model_max_length"], int)
    for marker in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"):
        ids = tok.encode(f"a{marker}b", add_special_tokens=False).ids
        assert tok.token_to_id(marker) in ids, marker
        assert tok.decode(ids, skip_special_tokens=False) == f"a{marker}b"
    text = "Explain photosynthesis, please: 12 + 30 = 42!\n\n"
    assert tok.decode(tok.encode(text).ids) == text


def test_demo_template_renders_qwen3_turns(demo_tokenizer_dir: Path) -> None:
    tpl = _template(demo_tokenizer_dir)
    convo = [*GOOD[:2], {"role": "assistant", "content": "4", "reasoning_content": "\nTwo plus two.\n"}]
    assert tpl.render(messages=convo, add_generation_prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nTwo plus two.\n</think>\n\n4<|im_end|>\n"
    )
    empty_last = [*GOOD[:2], {"role": "assistant", "content": ""}]
    assert tpl.render(messages=empty_last).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n<|im_end|>\n"
    )
    prompt = tpl.render(messages=GOOD[:2], add_generation_prompt=True)
    assert prompt.endswith("What is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    no_think = tpl.render(messages=GOOD[:2], add_generation_prompt=True, enable_thinking=False)
    assert no_think == prompt + "<think>\n\n</think>\n\n"
    # Qwen3 drops the reasoning of assistant turns before the last user query
    two_rounds = [*GOOD, {"role": "user", "content": "And 3+3?"}, {"role": "assistant", "content": "6"}]
    rendered = tpl.render(messages=two_rounds)
    assert "<|im_start|>assistant\n4<|im_end|>" in rendered
    assert rendered.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n6<|im_end|>\n")


def test_build_demo_tokenizer_is_deterministic_and_matches_shipped(
    tmp_path: Path, demo_tokenizer_dir: Path
) -> None:
    out = build_demo_tokenizer(tmp_path / "tok")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (demo_tokenizer_dir / name).read_bytes(), name


# --------------------------------------------------------------------------------------
# formats
# --------------------------------------------------------------------------------------


def test_messages_format_keeps_roles_content_reasoning(formats_dir: Path) -> None:
    samples, bad = _read(formats_dir / "messages.jsonl", id_column="id")
    assert bad == []
    assert [s.id for s in samples] == ["m-1", "m-2", "3"]
    assert [s.source["row"] for s in samples] == [0, 2, 3]  # blank line 1 still counts
    assert samples[0].messages[2] == Message("assistant", "4", "Add two and two.")
    assert samples[1].messages[3] == Message("assistant", "Green.", None)
    assert samples[2].messages[1] == Message("assistant", "", None)
    assert all(s.source["format"] == "messages" for s in samples)


@pytest.mark.parametrize("name", ["sharegpt.json", "sharegpt_rows.json"])
def test_sharegpt_maps_speakers_and_system(formats_dir: Path, name: str) -> None:
    samples, bad = _read(formats_dir / name, id_column="id")
    assert bad == []
    assert [m.to_json() for m in samples[0].messages] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    assert [m.role for m in samples[1].messages] == ["system", "user", "assistant", "user", "assistant"]
    assert samples[1].source == {
        "file": str(formats_dir / name),
        "row": 1,
        "format": "sharegpt",
        "id_json": '"s-2"',
    }


def test_prompt_format_makes_a_user_turn(formats_dir: Path) -> None:
    samples, bad = _read(formats_dir / "prompt.jsonl", id_column="id")
    assert bad == []
    assert samples[0].messages == (Message("system", "You are terse."), Message("user", "What is 2+2?"))
    assert samples[1].messages == (Message("user", "Name a colour."),)
    assert samples[2].messages == (Message("user", "Say hi."),)


def test_auto_detects_per_row_and_same_conversation_gets_same_id(formats_dir: Path) -> None:
    samples, bad = _read(formats_dir / "mixed.jsonl")
    assert bad == []
    assert [s.source["format"] for s in samples] == ["messages", "sharegpt", "prompt"]
    assert samples[0].id == samples[1].id  # same conversation, two formats
    assert samples[2].id != samples[0].id


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("messages.jsonl", "messages"),
        ("sharegpt.json", "sharegpt"),
        ("sharegpt_rows.json", "sharegpt"),
        ("prompt.jsonl", "prompt"),
    ],
)
def test_explicit_format_equals_auto(formats_dir: Path, name: str, fmt: str) -> None:
    assert detect_format(formats_dir / name) == fmt
    auto, _ = _read(formats_dir / name)
    explicit, bad = _read(formats_dir / name, fmt=fmt)
    assert bad == []
    assert explicit == auto


def test_wrong_explicit_format_names_the_missing_field(formats_dir: Path) -> None:
    samples, bad = _read(formats_dir / "messages.jsonl", fmt="sharegpt")
    assert samples == []
    assert [(b.row, b.field) for b in bad] == [
        (0, "conversations"),
        (2, "conversations"),
        (3, "conversations"),
    ]
    assert "format 'sharegpt'" in bad[0].problem


def test_unknown_format_and_policy_are_rejected(formats_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown dataset format 'chatml'.*auto, messages"):
        list(_samples(formats_dir / "messages.jsonl", fmt="chatml"))
    with pytest.raises(ValueError, match="on_bad_row"):
        list(_samples(formats_dir / "messages.jsonl", on_bad_row="ignore"))


def test_parquet_and_gzip_jsonl_read_like_jsonl(tmp_path: Path, formats_dir: Path) -> None:
    reference, _ = _read(formats_dir / "messages.jsonl", id_column="id")
    rows = [json.loads(line) for line in (formats_dir / "messages.jsonl").read_text().splitlines() if line]
    for r in rows:
        r["id"] = str(r["id"])
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "m.parquet")
    gz = tmp_path / "m.jsonl.gz"
    gz.write_bytes(gzip.compress((formats_dir / "messages.jsonl").read_bytes()))
    from_parquet, bad = _read(tmp_path / "m.parquet", id_column="id")
    assert bad == []
    # Parquet fills absent struct fields with null; the conversation is the same
    assert [s.id for s in from_parquet] == [s.id for s in reference]
    assert [[m.to_json() for m in s.messages] for s in from_parquet] == [
        [m.to_json() for m in s.messages] for s in reference
    ]
    from_gz, bad = _read(gz, id_column="id")
    assert bad == [] and [s.messages for s in from_gz] == [s.messages for s in reference]


def test_unknown_extension_and_missing_file(tmp_path: Path) -> None:
    (tmp_path / "data.xlsx").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"data\.xlsx.*\.jsonl"):
        list(_samples(tmp_path / "data.xlsx"))
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl"):
        list(_samples(tmp_path / "nope.jsonl"))


# --------------------------------------------------------------------------------------
# tokenized rows
# --------------------------------------------------------------------------------------


def _tokenized_rows(tokenizer_dir: Path) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]:
    chat = ChatTemplate.from_dir(tokenizer_dir)
    convos = [
        GOOD,
        _conv(("user", "Hi"), ("assistant", "")),  # scaffolding only
        _conv(
            ("user", "A?"), ("assistant", "a"), ("user", "B?"), ("assistant", "b\n\nwith a gap", "think b")
        ),
    ]
    rows = []
    for c in convos:
        ids, mask = chat.encode_with_loss_mask([Message(**m) for m in c])
        rows.append({"input_ids": ids, "loss_mask": mask})
    return convos, rows


@pytest.mark.parametrize("container", ["jsonl", "parquet"])
@pytest.mark.parametrize("supervision", ["loss_mask", "labels"])
def test_tokenized_rows_decode_into_turns(
    tmp_path: Path, demo_tokenizer_dir: Path, container: str, supervision: str
) -> None:
    _, rows = _tokenized_rows(demo_tokenizer_dir)
    expected_counts = [sum(r["loss_mask"]) for r in rows]
    if supervision == "labels":
        rows = [
            {
                "input_ids": r["input_ids"],
                "labels": [t if m else -100 for t, m in zip(r["input_ids"], r["loss_mask"], strict=True)],
            }
            for r in rows
        ]
    path = tmp_path / f"tok.{container}"
    if container == "jsonl":
        _write_jsonl(path, rows)
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    samples, bad = _read(path, tokenizer_dir=demo_tokenizer_dir)
    assert bad == []
    assert [s.source["mask_supervised_tokens"] for s in samples] == expected_counts
    assert all(s.source["format"] == "tokenized" for s in samples)
    assert [m.to_json() for m in samples[0].messages] == GOOD
    # scaffolding only: the mask covers exactly the empty think block and the end marker
    tok = Tokenizer.from_file(str(demo_tokenizer_dir / "tokenizer.json"))
    scaffold = tok.encode(f"<think>\n\n</think>\n\n{IM_END}", add_special_tokens=False).ids
    assert samples[1].source["mask_supervised_tokens"] == len(scaffold)
    assert samples[1].messages[-1] == Message("assistant", "", "")
    # multi-turn: the template dropped the earlier turn's (absent) think block, the last keeps its own
    assert samples[2].messages[1] == Message("assistant", "a", None)
    assert samples[2].messages[3] == Message("assistant", "b\n\nwith a gap", "think b")


def test_tokenized_rows_need_a_tokenizer(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "t.jsonl", [{"input_ids": [1, 2], "loss_mask": [0, 1]}])
    with pytest.raises(ValueError, match="tokenizer_dir"):
        list(_samples(path))


@pytest.mark.parametrize(
    ("row", "field", "problem"),
    [
        ({"input_ids": [1, 2, 3]}, "loss_mask", "needs loss_mask or labels"),
        ({"input_ids": [1, 2, 3], "loss_mask": [0, 1]}, "loss_mask", "2 entries for 3"),
        ({"input_ids": [1, 2, 3], "loss_mask": [0, 2, 1]}, "loss_mask", "0 or 1"),
        ({"input_ids": [1, 2, 3], "labels": [1, 2]}, "labels", "2 entries for 3"),
        ({"input_ids": [1, 99999], "loss_mask": [0, 1]}, "input_ids", "outside the tokenizer's vocabulary"),
        ({"input_ids": "1 2 3", "loss_mask": [0, 1, 1]}, "input_ids", "expected a list of integers"),
        ({"input_ids": [1.5], "loss_mask": [1]}, "input_ids", "element 0"),
    ],
)
def test_unreadable_tokenized_rows(
    tmp_path: Path, demo_tokenizer_dir: Path, row: dict[str, Any], field: str, problem: str
) -> None:
    path = _write_jsonl(tmp_path / "t.jsonl", [row])
    samples, bad = _read(path, tokenizer_dir=demo_tokenizer_dir)
    assert samples == []
    assert len(bad) == 1 and bad[0].field == field and problem in bad[0].problem


def test_markers_are_read_from_the_template(demo_tokenizer_dir: Path) -> None:
    decoder = tokenized.TokenizedDecoder(demo_tokenizer_dir)
    assert decoder.markers == tokenized.ChatMarkers("<|im_start|>", "\n", "<|im_end|>", "<think>", "</think>")
    other = (
        "{% for m in messages %}[[{{ m.role }}]]: {{ m.content }}[[end]]{% endfor %}"
        "{% if add_generation_prompt %}[[assistant]]: {% endif %}"
    )
    markers = tokenized.markers_from_template(other, ["[[", "[[end]]"])
    assert (markers.turn_start, markers.role_sep, markers.turn_end) == ("[[", "]]: ", "[[end]]")
    assert markers.think_open is None


# --------------------------------------------------------------------------------------
# ids
# --------------------------------------------------------------------------------------


def test_content_id_ignores_key_order_and_is_stable_across_processes(tmp_path: Path) -> None:
    a = {
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Yo", "reasoning_content": "r"},
        ]
    }
    b = {
        "messages": [
            {"content": "Hi", "role": "user"},
            {"reasoning_content": "r", "content": "Yo", "role": "assistant"},
        ]
    }
    c = {"messages": [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Yo"}]}
    samples, _ = _read(_write_jsonl(tmp_path / "ids.jsonl", [a, b, c]))
    assert samples[0].id == samples[1].id != samples[2].id
    assert len(samples[0].id) == 32 and int(samples[0].id, 16) >= 0
    code = (
        "from regen.ingest.dataset import iter_samples;import sys;"
        "print(' '.join(s.id for s in iter_samples(sys.argv[1], 'auto', None, 'skip')))"
    )
    for hashseed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hashseed}
        out = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / "ids.jsonl")],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        assert out.stdout.split() == [s.id for s in samples]


def test_content_id_changes_with_reasoning() -> None:
    plain = (Message("user", "Hi"), Message("assistant", "Yo"))
    with_reasoning = (Message("user", "Hi"), Message("assistant", "Yo", "thought"))
    assert content_id(plain) != content_id(with_reasoning)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("a/b", "contains"),
        ("a\\b", "contains"),
        ("a\x00b", "contains"),
        (".", "contains"),
        ("..", "contains"),
        ("", "empty"),
        (True, "got bool"),
        ([1], "got list"),
        (None, "got null"),
    ],
)
def test_bad_ids_are_unreadable_rows(tmp_path: Path, value: Any, problem: str) -> None:
    path = _write_jsonl(tmp_path / "ids.jsonl", [{"key": value, "prompt": "Hi"}, {"key": 7, "prompt": "Hi"}])
    samples, bad = _read(path, id_column="key")
    assert [s.id for s in samples] == ["7"]
    assert len(bad) == 1 and (bad[0].row, bad[0].field) == (0, "key") and problem in bad[0].problem


def test_missing_id_column_is_unreadable(tmp_path: Path) -> None:
    samples, bad = _read(_write_jsonl(tmp_path / "ids.jsonl", [{"prompt": "Hi"}]), id_column="uid")
    assert samples == [] and (bad[0].field, bad[0].problem) == ("uid", "missing (configured as id_column)")


# --------------------------------------------------------------------------------------
# bad input: unreadable rows vs structure faults
# --------------------------------------------------------------------------------------

OK_LINE = orjson.dumps({"messages": GOOD})

BAD_JSONL_LINES: list[tuple[str, bytes, str, str]] = [
    ("malformed", b'{"messages": [{"role": "user"', "<row>", "malformed JSON"),
    ("invalid_utf8", b'{"prompt": "caf\xe9"}', "<row>", "invalid UTF-8"),
    ("raw_nul", b'{"prompt": "a\x00b"}', "<row>", "malformed JSON"),
    ("escaped_nul", b'{"prompt": "a\\u0000b"}', "prompt", "NUL"),
    ("nul_turn", b'{"messages": [{"role": "user", "content": "\\u0000"}]}', "messages[0].content", "NUL"),
    ("not_object", b"[1, 2]", "<row>", "expected a JSON object, got list"),
    ("scalar", b"42", "<row>", "expected a JSON object, got int"),
    ("no_known_field", b'{"text": "hello"}', "<row>", "cannot tell the format"),
    ("messages_str", b'{"messages": "hello"}', "messages", "expected a list of turns, got str"),
    ("messages_null", b'{"messages": null}', "messages", "got null"),
    ("turn_not_object", b'{"messages": ["hello"]}', "messages[0]", "got str"),
    ("role_missing", b'{"messages": [{"content": "hello"}]}', "messages[0].role", "missing"),
    ("role_int", b'{"messages": [{"role": 1, "content": "hello"}]}', "messages[0].role", "got int"),
    ("reasoning_int", b'{"messages": [{"role": "assistant", "content": "", "reasoning_content": 3}]}',
     "messages[0].reasoning_content", "got int"),
    ("sharegpt_from_missing", b'{"conversations": [{"value": "hi"}]}', "conversations[0].from", "missing"),
    ("sharegpt_system_list", b'{"system": [], "conversations": []}', "system", "got list"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "line", "field", "problem"), BAD_JSONL_LINES, ids=[b[0] for b in BAD_JSONL_LINES]
)
def test_unreadable_row_skip_records_file_row_field(
    tmp_path: Path, kind: str, line: bytes, field: str, problem: str
) -> None:
    path = tmp_path / f"{kind}.jsonl"
    path.write_bytes(OK_LINE + b"\n" + line + b"\n" + OK_LINE + b"\n")
    samples, bad = _read(path)
    assert [s.source["row"] for s in samples] == [0, 2]
    assert len(bad) == 1
    assert (bad[0].file, bad[0].row, bad[0].field) == (str(path), 1, field)
    assert problem in bad[0].problem
    assert str(path) in str(bad[0]) and "row 1" in str(bad[0])


@pytest.mark.parametrize(
    ("kind", "line", "field", "problem"), BAD_JSONL_LINES[:4], ids=[b[0] for b in BAD_JSONL_LINES[:4]]
)
def test_unreadable_row_stop_raises_after_good_rows(
    tmp_path: Path, kind: str, line: bytes, field: str, problem: str
) -> None:
    path = tmp_path / f"{kind}.jsonl"
    path.write_bytes(OK_LINE + b"\n" + line + b"\n" + OK_LINE + b"\n")
    seen: list[Sample] = []
    with pytest.raises(BadInputError) as err:
        for s in _samples(path, on_bad_row="stop"):
            seen.append(s)
    assert len(seen) == 1
    assert (err.value.bad.row, err.value.bad.field) == (1, field)
    assert problem in str(err.value)


@pytest.mark.parametrize("content", [b"", b"\n\n  \n"])
def test_empty_jsonl_is_a_file_level_bad_row(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(content)
    samples, bad = _read(path)
    assert samples == [] and bad == [BadRow(str(path), 0, "<file>", "file is empty")]
    with pytest.raises(BadInputError, match="file is empty"):
        list(_samples(path, on_bad_row="stop"))


@pytest.mark.parametrize("name", ["empty.json", "empty.parquet"])
def test_empty_json_and_parquet_files(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_bytes(b"")
    samples, bad = _read(tmp_path / name)
    assert samples == [] and [(b.row, b.field, b.problem) for b in bad] == [(0, "<file>", "file is empty")]


def test_truncated_and_corrupt_parquet(tmp_path: Path) -> None:
    rows = [{"id": f"r{i}", "prompt": f"question {i} " * 20} for i in range(5000)]
    good = tmp_path / "good.parquet"
    pq.write_table(pa.Table.from_pylist(rows), good, row_group_size=1000)
    data = good.read_bytes()
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(data[: len(data) // 2])
    samples, bad = _read(truncated)
    assert samples == [] and len(bad) == 1
    assert (bad[0].row, bad[0].field) == (0, "<file>") and "Parquet" in bad[0].problem
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"PAR1 this is not parquet")
    _, bad = _read(garbage)
    assert len(bad) == 1 and bad[0].field == "<file>"
    with pytest.raises(BadInputError, match=r"garbage\.parquet"):
        list(_samples(garbage, on_bad_row="stop"))


def test_parquet_with_a_damaged_row_group_reports_first_unread_row(tmp_path: Path) -> None:
    rows = [{"prompt": f"question {i} " * 20} for i in range(3000)]
    path = tmp_path / "damaged.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=1000, compression="none")
    meta = pq.ParquetFile(path).metadata
    second = meta.row_group(1).column(0)
    start = second.data_page_offset
    data = bytearray(path.read_bytes())
    data[start : start + 64] = b"\xff" * 64  # smash the second row group's first page header
    path.write_bytes(bytes(data))
    samples, bad = _read(path)
    assert len(samples) == 1000
    assert len(bad) == 1 and (bad[0].row, bad[0].field) == (1000, "<file>")


@pytest.mark.parametrize(
    ("text", "n_ok", "row", "problem"),
    [
        (b'[{"prompt": "a"}, {"prompt": "b"', 1, 1, "file ends inside a record"),
        (b'[{"prompt": "a"} {"prompt": "b"}]', 1, 1, "expected ',' or ']'"),
        (b'[{"prompt": "a"},]', 1, 1, "expected a value"),
        (b'"just a string"', 0, 0, "expected a JSON array or object"),
        (b'{"meta": 1}', 0, 0, "no data or rows list"),
        (b'{"prompt": "a"}\n{"prompt": "b"}\n', 0, 0, "looks like JSON Lines"),
    ],
)
def test_malformed_json_files(tmp_path: Path, text: bytes, n_ok: int, row: int, problem: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(text)
    samples, bad = _read(path)
    assert len(samples) == n_ok
    assert len(bad) == 1 and (bad[0].row, bad[0].field) == (row, "<file>") and problem in bad[0].problem


def test_json_array_element_errors_do_not_lose_later_rows(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_bytes(b'[{"prompt": "a"}, {"prompt": tru}, {"prompt": "caf\xe9"}, {"prompt": "d"}]')
    samples, bad = _read(path)
    assert [s.messages[0].content for s in samples] == ["a", "d"]
    assert [(b.row, b.field) for b in bad] == [(1, "<row>"), (2, "<row>")]
    assert "invalid UTF-8" in bad[1].problem


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_utf8_byte_order_mark_is_skipped(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"bom{suffix}"
    body = orjson.dumps({"prompt": "Hi"}) if suffix == ".jsonl" else orjson.dumps([{"prompt": "Hi"}])
    path.write_bytes(b"\xef\xbb\xbf" + body + b"\n")
    samples, bad = _read(path)
    assert bad == [] and samples[0].messages == (Message("user", "Hi"),)


def test_single_object_json_is_one_record(tmp_path: Path) -> None:
    path = tmp_path / "one.json"
    path.write_text(json.dumps({"id": "only", "messages": GOOD}))
    samples, bad = _read(path, id_column="id")
    assert bad == [] and [s.id for s in samples] == ["only"]


def test_structure_faults_are_kept_for_the_audit(tmp_path: Path) -> None:
    convos = [
        _conv(("narrator", "Once."), ("user", "Hi"), ("assistant", "Yo")),  # unknown role
        _conv(("user", ""), ("assistant", "Yo")),  # empty content
        _conv(("user", [{"type": "text", "text": "Hi"}]), ("assistant", "Yo")),  # non-text content
        _conv(("user", {"text": "Hi"}), ("assistant", 5)),  # non-text content
        _conv(("system", "S"), ("assistant", "Yo")),  # no user turn
        _conv(("assistant", "Yo"), ("user", "Hi")),  # bad order
        [{"role": "user"}],  # content missing
        [],  # no turns at all
    ]
    samples, bad = _read(_write_jsonl(tmp_path / "faults.jsonl", [{"messages": c} for c in convos]))
    assert bad == []
    as_read = [[dict(m) for m in c] for c in convos[:6]]
    as_read[2][0]["content"] = "Hi"  # a list of text parts is joined, as SGLang does
    assert [[m.to_json() for m in s.messages] for s in samples[:6]] == as_read
    assert samples[6].messages == (Message("user", None),)
    assert samples[7].messages == ()


def test_unknown_sharegpt_speaker_is_kept_as_read(tmp_path: Path) -> None:
    row = {"conversations": [{"from": "narrator", "value": "Once."}, {"from": "human", "value": "Hi"}]}
    samples, bad = _read(_write_jsonl(tmp_path / "s.jsonl", [row]))
    assert bad == [] and [m.role for m in samples[0].messages] == ["narrator", "user"]


# --------------------------------------------------------------------------------------
# streaming
# --------------------------------------------------------------------------------------


def _peak_while_iterating(path: Path, **kw: Any) -> tuple[int, int]:
    tracemalloc.start()
    try:
        n = sum(1 for _ in _samples(path, **kw))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return n, peak


# Sizes keep tracemalloc's overhead to a few seconds; each file is several times larger
# than the peak allowed while reading it, so reading it whole would fail the test.
MiB = 1024 * 1024
# about 700 bytes a row: few rows (tracemalloc slows each allocation) but large files
WIDE = [
    *GOOD[:2],
    {"role": "assistant", "content": "An answer. " * 40, "reasoning_content": "Thinking. " * 20},
]


def test_jsonl_streaming_memory_is_flat(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    line = orjson.dumps({"messages": WIDE})
    n_rows = 20_000
    with open(path, "wb") as fh:
        for _ in range(n_rows // 1000):
            fh.write((line + b"\n") * 1000)
    assert path.stat().st_size > 12 * MiB
    n, peak = _peak_while_iterating(path)
    assert n == n_rows
    assert peak < 1 * MiB, f"peak {peak} bytes while streaming {path.stat().st_size} bytes"


def test_json_array_streaming_memory_is_flat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonscan, "JSON_CHUNK_BYTES", 64 * 1024)
    n_rows = 8_000
    array = tmp_path / "big.json"
    with open(array, "wb") as fh:
        fh.write(b'{"meta": {"n": %d}, "data": [' % n_rows)
        for i in range(n_rows):
            fh.write((b",\n" if i else b"") + orjson.dumps({"id": i, "messages": WIDE}))
        fh.write(b"]}")
    assert array.stat().st_size > 5 * MiB
    n, peak = _peak_while_iterating(array, id_column="id")
    assert n == n_rows and peak < 1 * MiB, peak


def test_parquet_streaming_memory_is_flat(tmp_path: Path) -> None:
    n_rows = 8_000
    parquet = tmp_path / "big.parquet"
    table = pa.Table.from_pylist([{"messages": WIDE}] * 2000)
    with pq.ParquetWriter(parquet, table.schema) as writer:
        for _ in range(n_rows // 2000):
            writer.write_table(table, row_group_size=2000)
    n, peak = _peak_while_iterating(parquet)
    # the whole file as Python objects takes over 10 MiB; one batch of rows about 1.5 MiB
    assert n == n_rows and peak < 4 * MiB, peak


def test_json_scanner_handles_chunk_boundaries(tmp_path: Path) -> None:
    records = [
        {"prompt": 'quote " and backslash \\ and unicode é ' + "x" * i, "meta": {"a": [1, {"b": "]}"}]}}
        for i in range(40)
    ]
    path = tmp_path / "tricky.json"
    path.write_text(json.dumps({"rows": records}, indent=1))
    for chunk in (1, 2, 3, 5, 17, 4096):
        with open(path, "rb") as fh:
            scanner = jsonscan.JsonScanner(fh, chunk_bytes=chunk)
            assert scanner.peek() == ord("{")
            got = [record for _, record in jsonscan._iter_json_object(scanner, str(path))]
        assert got == records, chunk


# --------------------------------------------------------------------------------------
# demo dataset
# --------------------------------------------------------------------------------------


def test_demo_dataset_is_deterministic_and_matches_shipped(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    a = build_demo_dataset(tmp_path / "a", demo_tokenizer_dir, seed=0)
    b = build_demo_dataset(tmp_path / "b", demo_tokenizer_dir, seed=0)
    c = build_demo_dataset(tmp_path / "c", demo_tokenizer_dir, seed=1)
    shipped = REPO / "data" / "demo"
    for name in ("jsonl", "tokenized", "sharegpt"):
        pa_, pb, pc = getattr(a, name), getattr(b, name), getattr(c, name)
        assert pa_.read_bytes() == pb.read_bytes(), name
        assert pa_.read_bytes() != pc.read_bytes(), name
        assert pa_.read_bytes() == (shipped / pa_.name).read_bytes(), f"data/demo/{pa_.name} is stale"
    assert a.benchmark.read_bytes() == (shipped / "benchmark.jsonl").read_bytes(), (
        "data/demo/benchmark.jsonl is stale"
    )
    assert sum(p.stat().st_size for p in shipped.iterdir()) < 2 * 1024 * 1024


def test_demo_dataset_has_every_fault_within_the_gates(demo_tokenizer_dir: Path) -> None:
    path = REPO / "data" / "demo" / "dataset.jsonl"
    samples, bad = _read(path, id_column="id")
    n_rows = len(samples) + len(bad)
    assert 250 <= n_rows <= 350
    assert {b.field for b in bad} >= {"<row>", "messages", "id"}
    tok = Tokenizer.from_file(str(demo_tokenizer_dir / "tokenizer.json"))
    tpl = _template(demo_tokenizer_dir)

    def last_is_scaffolding(s: Sample) -> bool:
        last = s.messages[-1]
        return last.role == "assistant" and last.content == "" and not last.reasoning_content

    def structure_fault(s: Sample) -> bool:
        roles = [m.role for m in s.messages]
        return (
            any(r not in {"system", "user", "assistant"} for r in roles)
            or "user" not in roles
            or roles[0] == "assistant"
            or any(not isinstance(m.content, str) for m in s.messages)
            or any(
                m.role == "user" and not m.content.strip() for m in s.messages if isinstance(m.content, str)
            )
        )

    def prompt_tokens(s: Sample) -> int:
        turns = [m.to_json() for m in s.messages if isinstance(m.content, str)]
        prompt = turns[:-1] if turns and turns[-1]["role"] == "assistant" else turns
        return len(tok.encode(tpl.render(messages=prompt, add_generation_prompt=True)).ids) if prompt else 0

    empty = sum(map(last_is_scaffolding, samples))
    structure = sum(map(structure_fault, samples))
    over = sum(prompt_tokens(s) > DEMO_CONTEXT_LIMIT for s in samples)
    prompts = [json.dumps([m.to_json() for m in s.messages if m.role != "assistant"]) for s in samples]
    assert 0.10 <= empty / n_rows <= 0.5
    assert structure > 0 and (structure + len(bad)) / n_rows <= 0.2
    assert over > 0 and over / n_rows <= 0.1
    assert len(set(prompts)) < len(prompts)  # exact-duplicate prompts
    assert any(m.role == "narrator" for s in samples for m in s.messages)  # unknown role


def test_demo_tokenized_and_sharegpt_files_ingest(demo_tokenizer_dir: Path) -> None:
    tokenized, bad = _read(
        REPO / "data" / "demo" / "tokenized.parquet", id_column="id", tokenizer_dir=demo_tokenizer_dir
    )
    assert bad == [] and 40 <= len(tokenized) <= 60
    counts = [s.source["mask_supervised_tokens"] for s in tokenized]
    assert min(counts) <= 8 < max(counts)  # scaffolding-only rows next to real answers
    sharegpt, bad = _read(REPO / "data" / "demo" / "sharegpt.json", id_column="id")
    assert bad == [] and 15 <= len(sharegpt) <= 25
