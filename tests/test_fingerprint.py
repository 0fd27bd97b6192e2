"""Resume keyed by what decides an answer (regen.fingerprint): a rerun replays a journaled sample only
under the same settings and prompt; a changed setting regenerates everything, an edited prompt that
sample alone, failures are retried with their history, and the output never mixes settings."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow.dataset as ds
import pytest

from regen.fingerprint import GenerationSettings, decisive_config, decisive_plan_config
from regen.generate.client import (
    Endpoint,
    ProgressOptions,
    ShardJob,
    generate_shard,
    generate_shard_async,
)
from regen.generate.journal import Journal, finalize_journal
from regen.generate.replay import JournalIndex, numerics_last_reported, plan_replay
from regen.generate.scheduler import sample_fingerprint
from regen.ingest.audit import AuditConfig
from regen.output.export import ExportConfig
from regen.output.merge import MergeConfig, merge
from regen.output.reaudit import MixedSettingsError, ReauditGates, reaudit_dataset
from regen.output.validate import ValidateConfig, validate_shard
from regen.prompts import prompt_for_last, request_content, turn_prefixes
from regen.runconfig import ANSWERS, PLAN, GenerateConfig, RunConfig, ServerConfig, Variant, keys_deciding
from regen.simulated.launcher import start_simulated_server
from regen.types import Message, Sample

FAST = {"backoff_base_s": 0.001, "request_timeout_s": 5, "concurrency": 8, "sampling": {"max_tokens": 256}}


def samples(n: int, edit: dict[int, str] | None = None) -> list[Sample]:
    edit = edit or {}
    return [
        Sample(
            id=f"s{i}",
            messages=(
                Message("system", "be brief"),
                Message("user", edit.get(i, f"question {i}")),
                Message("assistant", "old answer", "old reasoning"),
            ),
        )
        for i in range(n)
    ]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines()] if path.exists() else []


def received(url: str) -> dict[str, int]:
    import aiohttp

    async def go() -> dict[str, int]:
        async with aiohttp.ClientSession() as s, s.get(url + "/_sim/stats") as r:
            return orjson.loads(await r.read())["received_by_id"]

    return asyncio.run(go())


class Shard:
    def __init__(self, root: Path) -> None:
        self.journal = root / "work" / "journal" / "00000.jsonl"
        self.out = root / "results" / "generations" / "00000.jsonl"
        self.failed = root / "results" / "generations" / "00000.failed.jsonl"

    def run(self, batch: list[Sample], url: str, **cfg: Any):
        merged = {**FAST, **cfg, "sampling": {**FAST["sampling"], **cfg.get("sampling", {})}}
        return generate_shard(
            ShardJob(
                batch,
                self.journal,
                self.out,
                self.failed,
                GenerateConfig.from_dict(merged),
                Endpoint(url, "gpu0"),
                "00000",
            )
        )

    def records(self) -> list[dict[str, Any]]:
        return read_jsonl(self.out)


@pytest.fixture
def sim() -> Iterator[str]:
    url, stop = start_simulated_server(inline=True, mean_answer_tokens=8, mean_reasoning_tokens=8)
    yield url
    stop()


# ------------------------------------------------------------------------------------ the hash

BASE_RUN = RunConfig.from_config(
    {
        "generate": {"sampling": {"temperature": 0.6, "max_tokens": 512}},
        "server": {"model_path": "demo-model", "mode": "simulated", "reasoning_parser": "qwen3"},
        "tokenizer": "resources/demo-tokenizer",
    }
)
BASE = GenerationSettings.for_run(BASE_RUN)
#: one change of every field of the run's and the variant's settings (``version`` aside)
CHANGES = [
    {"model_path": "other-model"},
    {"model_revision": "abc123"},
    {"server_mode": "sglang"},
    {"chat_template_sha256": "0" * 64},
    {"reasoning_parser": "deepseek-r1"},
    {"regenerate": "all"},
    {"thinking": "off"},
    {"thinking_fraction": 0.25},
    {"temperature": 0.9},
    {"top_p": 0.5},
    {"top_k": -1},
    {"max_tokens": 300},
    {"seed": 1},
    {"sampling_non_thinking": (("top_p", 0.8),)},
    {"sampling_thinking": (("top_p", 0.8),)},
    {"name": "hot"},
    {"reasoning_effort": "low"},
    {"truncation": "retry"},
    {"retry_max_tokens_factor": 3.0},
    {"extra_body": {"min_p": 0.1}},
    {"return_token_ids": False},
    {"preserve_thinking": True},
    {"server_numerics": {"mamba_ssm_dtype": "bfloat16"}},
]


def changed_settings_of(change: dict[str, Any]) -> GenerationSettings:
    """``BASE`` with ``change`` applied to the run's part or the variant's, whichever has the field."""
    run_fields = {f.name for f in dataclasses.fields(BASE.run)}
    run = {k: v for k, v in change.items() if k in run_fields}
    variant = {k: v for k, v in change.items() if k not in run}
    replace = dataclasses.replace
    return GenerationSettings(replace(BASE.run, **run), replace(BASE.variant, **variant))


@pytest.mark.parametrize("change", CHANGES)
def test_every_decisive_setting_changes_the_fingerprint(change: dict[str, Any]) -> None:
    assert changed_settings_of(change).fingerprint != BASE.fingerprint


def test_every_field_of_the_settings_is_hashed() -> None:
    """The parametrized changes cover every field of both parts (a new field must join the hash)."""
    fields = {f.name for part in (BASE.run, BASE.variant) for f in dataclasses.fields(part)}
    assert fields - {"version"} == {k for change in CHANGES for k in change}


def test_a_variants_n_changes_no_fingerprint() -> None:
    """One record is one completion: raising n adds completions and keeps those made before."""
    more = BASE.run.for_variant(BASE_RUN.generate, Variant("default", n=3))
    assert more.fingerprint == BASE.fingerprint and more == BASE


def test_each_variant_is_hashed_once_when_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """A variant's settings hash when built, never again however often the fingerprint is read."""
    import regen.fingerprint as fingerprint

    calls: list[Any] = []
    digest = fingerprint._digest
    monkeypatch.setattr(fingerprint, "_digest", lambda payload: calls.append(payload) or digest(payload))
    cfg = GenerateConfig.from_dict({"variants": [{"name": "default"}, {"name": "hot", "temperature": 1.0}]})
    run = fingerprint.RunSettings.of(cfg)
    settings = [run.for_variant(cfg, v) for v in cfg.variants()]
    assert [s.fingerprint for s in settings for _ in range(3)] and len(calls) == 2
    assert settings[0].fingerprint == GenerationSettings.of(GenerateConfig.from_dict({})).fingerprint


