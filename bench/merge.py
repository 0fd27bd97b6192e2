"""Benchmark: validate + merge of synthetic generation records vs pyarrow's own JSONL -> Parquet.

The reference side (``pyarrow.json.read_json`` + ``pyarrow.parquet.write_table``, no checks at
all) is the floor of this job. Each side runs in its own subprocess so its peak RSS is its own.

    .venv/bin/python -m bench.merge            # 1M records (~6 KB each)
    .venv/bin/python -m bench.merge --n 100000
    .venv/bin/python -m bench.merge --smoke     # CI: 500 records

Last line: ``merge: regen_rps=… pyarrow_rps=… ratio=… peak_rss_mb=…`` (peak_rss_mb is regen's).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench.harness import add_smoke, parse_args, peak_rss_mb
from bench.synthetic import WORDS, run_side


def _text(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    n = 0
    while n < chars:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)


class TextPool:
    """Pre-made texts of a few sizes and token id lists, picked at random (generating words or ids per
    record is slow)."""

    def __init__(self, rng: random.Random, per_size: int = 64) -> None:
        self.rng = rng
        self.pool = {c: [_text(rng, c) for _ in range(per_size)] for c in (120, 350, 380, 900, 1250)}
        self.ids = [[rng.randrange(VOCAB) for _ in range(MAX_IDS)] for _ in range(per_size)]

    def __call__(self, chars: int) -> str:
        return self.rng.choice(self.pool[chars])

    def token_ids(self, n: int) -> list[int]:
        """``n`` token ids (a slice of a pre-made list)."""
        return self.rng.choice(self.ids)[:n]


#: Qwen3's vocabulary size (token ids as the server reports them are below it)
VOCAB = 151_669
MAX_IDS = 400
#: the fingerprinted settings (regen.fingerprint.GenerationSettings.to_json) every record carries
SETTINGS = {
    "model_path": "Qwen/Qwen3-8B",
    "model_revision": None,
    "server_mode": "external",
    "chat_template_sha256": "a55ee1b1660128b7098723e0abcd92caa0788061051c62d51cbe87d9cf1974d8",
    "reasoning_parser": "qwen3",
    "regenerate": "last",
    "thinking": "on",
    "thinking_fraction": 0.75,
    "temperature": 0.6,
    "top_p": 0.95,
    "top_k": 20,
    "max_tokens": 4096,
    "n": 1,
    "seed": 0,
    "truncation": "keep",
    "retry_max_tokens_factor": 2.0,
    "extra_body": {"skip_special_tokens": False},  # non-empty: Parquet cannot write an empty struct
    "return_token_ids": True,
    "server_numerics": {
        "version": "0.5.23",
        "dtype": "auto",
        "quantization": None,
        "kv_cache_dtype": "auto",
        "mamba_ssm_dtype": None,
        "enable_deterministic_inference": False,
    },
    "version": 2,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
                "required": ["city"],
            },
        },
    }
]


def synthetic_record(i: int, text: TextPool, shard: str = "00000") -> dict[str, Any]:
    """One record as the generation stage writes it (``regen.records.GenerationRecord.to_json`` with the
    client's fingerprint stamp), ~6 KB serialised: the server's token ids (``return_token_ids`` is on by
    default; ~4 characters a token), fingerprints and settings on every record; every 10th sample has
    tools, every 20th answers with a tool call."""
    thinking = i % 4 != 0
    prompt_tokens = 130 + i % 21
    completion_tokens = 290 + i % 41
    rec: dict[str, Any] = {
        "id": f"{i:016x}",
        "shard": shard,
        "messages": [
            {"role": "system", "content": text(120)},
            {"role": "user", "content": text(380)},
        ],
        "reasoning_content": text(900) if thinking else None,
        "content": text(350 if thinking else 1250),
        "finish_reason": "tool_calls" if i % 20 == 5 else ("stop" if i % 50 else "length"),
        "truncated": i % 50 == 0,
        "thinking": thinking,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "reasoning_tokens": 220 if thinking else None,
        },
        "sampling": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 4096},
        "seed": (i * 2654435761) % (2**31),
        "model": "Qwen/Qwen3-8B",
        "server": {"id": f"gpu{i % 8}", "url": f"http://127.0.0.1:{30000 + i % 8}", "version": "0.5.23"},
        "attempts": 1,
        "timings": {"started_at": 1732900000.0 + i * 0.01, "latency_s": 1.5 + (i % 7) * 0.1},
        "prompt_token_ids": text.token_ids(prompt_tokens),
        "completion_token_ids": text.token_ids(completion_tokens),
    }
    if i % 10 == 5:
        rec["tools"] = TOOLS
    if i % 20 == 5:
        rec["tool_calls"] = [
            {
                "id": f"call_{i:08x}",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'},
            }
        ]
    rec["fingerprint"] = f"{(i * 0x9E3779B97F4A7C15) % 2**64:016x}"
    rec["settings_fingerprint"] = "81a465f8322df173"
    rec["settings"] = SETTINGS
    return rec


def shard_paths(src: Path, shards: int) -> list[Path]:
    return [src / f"{k:05d}.jsonl" for k in range(shards)]


def write_records(src: Path, n: int, shards: int) -> int:
    """Stream ``n`` records into ``shards`` generation files (as the generate jobs write them,
    record i in shard i mod shards); returns bytes written."""
    text = TextPool(random.Random(1234))
    size = 0
    paths = shard_paths(src, shards)
    bufs: list[list[bytes]] = [[] for _ in paths]
    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(open(p, "wb")) for p in paths]
        for i in range(n):
            k = i % shards
            bufs[k].append(orjson.dumps(synthetic_record(i, text, shard=f"{k:05d}")))
            if len(bufs[k]) == 10000 or i == n - 1:
                for fh, buf in zip(handles, bufs, strict=True):
                    if buf:
                        chunk = b"\n".join(buf) + b"\n"
                        fh.write(chunk)
                        size += len(chunk)
                        buf.clear()
    return size


def _validate_one(path: Path, work: Path) -> int:
    from regen.output.validate import ValidateConfig, validate_shard

    valid, quarantine = work / "valid" / f"{path.stem}.parquet", work / "quarantine" / f"{path.stem}.jsonl"
    stats = validate_shard(path, valid, quarantine, ValidateConfig.from_dict({}))
    return stats.records_in


def side_regen(src: Path, work: Path) -> dict[str, Any]:
    """The workflow's shape: one validate job per shard, run side by side (Snakemake with
    --cores N runs them concurrently), then one merge over the valid shards."""
    from concurrent.futures import ProcessPoolExecutor

    from regen.output.merge import MergeConfig, merge

    paths = sorted(src.glob("*.jsonl"))
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=len(paths)) as pool:
        records_in = sum(pool.map(_validate_one, paths, [work] * len(paths)))
    t1 = time.perf_counter()
    valid = [work / "valid" / f"{p.stem}.parquet" for p in paths]
    manifest = merge(valid, work / "dataset", MergeConfig.from_dict({}), {"bench": True})
    t2 = time.perf_counter()
    return {
        "rows": manifest.total_rows,
        "records_in": records_in,
        "shards": len(paths),
        "validate_s": t1 - t0,
        "merge_s": t2 - t1,
        "seconds": t2 - t0,
        "peak_rss_mb": peak_rss_mb("either"),
    }


def side_pyarrow(src: Path, work: Path) -> dict[str, Any]:
    """pyarrow's own conversion of the same shard files (multithreaded JSON reader, schema inferred),
    one Parquet file per shard (shards infer different schemas: tools appear in some only)."""
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    rows = 0
    for path in sorted(src.glob("*.jsonl")):
        table = pj.read_json(path)
        pq.write_table(table, work / f"pyarrow-{path.stem}.parquet", compression="zstd")
        rows += table.num_rows
        del table
    t1 = time.perf_counter()
    return {"rows": rows, "seconds": t1 - t0, "peak_rss_mb": peak_rss_mb("either")}


def _run_side(side: str, src: Path, work: Path) -> dict[str, Any]:
    return run_side("bench.merge", ["--side", side, "--src", str(src), "--work", str(work)])


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="bench/merge.py", description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="records to generate")
    ap.add_argument(
        "--shards", type=int, default=os.cpu_count() or 1, help="generation shards (default: one per core)"
    )
    ap.add_argument("--side", choices=["regen", "pyarrow"], help=argparse.SUPPRESS)
    ap.add_argument("--src", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    add_smoke(ap, n=500)
    args = parse_args(ap, argv)
    if args.side:
        fn = side_regen if args.side == "regen" else side_pyarrow
        print(json.dumps(fn(args.src, args.work)))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-merge-") as tmp:
        work = Path(tmp)
        src = work / "generations"
        src.mkdir()
        t0 = time.perf_counter()
        size = write_records(src, args.n, args.shards)
        print(
            f"generated {args.n} records, {size / 1e6:.0f} MB ({size / args.n:.0f} B/record) "
            f"in {time.perf_counter() - t0:.1f}s"
        )
        ref = _run_side("pyarrow", src, work)
        print(f"pyarrow: {ref}")
        ours = _run_side("regen", src, work)
        print(f"regen:   {ours}")
        if ours["rows"] != args.n or ref["rows"] != args.n:
            raise SystemExit(f"row counts differ: regen {ours['rows']}, pyarrow {ref['rows']}, want {args.n}")
        regen_rps = args.n / ours["seconds"]
        pyarrow_rps = args.n / ref["seconds"]
        print(
            f"merge: regen_rps={regen_rps:.0f} pyarrow_rps={pyarrow_rps:.0f} "
            f"ratio={regen_rps / pyarrow_rps:.3f} peak_rss_mb={ours['peak_rss_mb']:.0f} "
            f"pyarrow_peak_rss_mb={ref['peak_rss_mb']:.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
