"""Step 1 of the drafter loop: the training rows, regen's and the original answers', in one token form.

    python -m bench.loop.prepare --run RUN --dataset DATASET --model MODEL --out DATA

Writes, each row ``{"id", "input_ids", "loss_mask"}``:

- ``regen-train.jsonl`` / ``regen-eval.jsonl``: regen's exported token ids and loss mask as they are
  (``results/export/tokenized.jsonl`` and its eval split, found through ``regen.layout``);
- ``original-train.jsonl``: the SAME train ids with DATASET's original answers (``messages`` = [user,
  assistant]), tokenized and masked by SpecForge's own preprocessing (``preprocess_conversations``) with
  the template regen's manifest names (``specforge.chat_template``, thinking mode included) and its
  ``train_only_last_turn``. One change to that template: no default system prompt, because regen's rows
  (and the eval prompts SGLang is served) have none: the prompt ids of both files then match, which is
  checked per row (``prompt_equal`` in prepare.json), so the two drafters differ only in the answers;
- ``eval-prompts.jsonl``: ``{"id", "input_ids"}``, each eval row's ids before its first supervised token
  (the prompt up to and including the assistant generation prompt, thinking on; checked against the
  tokenizer's own chat template);
- ``prepare.json``: rows, tokens, masked tokens per file; the chain states the supervised tokens visit
  where MODEL has ``chain.json`` (the known-answer target).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from regen.io import atomic_open, write_json
from regen.layout.run import RunLayout

MAX_LENGTH = 1 << 20  # no truncation: regen's export already left out rows over the trainer window


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"{path}:{n}: not JSON ({e})") from e
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """``rows`` as JSON lines at ``path``, atomically (``regen.io.atomic_open``)."""
    with atomic_open(path) as fh:
        fh.write("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))


def token_rows(path: Path) -> list[dict[str, Any]]:
    """regen's token export rows, reduced to the three fields the loop reads."""
    out = []
    for n, r in enumerate(read_jsonl(path), 1):
        ids, mask = r.get("input_ids"), r.get("loss_mask")
        if not isinstance(ids, list) or not isinstance(mask, list) or len(ids) != len(mask):
            raise SystemExit(
                f"{path}:{n} (id {r.get('id')!r}): input_ids/loss_mask missing or unequal length"
            )
        out.append({"id": r["id"], "input_ids": ids, "loss_mask": mask})
    return out


def prompt_ids(row: dict[str, Any]) -> list[int]:
    """The ids before the row's first supervised token: the prompt and the assistant generation prompt."""
    mask = row["loss_mask"]
    if 1 not in mask:
        raise SystemExit(f"row {row['id']!r}: no supervised token")
    return row["input_ids"][: mask.index(1)]


def original_rows(
    train: list[dict[str, Any]], dataset: Path, model: Path, manifest: dict[str, Any]
) -> tuple[list[dict[str, Any]], int]:
    """DATASET's original answers for ``train``'s ids through SpecForge's preprocessing; (rows, rows whose
    prompt ids equal regen's)."""
    from specforge.data.preprocessing import preprocess_conversations
    from specforge.data.template import TEMPLATE_REGISTRY
    from transformers import AutoTokenizer

    spec = manifest["specforge"]
    template = TEMPLATE_REGISTRY.get(spec["chat_template"]).model_copy(update={"system_prompt": None})
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    by_id = {r["id"]: r for r in read_jsonl(dataset)}
    out, prompt_equal = [], 0
    for row in train:
        src = by_id.get(row["id"])
        if src is None:
            raise SystemExit(f"{dataset}: no row with id {row['id']!r} (a train id of regen's export)")
        messages = src.get("messages") or []
        if [m.get("role") for m in messages][-1:] != ["assistant"]:
            raise SystemExit(
                f"{dataset}: row {row['id']!r}: messages must end with the original assistant answer"
            )
        got = preprocess_conversations(
            tokenizer,
            [messages],
            template,
            MAX_LENGTH,
            train_only_last_turn=spec["train_only_last_turn"],
            tools=[src.get("tools") or []],
        )
        orig = {
            "id": row["id"],
            "input_ids": got["input_ids"][0][0].tolist(),
            "loss_mask": got["loss_mask"][0][0].tolist(),
        }
        prompt_equal += prompt_ids(orig) == prompt_ids(row)
        out.append(orig)
    return out, prompt_equal