def test_fingerprint_is_stable_and_ignores_operational_keys(demo_tokenizer_dir: Path) -> None:
    config = {
        "tokenizer": str(demo_tokenizer_dir),
        "generate": {
            "sampling": {"temperature": 0.6},
            "extra_body": {"b": 1, "a": 2},
            "request_timeout_s": 30,
        },
        "server": {"model_path": "m", "mode": "simulated", "reasoning_parser": "qwen3", "port_base": 31000},
    }
    ops = {
        "generate": {"request_timeout_s": 99, "concurrency": 3, "max_attempts": 9, "backoff_base_s": 2.0},
        "server": {"port_base": 32000, "idle_timeout_s": 5, "startup_timeout_s": 9, "max_restarts": 0},
    }
    changed = {
        "tokenizer": config["tokenizer"],
        "generate": {**config["generate"], **ops["generate"], "extra_body": {"a": 2, "b": 1}},
        "server": {**config["server"], **ops["server"]},
    }
    a = GenerationSettings.for_run(RunConfig.from_config(config))
    b = GenerationSettings.for_run(RunConfig.from_config(changed))
    assert a == b and a.fingerprint == b.fingerprint and len(a.fingerprint) == 16
    assert a.run.chat_template_sha256 is not None  # the demo template is hashed
    assert decisive_config(config) == decisive_config(changed)  # the generate jobs' rerun trigger
    run = RunConfig.from_config(changed, 2)
    assert not set(ops["generate"]) & set(keys_deciding(GenerateConfig, ANSWERS))
    assert run.generate.concurrency == 3 and run.gpu_slots == 2


