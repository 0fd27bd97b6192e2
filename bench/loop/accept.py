"""Acceptance as served (issue 36 item 5): SGLang 0.5.17 with the target and an EAGLE3 drafter, the eval
prompts sampled as the data was made, the accept length read from SGLang's own numbers.

  accept --target MODEL --drafter TRAIN/NAME/sglang --prompts DATA/eval-prompts.jsonl --out ACC/NAME.json
         [--max-new-tokens 2048] [--concurrency 48]
      starts SGLang through regen's own server lifecycle (``regen.serving.lifecycle.acquire_server``, as
      bench/gpu/known_target/baselines.py does) with ``--speculative-algorithm EAGLE3
      --speculative-draft-model-path DIR --speculative-num-steps 3 --speculative-eagle-topk 1
      --speculative-num-draft-tokens 4``, POSTs each prompt's ``input_ids`` to ``/generate`` with
      temperature 0.6, top_p 0.95, top_k 20 (not greedy: the chain loops) and reads:
        * ``accept_length``: sum of ``meta_info.completion_tokens`` / sum of ``meta_info.spec_verify_ct``
          (SGLang 0.5.17 ``TokenizerManager._calculate_spec_decoding_metrics``: its per-request
          ``spec_accept_length`` is the same ratio, the first token, from prefill, included)
        * ``log_accept_len``: the decode lines' ``accept len`` (``SchedulerMetricsReporter``: accepted
          tokens per verify step over the log interval, prefill's token not included), median and
          running-weighted mean
  accept --target MODEL --ceiling --out ACC/ceiling.json
      the designed ceiling: a perfect drafter (the chain's own most likely successor, top-k 1, 3 steps)
      verified as SGLang 0.5.17 verifies a sampled batch (target-only: draft ``d`` accepted with the
      target's probability of ``d``, else a token from the rest; all accepted: one bonus token), both
      ratios (meta_info's and the log's), simulated on the chain (thinking on), beside
      ``known_target.mtp_acceptance``'s visit-weighted estimate
  accept ... --dry
      the CPU rehearsal: no SGLang; the drafter's ``train.json`` (beside DIR) gives
      ``predicted_accept_length_3steps`` (SpecForge's per-position accuracies chained)

What SGLang 0.5.17 needs and does by itself (read in its source): EAGLE3 needs no ``--disable-radix-cache``
and keeps CUDA graphs (draft and verify graphs are captured), no draft revision for a local dir
(``ServerArgs._resolve_model_paths`` only downloads paths that do not exist), ``max_running_requests``
reset to 48 when unset (``speculative_hook``), and the draft vocabulary mapping is the drafter's own:
``LlamaForCausalLMEagle3.load_weights`` turns ``d2t`` into ``hot_token_id`` and ignores ``t2d``; a full
vocabulary drafter has neither. The drafter's vocabulary, ``d2t``/``t2d`` and aux-layer ids are recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import struct
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bench.gpu.known_target import model as kt
from bench.gpu.serverlog import accept_lengths

STEPS = 3
EAGLE3_FLAGS = shlex.split(
    f"--speculative-algorithm EAGLE3 --speculative-num-steps {STEPS} --speculative-eagle-topk 1 "
    f"--speculative-num-draft-tokens {STEPS + 1}"
)
SAMPLING = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}


# ------------------------------------------------------------------------------------ SGLang's numbers


def meta_accept(metas: list[dict[str, Any]]) -> dict[str, Any]:
    """The accept length over requests from ``/generate``'s ``meta_info``: sum of completion tokens over
    sum of verify steps (requests without ``spec_verify_ct`` are counted and left out)."""
    with_spec = [m for m in metas if m.get("spec_verify_ct")]
    tokens = sum(int(m["completion_tokens"]) for m in with_spec)
    verifies = sum(int(m["spec_verify_ct"]) for m in with_spec)
    per_request = [int(m["completion_tokens"]) / int(m["spec_verify_ct"]) for m in with_spec]
    return {
        "requests": len(metas),
        "requests_without_spec": len(metas) - len(with_spec),
        "completion_tokens": tokens,
        "spec_verify_ct": verifies,
        "accept_length": tokens / verifies if verifies else None,
        "per_request_mean": statistics.fmean(per_request) if per_request else None,
        "finish": _count(str((m.get("finish_reason") or {}).get("type")) for m in metas),
    }


def _count(xs: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in xs:
        out[x] = out.get(x, 0) + 1
    return out


# ---------------------------------------------------------------------------------------- the ceiling


def ceiling(chain: kt.Chain, steps: int = STEPS, runs: int = 2000, max_tokens: int = 2048, seed: int = 0):
    """A perfect drafter's accept length (module doc): per completion the first token is sampled (prefill),
    then verify steps until ``<|im_end|>``; both SGLang ratios over all completions."""
    rng = np.random.default_rng(seed)
    best = {t: max(chain.probs(t).items(), key=lambda kv: kv[1]) for t in chain.states if chain.probs(t)}
    tokens = verifies = accepted = 0
    for _ in range(runs):
        cur, n = _draw(chain.probs(chain.start_thinking), rng), 1
        while cur != chain.eos and n < max_tokens:
            verifies += 1
            d = cur
            for k in range(steps + 1):
                if k < steps:
                    d, p = best[cur]
                    if rng.random() < p:
                        cur = d
                    else:
                        cur = _draw({u: q for u, q in chain.probs(cur).items() if u != d}, rng)
                else:  # every draft accepted: the bonus token
                    cur = _draw(chain.probs(cur), rng)
                n += 1
                accepted += 1
                if cur != d or cur == chain.eos or n >= max_tokens:
                    break
        tokens += n
    vis = kt.visits(chain, chain.start_thinking, chain.eos, 8 * max_tokens)
    return {
        "accept_length": tokens / verifies,
        "log_accept_len": accepted / verifies,
        "visit_weighted": float(kt.mtp_acceptance(chain, vis, steps)["accept_length"]),
        "steps": steps,
        "runs": runs,
        "how": "perfect drafter (the chain's most likely successor, top-k 1), target-only verification "
        "at the chain's sampling; accept_length as meta_info counts it (prefill's token included), "
        "log_accept_len as the decode lines do",
    }


def _draw(probs: dict[int, float], rng: np.random.Generator) -> int:
    toks = list(probs)
    w = np.array([probs[t] for t in toks])
    return toks[int(rng.choice(len(toks), p=w / w.sum()))]


# ---------------------------------------------------------------------------------------- the drafter


def safetensors_names(path: Path) -> dict[str, list[int]]:
    """Tensor names and shapes from a safetensors header."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    return {k: v["shape"] for k, v in header.items() if k != "__metadata__"}


