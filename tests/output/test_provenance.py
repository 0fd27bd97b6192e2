"""Provenance recorded in the manifest: what made the dataset, exactly, and when."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from regen.fingerprint import GenerationSettings, chat_template_hash
from regen.output.provenance import build_provenance, generation_window, settings_in_records
from regen.records import VALID_SCHEMA, ValidColumns
from regen.runconfig import GenerateConfig


def test_generation_window_spans_every_request(tmp_path: Path) -> None:
    a, b = tmp_path / "00000.parquet", tmp_path / "00001.parquet"
    pq.write_table(pa.table({"started_at": [100.0, 105.0], "latency_s": [2.0, 1.0]}), a)
    pq.write_table(pa.table({"started_at": [98.0], "latency_s": [30.0]}), b)
    empty = tmp_path / "00002.parquet"
    pq.write_table(
        pa.table({"started_at": pa.array([], pa.float64()), "latency_s": pa.array([], pa.float64())}), empty
    )
    assert generation_window([str(a), str(b), str(empty)]) == (98.0, 128.0)
    assert generation_window([str(empty)]) == (None, None)


def valid_shard(path: Path, temperature: float, n: int, start: int = 0) -> Path:
    """A valid shard of ``n`` records made under default settings but ``temperature``."""
    settings = GenerationSettings.of(
        GenerateConfig.from_dict({"sampling": {"temperature": temperature}}), model_path="m"
    )
    cols = ValidColumns()
    for i in range(start, start + n):
        cols.append(
            {
                "id": f"s{i}", "shard": "00000", "messages": [{"role": "user", "content": "q"}],
                "reasoning_content": None, "content": "a", "finish_reason": "stop", "truncated": False,
                "thinking": True, "usage": {"prompt_tokens": 1, "completion_tokens": 1},
                "sampling": {"temperature": temperature, "top_p": 0.95, "top_k": 20, "max_tokens": 4096},
                "seed": i, "model": "m", "server": {"id": "gpu0"}, "attempts": 1,
                "timings": {"started_at": 100.0 + i, "latency_s": 1.0},
                "fingerprint": f"{i:016x}", "settings_fingerprint": settings.fingerprint,
                "settings": settings.to_json(),
            }
        )  # fmt: skip
    pq.write_table(pa.Table.from_batches([cols.to_batch()], schema=VALID_SCHEMA), path)
    return path


def test_provenance_comes_from_the_records_not_the_config(demo_tokenizer_dir: Path, tmp_path: Path) -> None:
    template = json.loads((demo_tokenizer_dir / "tokenizer_config.json").read_text())["chat_template"]
    assert chat_template_hash(str(demo_tokenizer_dir)) == hashlib.sha256(template.encode()).hexdigest()
    shard = valid_shard(tmp_path / "00000.parquet", 0.6, 3)
    plan = {"launch_args": ["--disable-radix-cache"], "sglang_version": "0.5.23"}
    prov = build_provenance(plan=plan, tokenizer_dir=str(demo_tokenizer_dir), valid_paths=[str(shard)])
    assert prov["server_flags"] == ["--disable-radix-cache"]
    assert prov["sglang_version"] == "0.5.23"
    assert prov["chat_template_sha256"] == chat_template_hash(str(demo_tokenizer_dir))
    # what decided the answers is what the records say
    assert prov["sampling"]["temperature"] == 0.6 and prov["model_path"] == "m"
    assert not prov["mixed_settings"] and list(prov["settings_fingerprints"].values()) == [3]
    assert prov["settings_fingerprint"] == next(iter(prov["settings_fingerprints"]))


def test_provenance_lists_every_settings_fingerprint_when_mixed(
    demo_tokenizer_dir: Path, tmp_path: Path
) -> None:
    a = valid_shard(tmp_path / "00000.parquet", 0.6, 2)
    b = valid_shard(tmp_path / "00001.parquet", 0.9, 5, start=2)
    groups = settings_in_records([str(a), str(b)])
    assert [(g.rows, g.settings["temperature"]) for g in groups] == [(5, 0.9), (2, 0.6)]
    prov = build_provenance(plan={}, tokenizer_dir=str(demo_tokenizer_dir), valid_paths=[str(a), str(b)])
    assert prov["mixed_settings"] and prov["settings_fingerprint"] is None and prov["sampling"] is None
    assert sorted(prov["settings_fingerprints"].values()) == [2, 5]