#: an odd config: every decisive key off its default (int where the schema says number, too)
ODD = {
    "tokenizer": "resources/demo-tokenizer",
    "generate": {
        "thinking": "mix", "thinking_fraction": 0.3, "preserve_thinking": True, "truncation": "retry",
        "retry_max_tokens_factor": 3, "return_token_ids": False,
        "extra_body": {"min_p": 0.1, "ignore_eos": True},
        "sampling": {"temperature": 1, "top_p": 1, "top_k": -1, "max_tokens": 100, "seed": 7,
                     "thinking": {"top_p": 0.9, "temperature": 1}},
    },
    "server": {"model_path": "m", "mode": "simulated", "reasoning_parser": "deepseek-r1"},
}  # fmt: skip


def demo_config() -> dict[str, Any]:
    """config/demo.yaml with the schema's defaults filled in, as the workflow validates it."""
    from regen.configfile import load_config

    return load_config(["config/demo.yaml"])


def test_fingerprints_and_tracked_params_are_those_of_earlier_releases() -> None:
    """Pinned at 2946126 (before the typed run config): the same config gives the same fingerprints, so
    an existing journal still replays, and the same tracked rule params (Snakemake compares their repr),
    so an existing run is not rerun."""
    demo = demo_config()
    assert GenerationSettings.for_run(RunConfig.from_config(demo)).fingerprint == "72dcd096719043c1"
    assert GenerationSettings.for_run(RunConfig.from_config(ODD)).fingerprint == "07a9929015c62358"
    assert GenerationSettings.of(GenerateConfig.from_dict({})).fingerprint == "fc5cadd0ba422abd"
    odd = GenerateConfig.from_dict(ODD["generate"])
    assert GenerationSettings.of(odd, model_path="m").fingerprint == "95b40af8681c7556"
    assert repr(decisive_config(demo)) == (
        "{'generate': {'regenerate': 'last', 'thinking': 'on', 'thinking_fraction': 0.5, "
        "'sampling': {'max_tokens': 512, 'non_thinking': {'temperature': 0.7, 'top_p': 0.8, "
        "'top_k': 20}, 'temperature': 0.6, 'top_p': 0.95, 'top_k': 20, 'n': 1, 'seed': 0}, "
        "'truncation': 'keep', 'retry_max_tokens_factor': 2, 'extra_body': {}, 'return_token_ids': "
        "True, 'preserve_thinking': False}, 'model_path': 'demo-model', 'server_mode': 'simulated', "
        "'reasoning_parser': 'qwen3', 'tokenizer': 'resources/demo-tokenizer'}"
    )
    assert repr(decisive_plan_config(demo)) == (
        "{'server': {'mode': 'simulated', 'model_path': 'demo-model', 'model_config': "
        "'resources/demo-model/config.json', 'gpu_memory_mib': 81920, 'sglang_version': None, 'tp': 1, "
        "'args': [], 'allow_fp8_kv': False, 'allow_bf16_state': False, 'use_tuner': True}, 'max_tokens': 512}"
    )


def test_what_decides_is_said_once_on_the_fields() -> None:
    """The keys that decide answers or the plan are field metadata; every other key is operational."""
    assert keys_deciding(GenerateConfig, ANSWERS) == (
        "regenerate", "thinking", "thinking_fraction", "sampling", "truncation", "retry_max_tokens_factor",
        "extra_body", "return_token_ids", "preserve_thinking",
    )  # fmt: skip
    assert keys_deciding(ServerConfig, ANSWERS) == ("mode", "model_path", "reasoning_parser")
    assert "port_base" not in keys_deciding(ServerConfig, PLAN) and "tp" in keys_deciding(ServerConfig, PLAN)


