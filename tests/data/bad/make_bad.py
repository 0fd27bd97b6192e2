"""Writes the bad-input corpus beside this file (committed; rerun to regenerate).

Each JSONL file holds a good row 0, the bad row 1 and a good row 2, unless the fault is file-level.
EXPECTED maps each file to how regen must treat its bad row: "bad_row" (unreadable: file, row and
field named, skip-or-stop policy applies), a structure/audit flag (the row is read and flagged),
"file" (the whole file is unreadable), "tail" (the file is unreadable from that row on: lost input,
which fails the audit unless allowed), "empty" (readable, no rows), "ok" (all three rows read
faithfully, however unusual the shape) or "kept:<flag>" (flagged but still generated).
"""

import gzip
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).parent

TRUNCATED_GZIP_ROWS = (
    91  # complete lines in the first half of the compressed bytes (zlib, checked by the test)
)

EXPECTED = {
    "malformed_json.jsonl": ("bad_row", 1),
    "wrong_type_messages.jsonl": ("bad_row", 1),
    "missing_role.jsonl": ("bad_row", 1),
    "invalid_utf8.jsonl": ("bad_row", 1),
    "not_an_object.jsonl": ("bad_row", 1),
    "path_separator_id.jsonl": ("bad_row", 1),
    "dotdot_id.jsonl": ("bad_row", 1),
    "null_id.jsonl": ("bad_row", 1),
    "nul_bytes.jsonl": ("bad_row", 1),
    "empty_file.jsonl": ("file", 0),
    "truncated.parquet": ("file", 0),
    "json_not_list.json": ("file", 0),
    "json_truncated.json": ("tail", 1),
    "wrong_type_content.jsonl": ("structure_error", 1),
    "empty_conversation.jsonl": ("structure_error", 1),
    "only_system.jsonl": ("structure_error", 1),
    "unknown_role.jsonl": ("structure_error", 1),
    "non_string_content.jsonl": ("structure_error", 1),
    "bad_role_order.jsonl": ("structure_error", 1),
    "giant_prompt.jsonl": ("over_length", 1),
    "duplicate_ids.jsonl": ("structure_error", 1),  # duplicate_id: the later copy is kept out
    "mixed_formats.jsonl": ("ok", None),
    # real-world shapes (issue 14): read faithfully, or named
    "truncated_gzip.jsonl.gz": ("tail", TRUNCATED_GZIP_ROWS),
    "gzip_named_jsonl.jsonl": ("ok", None),
    "rows.json.gz": ("ok", None),
    "cr_line_endings.jsonl": ("ok", None),
    "json_array_in_jsonl.jsonl": ("ok", None),
    "string_and_int_id.jsonl": ("structure_error", 1),  # "1" then 1: one id, the later copy is kept out
    "newline_in_id.jsonl": ("ok", None),
    "bigint_id.jsonl": ("ok", None),
    "tool_calls.jsonl": ("ok", None),
    "content_parts.jsonl": ("ok", None),
    "developer_role.jsonl": ("ok", None),
    "ends_with_user.jsonl": ("ok", None),
    "whitespace_duplicate.jsonl": ("kept:whitespace_duplicate_prompt", 1),
    "zero_rows.parquet": ("empty", None),
}


def good(i, **kw):
    row = {
        "id": f"g{i}",
        "messages": [
            {"role": "user", "content": f"question {i}?"},
            {"role": "assistant", "content": f"answer {i}."},
        ],
    }
    row.update(kw)
    return row


def jsonl(name, rows):
    with open(HERE / name, "wb") as fh:
        for row in rows:
            fh.write(row if isinstance(row, bytes) else (json.dumps(row) + "\n").encode())


