"""Tokenized rows (``input_ids`` with ``loss_mask`` or ``labels``): decoded with the tokenizer and split
back into turns on the chat template's role markers."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regen.ingest.rows import UnreadableRow, require, type_name
from regen.types import Message

LABEL_IGNORE = -100


@dataclass(frozen=True, slots=True)
class ChatMarkers:
    """The strings that frame a turn in the rendered chat: ``{start}{role}{sep}...{end}``."""

    turn_start: str
    role_sep: str
    turn_end: str
    think_open: str | None
    think_close: str | None


CHATML_MARKERS = ChatMarkers("<|im_start|>", "\n", "<|im_end|>", "<think>", "</think>")


_PROBE_USER = "\ue000U"


_PROBE_REASONING = "\ue001R"


_PROBE_CONTENT = "\ue002C"


def markers_from_template(template: str, added_tokens: Iterable[str]) -> ChatMarkers:
    """Find the turn markers by rendering probe conversations through ``template``."""
    from regen.chat import compile_template  # jinja2's sandbox: only where tokenized rows are read

    tokens = sorted(set(added_tokens), key=len, reverse=True)
    tpl = compile_template(template)
    text = tpl.render(messages=[{"role": "user", "content": _PROBE_USER}], add_generation_prompt=False)
    head, _, tail = text.partition(_PROBE_USER)
    before_role, found_role, role_sep = head.rpartition("user")
    start = next((t for t in tokens if found_role and before_role.endswith(t)), None)
    end = next((t for t in tokens if tail.startswith(t)), None)
    if start is None or end is None or not role_sep:
        raise ValueError(
            "cannot find the turn markers: the chat template does not frame turns with added tokens"
        )
    think_open = think_close = None
    convo = [
        {"role": "user", "content": _PROBE_USER},
        {"role": "assistant", "content": _PROBE_CONTENT, "reasoning_content": _PROBE_REASONING},
    ]
    text = tpl.render(messages=convo, add_generation_prompt=False)
    if _PROBE_REASONING in text:
        before, _, after = text.partition(_PROBE_REASONING)
        opener = before.rpartition(f"assistant{role_sep}")[2].strip()
        closer = after.partition(_PROBE_CONTENT)[0].strip()
        think_open, think_close = opener or None, closer or None
    return ChatMarkers(start, role_sep, end, think_open, think_close)


class TokenizedDecoder:
    """Decodes tokenized rows with one tokenizer directory and splits them into turns."""

    def __init__(self, tokenizer_dir: str | Path) -> None:
        from tokenizers import Tokenizer

        tdir = Path(tokenizer_dir)
        tok_file = tdir / "tokenizer.json"
        if not tok_file.is_file():
            raise FileNotFoundError(f"{tok_file}: tokenizer.json not found (needed to decode tokenized rows)")
        self.tokenizer = Tokenizer.from_file(str(tok_file))
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        cfg_file = tdir / "tokenizer_config.json"
        cfg = json.loads(cfg_file.read_text(encoding="utf-8")) if cfg_file.is_file() else {}
        added = [t.content for t in self.tokenizer.get_added_tokens_decoder().values()]
        template = cfg.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
        self.markers = markers_from_template(template, added) if isinstance(template, str) else CHATML_MARKERS
        pad = cfg.get("pad_token")
        pad = pad.get("content") if isinstance(pad, dict) else pad
        pad_id = self.tokenizer.token_to_id(pad) if isinstance(pad, str) else None
        self.pad_id: int | None = pad_id

    def decode_record(self, record: dict[str, Any]) -> tuple[tuple[Message, ...], dict[str, Any]]:
        ids = _int_list(require(record, "input_ids", "tokenized"), "input_ids")
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise UnreadableRow(
                "input_ids", f"token id {bad} outside the tokenizer's vocabulary (0..{self.vocab_size - 1})"
            )
        supervised = _supervised_count(record, len(ids))
        kept = [t for t in ids if t != self.pad_id]
        text = self.tokenizer.decode(kept, skip_special_tokens=False)
        messages = split_turns(text, self.markers)
        stats = {"mask_supervised_tokens": supervised, "input_tokens": len(ids)}
        return messages, stats


def _int_list(value: Any, field_name: str) -> list[int]:
    if hasattr(value, "tolist"):  # numpy arrays from some Parquet readers
        value = value.tolist()
    if not isinstance(value, list):
        raise UnreadableRow(field_name, f"expected a list of integers, got {type_name(value)}")
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int):
            raise UnreadableRow(field_name, f"element {i} is {type_name(v)}, expected an integer")
    return value


def _supervised_count(record: dict[str, Any], n_ids: int) -> int:
    if "loss_mask" in record:
        mask = _int_list(record["loss_mask"], "loss_mask")
        if len(mask) != n_ids:
            raise UnreadableRow("loss_mask", f"has {len(mask)} entries for {n_ids} input_ids")
        if any(v not in (0, 1) for v in mask):
            raise UnreadableRow("loss_mask", "entries must be 0 or 1")
        return sum(mask)
    if "labels" in record:
        labels = _int_list(record["labels"], "labels")
        if len(labels) != n_ids:
            raise UnreadableRow("labels", f"has {len(labels)} entries for {n_ids} input_ids")
        return sum(1 for v in labels if v != LABEL_IGNORE)
    raise UnreadableRow("loss_mask", "missing: a tokenized row needs loss_mask or labels")


def split_turns(text: str, markers: ChatMarkers) -> tuple[Message, ...]:
    """Split rendered chat text back into turns; an assistant think block becomes reasoning."""
    pieces = text.split(markers.turn_start)
    if len(pieces) < 2:
        raise UnreadableRow("input_ids", f"decoded text has no {markers.turn_start!r} turn marker")
    out: list[Message] = []
    for k, piece in enumerate(pieces[1:]):
        role, sep, rest = piece.partition(markers.role_sep)
        if not sep or not role:
            raise UnreadableRow("input_ids", f"turn {k} has no role line after {markers.turn_start!r}")
        body = rest.partition(markers.turn_end)[0]
        reasoning: str | None = None
        if role == "assistant" and markers.think_open and markers.think_close:
            stripped = body.lstrip("\n")
            if stripped.startswith(markers.think_open) and markers.think_close in stripped:
                inner, _, after = stripped[len(markers.think_open) :].partition(markers.think_close)
                reasoning, body = inner.strip("\n"), after.lstrip("\n")
        out.append(Message(role=role, content=body, reasoning_content=reasoning))
    return tuple(out)


@functools.lru_cache(maxsize=4)
def _decoder_for(tokenizer_dir: str) -> TokenizedDecoder:
    return TokenizedDecoder(tokenizer_dir)


class LazyDecoder:
    """Loads the tokenizer on the first tokenized row only."""

    def __init__(self, tokenizer_dir: str | Path | None) -> None:
        self.tokenizer_dir = tokenizer_dir

    def get(self) -> TokenizedDecoder:
        if self.tokenizer_dir is None:
            raise ValueError("the dataset has tokenized rows (input_ids); set tokenizer_dir to decode them")
        return _decoder_for(str(Path(self.tokenizer_dir).resolve()))