def test_request_content_is_exactly_what_the_requests_send() -> None:
    conv = (
        Message("system", "sys"),
        Message("user", "u1"),
        Message("assistant", "a1", "r1"),
        Message("user", "u2"),
        Message("assistant", "a2"),
    )
    sample = Sample("x", conv)
    assert request_content(sample, "last") == {"messages": prompt_for_last(conv), "tools": None}
    segments = [[{"role": m.role, "content": m.content} for m in seg] for seg in turn_prefixes(conv)]
    assert request_content(sample, "all") == {"messages": segments, "tools": None}
    every = changed_settings_of({"regenerate": "all"})

    def fp(s: Sample, settings: GenerationSettings = BASE) -> str:
        return sample_fingerprint(settings, s)

    # what is not sent decides nothing: the answer being regenerated, an old turn's reasoning
    same = Sample(
        "x", (*conv[:2], Message("assistant", "a1", "other reasoning"), conv[3], Message("assistant", "?"))
    )
    assert fp(same) == fp(sample) and fp(same, every) == fp(sample, every)
    # an earlier old answer is part of the prompt under last, regenerated (not sent) under all
    other_a1 = Sample("x", (*conv[:2], Message("assistant", "a1 rewritten"), *conv[3:]))
    assert fp(other_a1) != fp(sample) and fp(other_a1, every) == fp(sample, every)
    edited = Sample("x", (conv[0], Message("user", "u1 edited"), *conv[2:]))
    assert fp(edited) != fp(sample) and fp(edited, every) != fp(sample, every)
    assert fp(dataclasses.replace(sample, tools=({"type": "function", "function": {"name": "f"}},))) != fp(
        sample
    )
    assert fp(dataclasses.replace(sample, id="y")) != fp(sample)  # the seed derives from the id


# ------------------------------------------------------------------------- replay on the client


def test_sampling_change_regenerates_every_sample_and_never_mixes(sim: str, tmp_path: Path) -> None:
    sh = Shard(tmp_path)
    first = sh.run(samples(20), sim)
    assert first.completed == 20
    old = {r["id"]: r for r in sh.records()}
    before = received(sim)

    st = sh.run(samples(20), sim, sampling={"temperature": 0.9})
    assert (st.skipped_resumed, st.regenerated_changed, st.completed) == (0, 20, 20)
    assert all(received(sim)[f"s{i}"] == before[f"s{i}"] + 1 for i in range(20))
    recs = sh.records()
    assert len(recs) == 20 and {r["sampling"]["temperature"] for r in recs} == {0.9}
    assert len({r["settings_fingerprint"] for r in recs}) == 1
    assert {r["settings_fingerprint"] for r in recs} != {r["settings_fingerprint"] for r in old.values()}
    assert all(r["settings"]["temperature"] == 0.9 for r in recs)

    # back to the first settings: every sample is in the journal under them again, nothing is sent
    before = received(sim)
    st = sh.run(samples(20), sim)
    assert (st.skipped_resumed, st.completed) == (20, 0) and received(sim) == before
    assert {r["id"]: r["content"] for r in sh.records()} == {i: r["content"] for i, r in old.items()}


def test_a_server_with_other_numerics_regenerates_and_says_so(tmp_path: Path) -> None:
    """Same config, but the server now keeps the linear-attention state in bf16 (or runs another SGLang):
    nothing journaled under the fp32-state server is replayed, and each record names its server."""
    fp32, stop32 = start_simulated_server(inline=True, mamba_ssm_dtype="float32")
    bf16, stop16 = start_simulated_server(inline=True, mamba_ssm_dtype="bfloat16")
    newer, stop_newer = start_simulated_server(inline=True, mamba_ssm_dtype="bfloat16", version="0.5.24")
    try:
        sh = Shard(tmp_path)
        assert sh.run(samples(8), fp32).completed == 8
        st = sh.run(samples(8), bf16)
        assert (st.skipped_resumed, st.regenerated_changed) == (0, 8)
        recs = sh.records()
        assert {r["settings"]["server_numerics"]["mamba_ssm_dtype"] for r in recs} == {"bfloat16"}
        assert {r["settings"]["server_numerics"]["version"] for r in recs} == {"0.5.23"}
        assert sh.run(samples(8), bf16).skipped_resumed == 8  # the same server again: all replayed
        assert sh.run(samples(8), newer).regenerated_changed == 8
        # the dry-run preview has no server: it assumes the numerics the journal's records last reported
        index = JournalIndex.read([sh.journal])
        cfg = GenerateConfig.from_dict(FAST)
        seen = numerics_last_reported(index, GenerationSettings.of(cfg).run)
        assert seen is not None and seen["version"] == "0.5.24"
        served = GenerationSettings.of(cfg).served_by(seen)
        assert plan_replay(samples(8), index, served, cfg.retry_failed).replay == 8
    finally:
        stop32()
        stop16()
        stop_newer()


