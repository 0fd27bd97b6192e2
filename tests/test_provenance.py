"""Provenance recorded in the manifest: what made the dataset, exactly, and when."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from regen.provenance import build_provenance, chat_template_hash, config_hash, generation_window


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


def test_provenance_names_the_template_config_and_flags(demo_tokenizer_dir: Path, tmp_path: Path) -> None:
    template = json.loads((demo_tokenizer_dir / "tokenizer_config.json").read_text())["chat_template"]
    assert chat_template_hash(str(demo_tokenizer_dir)) == hashlib.sha256(template.encode()).hexdigest()
    config = {"server": {"model_path": "m", "mode": "simulated", "api_key_env": "MY_KEY"}, "generate": {}}
    assert config_hash(config) == config_hash(json.loads(json.dumps(config)))  # key order does not matter
    assert config_hash(config) != config_hash({**config, "generate": {"thinking": "off"}})
    plan = {"launch_args": ["--disable-radix-cache"], "sglang_version": "0.5.23"}
    prov = build_provenance(plan=plan, config=config, tokenizer_dir=str(demo_tokenizer_dir), valid_paths=[])
    assert prov["server_flags"] == ["--disable-radix-cache"]
    assert prov["sglang_version"] == "0.5.23"
    assert prov["chat_template_sha256"] == chat_template_hash(str(demo_tokenizer_dir))
