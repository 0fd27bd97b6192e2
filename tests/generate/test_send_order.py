"""The send order decides no answer (issue 37 item 3): a shard ordered longest expected answer first gives
the same records as the same shard in dataset order, resume skips exactly the journaled samples whatever
the order, and a truncated answer's retry goes out before its worker takes a new sample."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq

from regen.generate.client import Endpoint, GenerateConfig, ShardJob, ShardStats, generate_shard
from regen.ingest.shards import BY_OLD_ANSWERS, BY_PROMPT, Expected, read_send_order, read_shard, write_shards
from regen.simulated.launcher import start_simulated_server
from regen.simulated.requestlog import read_request_log
from regen.types import Message, Sample

FAST = {"backoff_base_s": 0.001, "request_timeout_s": 10, "sampling": {"max_tokens": 4096}}
#: what decides a record: ids, settings, fingerprints, seed, thinking switch, the prompt and the answer
DECIDED = ("id", "fingerprint", "settings_fingerprint", "settings", "seed", "thinking", "messages",
           "content", "reasoning_content", "finish_reason", "usage")  # fmt: skip


def samples(n: int) -> list[Sample]:
    """Samples whose old answers' lengths vary (sample i: (i * 37) % n words), one without an answer."""
    out = []
    for i in range(n):
        turns = [Message("user", f"question {i}")]
        if i != 3:
            turns.append(Message("assistant", " ".join(["word"] * ((i * 37) % n + 1))))
        out.append(Sample(f"q{i}", tuple(turns), {"file": "in.jsonl", "row": i, "format": "messages"}))
    return out


def lengths(data: list[Sample]) -> dict[tuple[str | None, int | None], Expected]:
    """The audit's expectation, as its flags would give it: the old answer's words, else the prompt's."""
    out = {}
    for s in data:
        key = (s.source["file"], s.source["row"])
        answer = [m for m in s.messages if m.role == "assistant"]
        if answer:
            out[key] = Expected(len(answer[0].content.split()), BY_OLD_ANSWERS)
        else:
            out[key] = Expected(len(s.messages[0].content.split()), BY_PROMPT)
    return out


def shard_ids(path: Path) -> list[str]:
    return pq.read_table(path, columns=["id"])["id"].to_pylist()


def run(shard: Path, journal: Path, url: str, source: Any = None, **cfg: Any) -> tuple[ShardStats, Path]:
    out = journal.with_suffix(".records.jsonl")
    stats = generate_shard(
        ShardJob(
            read_shard(shard) if source is None else source,
            journal,
            out,
            journal.with_suffix(".failed.jsonl"),
            GenerateConfig.from_dict({**FAST, **cfg}),
            Endpoint(url, "gpu0"),
            "00000",
        )
    )
    return stats, out


def decided(records: Path) -> dict[str, tuple[Any, ...]]:
    recs = [orjson.loads(line) for line in records.read_bytes().splitlines()]
    return {
        r["id"]: tuple(orjson.dumps(r.get(k), option=orjson.OPT_SORT_KEYS) for k in DECIDED) for r in recs
    }