def test_max_tokens_change_reaches_every_row(sim: str, tmp_path: Path) -> None:
    sh = Shard(tmp_path)
    sh.run(samples(10), sim, sampling={"max_tokens": 512})
    st = sh.run(samples(10), sim, sampling={"max_tokens": 300})
    assert st.regenerated_changed == 10
    assert {r["sampling"]["max_tokens"] for r in sh.records()} == {300}


def test_edited_prompt_regenerates_that_sample_alone(sim: str, tmp_path: Path) -> None:
    sh = Shard(tmp_path)
    sh.run(samples(15), sim)
    before = received(sim)
    st = sh.run(samples(15, edit={7: "question 7, edited"}), sim)
    assert (st.skipped_resumed, st.regenerated_changed, st.completed) == (14, 1, 1)
    now = received(sim)
    assert [k for k in now if now[k] != before.get(k)] == ["s7"]
    [rec] = [r for r in sh.records() if r["id"] == "s7"]
    assert rec["messages"][-1] == {"role": "user", "content": "question 7, edited"}
    assert len(sh.records()) == 15


def test_journal_from_before_fingerprints_is_regenerated(sim: str, tmp_path: Path) -> None:
    sh = Shard(tmp_path)
    sh.journal.parent.mkdir(parents=True)
    old = [{"kind": "record", "id": f"s{i}", "content": "stale"} for i in range(5)]
    sh.journal.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in old))
    st = sh.run(samples(5), sim)
    assert (st.skipped_resumed, st.regenerated_changed) == (0, 5)
    assert all(r["content"] != "stale" and "fingerprint" in r for r in sh.records())


def test_failures_are_retried_on_rerun_with_their_history(tmp_path: Path) -> None:
    sh = Shard(tmp_path)
    url, stop = start_simulated_server(inline=True, faults={"error_for": ["s3"]})
    try:
        st = sh.run(samples(12), url, max_attempts=2)
    finally:
        stop()
    assert (st.completed, st.failed) == (11, 1)
    [failed] = read_jsonl(sh.failed)
    assert failed["id"] == "s3" and failed["reason"] == "server_error" and "fingerprint" in failed

    # keep failures: the failed sample is replayed as a failure, nothing is sent
    healthy, stop = start_simulated_server(inline=True)
    try:
        kept = sh.run(samples(12), healthy, retry_failed=False)
        assert received(healthy) == {} and kept.skipped_resumed == 12
        assert [f["id"] for f in read_jsonl(sh.failed)] == ["s3"]
        # the default retries it (the cause is gone): a record, with the earlier failure as history
        st = sh.run(samples(12), healthy)
        assert received(healthy) == {"s3": 1} and (st.retried_failed, st.completed) == (1, 1)
    finally:
        stop()
    assert read_jsonl(sh.failed) == []
    [rec] = [r for r in sh.records() if r["id"] == "s3"]
    assert [h["reason"] for h in rec["history"]] == ["server_error"] and rec["history"][0]["attempts"] == 2
    kinds = [e["kind"] for e in read_jsonl(sh.journal) if e["id"] == "s3"]
    assert kinds == ["failed", "record"]  # every try stays in the journal


def test_a_failure_failing_again_keeps_the_whole_history(tmp_path: Path) -> None:
    sh = Shard(tmp_path)
    url, stop = start_simulated_server(inline=True, faults={"bad_request_for": ["s1"]})
    try:
        sh.run(samples(4), url)
        sh.run(samples(4), url)
        st = sh.run(samples(4), url)
    finally:
        stop()
    assert st.retried_failed == 1
    [failed] = read_jsonl(sh.failed)
    assert failed["id"] == "s1" and failed["reason"].startswith("client_error")
    assert len(failed["history"]) == 2 and all(h["at"] for h in failed["history"])