def eval_prompts(rows: list[dict[str, Any]], dataset: Path, model: Path) -> list[dict[str, Any]]:
    """Each eval row's prompt ids, checked against the tokenizer's chat template (thinking on)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    by_id = {r["id"]: r for r in read_jsonl(dataset)}
    out = []
    for row in rows:
        ids = prompt_ids(row)
        src = by_id.get(row["id"])
        if src is not None:
            user = [m for m in src["messages"] if m.get("role") != "assistant"]
            want = tokenizer.apply_chat_template(
                user,
                tools=src.get("tools") or None,
                add_generation_prompt=True,
                enable_thinking=True,
                tokenize=False,
            )
            want_ids = tokenizer(want, add_special_tokens=False)["input_ids"]
            if want_ids != ids:
                raise SystemExit(
                    f"eval row {row['id']!r}: the export's prompt ids differ from {model}'s chat template "
                    "(add_generation_prompt, enable_thinking): the eval prompts would not be what was served"
                )
        out.append({"id": row["id"], "input_ids": ids})
    return out


def file_stats(rows: list[dict[str, Any]], chain_tokens: set[int] | None) -> dict[str, Any]:
    stats: dict[str, Any] = {
        "rows": len(rows),
        "tokens": sum(len(r["input_ids"]) for r in rows),
        "masked_tokens": sum(sum(r["loss_mask"]) for r in rows),
    }
    if chain_tokens is not None:
        seen = {
            t
            for r in rows
            for t, m in zip(r["input_ids"], r["loss_mask"], strict=True)
            if m and t in chain_tokens
        }
        stats["chain_states_visited"] = len(seen)
        stats["chain_states"] = len(chain_tokens)
    return stats


def prepare(run: Path, dataset: Path, model: Path, out: Path) -> dict[str, Any]:
    layout = RunLayout.under(run)
    manifest = json.loads(layout.export_manifest.read_text())
    train = token_rows(layout.export_tokenized)
    evals = token_rows(layout.export_tokenized_eval)
    original, prompt_equal = original_rows(train, dataset, model, manifest)
    prompts = eval_prompts(evals, dataset, model)
    chain_path = model / "chain.json"
    chain_tokens = (
        {s["token"] for s in json.loads(chain_path.read_text())["states"]} if chain_path.exists() else None
    )
    out.mkdir(parents=True, exist_ok=True)
    files = {"regen-train": train, "regen-eval": evals, "original-train": original}
    for name, rows in files.items():
        write_jsonl(out / f"{name}.jsonl", rows)
    write_jsonl(out / "eval-prompts.jsonl", prompts)
    summary = {
        "run": str(run),
        "dataset": str(dataset),
        "model": str(model),
        "chat_template": manifest["specforge"]["chat_template"],
        "train_only_last_turn": manifest["specforge"]["train_only_last_turn"],
        "system_prompt": "none: the template's default left out, as in regen's rows and the served prompts",
        "files": {name: file_stats(rows, chain_tokens) for name, rows in files.items()},
        "eval_prompts": len(prompts),
        "prompt_equal": {"rows": prompt_equal, "of": len(original)},
    }
    write_json(out / "prepare.json", summary)
    return summary


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.loop.prepare", description=__doc__.split("\n")[0])
    p.add_argument("--run", type=Path, required=True, help="regen's run directory (results/export inside)")
    p.add_argument(
        "--dataset", type=Path, required=True, help="jsonl: id, messages=[user, assistant(original)]"
    )
    p.add_argument(
        "--model", type=Path, required=True, help="the target model dir (tokenizer, chat template)"
    )
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    summary = prepare(a.run, a.dataset, a.model, a.out)
    print(json.dumps(summary["files"]), f"prompt_equal={summary['prompt_equal']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
