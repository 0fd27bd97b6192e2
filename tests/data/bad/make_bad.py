"""Writes the bad-input corpus beside this file (committed; rerun to regenerate).

Each JSONL file holds a good row 0, the bad row 1 and a good row 2, unless the fault is file-level.
EXPECTED maps each file to how regen must treat its bad row: "bad_row" (unreadable: file, row and
field named, skip-or-stop policy applies), a structure/audit flag (the row is read and flagged),
or "file" (the whole file is unreadable).
"""

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).parent

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
    "json_truncated.json": ("bad_row", 1),
    "wrong_type_content.jsonl": ("structure_error", 1),
    "empty_conversation.jsonl": ("structure_error", 1),
    "only_system.jsonl": ("structure_error", 1),
    "unknown_role.jsonl": ("structure_error", 1),
    "non_string_content.jsonl": ("structure_error", 1),
    "bad_role_order.jsonl": ("structure_error", 1),
    "giant_prompt.jsonl": ("over_length", 1),
    "duplicate_ids.jsonl": ("structure_error", 1),  # duplicate_id: the later copy is kept out
    "mixed_formats.jsonl": ("ok", None),
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


if __name__ == "__main__":
    main()