def test_kill_in_the_middle_of_a_config_change(tmp_path: Path) -> None:
    """Complete at 0.6; switch to 0.9 and kill mid-way; rerun at 0.9: the killed run's 0.9 answers are
    replayed, the rest regenerated, no 0.6 answer survives. Back to 0.6: everything replays."""
    batch = samples(60)
    sh = Shard(tmp_path)
    url, stop = start_simulated_server(
        token_rate=2000,
        mean_answer_tokens=20,
        mean_reasoning_tokens=20,
        long_fraction=0.0,
        max_running_requests=8,
    )
    try:
        sh.run(batch, url)
        at_06 = sh.journal.read_bytes().count(b"\n")

        async def killed_at_09() -> None:
            cfg = {**FAST, "sampling": {**FAST["sampling"], "temperature": 0.9}}
            task = asyncio.create_task(
                generate_shard_async(
                    ShardJob(
                        batch,
                        sh.journal,
                        sh.out,
                        sh.failed,
                        GenerateConfig.from_dict(cfg),
                        Endpoint(url, "gpu0"),
                        "00000",
                        ProgressOptions(),
                    )
                )
            )
            while sh.journal.read_bytes().count(b"\n") < at_06 + 15:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(killed_at_09())
        new_entries = read_jsonl(sh.journal)[at_06:]
        done_at_09 = {e["id"] for e in new_entries}
        assert 15 <= len(done_at_09) < 60
        # the outputs of the 0.6 run are still there, untouched, until the 0.9 run finishes
        assert {r["sampling"]["temperature"] for r in sh.records()} == {0.6}

        before = received(url)
        st = sh.run(batch, url, sampling={"temperature": 0.9})
        after = received(url)
        assert st.skipped_resumed == len(done_at_09) and st.regenerated_changed == 60 - len(done_at_09)
        assert all(after[sid] == before[sid] for sid in done_at_09), "a 0.9 answer was sent again"
        recs = sh.records()
        assert len(recs) == 60 and {r["sampling"]["temperature"] for r in recs} == {0.9}
        assert len({r["settings_fingerprint"] for r in recs}) == 1

        st = sh.run(batch, url)
        assert st.skipped_resumed == 60 and received(url) == after
        assert {r["sampling"]["temperature"] for r in sh.records()} == {0.6}
    finally:
        stop()


# ---------------------------------------------------------------------------------- journal


def entry(kind: str, sid: str, fp: str, **more: Any) -> dict[str, Any]:
    base = {"kind": kind, "id": sid, "fingerprint": fp, "settings_fingerprint": "f" * 16}
    if kind == "failed":
        base |= {"reason": "timeout", "attempts": 3, "error": "no response", "at": 1.0}
    return base | more


def test_finalize_keeps_only_current_fingerprints(tmp_path: Path) -> None:
    path = tmp_path / "00000.jsonl"
    lines = [
        entry("record", "a", "old", content="a-old"),
        entry("record", "a", "new", content="a-new"),
        entry("failed", "b", "new"),
        entry("record", "b", "new", content="b-new"),
        entry("failed", "c", "new"),
        entry("failed", "c", "new", reason="server_error"),
        entry("record", "gone", "new", content="not sampled any more"),
        entry("record", "a", "new", content="a-duplicate"),
    ]
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in lines))
    with Journal.open(path) as j:
        assert j.outcome("a", "new") == "record" and j.outcome("a", "old") == "record"
        assert j.outcome("b", "new") == "record" and j.outcome("c", "new") == "failed"
        assert j.outcome("a", "other") is None
    counts = finalize_journal(
        path, tmp_path / "r.jsonl", tmp_path / "f.jsonl", {"a": "new", "b": "new", "c": "new"}
    )
    assert (counts.records, counts.failed, counts.duplicates_ignored, counts.stale_ignored) == (2, 1, 1, 2)
    recs = {r["id"]: r for r in read_jsonl(tmp_path / "r.jsonl")}
    assert recs["a"]["content"] == "a-new" and "history" not in recs["a"]
    assert recs["b"]["history"] == [{"reason": "timeout", "attempts": 3, "error": "no response", "at": 1.0}]
    [c] = read_jsonl(tmp_path / "f.jsonl")
    assert c["reason"] == "server_error" and [h["reason"] for h in c["history"]] == ["timeout"]