def test_longest_first_changes_no_record_and_resume_skips_exactly_the_journaled(tmp_path: Path) -> None:
    data = samples(40)
    dataset_order, longest_first = [tmp_path / "d" / "00000.parquet"], [tmp_path / "l" / "00000.parquet"]
    assert write_shards(data, (), dataset_order) == write_shards(
        data, (), longest_first, expected=lengths(data)
    )
    assert sorted(shard_ids(dataset_order[0])) == sorted(shard_ids(longest_first[0]))  # same membership
    ordered = shard_ids(longest_first[0])
    assert ordered != shard_ids(dataset_order[0])
    want = lengths(data)
    by_id = {s.id: want[(s.source["file"], s.source["row"])].tokens for s in data}
    assert [by_id[i] for i in ordered] == sorted(by_id.values(), reverse=True)
    assert read_send_order(longest_first[0])["by_prompt"] == 1  # the sample with no old answer

    url, stop = start_simulated_server(inline=True, mean_answer_tokens=20, mean_reasoning_tokens=10)
    try:
        _, plain = run(dataset_order[0], tmp_path / "d.jsonl", url, thinking="mix", thinking_fraction=0.5)
        _, sorted_ = run(longest_first[0], tmp_path / "l.jsonl", url, thinking="mix", thinking_fraction=0.5)
    finally:
        stop()
    a, b = decided(plain), decided(sorted_)
    assert set(a) == {s.id for s in data} and a == b  # same ids, settings, fingerprints and answers
    assert len({v[DECIDED.index("thinking")] for v in a.values()}) == 2  # the switch varies, and still agrees

    # resume: a journal with the first 15 samples in dataset order, then the run on the reordered shard
    journal = tmp_path / "resume.jsonl"
    first = [s for s in data if s.id in set(shard_ids(dataset_order[0])[:15])]
    log = tmp_path / "requests.jsonl"
    url, stop = start_simulated_server(inline=True, mean_answer_tokens=20, mean_reasoning_tokens=10,
                                       request_log=str(log))  # fmt: skip
    try:
        run(dataset_order[0], journal, url, source=first, thinking="mix", thinking_fraction=0.5)
        before = len(read_request_log(log))
        stats, resumed = run(
            longest_first[0], journal, url, thinking="mix", thinking_fraction=0.5, concurrency=1
        )
        sent = [e["id"] for e in read_request_log(log)[before:] if e["event"] == "received"]
    finally:
        stop()
    assert stats.skipped_resumed == 15 and stats.completed == 25
    assert sorted(sent) == sorted(set(by_id) - {s.id for s in first})  # each of the others once
    assert sent == [i for i in ordered if i not in {s.id for s in first}]  # in the shard's order
    assert decided(resumed) == a


def test_truncation_retry_goes_out_before_any_new_sample(tmp_path: Path) -> None:
    """A truncated first attempt's retry is sent by the same coroutine as soon as the first attempt
    ends (``Requests.answer_turn``): with one worker, the server receives it next, before the next sample."""
    data = samples(60)
    shard = tmp_path / "00000.parquet"
    write_shards(data, (), [shard])
    log = tmp_path / "requests.jsonl"
    url, stop = start_simulated_server(mean_answer_tokens=20, mean_reasoning_tokens=10, long_fraction=0.2,
                                       long_factor=64, request_log=str(log))  # fmt: skip
    try:
        stats, _ = run(shard, tmp_path / "j.jsonl", url, concurrency=1, truncation="retry",
                       retry_max_tokens_factor=2.0, sampling={"max_tokens": 256})  # fmt: skip
    finally:
        stop()
    events = [(e["event"], e["id"]) for e in read_request_log(log) if e["event"] in ("received", "completed")]
    assert stats.retried_requests == 0  # no failed request: the only repeats are truncation retries
    seen: set[str] = set()
    retried = 0
    for k, (event, sid) in enumerate(events):
        if event == "received" and sid in seen:
            retried += 1
            assert events[k - 1] == ("completed", sid), f"{sid}'s retry came after {events[k - 1]}"
        seen.add(sid)
    assert retried >= 3, "the workload truncates some answers"
    assert len(seen) == len(data)


def test_the_sweeps_pilot_spreads_over_a_longest_first_shard(tmp_path: Path) -> None:
    """The pilot measures the run's workload: from a shard sorted longest first it takes every k-th
    sample, not the first (the longest) ones."""
    from regen.tune.tune import pilot_samples

    data = samples(40)
    shard = tmp_path / "00000.parquet"
    write_shards(data, (), [shard], expected=lengths(data))
    ordered = shard_ids(shard)
    assert [s.id for s in pilot_samples(shard, 10)] == ordered[::4]
    assert [s.id for s in pilot_samples(shard, 100)] == ordered  # fewer samples than asked: all of them
