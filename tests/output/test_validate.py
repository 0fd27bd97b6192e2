"""regen.output.validate and schemas/record.schema.json."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import fastjsonschema
import jsonschema
import orjson
import pyarrow.parquet as pq
import pytest
from stamped import fingerprint_fields

from regen.output import validate as V
from regen.records import VALID_SCHEMA

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "record.schema.json"
CFG = V.ValidateConfig.from_dict(
    {"max_content_chars": 1000, "max_reasoning_chars": 2000, "quarantine_truncated": True}
)


def make_record(i: int = 0, shard: str = "00000", **over: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "id": f"id-{i}",
        "shard": shard,
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"question {i}"}],
        "reasoning_content": f"thinking about {i}",
        "content": f"answer {i}",
        "finish_reason": "stop",
        "truncated": False,
        "thinking": True,
        "usage": {"prompt_tokens": 12, "completion_tokens": 30, "reasoning_tokens": 10},
        "sampling": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 256},
        "seed": 1000 + i,
        "model": "demo-model",
        "server": {"id": "gpu0", "url": "http://127.0.0.1:30000", "version": "0.5.0"},
        "attempts": 1,
        "timings": {"started_at": 1732900000.0 + i, "latency_s": 0.25},
        **fingerprint_fields(i),
    }
    rec.update(over)
    return rec


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    with open(path, "wb") as fh:
        for r in rows:
            fh.write(r if isinstance(r, bytes) else orjson.dumps(r))
            fh.write(b"\n")
    return path


def read_quarantine(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _set(rec: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    rec = copy.deepcopy(rec)
    *parents, last = dotted.split(".")
    node = rec
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return rec


_DELETE = object()

BAD_FIELDS = [
    ("id", 5),
    ("id", ""),
    ("id", _DELETE),
    ("shard", "3"),
    ("messages", []),
    ("messages.0.role", "robot"),
    ("messages.0.content", None),
    ("messages.0.extra", "x"),
    ("reasoning_content", 3),
    ("content", None),
    ("finish_reason", "eos"),
    ("truncated", "no"),
    ("thinking", None),
    ("usage.prompt_tokens", -1),
    ("usage.completion_tokens", 1.5),
    ("usage.reasoning_tokens", True),
    ("usage.completion_tokens", _DELETE),
    ("sampling.temperature", -0.1),
    ("sampling.top_p", 1.5),
    ("sampling.max_tokens", 0),
    ("seed", -1),
    ("seed", 2**63),
    ("model", ""),
    ("server.id", _DELETE),
    ("attempts", 0),
    ("timings.latency_s", -1.0),
    ("timings", _DELETE),
    ("unexpected_top_level", 1),
    ("turns", [{"content": "x"}]),
]


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


def test_schema_is_valid_2020_12_and_described(schema: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] and schema["additionalProperties"] is False
    for name, prop in schema["properties"].items():
        assert prop.get("description") or "$ref" in prop, name
    assert set(schema["$defs"]["finish_reason"]["enum"]) == {
        "stop", "length", "tool_calls", "content_filter", "function_call", "abort",
    }  # fmt: skip


def test_schema_accepts_good_records(schema: dict[str, Any]) -> None:
    ref = jsonschema.Draft202012Validator(schema)
    good = [
        make_record(),
        make_record(reasoning_content=None, thinking=False),
        make_record(usage={"prompt_tokens": 1, "completion_tokens": 0}),
        make_record(turns=[{"reasoning_content": None, "content": "a", "finish_reason": "stop",
                            "usage": {"prompt_tokens": 1, "completion_tokens": 2}}]),
    ]  # fmt: skip
    for rec in good:
        assert ref.is_valid(rec), list(ref.iter_errors(rec))


@pytest.mark.parametrize(("field", "value"), BAD_FIELDS, ids=[f"{f}={v!r}"[:40] for f, v in BAD_FIELDS])
def test_schema_rejects_bad_field(schema: dict[str, Any], field: str, value: Any) -> None:
    rec = _set(make_record(), field, value) if field != "turns" else make_record(turns=value)
    assert not jsonschema.Draft202012Validator(schema).is_valid(rec)


@pytest.mark.parametrize("inlined", [False, True], ids=["as_written", "refs_inlined"])
def test_fast_and_reference_validators_agree(schema: dict[str, Any], inlined: bool) -> None:
    """fastjsonschema, on the schema as written and with its $refs inlined (what validate compiles),
    accepts and refuses exactly what the reference validator does."""
    fast = fastjsonschema.compile(V.inline_refs(schema) if inlined else copy.deepcopy(schema))
    ref = jsonschema.Draft202012Validator(schema)
    fixtures = [make_record(), make_record(reasoning_content=None), make_record(seed=1.0)]
    fixtures += [_set(make_record(), f, v) for f, v in BAD_FIELDS if f != "turns"]
    fixtures += [make_record(turns=[{"content": "x"}]), [], "text", None]
    verdicts = []
    for rec in fixtures:
        try:
            fast(rec)
            fast_ok = True
        except fastjsonschema.JsonSchemaValueException:
            fast_ok = False
        assert fast_ok == ref.is_valid(rec), rec
        verdicts.append(fast_ok)
    assert verdicts.count(True) == 3


def test_inline_refs_leaves_no_ref_and_refuses_a_remote_one(schema: dict[str, Any]) -> None:
    inlined = json.dumps(V.inline_refs(schema))
    assert '"$ref"' not in inlined and '"$defs"' not in inlined
    with pytest.raises(ValueError, match="not a local, non-recursive definition"):
        V.inline_refs({"properties": {"x": {"$ref": "https://example.com/x.json"}}})
    with pytest.raises(ValueError, match="not a local, non-recursive definition"):
        V.inline_refs({"$defs": {"a": {"items": {"$ref": "#/$defs/a"}}}, "$ref": "#/$defs/a"})


@pytest.mark.parametrize(
    ("over", "reason"),
    [
        ({"content": "", "reasoning_content": "long thought"}, V.EMPTY_ANSWER_WITH_REASONING),
        ({"content": "  ", "reasoning_content": None}, V.EMPTY_ANSWER),
        (
            {"content": "", "reasoning_content": "cut off", "finish_reason": "length"},
            V.TRUNCATED_IN_REASONING,
        ),
        ({"content": "<think>still going", "reasoning_content": None}, V.UNCLOSED_THINK),
        ({"content": "ok", "reasoning_content": "a <think> b"}, V.UNCLOSED_THINK),
        ({"content": "x </think> answer"}, V.THINK_TAG_IN_ANSWER),
        ({"content": "<think>r</think> answer"}, V.THINK_TAG_IN_ANSWER),
        ({"content": "a" * 1001}, V.CONTENT_TOO_LONG),
        ({"reasoning_content": "r" * 2001}, V.REASONING_TOO_LONG),
        ({"shard": "00007"}, V.SHARD_MISMATCH),
    ],
)
def test_semantic_checks_quarantine(tmp_path: Path, over: dict[str, Any], reason: str) -> None:
    src = write_jsonl(tmp_path / "00000.jsonl", [make_record(0), make_record(1, **over)])
    stats = V.validate_shard(src, tmp_path / "v.parquet", tmp_path / "q.jsonl", CFG)
    assert (stats.records_in, stats.valid, stats.quarantined) == (2, 1, 1)
    q = read_quarantine(tmp_path / "q.jsonl")
    assert [(e["id"], e["reason"]) for e in q] == [("id-1", reason)]
    assert "00000.jsonl: line 2" in q[0]["detail"]
    assert q[0]["record"]["id"] == "id-1"


def test_truncated_kept_when_policy_allows(tmp_path: Path) -> None:
    rec = make_record(1, content="", reasoning_content="cut off", finish_reason="length", truncated=True)
    src = write_jsonl(tmp_path / "00000.jsonl", [rec])
    cfg = dataclasses.replace(CFG, quarantine_truncated=False)
    stats = V.validate_shard(src, tmp_path / "v.parquet", tmp_path / "q.jsonl", cfg)
    assert (stats.valid, stats.quarantined) == (1, 0)


def test_turn_problems_are_found(tmp_path: Path) -> None:
    turn_ok = {"reasoning_content": "r", "content": "a", "finish_reason": "stop",
               "usage": {"prompt_tokens": 1, "completion_tokens": 2}}  # fmt: skip
    turn_bad = dict(turn_ok, content="leak </think>")
    src = write_jsonl(
        tmp_path / "00000.jsonl", [make_record(0, turns=[turn_ok]), make_record(1, turns=[turn_bad])]
    )
    V.validate_shard(src, tmp_path / "v.parquet", tmp_path / "q.jsonl", CFG)
    q = read_quarantine(tmp_path / "q.jsonl")
    assert [(e["id"], e["reason"]) for e in q] == [("id-1", V.THINK_TAG_IN_ANSWER)]
    assert "turn 0" in q[0]["detail"]


def test_mixed_shard_counts_reconcile_and_valid_parquet(tmp_path: Path) -> None:
    rows: list[Any] = [make_record(i) for i in range(25)]
    rows.insert(3, b'{"id": "id-broken", "content": ')  # unparsable, id recoverable
    rows.insert(5, b"not json at all")
    rows.insert(7, make_record(4))  # duplicate of id-4 (later copy)
    rows.insert(9, _set(make_record(100), "usage.prompt_tokens", -5))
    rows.append(b"")  # blank line: not a record
    src = write_jsonl(tmp_path / "00000.jsonl", rows)
    stats = V.validate_shard(src, tmp_path / "valid.parquet", tmp_path / "q.jsonl", CFG)
    assert stats.records_in == 29
    assert stats.valid == 25 and stats.quarantined == 4
    assert stats.reasons == {V.UNPARSABLE: 2, V.DUPLICATE_ID: 1, V.SCHEMA: 1}
    table = pq.read_table(tmp_path / "valid.parquet")
    assert table.schema.remove_metadata() == VALID_SCHEMA.remove_metadata()
    assert table.column("id").to_pylist() == [f"id-{i}" for i in range(25)]
    assert table.column("messages").to_pylist()[0][1] == {
        "role": "user", "content": "question 0", "reasoning_content": None,
        "tool_calls_json": None, "tool_call_id": None, "name": None,
    }  # fmt: skip
    q = {(e["id"], e["reason"]): e for e in read_quarantine(tmp_path / "q.jsonl")}
    assert ("id-broken", V.UNPARSABLE) in q and (None, V.UNPARSABLE) in q
    assert "line 4" in q[("id-broken", V.UNPARSABLE)]["detail"]
    assert "line 6" in q[(None, V.UNPARSABLE)]["detail"]
    assert "line 8: id 'id-4' first seen on line 7" in q[("id-4", V.DUPLICATE_ID)]["detail"]
    assert "$.usage.prompt_tokens" in q[("id-100", V.SCHEMA)]["detail"]


def test_duplicate_of_a_quarantined_record_is_also_duplicate(tmp_path: Path) -> None:
    bad_first = make_record(1, content="")
    src = write_jsonl(tmp_path / "00000.jsonl", [bad_first, make_record(1)])
    V.validate_shard(src, tmp_path / "v.parquet", tmp_path / "q.jsonl", CFG)
    reasons = [e["reason"] for e in read_quarantine(tmp_path / "q.jsonl")]
    assert reasons == [V.EMPTY_ANSWER_WITH_REASONING, V.DUPLICATE_ID]
    assert pq.read_table(tmp_path / "v.parquet").num_rows == 0


def test_failure_leaves_no_outputs(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "00000.jsonl", [make_record(0)])
    with pytest.raises(FileNotFoundError):
        V.validate_shard(
            src, tmp_path / "v.parquet", tmp_path / "q.jsonl", CFG, schema_path=tmp_path / "none.json"
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00000.jsonl"]


def test_cli_prints_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_jsonl(
        tmp_path / "00001.jsonl", [make_record(0, shard="00001"), make_record(1, shard="00001")]
    )
    assert V.cli([str(src), str(tmp_path / "v.parquet"), str(tmp_path / "q.jsonl")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {"shard": "00001", "records_in": 2, "valid": 2, "quarantined": 0, "reasons": {}}


TURN = {
    "reasoning_content": None,
    "content": "t",
    "finish_reason": "stop",
    "usage": {"prompt_tokens": 1, "completion_tokens": 1},
}


@pytest.mark.parametrize("bad", [-1, True, 1.5, "7", None, [3], 2**31])
@pytest.mark.parametrize("where", ["prompt_token_ids", "completion_token_ids", "turn"])
def test_token_id_items_checked_as_the_schema_says(schema: dict[str, Any], bad: Any, where: str) -> None:
    """Token id arrays skip the compiled item loop (checked in C): every item the schema rejects, at
    the top level or in a turn, is still a schema problem naming the item; what it accepts passes."""
    v = V.load_validator(str(SCHEMA_PATH))
    assert v.token_ids is not None and v.fast is not v.full
    ids = [5, 0, bad, 9]
    if where == "turn":
        rec = make_record(turns=[{**TURN, "prompt_token_ids": [1], "completion_token_ids": ids}])
        path = "$.turns[0].completion_token_ids[2]"
    else:
        rec = make_record(**{"prompt_token_ids": [1, 2], "completion_token_ids": [3], where: ids})
        path = f"$.{where}[2]"
    assert not jsonschema.Draft202012Validator(schema).is_valid(rec)
    problem = v.schema_problem(rec)
    assert problem is not None and problem.reason == V.SCHEMA and problem.detail.startswith(path)
    good = [5, 0, 1.0, 2**31 - 1] if where != "turn" else [5]
    ok = make_record(
        prompt_token_ids=good, completion_token_ids=[], turns=[{**TURN, "completion_token_ids": good}]
    )
    assert jsonschema.Draft202012Validator(schema).is_valid(ok)
    assert v.schema_problem(ok) is None


def test_token_ids_reach_valid_parquet_as_sent(tmp_path: Path) -> None:
    """Rows with and without server token ids (and empty ones) keep exactly their ids in the valid shard."""
    recs = [
        make_record(0, prompt_token_ids=[1, 2, 3], completion_token_ids=[151000, 0]),
        make_record(1),
        make_record(2, prompt_token_ids=[], completion_token_ids=[7]),
    ]
    src = write_jsonl(tmp_path / "00000.jsonl", recs)
    stats = V.validate_shard(src, tmp_path / "v.parquet", tmp_path / "q.jsonl", CFG)
    assert stats.valid == 3
    table = pq.read_table(tmp_path / "v.parquet")
    assert table.column("prompt_token_ids").to_pylist() == [[1, 2, 3], None, []]
    assert table.column("completion_token_ids").to_pylist() == [[151000, 0], None, [7]]


def test_a_token_id_beyond_the_int32_column_is_quarantined_not_a_crash(tmp_path: Path) -> None:
    """The Parquet token-id column is int32: a larger id (a broken server) is a schema problem for that
    record, and the rest of the shard is written."""
    recs = [make_record(0, prompt_token_ids=[1], completion_token_ids=[2**31 - 1]),
            make_record(1, prompt_token_ids=[1], completion_token_ids=[5, 2**31])]  # fmt: skip
    src = write_jsonl(tmp_path / "00000.jsonl", recs)
    stats = V.validate_shard(src, tmp_path / "v.parquet", tmp_path / "q.jsonl", CFG)
    assert (stats.valid, stats.quarantined) == (1, 1)
    q = read_quarantine(tmp_path / "q.jsonl")
    assert q[0]["id"] == "id-1" and q[0]["reason"] == V.SCHEMA
    assert "line 2: $.completion_token_ids[1]: 2147483648 is greater than the maximum" in q[0]["detail"]


def test_an_answer_that_is_a_tool_call_is_valid_with_empty_content(tmp_path: Path) -> None:
    """With tools, the regenerated answer may be a tool call: empty content, reasoning before it and
    finish_reason tool_calls (OpenAI's shape, SGLang's with a tool-call parser). That is an answer;
    empty content without a call is still quarantined."""
    call = {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    recs = [
        make_record(0, content="", reasoning_content="the user wants the weather", finish_reason="tool_calls",
                    tool_calls=[call]),
        make_record(1, content="", reasoning_content="thinking only", finish_reason="stop"),
    ]  # fmt: skip
    src = write_jsonl(tmp_path / "00000.jsonl", recs)
    stats = V.validate_shard(src, tmp_path / "v.parquet", tmp_path / "q.jsonl", CFG)
    assert (stats.valid, stats.quarantined) == (1, 1)
    assert [(e["id"], e["reason"]) for e in read_quarantine(tmp_path / "q.jsonl")] == [
        ("id-1", V.EMPTY_ANSWER_WITH_REASONING)
    ]