def test_replay_preview_counts_and_explains(tmp_path: Path) -> None:
    settings = GenerationSettings.of(GenerateConfig.from_dict({}))
    hot = GenerationSettings.of(GenerateConfig.from_dict({"sampling": {"temperature": 0.9}}))
    batch = samples(6)
    path = tmp_path / "00000.jsonl"
    fp = {s.id: sample_fingerprint(settings, s) for s in batch}
    lines = [
        entry("record", "s0", fp["s0"], settings_fingerprint=settings.fingerprint),
        entry("record", "s1", "0" * 16, settings_fingerprint=settings.fingerprint),  # prompt since edited
        entry("failed", "s2", fp["s2"], settings_fingerprint=settings.fingerprint),
        entry("record", "s3", "1" * 16, settings_fingerprint=hot.fingerprint, settings=hot.to_json()),
        {"kind": "record", "id": "s4"},  # before fingerprints
    ]
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in lines))
    index = JournalIndex.read([path, tmp_path / "missing.jsonl"])
    plan = plan_replay(batch, index, settings, retry_failed=True)
    assert (plan.replay, plan.prompt_changed, plan.retry_failed, plan.settings_changed) == (1, 1, 1, 1)
    assert (plan.before_fingerprints, plan.new, plan.to_generate) == (1, 1, 5)
    assert plan.changes == {hot.fingerprint: ["temperature 0.9→0.6"]}
    text = "\n".join(plan.lines())
    assert "6 samples: 1 replayed" in text and "temperature 0.9→0.6" in text
    kept = plan_replay(batch, JournalIndex.read([path]), settings, retry_failed=False)
    assert (kept.keep_failed, kept.retry_failed) == (1, 0)


# --------------------------------------------------------------------------- merge + re-audit


