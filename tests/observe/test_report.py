"""regen.observe.report: report assets from a small results tree made by validate + merge + reconcile."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard
from stamped import fingerprint_fields

from regen.layout.run import RunLayout
from regen.observe import report as R
from regen.output.merge import MergeConfig, merge
from regen.output.reconcile import reconcile_results
from regen.output.validate import ValidateConfig, validate_shard


def make_record(
    i: int, server: str, start: float, latency: float, tokens: int, **over: Any
) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "id": f"id{i}", "shard": "00000",
        "messages": [{"role": "user", "content": f"q{i}"}],
        "reasoning_content": "r" * (i + 1), "content": f"a{i}",
        "finish_reason": "stop" if i % 3 else "length", "truncated": i % 3 == 0, "thinking": True,
        "usage": {"prompt_tokens": 5 + i, "completion_tokens": tokens, "reasoning_tokens": tokens // 2},
        "sampling": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 512},
        "seed": i, "model": "demo", "server": {"id": server, "url": "http://127.0.0.1:1"},
        "attempts": 1, "timings": {"started_at": start, "latency_s": latency}, **fingerprint_fields(i),
    }  # fmt: skip
    rec.update(over)
    return rec


def build_results(root: Path) -> Path:
    recs = [make_record(i, f"gpu{i % 2}", 1000.0 + i, 10.0, 100 * (1 + i % 2)) for i in range(12)]
    recs.append(make_record(12, "gpu0", 1005.0, 1.0, 10, content=""))  # quarantined
    gen = root / "generations" / "00000.jsonl.zst"  # as the workflow writes it: compressed
    gen.parent.mkdir(parents=True)
    gen.write_bytes(zstandard.compress(b"".join(orjson.dumps(r) + b"\n" for r in recs) + b"{broken\n"))
    validate_shard(
        gen,
        root / "valid" / "00000.parquet",
        root / "quarantine" / "00000.jsonl.zst",
        ValidateConfig.from_dict({}),
    )
    merge([root / "valid" / "00000.parquet"], root / "dataset", MergeConfig.from_dict({}), {})
    ids = [f"id{i}" for i in range(13)] + ["lost-one"]
    (root / "audit").mkdir()
    pq.write_table(pa.table({"id": ids}), root / "audit" / "flags.parquet")
    reconcile_results(root, strict=False)
    (root / "plan").mkdir()
    (root / "plan" / "server.json").write_bytes(
        orjson.dumps(
            {
                "launched": "recommended",
                "recommended": {"mem_fraction_static": 0.85, "kv_cache_tokens": 120000, "weights_gib": 15.0},
                "launch_args": ["--tp", "1"],
                "gpu_memory_mib": 81920,
            }
        )
    )
    return root


def test_write_report_assets_real_files(tmp_path: Path) -> None:
    results = build_results(tmp_path / "results")
    work = tmp_path / "work"
    (work / "servers").mkdir(parents=True)
    (work / "servers" / "gpu0.realized.json").write_bytes(
        orjson.dumps({"server_id": "gpu0", "realized": {"max_total_num_tokens": 118000, "weights_gib": 15.0}})
    )
    paths = R.write_report_assets(results, tmp_path / "assets", work)
    assert sorted(p.name for p in paths.values()) == sorted(R.ASSET_NAMES)
    for name in R.ASSET_NAMES:
        assert paths[name].stat().st_size > 200, name
    for svg in (R.TOKEN_LENGTHS_SVG, R.FINISH_REASONS_SVG, R.QUARANTINE_REASONS_SVG, R.THROUGHPUT_SVG):
        root = ET.parse(paths[svg]).getroot()
        assert root.tag.endswith("svg")
        assert len(root.findall(".//{http://www.w3.org/2000/svg}path")) > 5, svg
    quarantine_svg = paths[R.QUARANTINE_REASONS_SVG].read_text()
    assert "no data" not in quarantine_svg
    recon = paths[R.RECONCILE_HTML].read_text()
    assert "FAILED" in recon and "<td>lost</td><td>1</td>" in recon
    plan = paths[R.SERVER_PLAN_HTML].read_text()
    assert "<th></th><th>predicted</th><th>gpu0 realized</th><th>gpu0 drift</th>" in plan
    assert "<td>KV cache tokens</td><td>120000</td><td>118000</td><td>-1.7%</td>" in plan
    assert "<td>weights</td><td>15</td><td>15</td><td>+0.0%</td>" in plan
    assert "--tp 1" in plan


def test_missing_inputs_still_write_every_asset(tmp_path: Path) -> None:
    paths = R.write_report_assets(tmp_path / "nothing", tmp_path / "assets", tmp_path / "work")
    for name in R.ASSET_NAMES:
        assert paths[name].is_file()
    assert "no data" in paths[R.THROUGHPUT_SVG].read_text()


def test_throughput_buckets_conserve_tokens(tmp_path: Path) -> None:
    gen = tmp_path / "generations"
    gen.mkdir()
    recs = [make_record(0, "gpu0", 0.0, 10.0, 1000), make_record(1, "gpu1", 5.0, 2.0, 300),
            make_record(2, "gpu0", 3.0, 0.0, 50)]  # fmt: skip
    (gen / "00000.jsonl.zst").write_bytes(zstandard.compress(b"".join(orjson.dumps(r) + b"\n" for r in recs)))
    (gen / "00000.failed.jsonl").write_bytes(b'{"id": "x", "reason": "r"}\n')
    bucket_s, series = R.throughput_series(RunLayout.shard_outputs_in(gen), bucket_s=1.0)
    assert bucket_s == 1.0 and set(series) == {"gpu0", "gpu1"}
    assert np.isclose(series["gpu0"].sum() * bucket_s, 1050)
    assert np.isclose(series["gpu1"].sum() * bucket_s, 300)
    assert np.allclose(series["gpu1"][5:7], 150) and series["gpu1"][:5].sum() == 0
    assert np.isclose(series["gpu0"][3], 100 + 50)
