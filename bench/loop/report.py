"""The drafter loop's results (issue 36 item 6): ``RESULTS/loop-<date>.json`` and ``.md`` from what the
sequence's steps left under ROOT (``steps.json``, ``data/prepare.json``, ``train/<name>/train.json``,
``acc/<name>.json``, ``acc/ceiling.json``), and the last line

  loop: trainer=specforge algo=eagle3 rows=… steps=… accept_regen=… accept_original=… accept_ceiling=…
        ratio=… specforge_eval_regen=… specforge_eval_original=…

``rows``: regen's training rows (prepare.json); ``steps``: the train runs' steps; ``accept_*``: served
(SGLang's meta_info, completion tokens over verify steps) or, in the CPU rehearsal, train.json's
prediction (the report says which); ``ratio``: accept_regen / accept_original; ``specforge_eval_*``:
SpecForge's own eval number (the first of SPECFORGE_EVAL_KEYS in train.json's ``specforge_eval``; the
key is named in the report). A value not measured yet prints ``na``. Stdlib only: the sequence imports it.

Usage: python -m bench.loop.report --root /tmp/loop --results measurements [--date 2026-12-02]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness import fmt
from regen.io import atomic_open

#: the scalar SpecForge's eval is summarized by, in order of preference: its simulated accept length over the
#: TTT positions (specforge/eval/evaluator.py: ``eval/simulated_acc_len``), else position 0's accuracy
SPECFORGE_EVAL_KEYS = ("eval/simulated_acc_len", "eval/avg_acc")
NAMES = ("regen", "original")


def _json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def specforge_eval(train: dict[str, Any] | None) -> tuple[str | None, float | None]:
    """(key, value) of SpecForge's own eval summary in a train.json (SPECFORGE_EVAL_KEYS' first present,
    else the first key naming ``acc_len``)."""
    ev = (train or {}).get("specforge_eval") or {}
    for k in [*SPECFORGE_EVAL_KEYS, *(k for k in ev if "acc_len" in k)]:
        if isinstance(ev.get(k), (int, float)):
            return k, float(ev[k])
    return None, None


def collect(root: Path, dry: bool) -> dict[str, Any]:
    """Every result the sequence has written so far, and the headline numbers."""
    steps = _json(root / "steps.json") or {}
    prepare = _json(root / "data" / "prepare.json")
    designed = _json(root / "model" / "designed.json")
    train = {n: _json(root / "train" / n / "train.json") for n in NAMES}
    acc = {n: _json(root / "acc" / f"{n}.json") for n in (*NAMES, "ceiling")}
    accept = {n: (acc[n] or {}).get("accept_length") for n in (*NAMES, "ceiling")}
    ev = {n: specforge_eval(train[n]) for n in NAMES}
    ratio = (
        accept["regen"] / accept["original"] if accept["regen"] is not None and accept["original"] else None
    )
    rows = _rows(prepare, "regen-train")
    return {
        "issue": 36,
        "mode": "cpu rehearsal (DRY)" if dry else "device",
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "headline": {
            "trainer": "specforge",
            "algo": "eagle3",
            "rows": rows,
            "steps": next((t["steps"] for t in train.values() if t and "steps" in t), None),
            "accept_regen": accept["regen"],
            "accept_original": accept["original"],
            "accept_ceiling": accept["ceiling"],
            "ratio": ratio,
            "specforge_eval_regen": ev["regen"][1],
            "specforge_eval_original": ev["original"][1],
            "specforge_eval_key": ev["regen"][0] or ev["original"][0],
            "accept_source": {n: (acc[n] or {}).get("source") for n in (*NAMES, "ceiling")},
        },
        "steps": steps.get("steps", {}),
        "config": steps.get("config"),
        "prepare": prepare,
        "train": train,
        "accept": acc,
        "designed_mtp": (designed or {}).get("mtp"),
    }


def _rows(prepare: dict[str, Any] | None, name: str) -> int | None:
    """Rows of one of prepare's files, however prepare.json nests them (``{name: {rows}}`` or
    ``{files: {name.jsonl: {rows}}}``)."""
    if not prepare:
        return None
    for holder in (prepare, prepare.get("files") or {}):
        for key in (name, f"{name}.jsonl"):
            v = holder.get(key)
            if isinstance(v, dict) and isinstance(v.get("rows"), int):
                return v["rows"]
    return None


LINE_FIELDS = (
    "trainer",
    "algo",
    "rows",
    "steps",
    "accept_regen",
    "accept_original",
    "accept_ceiling",
    "ratio",
    "specforge_eval_regen",
    "specforge_eval_original",
)


def loop_line(r: dict[str, Any]) -> str:
    h = r["headline"]
    return "loop: " + " ".join(f"{k}={fmt(h[k], 4, 'na')}" for k in LINE_FIELDS)


def markdown(r: dict[str, Any], line: str) -> str:
    h = r["headline"]
    src = h["accept_source"]
    out = [
        f"# The drafter loop (issue 36), {r['mode']}",
        "",
        "A drafter trained by SpecForge 0.2.0 (offline EAGLE3, full vocabulary) on regen's regenerated rows, "
        "against one trained with the same config, steps and seed on the same prompts' original answers, "
        "both served with the dense known-answer target (SGLang 0.5.17, 3 steps, top-k 1, 4 draft tokens, "
        "temperature 0.6, top-p 0.95, top-k 20) on regen's eval prompts.",
        "",
        "| drafter | accept length | from | SpecForge eval | predicted (train.json) |",
        "|---|---|---|---|---|",
    ]
    for n in NAMES:
        t = r["train"].get(n) or {}
        out.append(
            f"| {n} | {fmt(h[f'accept_{n}'], 4, 'na')} | {src.get(n) or 'na'} | "
            f"{fmt(h[f'specforge_eval_{n}'], 4, 'na')} "
            f"| {fmt(t.get('predicted_accept_length_3steps'), 4, 'na')} |"
        )
    ceil = r["accept"].get("ceiling") or {}
    out += [
        f"| ceiling (perfect drafter) | {fmt(h['accept_ceiling'], 4, 'na')} | {src.get('ceiling') or 'na'} "
        f"| | visit-weighted {fmt(ceil.get('visit_weighted'), 4, 'na')} |",
        "",
        f"Ratio regen / original: {fmt(h['ratio'], 4, 'na')}. "
        f"SpecForge eval key: `{h['specforge_eval_key'] or 'na'}`.",
        "",
    ]
    for n in NAMES:
        a = r["accept"].get(n) or {}
        if a.get("log"):
            out.append(
                f"{n}: server log `accept len` median {fmt(a['log'].get('median'), 4, 'na')} over "
                f"{a['log'].get('lines')} decode lines; "
                f"{fmt((a.get('meta') or {}).get('requests'), 4, 'na')} requests, "
                f"server start {fmt(a.get('server_start_s'), 4, 'na')} s, generation "
                f"{fmt(a.get('generation_s'), 4, 'na')} s."
            )
    out += ["", "| step | rc | wall s |", "|---|---|---|"]
    for name, s in r["steps"].items():
        wall = s.get("wall_s")
        out.append(f"| {name} | {fmt(s.get('rc'), 4, 'na')} | {'na' if wall is None else f'{wall:.1f}'} |")
    out += ["", "    " + line, ""]
    return "\n".join(out)


def _atomic(path: Path, text: str) -> None:
    """``text`` at ``path``, atomically and readable by whoever collects it (``regen.io.atomic_open``
    leaves the umask's mode, not mkstemp's 0600)."""
    with atomic_open(path) as fh:
        fh.write(text)


def write(root: Path, results: Path, date: str, dry: bool = False) -> str:
    """Write ``results/loop-<date>.{json,md}``; return the loop line."""
    r = collect(root, dry)
    line = loop_line(r)
    r["line"] = line
    _atomic(results / f"loop-{date}.json", json.dumps(r, indent=1) + "\n")
    _atomic(results / f"loop-{date}.md", markdown(r, line))
    return line


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", type=Path, required=True)
    p.add_argument("--results", type=Path, required=True)
    p.add_argument("--date", default=time.strftime("%Y-%m-%d"))
    p.add_argument("--dry", action="store_true", default=os.environ.get("DRY") == "1")
    a = p.parse_args(argv)
    print(write(a.root, a.results, a.date, a.dry))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
