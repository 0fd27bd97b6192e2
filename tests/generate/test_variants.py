"""Sampling variants in the client (issue 52 items 1-2), on the simulated server: the typed config, one
record per (sample, variant, k) with its own seed and settings fingerprint, the completions of one
prompt sent back to back after its prefill request, and a rerun that sends only what a changed config adds."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from regen.fingerprint import GenerationSettings, decisive_config
from regen.generate.client import Endpoint, ProgressOptions, ShardJob, generate_shard
from regen.generate.pacing import plan_in_flight
from regen.generate.request import Halt, Requests, Sampled
from regen.runconfig import ConfigError, GenerateConfig, Variant
from regen.simulated.launcher import start_simulated_server
from regen.types import Message, Sample

SAMPLES = [
    Sample(f"s{i}", (Message("user", f"question {i} " + "word " * 40), Message("assistant", "old")))
    for i in range(4)
]


def cfg(variants: list[dict[str, Any]] | None = None, **more: Any) -> GenerateConfig:
    raw: dict[str, Any] = {"concurrency": 1, "sampling": {"max_tokens": 64}, "spill": False, **more}
    if variants is not None:
        raw["variants"] = variants
    return GenerateConfig.from_dict(raw)


def test_the_typed_variants() -> None:
    assert cfg().variants() == (Variant("default", n=1),) and cfg().plain_ids
    three = cfg(sampling={"n": 3})
    assert three.variants() == (Variant("default", n=3),) and not three.plain_ids
    both = cfg([{"name": "default"}, {"name": "hot", "temperature": 1.1, "thinking": "off", "n": 2}])
    assert both.variants()[1] == Variant("hot", n=2, temperature=1.1, thinking=False)
    assert both.completions_per_prompt == 3 and not both.plain_ids
    assert cfg([{"name": "solo", "top_k": 5}]).plain_ids  # one variant of one completion: sample ids
    with pytest.raises(
        ConfigError, match=r"generate.variants.1.name: 'a' is already the name of generate.variants.0"
    ):
        cfg([{"name": "a"}, {"name": "a", "temperature": 1.0}])
    with pytest.raises(ConfigError, match=r"generate.variants.0.name"):
        cfg([{"name": "Hot Variant"}])
    with pytest.raises(ConfigError, match=r"generate.variants.0.reasoning_effort"):
        cfg([{"name": "x", "reasoning_effort": "extreme"}])


def test_each_variant_has_its_own_fingerprint_and_default_keeps_the_one_before_variants() -> None:
    before = GenerationSettings.of(cfg()).fingerprint
    listed = cfg([{"name": "default"}, {"name": "hot", "temperature": 1.0}])
    default, hot = (GenerationSettings.of(listed, variant=v) for v in listed.variants())
    assert default.fingerprint == before and hot.fingerprint != before
    assert hot.variant.temperature == 1.0 and hot.variant_name == "hot" and "variant" not in default.to_json()
    hotter = cfg([{"name": "default"}, {"name": "hot", "temperature": 1.3}])
    assert [GenerationSettings.of(hotter, variant=v).fingerprint for v in hotter.variants()] == [
        before,
        GenerationSettings.of(hotter, variant=hotter.variants()[1]).fingerprint,
    ]
    assert GenerationSettings.of(hotter, variant=hotter.variants()[1]).fingerprint != hot.fingerprint
    # raising n adds completions; it changes no fingerprint
    more = cfg([{"name": "default", "n": 4}])
    assert GenerationSettings.of(more).fingerprint == before
    # the generate rule's tracked param: unchanged for a config without variants
    assert "variants" not in decisive_config({"generate": {"variants": []}})["generate"]
    assert decisive_config({"generate": {"variants": [{"name": "a"}]}})["generate"]["variants"] == [
        {"name": "a", "n": 1}
    ]  # as the workflow's validated config holds it: n filled in


def test_a_variants_request_body_samples_its_own_way() -> None:
    g = cfg(sampling={"non_thinking": {"temperature": 0.7, "top_p": 0.8}})
    hot = Variant("hot", n=1, temperature=1.2, reasoning_effort="high")
    requests = Requests(
        g,
        None,  # type: ignore[arg-type]  # no request is sent
        server=Endpoint("http://x", "gpu0"),
        model="m",
        shard="00000",
        rng=random.Random(0),
        halt=Halt(),
        restarts=None,
        pacing=plan_in_flight(1, None, 1.0, 64, None),
    )
    body = orjson.loads(
        requests.body([], 1, False, 64, None, Sampled("hot", hot.sampling(g.sampling), "high"))
    )
    # the variant's temperature wins over the non-thinking block's; the block's top_p stays
    assert (body["temperature"], body["top_p"], body["n"]) == (1.2, 0.8, 1)
    assert body["chat_template_kwargs"] == {"enable_thinking": False, "reasoning_effort": "high"}
    plain = orjson.loads(requests.body([], 1, False, 64, None))
    assert (plain["temperature"], plain["top_p"]) == (0.7, 0.8) and "reasoning_effort" not in plain[
        "chat_template_kwargs"
    ]


def run(tmp_path: Path, url: str, g: GenerateConfig) -> list[dict[str, Any]]:
    t = tmp_path
    progress = ProgressOptions(status_path=t / "status.json")
    job = ShardJob(
        SAMPLES, t / "j.jsonl", t / "o.jsonl", t / "f.jsonl", g, Endpoint(url, "gpu0"), "00000", progress
    )
    generate_shard(job)
    return [orjson.loads(line) for line in (tmp_path / "o.jsonl").read_bytes().splitlines()]


def received(log: Path, start: int = 0) -> list[str]:
    events = [orjson.loads(line) for line in log.read_bytes()[start:].splitlines()]
    return [e["id"] for e in events if e.get("event") == "received"]


def test_records_seeds_send_order_and_a_rerun_that_adds_completions(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    url, stop = start_simulated_server(inline=True, request_log=str(log), mean_answer_tokens=8)
    try:
        two = cfg([{"name": "default", "n": 2}, {"name": "cool", "temperature": 0.2}])
        records = run(tmp_path, url, two)
        ids = [f"{s.id}/{v}/{k}" for s in SAMPLES for v, k in (("default", 0), ("default", 1), ("cool", 0))]
        # one prompt's completions back to back, variant by variant (one in flight: the exact order), after
        # a request of its own that prefills the prompt (no sample id: it makes no record)
        assert received(log) == [x for i in range(0, len(ids), 3) for x in (None, *ids[i : i + 3])]
        assert sorted(r["id"] for r in records) == sorted(ids)
        by_id = {r["id"]: r for r in records}
        for s in SAMPLES:
            mine = [by_id[i] for i in ids if i.startswith(f"{s.id}/")]
            expected = {(s.id, "default", 0), (s.id, "default", 1), (s.id, "cool", 0)}
            assert {(r["sample_id"], r["variant"], r["k"]) for r in mine} == expected
            assert len({r["seed"] for r in mine}) == 3
            assert by_id[f"{s.id}/cool/0"]["sampling"]["temperature"] == 0.2
            assert by_id[f"{s.id}/cool/0"]["sampling"]["block"] == "variant"
        assert len({r["settings_fingerprint"] for r in records}) == 2
        status = orjson.loads((tmp_path / "status.json").read_bytes())  # counts records, not prompts
        assert (status["done"], status["total"], status["completions_per_sample"]) == (12, 12, 3)

        # n 2 -> 3 and cool removed: only the third completions are sent; cool's records leave the output
        start = log.stat().st_size
        three = cfg([{"name": "default", "n": 3}])
        records = run(tmp_path, url, three)
        assert received(log, start) == [f"{s.id}/default/2" for s in SAMPLES]
        assert sorted(r["id"] for r in records) == sorted(
            f"{s.id}/default/{k}" for s in SAMPLES for k in range(3)
        )
        again = {r["id"]: r for r in records}
        assert all(again[i]["content"] == by_id[i]["content"] for i in by_id if "/default/" in i)

        # back to one completion: the ids are the sample ids again, the answers those of k = 0
        start = log.stat().st_size
        records = run(tmp_path, url, cfg())
        assert received(log, start) == []
        assert {r["id"]: r["content"] for r in records} == {
            s.id: by_id[f"{s.id}/default/0"]["content"] for s in SAMPLES
        }
        assert {(r["sample_id"], r["variant"], r["k"]) for r in records} == {
            (s.id, "default", 0) for s in SAMPLES
        }
    finally:
        stop()


def test_a_job_lends_other_slots_by_its_endpoints_slot_not_its_name(tmp_path: Path) -> None:
    """The generate hand-off (issue 51 item 4): the slot travels on the Endpoint; an external server has
    none."""
    from regen.generate.generation import other_slots

    g = cfg(concurrency=8, spill=True)
    lenders = other_slots(Endpoint("http://x", "gpu3", max_running_requests=8, slot=3), g, tmp_path)
    assert lenders is not None and lenders.own_slot == 3
    lenders.close()
    assert other_slots(Endpoint("http://x", "external", max_running_requests=8), g, tmp_path) is None


def test_the_replay_preview_hashes_each_variants_settings_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``plan_variants`` (the dry run's and each job's replay count) builds the run's settings once and
    each variant's from them: one settings hash per variant, however many samples."""
    import regen.fingerprint as fingerprint
    from regen.generate.replay import JournalIndex, plan_variants

    hashed: list[Any] = []
    digest = fingerprint._digest
    monkeypatch.setattr(fingerprint, "_digest", lambda payload: hashed.append(payload) or digest(payload))
    g = cfg([{"name": "default"}, {"name": "hot", "temperature": 1.0, "n": 3}])
    plans = plan_variants(
        ((f"s{i}", f"d{i}") for i in range(200)), JournalIndex(), fingerprint.RunSettings.of(g), g
    )
    assert len(hashed) == 2 and {p.new for p in plans.plans.values()} == {200, 600}
