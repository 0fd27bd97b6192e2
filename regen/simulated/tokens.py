"""The simulated model: synthetic completions in words, and in tokens with the target's tokenizer and chat
template (``TokenModel``), as SGLang reports them."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, replace
from typing import Any

import orjson

from regen.simulated.completion import Ask, Completion
from regen.simulated.options import SimOptions
from regen.simulated.parsers import (
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_CALL_OPEN,
    parse_qwen3_reasoning,
    tool_call_text,
)

QWEN_IM_END_ID = 151645  # <|im_end|>: what matched_stop reports for a natural stop on Qwen3


def _make_words() -> tuple[str, ...]:
    rng = random.Random(20240531)
    onsets = [
        "b",
        "c",
        "d",
        "f",
        "g",
        "h",
        "k",
        "l",
        "m",
        "n",
        "p",
        "r",
        "s",
        "t",
        "v",
        "w",
        "z",
        "br",
        "tr",
        "st",
        "pl",
        "gr",
    ]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou", "ea"]
    words = {
        "".join(rng.choice(onsets) + rng.choice(vowels) for _ in range(rng.randint(1, 3))) for _ in range(600)
    }
    return tuple(sorted(words))[:512]


WORDS: tuple[str, ...] = _make_words()


def synth_completion(ask: Ask, opts: SimOptions, index: int = 0) -> Completion:
    """Deterministic synthetic completion for (messages, seed, index)."""
    max_tokens, thinking, ignore_eos = ask.max_tokens, ask.thinking, ask.ignore_eos
    key = orjson.dumps(ask.messages) + repr((None if ask.temperature == 0 else ask.seed, index)).encode()
    rng = random.Random(hashlib.blake2b(key, digest_size=8).digest())
    r_len = rng.randint(1, 2 * opts.mean_reasoning_tokens) if thinking else 0
    a_len = rng.randint(1, 2 * opts.mean_answer_tokens)
    if rng.random() < opts.long_fraction:
        a_len *= opts.long_factor
    want = max_tokens if ignore_eos else r_len + a_len
    finish = "length" if ignore_eos or want > max_tokens else "stop"
    total = min(want, max_tokens)
    r_used = min(r_len, total)
    reasoning = " ".join(rng.choices(WORDS, k=r_used)) if thinking else None
    # a budget spent inside the think block leaves no answer (unclosed <think>)
    content = " ".join(rng.choices(WORDS, k=total - r_used)) if r_used == r_len else ""
    return Completion(reasoning, content, r_used, total, finish)


def with_tool_calls(made: Completion, calls: list[dict[str, Any]]) -> Completion:
    """A stopped completion that ends in ``calls``: SGLang's tool-call parser takes them out of the text,
    reports them as ``message.tool_calls`` and turns finish_reason ``stop`` into ``tool_calls``."""
    return replace(made, tool_calls=tuple(calls), finish_reason="tool_calls")


@dataclass(frozen=True, slots=True)
class TokenCompletion:
    """A completion made in tokens: what SGLang's chat endpoint reports for one choice."""

    completion: Completion
    ids: list[int]
    matched_stop: int | None


