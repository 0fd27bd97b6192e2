"""The serving contract: what the drafter's training data assumes of the serving setup, in the export
manifest, so a drafter is trained the way it will be served (a mismatch in thinking mode alone has cut
acceptance from 60% to 25%).

It names: the thinking mode of every row (``thinking.jsonl`` beside the exports) and the run's mix;
``preserve_thinking`` (whether earlier turns' reasoning stays in context); the system prompt a trainer adds
and to how many rows; the chat template's sha256 (the text the answers were made under and the one the
export rendered with); the reasoning parser; and the sampling each thinking mode used. All of it comes
from the settings the records carry (``regen.fingerprint``, via the dataset manifest's provenance), never
from a config edited afterwards.

:func:`trainer_settings_markdown` renders the SpecForge and speculators settings that match a manifest:
the README's trainer section is that text for the demo (``tests/support/readme_trainer_section.py`` writes it;
a test checks the README still matches).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from regen.layout.run import RUN

#: the system prompt SpecForge 0.2.0 adds to a conversation that has no system turn, per chat template
#: (``specforge/data/template.py`` ``ChatTemplate.system_prompt``, added by ``parse.GeneralParser.parse``)
SPECFORGE_DEFAULT_SYSTEM_PROMPT = {"qwen3-thinking": "You are a helpful assistant."}
#: the thinking modes, each with its sampling block
THINKING_BLOCKS = ("thinking", "non_thinking")


def sampling_by_mode(settings: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The sampling each thinking mode used (``generate.sampling`` with that mode's overrides) and the
    config block it came from."""
    base = {k: settings.get(k) for k in ("temperature", "top_p", "top_k", "max_tokens")}
    out = {}
    for mode in THINKING_BLOCKS:
        overrides = settings.get(f"sampling_{mode}") or {}
        out[mode] = {**base, **overrides, "block": mode if overrides else "sampling"}
    return out


def serving_contract(
    *,
    settings: Mapping[str, Any],
    rows_by_thinking: Mapping[str, int],
    thinking_file: str,
    export_template_sha256: str | None,
    specforge_template: str | None,
    specforge_rows_without_system: int,
) -> dict[str, Any]:
    """The manifest's ``serving`` block (``settings``: the records' settings, ``regen.fingerprint``)."""
    added = SPECFORGE_DEFAULT_SYSTEM_PROMPT.get(specforge_template or "")
    return {
        "thinking": {
            "configured": settings.get("thinking"),
            "thinking_fraction": settings.get("thinking_fraction")
            if settings.get("thinking") == "mix"
            else None,
            "rows": {"on": int(rows_by_thinking.get("on", 0)), "off": int(rows_by_thinking.get("off", 0))},
            "per_row": thinking_file,
        },
        "preserve_thinking": settings.get("preserve_thinking"),
        "regenerate": settings.get("regenerate"),
        "reasoning_parser": settings.get("reasoning_parser"),
        "chat_template_sha256": {
            "generated_with": settings.get("chat_template_sha256"),
            "exported_with": export_template_sha256,
        },
        "system_prompt": {
            "specforge_template": specforge_template,
            "specforge_adds": added,
            "specforge_rows_it_is_added_to": specforge_rows_without_system if added else None,
            "tokenized": "nothing is added: tokenized.jsonl holds the server's own ids (speculators, "
            "SpecForge's pre-tokenized path)",
        },
        "sampling": sampling_by_mode(settings),
    }


def _flag(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def trainer_settings_markdown(manifest: Mapping[str, Any]) -> str:
    """The SpecForge and speculators settings that match an export manifest, as README markdown.

    Only the contract is rendered (templates, modes, windows, file names), never counts, so the demo's
    section stays the same from run to run. SpecForge 0.2.0 takes a typed config (``specforge train -c
    run.yaml`` with dotted overrides); speculators 0.9.0 takes flags."""
    serving, sf, window = manifest["serving"], manifest["specforge"], manifest["trainer_window"]
    thinking, system = serving["thinking"], serving["system_prompt"]
    window_tokens = window["max_length"] or "<your window>"
    mode = thinking["configured"]
    if mode == "mix":
        mode = f"mix ({thinking['thinking_fraction']:.0%} of samples with thinking on)"
    if system["specforge_adds"]:
        sys_line = (
            f"SpecForge's `{system['specforge_template']}` template adds the system prompt "
            f"`{system['specforge_adds']}` to rows without one (the manifest counts them; the token export "
            "adds nothing)"
        )
    else:
        sys_line = "SpecForge's template adds no known system prompt"
    rows = thinking["rows"]
    used_modes = [m for m, key in zip(THINKING_BLOCKS, ("on", "off"), strict=True) if rows.get(key)]
    used_modes = used_modes or list(THINKING_BLOCKS)  # the modes rows were made in: what serving must match
    samp = "; ".join(
        f"{m.replace('_', '-')}: temperature {s['temperature']}, top_p {s['top_p']}, top_k {s['top_k']}"
        + (f" (`generate.sampling.{m}`)" if s["block"] != "sampling" else "")
        for m, s in ((m, serving["sampling"][m]) for m in used_modes)
    )
    preserve = serving["preserve_thinking"]
    vocab = RUN.export_vocab_dir
    lines = [
        "| | SpecForge 0.2.0 (`specforge train -c run.yaml`) | speculators 0.9.0 |",
        "|---|---|---|",
        f"| training data | `data.train_data_path: {RUN.export_specforge}` (or the token-exact "
        f"`data.prompts_path: {RUN.export_tokenized}`) | "
        f"`speculators prepare-data --data {RUN.export_tokenized} --seq-length {window_tokens}` |",
        f"| held-out eval | `{RUN.export_specforge_eval}`, `{RUN.export_tokenized_eval}` | "
        f"`prepare-data --data {RUN.export_tokenized_eval}`; train with `--train-data-ratio 1.0` "
        "(the split is regen's, by prompt) |",
        f"| chat template | `data.chat_template: {sf['chat_template']}` | none: the server's own ids |",
        f"| turns trained | `data.train_only_last_turn: {_flag(sf['train_only_last_turn'])}` | "
        "the loss mask as exported |",
        f"| sequence window | `data.max_length: {window_tokens}` | `--total-seq-len {window_tokens}` |",
        "| EAGLE3 draft vocabulary (`regen vocab --draft-vocab-size N`) | "
        f"`model.vocab_mapping_path: {vocab}/vocab_mapping-N.pt` | "
        f"`--token-freq-path {vocab}/token_freq.pt --d2t-path {vocab}/d2t-N.npy "
        f"--t2d-path {vocab}/t2d-N.npy --draft-vocab-size N` |",
        "",
        f"Serve the drafter as the data was made: thinking {mode}; `preserve_thinking` "
        f"{'not set' if preserve is None else _flag(preserve)} (SGLang `chat_template_kwargs`); reasoning "
        f"parser `{serving['reasoning_parser']}`; sampling {samp}. {sys_line}.",
    ]
    return "\n".join(lines) + "\n"