def main():
    jsonl(
        "malformed_json.jsonl",
        [good(0), b'{"id": "b1", "messages": [{"role": "user", "content": "x"}\n', good(2)],
    )
    jsonl("wrong_type_messages.jsonl", [good(0), {"id": "b1", "messages": "hello"}, good(2)])
    jsonl(
        "wrong_type_content.jsonl",
        [good(0), {"id": "b1", "messages": [{"role": "user", "content": 42}]}, good(2)],
    )
    jsonl("missing_role.jsonl", [good(0), {"id": "b1", "messages": [{"content": "no role"}]}, good(2)])
    jsonl("empty_conversation.jsonl", [good(0), {"id": "b1", "messages": []}, good(2)])
    jsonl(
        "only_system.jsonl",
        [good(0), {"id": "b1", "messages": [{"role": "system", "content": "Be kind."}]}, good(2)],
    )
    jsonl(
        "invalid_utf8.jsonl",
        [good(0), b'{"id": "b1", "messages": [{"role": "user", "content": "caf\xe9 \xff"}]}\n', good(2)],
    )
    jsonl(
        "nul_bytes.jsonl",
        [good(0), b'{"id": "b1", "messages": [{"role": "user", "content": "a\x00b"}]}\n', good(2)],
    )
    jsonl(
        "giant_prompt.jsonl",
        [good(0), {"id": "b1", "messages": [{"role": "user", "content": "word " * 60000}]}, good(2)],
    )
    jsonl("duplicate_ids.jsonl", [good(0), good(0, messages=[{"role": "user", "content": "other"}]), good(2)])
    jsonl(
        "mixed_formats.jsonl",
        [
            good(0),
            {"id": "b1", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]},
            {"id": "b2", "prompt": "just a prompt"},
        ],
    )
    (HERE / "empty_file.jsonl").write_bytes(b"")
    jsonl(
        "unknown_role.jsonl",
        [
            good(0),
            {
                "id": "b1",
                "messages": [{"role": "narrator", "content": "Once"}, {"role": "user", "content": "go"}],
            },
            good(2),
        ],
    )
    jsonl(
        "non_string_content.jsonl",
        [
            good(0),
            {
                "id": "b1",
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}],
            },
            good(2),
        ],
    )
    jsonl("path_separator_id.jsonl", [good(0), good(1, id="../../etc/passwd"), good(2)])
    jsonl("dotdot_id.jsonl", [good(0), good(1, id=".."), good(2)])
    jsonl(
        "bad_role_order.jsonl",
        [
            good(0),
            {
                "id": "b1",
                "messages": [{"role": "assistant", "content": "first"}, {"role": "user", "content": "ok"}],
            },
            good(2),
        ],
    )
    jsonl("not_an_object.jsonl", [good(0), [1, 2, 3], good(2)])
    jsonl("null_id.jsonl", [good(0), good(1, id=None), good(2)])
    table = pa.table({"id": [f"p{i}" for i in range(100)], "prompt": [f"prompt {i}" for i in range(100)]})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    (HERE / "truncated.parquet").write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    (HERE / "json_not_list.json").write_text('"just a string"')
    (HERE / "json_truncated.json").write_text('[{"id": "a", "prompt": "x"}, {"id": "b", "pro')
    real_world_shapes()


def tail_rows(n):
    return [
        {
            "id": f"t{i}",
            "messages": [
                {"role": "user", "content": f"question number {i} about topic {i * 7 % 13}?"},
                {"role": "assistant", "content": f"answer {i}."},
            ],
        }
        for i in range(n)
    ]


def lines(rows, end=b"\n"):
    return b"".join(json.dumps(r).encode() + end for r in rows)


def real_world_shapes():
    whole = gzip.compress(lines(tail_rows(200)), mtime=0)
    (HERE / "truncated_gzip.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    (HERE / "gzip_named_jsonl.jsonl").write_bytes(gzip.compress(lines([good(0), good(1), good(2)]), mtime=0))
    (HERE / "rows.json.gz").write_bytes(
        gzip.compress(json.dumps([good(0), good(1), good(2)]).encode(), mtime=0)
    )
    (HERE / "cr_line_endings.jsonl").write_bytes(lines([good(0), good(1), good(2)], end=b"\r"))
    (HERE / "json_array_in_jsonl.jsonl").write_text(json.dumps([good(0), good(1), good(2)], indent=2))
    jsonl("string_and_int_id.jsonl", [good(0, id="1"), good(1, id=1), good(2)])
    jsonl("newline_in_id.jsonl", [good(0), good(1, id="line\nbreak: x\r\ny"), good(2)])
    (HERE / "bigint_id.jsonl").write_bytes(
        lines([good(0)])
        + lines([good(1, id=0)]).replace(b'"id": 0', b'"id": 123456789012345678901234567890')
        + lines([good(2)])
    )
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    }
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    tool_turns = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 3}'},
        {"role": "assistant", "content": "It is 3 degrees C in Oslo."},
    ]
    jsonl("tool_calls.jsonl", [good(0), {"id": "b1", "messages": tool_turns, "tools": tools}, good(2)])
    parts = [{"type": "text", "text": "Describe"}, {"type": "text", "text": "a cat."}]
    parts_turns = [{"role": "user", "content": parts}, {"role": "assistant", "content": "Furry."}]
    jsonl("content_parts.jsonl", [good(0), {"id": "b1", "messages": parts_turns}, good(2)])
    developer = [{"role": "developer", "content": "Answer in French."}, *good(1)["messages"]]
    jsonl("developer_role.jsonl", [good(0), {"id": "b1", "messages": developer}, good(2)])
    ends_with_user = [*good(1)["messages"], {"role": "user", "content": "And in more detail?"}]
    jsonl("ends_with_user.jsonl", [good(0), {"id": "b1", "messages": ends_with_user}, good(2)])
    spaced = [{"role": "user", "content": "  question   0?\n"}, {"role": "assistant", "content": "other."}]
    jsonl("whitespace_duplicate.jsonl", [good(0), {"id": "b1", "messages": spaced}, good(2)])
    empty = pa.table({"id": pa.array([], pa.string()), "prompt": pa.array([], pa.string())})
    pq.write_table(empty, HERE / "zero_rows.parquet")


if __name__ == "__main__":
    main()