class TokenModel:
    """The simulated model's token side: the target tokenizer and chat template (``regen.chat``)."""

    def __init__(self, tokenizer_path: str) -> None:
        from regen.chat import ChatTemplate  # only in token mode

        self.template = ChatTemplate.from_dir(tokenizer_path)
        tok = self.template.tokenizer
        self.tokenizer = tok
        self.eos_id = tok.token_to_id(self.template.end_of_turn)
        self.think_close_id = tok.token_to_id(THINK_CLOSE)
        self._word_tokens: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def prompt_ids(
        self, messages: list[Any], thinking: bool, template_kwargs: dict[str, Any] | None = None
    ) -> list[int]:
        """The prompt as SGLang tokenizes it: the chat template with the generation prompt and the
        request's other ``chat_template_kwargs`` (e.g. ``preserve_thinking``)."""
        if not template_kwargs:
            text = self.template.render(messages, add_generation_prompt=True, enable_thinking=thinking)
        else:
            from regen.chat import to_template_dicts  # only in token mode

            dicts = to_template_dicts(messages)
            text = self.template.render_dicts(dicts, True, thinking, template_kwargs=template_kwargs)
        return self.encode(text)

    def complete(
        self, made: Completion, thinking: bool, max_tokens: int, ignore_eos: bool, noncanonical: bool
    ) -> TokenCompletion:
        """Turn a synthetic completion into the model's raw tokens and SGLang's parsed view of them."""
        calls = made.tool_calls
        if calls:  # the model stops after its calls: the text ends with them, then the end of turn
            made = replace(made, finish_reason="stop", tool_calls=None)
        made = replace(
            made,
            reasoning=(
                self._fit(made.reasoning, made.reasoning_tokens)
                if made.reasoning is not None and (made.content or made.finish_reason == "stop")
                else made.reasoning
            ),
            content=(  # a cut answer keeps a word per token, so its tokens still reach max_tokens
                self._fit(made.content, made.completion_tokens - made.reasoning_tokens)
                if made.finish_reason == "stop"
                else made.content
            ),
        )
        raw = made.content
        if made.reasoning is not None:
            raw = f"{THINK_OPEN}\n{made.reasoning}"
            if made.content or made.finish_reason == "stop":  # a budget spent inside the think block
                raw += f"\n{THINK_CLOSE}\n\n{made.content}"
        if calls:
            raw += ("\n" if made.content else "") + tool_call_text(calls)
        ids = self.encode(raw)
        if noncanonical:
            ids = self._split_one_token(ids)
        stopped = made.finish_reason == "stop" and not ignore_eos
        if stopped:
            ids.append(self.eos_id)
        if len(ids) > max_tokens:
            ids, stopped = ids[:max_tokens], False
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        reasoning, content = parse_qwen3_reasoning(text, thinking)
        if reasoning is None:
            reasoning_tokens = 0
        elif self.think_close_id in ids:
            reasoning_tokens = ids.index(self.think_close_id) + 1
        else:
            reasoning_tokens = len(ids)
        finish = "stop" if stopped else "length"
        if calls and stopped:  # parsed out of the text (a call cut by max_tokens stays text, unparsed)
            content = content.split(TOOL_CALL_OPEN, 1)[0].strip()
            completion = Completion(reasoning, content, reasoning_tokens, len(ids), "tool_calls", calls)
            return TokenCompletion(completion, ids, None)
        completion = Completion(reasoning, content, reasoning_tokens, len(ids), finish)
        return TokenCompletion(completion, ids, self.eos_id if stopped else None)

    def _fit(self, words: str, n_tokens: int) -> str:
        """The leading words of ``words`` whose tokens fit in ``n_tokens`` (at least one word): the
        synthetic lengths are drawn in tokens, the text in words."""
        if not words:
            return words
        kept: list[str] = []
        used = 0
        for w in words.split(" "):
            cost = self._word_tokens.get(w)
            if cost is None:
                cost = self._word_tokens[w] = len(self.encode(" " + w))
            if kept and used + cost > n_tokens:
                break
            kept.append(w)
            used += cost
        return " ".join(kept)

    def _split_one_token(self, ids: list[int]) -> list[int]:
        """Emit the longest plain token as two (its first character, then the rest)."""
        best, best_len = -1, 1
        for i, tid in enumerate(ids):
            piece = self.tokenizer.decode([tid], skip_special_tokens=False)
            if len(piece) > best_len and piece.isalpha():
                best, best_len = i, len(piece)
        if best < 0:
            return ids
        piece = self.tokenizer.decode([ids[best]], skip_special_tokens=False)
        return ids[:best] + self.encode(piece[:1]) + self.encode(piece[1:]) + ids[best + 1 :]
