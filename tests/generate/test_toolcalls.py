"""Tool calls that stay true (issue 24, item 5): under ``regenerate: all`` a regenerated turn whose calls
differ from those the dataset's next tool turns answer ends the row there, counted by kind; matching calls
carry on under the ids the tool turns answer (SGLang 0.5.23 refuses unpaired tool turns)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pyarrow.parquet as pq
import pytest
from support.workflow import copy_workflow, snakemake

from regen.chat import ChatTemplate
from regen.generate.client import ShardJob, generate_shard
from regen.runconfig import GenerateConfig
from regen.simulated.launcher import start_simulated_server
from regen.simulated.parsers import tool_call_pairing_error
from regen.toolcalls import tool_call_mismatch
from regen.types import Endpoint, Message, Sample

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "schemas" / "record.schema.json").read_text())
TOKENIZER = str(ROOT / "resources" / "demo-tokenizer")
TOOLS = (
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
)
OSLO = {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "C"}}


def call(name: str, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def conversation() -> tuple[Message, ...]:
    """user -> assistant calls get_weather(Oslo) -> tool answers it -> assistant -> user -> assistant."""
    return (
        Message("user", "Weather in Oslo?"),
        Message(
            "assistant", "", tool_calls=(call("get_weather", {"unit": "C", "city": "Oslo"}, "call_ds_1"),)
        ),
        Message("tool", '{"temp_c": 3}', tool_call_id="call_ds_1"),
        Message("assistant", "3 degrees."),
        Message("user", "Thanks. And tomorrow?"),
        Message("assistant", "Colder."),
    )


#: what the simulated model calls in its first answer, per sample: the same call with the arguments'
#: keys in another order (a match), another function, other arguments, no call, two calls
SCRIPT = {
    "match": [[{"name": "get_weather", "arguments": {"unit": "C", "city": "Oslo"}}]],
    "name": [[{"name": "get_time", "arguments": {"city": "Oslo", "unit": "C"}}]],
    "arguments": [[{"name": "get_weather", "arguments": {"city": "Bergen", "unit": "C"}}]],
    "none": [[]],
    "two": [[OSLO, OSLO]],
    # a call where the dataset's next turn is the user's: nothing answers it
    "late": [[{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "C"}}], [OSLO]],
}


@pytest.fixture(params=[None, TOKENIZER], ids=["words", "tokens"])
def tool_sim(request: pytest.FixtureRequest) -> Iterator[str]:
    url, stop = start_simulated_server(
        inline=True,
        long_fraction=0.0,
        mean_answer_tokens=8,
        mean_reasoning_tokens=8,
        tokenizer_path=request.param,
        faults={"tool_calls_for": SCRIPT},
    )
    yield url
    stop()


def run(tmp_path: Path, url: str, regenerate: str) -> dict[str, dict[str, Any]]:
    out = tmp_path / "out.jsonl"
    samples = [Sample(sid, conversation(), tools=TOOLS) for sid in SCRIPT]
    stats = generate_shard(
        ShardJob(
            samples,
            tmp_path / "journal.jsonl",
            out,
            tmp_path / "failed.jsonl",
            GenerateConfig.from_dict(
                {"regenerate": regenerate, "backoff_base_s": 0.001, "request_timeout_s": 5}
            ),
            Endpoint(url, "gpu0"),
            "00000",
        )
    )
    assert (stats.completed, stats.failed) == (len(SCRIPT), 0)
    recs = {r["id"]: r for r in map(orjson.loads, out.read_bytes().splitlines())}
    for r in recs.values():
        jsonschema.validate(r, SCHEMA)
    return recs


def test_mismatch_kinds() -> None:
    ds = [call("get_weather", {"city": "Oslo", "unit": "C"}, "a")]
    assert tool_call_mismatch([call("get_weather", {"unit": "C", "city": "Oslo"}, "b")], ds) is None
    assert (
        tool_call_mismatch(
            [{"function": {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "C"}}}], ds
        )
        is None
    )
    assert tool_call_mismatch([call("get_time", {"city": "Oslo", "unit": "C"}, "b")], ds) == "name"
    assert tool_call_mismatch([call("get_weather", {"city": "Oslo"}, "b")], ds) == "arguments"
    assert tool_call_mismatch(None, ds) == "count"
    assert tool_call_mismatch([*ds, *ds], ds) == "count"
    assert tool_call_mismatch(ds, ()) == "count"
    assert tool_call_mismatch(None, ()) is None


def test_regenerate_all_ends_a_row_at_the_turn_whose_calls_differ(tool_sim: str, tmp_path: Path) -> None:
    recs = run(tmp_path, tool_sim, "all")
    # matching calls: the row goes on to the end, the tool turn answering the call under its own id
    whole = recs["match"]
    assert "tool_call_mismatch" not in whole and len(whole["turns"]) == 3
    assert [m["role"] for m in whole["messages"]] == ["user", "assistant", "tool", "assistant", "user"]
    sent = whole["messages"][1]["tool_calls"]
    assert [c["id"] for c in sent] == ["call_ds_1"] and sent[0]["function"]["name"] == "get_weather"
    assert whole["turns"][0]["finish_reason"] == "tool_calls"
    assert tool_call_pairing_error(whole["messages"]) is None
    # a differing call ends the row at that turn: no tool result that answers another question
    for kind in ("name", "arguments"):
        r = recs[kind]
        assert r["tool_call_mismatch"] == {"turn": 0, "kind": kind}
        assert len(r["turns"]) == 1 and [m["role"] for m in r["messages"]] == ["user"]
        assert r["tool_calls"] and r["finish_reason"] == "tool_calls"
    assert (
        recs["none"]["tool_call_mismatch"] == {"turn": 0, "kind": "count"}
        and "tool_calls" not in recs["none"]
    )
    assert (
        recs["two"]["tool_call_mismatch"] == {"turn": 0, "kind": "count"}
        and len(recs["two"]["tool_calls"]) == 2
    )
    # the second answer calls a tool, but the dataset's next turn is the user's: cut there
    late = recs["late"]
    assert late["tool_call_mismatch"] == {"turn": 1, "kind": "count"} and len(late["turns"]) == 2
    assert [m["role"] for m in late["messages"]] == ["user", "assistant", "tool"]


def test_regenerate_last_is_unaffected(tool_sim: str, tmp_path: Path) -> None:
    recs = run(tmp_path, tool_sim, "last")
    for r in recs.values():
        assert "tool_call_mismatch" not in r and "turns" not in r
        assert r["messages"] == [m.to_json() for m in conversation()[:-1]]


def test_token_mode_tool_call_ids_render_back(tmp_path: Path) -> None:
    """In token mode the completion ids hold the calls as the chat template writes them, so the next
    turn's prompt (rendered from the parsed calls) continues the model's own tokens."""
    url, stop = start_simulated_server(
        inline=True, long_fraction=0.0, tokenizer_path=TOKENIZER, faults={"tool_calls_for": SCRIPT}
    )
    try:
        recs = run(tmp_path, url, "all")
    finally:
        stop()
    tpl = ChatTemplate.from_dir(TOKENIZER)
    r = recs["match"]
    first, second = r["turns"][0], r["turns"][1]
    text = tpl.tokenizer.decode(first["completion_token_ids"], skip_special_tokens=False)
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"unit": "C", "city": "Oslo"}}\n</tool_call>'
        in text
    )
    assert second["prompt_token_ids"][: len(first["prompt_token_ids"])] == first["prompt_token_ids"]


def test_the_workflow_counts_tool_call_cuts_end_to_end(tmp_path: Path) -> None:
    """Snakemake with regenerate: all on tool conversations, the simulated model scripted to call as the
    dataset did or otherwise: the merged rows end at the differing turn, the re-audit counts them by kind,
    and the report's landing page names the cuts."""
    wd = copy_workflow(tmp_path / "wf")
    kinds = {"match": 3, "name": 2, "arguments": 2, "none": 1}
    lines = []
    for kind, n in kinds.items():
        for i in range(n):
            conv = [
                {"role": "user", "content": f"Weather in Oslo, question {kind} {i}?"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [call("get_weather", OSLO["arguments"], f"c{i}")],
                },
                {"role": "tool", "content": '{"temp_c": 3}', "tool_call_id": f"c{i}"},
                {"role": "assistant", "content": "3 degrees."},
            ]
            lines.append(orjson.dumps({"id": f"tool-{kind}-{i}", "messages": conv, "tools": list(TOOLS)}))
    (wd / "data" / "tools.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    script = {f"tool-{kind}-.*": SCRIPT[kind] for kind in kinds}
    override = {
        "dataset": {"path": "data/tools.jsonl"},
        "audit": {"decontamination": {"benchmarks": []}},
        "shards": {"count": 1},
        "generate": {"regenerate": "all"},
        "server": {
            "gpus": 1,
            "port_base": 41500 + (hash(str(tmp_path)) % 400) * 2,
            "simulated": {"faults": {"tool_calls_for": script, "error_rate": 0, "think_leak_rate": 0,
                                     "empty_answer_rate": 0, "noncanonical_rate": 0}},
        },
        "reaudit": {"max_duplicate_fraction": 1.0},
    }  # fmt: skip
    (wd / "config" / "tools.yaml").write_text(json.dumps(override))
    run = snakemake(wd, "--cores", "2", "--configfile", "config/demo.yaml", "config/tools.yaml", timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((wd / "results" / "reaudit" / "summary.json").read_text())
    assert summary["tool_call_mismatch"]["by_kind"] == {"count": 1, "name": 2, "arguments": 2}
    rows = {r["id"]: r for r in pq.read_table(wd / "results" / "dataset").to_pylist()}
    assert all(len(rows[f"tool-match-{i}"]["turns"]) == 2 for i in range(3))
    assert all(rows[f"tool-name-{i}"]["tool_call_mismatch"] == "name" for i in range(2))
    assert [m["role"] for m in rows["tool-name-0"]["messages"]] == ["user", "assistant"]
    landing = (wd / "results" / "report" / "landing.rst").read_text()
    assert (
        "5 rows ended at a regenerated turn whose tool calls differ (arguments 2, count 1, name 2)" in landing
    )
