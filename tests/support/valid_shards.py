"""Valid shards from hand-built generation records: each record as the client writes it, run through
the real validate step (tests/output/test_merge.py, tests/observe/test_stage_progress.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from stamped import fingerprint_fields

from regen.output.validate import ValidateConfig, validate_shard


def make_record(i: int, shard: str, **over: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "id": f"s{shard}-{i}",
        "shard": shard,
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"q{i}?"}],
        "reasoning_content": f"let me think about {i}",
        "content": f"the answer is {i}",
        "finish_reason": "stop" if i % 5 else "length",
        "truncated": i % 5 == 0,
        "thinking": True,
        "usage": {"prompt_tokens": 10 + i, "completion_tokens": 20 + i, "reasoning_tokens": 5},
        "sampling": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 128},
        "seed": 7 * i,
        "model": "demo-model",
        "server": {"id": "gpu0", "url": "http://127.0.0.1:30000", "version": None},
        "attempts": 1,
        "timings": {"started_at": 1.7e9 + i, "latency_s": 0.5},
        **fingerprint_fields(i),
    }
    rec.update(over)
    return rec


def make_valid_shards(tmp: Path, counts: list[int]) -> list[Path]:
    paths = []
    for k, n in enumerate(counts):
        shard = f"{k:05d}"
        src = tmp / "gen" / f"{shard}.jsonl"
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_bytes(b"".join(orjson.dumps(make_record(i, shard)) + b"\n" for i in range(n)))
        out = tmp / "valid" / f"{shard}.parquet"
        stats = validate_shard(src, out, tmp / "q" / f"{shard}.jsonl", ValidateConfig.from_dict({}))
        assert stats.valid == n
        paths.append(out)
    return paths
