"""Benchmark: validate + merge of synthetic generation records vs pyarrow's own JSONL -> Parquet.

The reference side (``pyarrow.json.read_json`` + ``pyarrow.parquet.write_table``, no checks at
all) is the floor of this job. Each side runs in its own subprocess so its peak RSS is its own.

    .venv/bin/python bench/merge.py            # 1M records (~2 KB each)
    .venv/bin/python bench/merge.py --n 100000

Last line: ``merge: regen_rps=… pyarrow_rps=… ratio=… peak_rss_mb=…`` (peak_rss_mb is regen's).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from synthetic import WORDS, run_side


def _text(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    n = 0
    while n < chars:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)


class TextPool:
    """Pre-made texts of a few sizes, picked at random (generating words per record is slow)."""

    def __init__(self, rng: random.Random, per_size: int = 64) -> None:
        self.rng = rng
        self.pool = {c: [_text(rng, c) for _ in range(per_size)] for c in (120, 350, 380, 900, 1250)}

    def __call__(self, chars: int) -> str:
        return self.rng.choice(self.pool[chars])


def synthetic_record(i: int, text: TextPool, shard: str = "00000") -> dict[str, Any]:
    """One record as the generation stage writes it, ~2 KB serialised."""
    thinking = i % 4 != 0
    return {
        "id": f"{i:016x}",
        "shard": shard,
        "messages": [
            {"role": "system", "content": text(120)},
            {"role": "user", "content": text(380)},
        ],
        "reasoning_content": text(900) if thinking else None,
        "content": text(350 if thinking else 1250),
        "finish_reason": "stop" if i % 50 else "length",
        "truncated": i % 50 == 0,
        "thinking": thinking,
        "usage": {"prompt_tokens": 120 + i % 97, "completion_tokens": 300 + i % 301, "reasoning_tokens": 200},
        "sampling": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 4096},
        "seed": (i * 2654435761) % (2**31),
        "model": "Qwen/Qwen3-8B",
        "server": {"id": f"gpu{i % 8}", "url": f"http://127.0.0.1:{30000 + i % 8}", "version": "0.5.0"},
        "attempts": 1,
        "timings": {"started_at": 1732900000.0 + i * 0.01, "latency_s": 1.5 + (i % 7) * 0.1},
    }


def write_records(path: Path, n: int) -> int:
    """Stream ``n`` records to ``path``; returns bytes written."""
    text = TextPool(random.Random(1234))
    size = 0
    with open(path, "wb") as fh:
        buf: list[bytes] = []
        for i in range(n):
            buf.append(orjson.dumps(synthetic_record(i, text)))
            if len(buf) == 10000:
                chunk = b"\n".join(buf) + b"\n"
                fh.write(chunk)
                size += len(chunk)
                buf.clear()
        if buf:
            chunk = b"\n".join(buf) + b"\n"
            fh.write(chunk)
            size += len(chunk)
    return size


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def side_regen(src: Path, work: Path) -> dict[str, Any]:
    from regen.merge import merge
    from regen.validate import validate_shard

    t0 = time.perf_counter()
    stats = validate_shard(src, work / "valid" / "00000.parquet", work / "quarantine" / "00000.jsonl", {})
    t1 = time.perf_counter()
    manifest = merge([work / "valid" / "00000.parquet"], work / "dataset", {}, {"bench": True})
    t2 = time.perf_counter()
    return {
        "rows": manifest.total_rows,
        "records_in": stats.records_in,
        "validate_s": t1 - t0,
        "merge_s": t2 - t1,
        "seconds": t2 - t0,
        "peak_rss_mb": _peak_rss_mb(),
    }


def side_pyarrow(src: Path, work: Path) -> dict[str, Any]:
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    table = pj.read_json(src)
    pq.write_table(table, work / "pyarrow.parquet", compression="zstd")
    t1 = time.perf_counter()
    return {"rows": table.num_rows, "seconds": t1 - t0, "peak_rss_mb": _peak_rss_mb()}


def _run_side(side: str, src: Path, work: Path) -> dict[str, Any]:
    return run_side(__file__, ["--side", side, "--src", str(src), "--work", str(work)])


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="bench/merge.py", description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="records to generate")
    ap.add_argument("--side", choices=["regen", "pyarrow"], help=argparse.SUPPRESS)
    ap.add_argument("--src", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.side:
        fn = side_regen if args.side == "regen" else side_pyarrow
        print(json.dumps(fn(args.src, args.work)))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-merge-") as tmp:
        work = Path(tmp)
        src = work / "00000.jsonl"
        t0 = time.perf_counter()
        size = write_records(src, args.n)
        print(f"generated {args.n} records, {size / 1e6:.0f} MB ({size / args.n:.0f} B/record) "
              f"in {time.perf_counter() - t0:.1f}s")  # fmt: skip
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