def test_reaudit_fails_loudly_on_mixed_settings(sim: str, tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    a, b = Shard(tmp_path / "a"), Shard(tmp_path / "b")
    a.run(samples(6), sim)
    b.run([dataclasses.replace(s, id=f"t{i}") for i, s in enumerate(samples(6))], sim, sampling={"seed": 5})
    valid = []
    for k, sh in enumerate((a, b)):
        out = tmp_path / "valid" / f"0000{k}.parquet"
        validate_shard(
            sh.out,
            out,
            tmp_path / "q" / f"0000{k}.jsonl",
            ValidateConfig.from_dict({"quarantine_truncated": False}),
        )
        valid.append(out)
    merge(valid, tmp_path / "dataset", MergeConfig.from_dict({}), {})
    table = ds.dataset(str(tmp_path / "dataset"), format="parquet").to_table()
    assert len(set(table.column("settings_fingerprint").to_pylist())) == 2
    assert len(set(table.column("fingerprint").to_pylist())) == table.num_rows
    gates = {"max_empty_answer_fraction": 1, "max_truncated_fraction": 1, "max_duplicate_fraction": 1}
    with pytest.raises(MixedSettingsError, match="2 different settings"):
        reaudit_dataset(
            dataset_dir=str(tmp_path / "dataset"),
            summary_out=str(tmp_path / "summary.json"),
            ready_out=str(tmp_path / "READY.json"),
            gates=ReauditGates.from_dict({**gates, "override_gates": True}),  # no override for mixed settings
            audit=AuditConfig.from_dict({}),
            tokenizer_dir=str(demo_tokenizer_dir),
            export=ExportConfig.from_dict({}),
        )
    assert not (tmp_path / "READY.json").exists()


# ------------------------------------------------------------------- S3 journal, other machine


@pytest.mark.s3
def test_s3_journal_from_a_machine_with_another_config(s3_prefix: str, sim: str, tmp_path: Path) -> None:
    """Machine A journals to S3 at temperature 0.6 and is killed part-way; machine B, a fresh directory
    with temperature 0.9, restores A's journal but replays none of it; machine C at 0.6 replays all."""
    from regen.storage import S3JournalSink

    batch = samples(24)

    def run_on(machine: str, n: int | None = None, **cfg: Any):
        sh = Shard(tmp_path / machine)
        sink = S3JournalSink(s3_prefix, "00000", every_records=4, every_seconds=0.2)
        merged = {**FAST, **cfg, "sampling": {**FAST["sampling"], **cfg.get("sampling", {})}}
        stats = generate_shard(
            ShardJob(
                batch if n is None else batch[:n],
                sh.journal,
                sh.out,
                sh.failed,
                GenerateConfig.from_dict(merged),
                Endpoint(sim, "gpu0"),
                "00000",
                journal_sync=sink,
            )
        )
        return sh, stats

    run_on("a", n=10)  # a partial shard: the first 10 samples, at 0.6
    before = received(sim)
    b, st = run_on("b", sampling={"temperature": 0.9})
    assert b.journal.read_bytes().count(b'"temperature":0.6') >= 10, "A's entries were restored from S3"
    assert (st.skipped_resumed, st.regenerated_changed, st.completed) == (0, 10, 24)
    assert all(received(sim)[s.id] == before.get(s.id, 0) + 1 for s in batch)
    assert {r["sampling"]["temperature"] for r in b.records()} == {0.9} and len(b.records()) == 24

    after_b = received(sim)
    c, st = run_on("c")
    assert st.skipped_resumed == 10 and st.completed == 14  # A's 0.6 answers, from S3, are replayed
    assert all(received(sim)[s.id] == after_b[s.id] + (1 if int(s.id[1:]) >= 10 else 0) for s in batch)
    recs = c.records()
    assert {r["sampling"]["temperature"] for r in recs} == {0.6} and len(
        {r["settings_fingerprint"] for r in recs}
    ) == 1


def test_the_rerun_contract_is_a_named_list_covering_every_deciding_field() -> None:
    """The generate rule's tracked param is built from ``RERUN_*_KEYS`` (order included), which name every
    field marked as deciding answers and every key a variant may have; the demo's param, with and without
    variants, is byte-identical to the one main computed before the lists existed (sha256 of its repr at
    173b324; with variants, of the validated config, at 626ded3, when the variants were read raw)."""
    from regen.fingerprint import (
        RERUN_GENERATE_KEYS,
        RERUN_PLAN_SERVER_KEYS,
        RERUN_RUN_KEYS,
        RERUN_SERVER_KEYS,
        RERUN_VARIANT_KEYS,
    )
    from regen.runconfig import section_schema, validated

    assert set(RERUN_GENERATE_KEYS) == set(keys_deciding(GenerateConfig, ANSWERS))
    assert set(RERUN_SERVER_KEYS) == set(keys_deciding(ServerConfig, ANSWERS))
    assert set(RERUN_RUN_KEYS) == set(keys_deciding(RunConfig, ANSWERS))
    assert set(RERUN_PLAN_SERVER_KEYS) == set(keys_deciding(ServerConfig, PLAN))
    variant_keys = section_schema("generate")["properties"]["variants"]["items"]["properties"]
    assert set(RERUN_VARIANT_KEYS) == set(variant_keys) == {f.name for f in dataclasses.fields(Variant)}
    demo = demo_config()
    assert hashlib.sha256(repr(decisive_config(demo)).encode()).hexdigest() == (
        "92383c2a303b4dd36f79a2e5a4bdaf12b184ac4ac30d1c34119350d8c0210bb1"
    )
    pinned = {
        "daf7b5fe8040117f50875907301f1bbf3f94359a669b582d093e45a540cf34b4": [
            {"name": "hot", "temperature": 1.0},
        ],
        "394ab9fbc170f1e7e92be6db415aca8f073a4aec7360cb5b66caf9059a5aef0e": [
            {"name": "default"},
            {"name": "hot", "temperature": 1.3, "top_p": 0.9, "top_k": 5, "thinking": "off",
             "reasoning_effort": "low", "n": 4},
        ],
    }  # fmt: skip
    for digest, variants in pinned.items():
        demo["generate"] = validated("generate", {**demo["generate"], "variants": variants})
        assert hashlib.sha256(repr(decisive_config(demo)).encode()).hexdigest() == digest


def test_the_generate_job_gets_the_typed_run_inside_its_tracked_param() -> None:
    """One param: Snakemake tracks it by its repr (that of :func:`decisive_config`), the job reads the typed
    run config it carries, and both survive the pickle Snakemake hands a script its params in."""
    from regen.fingerprint import TrackedRun

    demo = demo_config()
    run = RunConfig.from_config(demo)
    tracked = TrackedRun.of(demo, run)
    assert isinstance(tracked, dict) and repr(tracked) == repr(decisive_config(demo))
    back = pickle.loads(pickle.dumps(tracked))
    assert back.run == run and back == decisive_config(demo)