def drafter_facts(drafter: Path) -> dict[str, Any]:
    """What SGLang's EAGLE3 loader will see: architecture, vocabularies, d2t/t2d, aux layers."""
    cfg = json.loads((drafter / "config.json").read_text()) if (drafter / "config.json").exists() else {}
    names: dict[str, list[int]] = {}
    for f in sorted(drafter.glob("*.safetensors")):
        names |= safetensors_names(f)
    return {
        "architectures": cfg.get("architectures"),
        "vocab_size": cfg.get("vocab_size"),
        "draft_vocab_size": cfg.get("draft_vocab_size"),
        "aux_layer_ids": (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids"),
        "d2t": names.get("d2t"),
        "t2d": names.get("t2d"),
        "tensors": len(names),
    }


# ------------------------------------------------------------------------------------------ serving


def read_prompts(path: Path) -> list[dict[str, Any]]:
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row.get("input_ids"), list) or not row["input_ids"]:
            raise SystemExit(f"{path}: row {i} ({row.get('id')}): no input_ids")
        rows.append(row)
    return rows


def post_generate(url: str, row: dict[str, Any], max_new_tokens: int, timeout_s: float) -> dict[str, Any]:
    body = {"input_ids": row["input_ids"], "sampling_params": {**SAMPLING, "max_new_tokens": max_new_tokens}}
    req = urllib.request.Request(
        f"{url}/generate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            data = json.loads(resp.read())
    except (OSError, ValueError) as exc:
        return {"id": row["id"], "error": f"{type(exc).__name__}: {exc}"}
    return {"id": row["id"], "meta_info": data.get("meta_info") or {}}


def serve(a: argparse.Namespace, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One SGLang server (the target + the drafter) for all prompts; the answers' meta_info and the log."""
    from bench.gpu.harness import bench_server_cfg, wait_gpu_free
    from regen.serving import lifecycle
    from regen.serving.procfs import SERVER_START_MARK

    work = a.out.with_suffix("")
    servers, logs = work / "servers", work / "logs"
    args = [*EAGLE3_FLAGS, "--speculative-draft-model-path", str(a.drafter.resolve())]
    cfg = bench_server_cfg(
        a.target.resolve(), False, args=args, use_tuner=False, port_base=a.port_base, simulated=None
    )
    out: dict[str, Any] = {"launch_args": args, "gpu_used_before_mib": wait_gpu_free(timeout_s=180)}
    t0 = time.monotonic()
    try:
        with lifecycle.acquire_server(cfg, None, servers, logs, owner_pid=os.getpid()) as ep:
            out["server_start_s"] = round(time.monotonic() - t0, 1)
            t1 = time.monotonic()
            with ThreadPoolExecutor(a.concurrency) as pool:
                answers = list(pool.map(lambda r: post_generate(ep.url, r, a.max_new_tokens, 3600), rows))
            out["generation_s"] = round(time.monotonic() - t1, 1)
    finally:
        out["stopped_supervisors"] = lifecycle.stop_all_servers(servers, grace_s=60)
    text = (logs / "gpu0.log").read_text(errors="replace") if (logs / "gpu0.log").exists() else ""
    text = text[text.rfind(SERVER_START_MARK) :] if SERVER_START_MARK in text else text
    errors = [x for x in answers if "error" in x]
    out["errors"] = {"count": len(errors), "examples": [x["error"][:300] for x in errors[:3]]}
    out["meta"] = meta_accept([x["meta_info"] for x in answers if "meta_info" in x])
    out["log"] = accept_lengths(text)
    out["server_log"] = str(logs / "gpu0.log")
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("--drafter", type=Path, help="an EAGLE3 draft model dir (TRAIN/NAME/sglang)")
    p.add_argument("--prompts", type=Path, help="DATA/eval-prompts.jsonl")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--max-new-tokens", type=int, default=2048, help="the workflow's max_tokens")
    p.add_argument("--concurrency", type=int, default=48, help="SGLang's spec cap when unset is 48")
    p.add_argument("--port-base", type=int, default=31200)
    p.add_argument("--ceiling", action="store_true", help="the designed ceiling from the chain; no server")
    p.add_argument("--dry", action="store_true", help="CPU rehearsal: train.json's predicted accept length")
    a = p.parse_args(argv)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    result: dict[str, Any] = {"steps": STEPS, "sampling": SAMPLING, "max_new_tokens": a.max_new_tokens}
    if a.ceiling:
        chain = kt.Chain.from_json(json.loads((a.target / "chain.json").read_text()))
        result |= {"source": "ceiling", **ceiling(chain, max_tokens=a.max_new_tokens)}
    elif a.drafter is None or a.prompts is None:
        p.error("--drafter and --prompts are needed unless --ceiling")
    else:
        result["drafter"] = str(a.drafter)
        result["drafter_facts"] = drafter_facts(a.drafter)
        if a.dry:
            train = json.loads((a.drafter.parent / "train.json").read_text())
            result |= {"source": "predicted (train.json, no server)"}
            result["accept_length"] = train.get("predicted_accept_length_3steps")
            result["prompts"] = len(read_prompts(a.prompts))
        else:
            rows = read_prompts(a.prompts)
            served = serve(a, rows)
            result |= {"source": "sglang 0.5.17 meta_info", "prompts": len(rows), **served}
            result["accept_length"] = served["meta"]["accept_length"]
            result["log_accept_len_median"] = (served["log"] or {}).get("median")
    result["wall_s"] = round(time.time() - t0, 1)
    from regen.io import write_json

    write_json(a.out, result)
    print(f"accept: out={a.out} source={result['source']!r} accept_length={result.get('accept_length')}")
    return 0 if result.get("accept_length") is not None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
