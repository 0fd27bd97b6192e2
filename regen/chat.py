"""Chat-template rendering and token accounting (what a trainer's loss mask sums over).

``ChatTemplate`` pairs a ``tokenizers.Tokenizer`` with the model's jinja ``chat_template``
(HF-compatible environment, compiled once). Token accounting works on the *rendered*
conversation, encoded once per sample:

* the **supervised** tokens of an assistant turn are the tokens from just after the
  assistant header (``<|im_start|>assistant\\n`` for Qwen3, derived from the template's
  generation prompt) through the turn's end-of-turn token (the tokenizer's ``eos_token``,
  ``<|im_end|>``), mapped from characters to tokens with the encoding's offsets the way
  HF's assistant-token mask does;
* the **prompt** tokens are the conversation up to the last assistant turn plus the
  generation prompt (the whole conversation plus the generation prompt when there is no
  assistant turn);
* a turn is **scaffolding only** when every supervised token is template scaffolding:
  the think tags, the end-of-turn token or whitespace (an empty think block
  ``<think>\\n\\n</think>\\n\\n`` plus end-of-turn, or nothing but end-of-turn).

When the template is the known Qwen3 one, a Python renderer reproduces it exactly (it is
enabled only after matching jinja on a probe battery when the template is loaded) and the
audit renders with it; anything else renders through jinja.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import orjson
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Encoding, Tokenizer

from regen.types import DEVELOPER_ROLE, Message, prompt_end

ChatDict = dict[str, Any]
Conversation = Sequence[Message] | Sequence[Mapping[str, Any]]

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
DEFAULT_END_OF_TURN = "<|im_end|>"


class ChatTemplateError(ValueError):
    """The template cannot be loaded or fails to render a conversation."""


# --------------------------------------------------------------------------------------
# Message conversion
# --------------------------------------------------------------------------------------


def content_as_text(content: Any) -> str:
    """Text content as is; anything else (lists of parts, numbers, null) as its JSON string."""
    if isinstance(content, str):
        return content
    return orjson.dumps(content, option=orjson.OPT_SORT_KEYS).decode()


TOOL_FIELDS: tuple[str, ...] = ("tool_calls", "tool_call_id", "name")


def to_template_dicts(messages: Conversation) -> list[ChatDict]:
    """Plain dicts for the template; non-text content becomes its JSON string so rendering never fails.

    ``tool_calls``, ``tool_call_id`` and ``name`` are passed on when set (templates render them).
    """
    out: list[ChatDict] = []
    for m in messages:
        if isinstance(m, Message):
            role, content, reasoning = m.role, m.content, m.reasoning_content
            tool_fields = (m.tool_calls, m.tool_call_id, m.name)
        else:
            role, content, reasoning = m.get("role"), m.get("content"), m.get("reasoning_content")
            tool_fields = tuple(m.get(key) for key in TOOL_FIELDS)
        d: ChatDict = {
            "role": role if isinstance(role, str) else str(role),
            "content": content_as_text(content),
        }
        if isinstance(reasoning, str):
            d["reasoning_content"] = reasoning
        if tool_fields != (None, None, None):
            for key, value in zip(TOOL_FIELDS, tool_fields, strict=True):
                if value is not None:
                    d[key] = list(value) if key == "tool_calls" else value
        out.append(d)
    return out


def _needs_jinja(messages: Sequence[ChatDict], tools: Sequence[Any] | None) -> bool:
    """Tools and tool calls are rendered by the model's own template only (the fast renderer has neither)."""
    return bool(tools) or any("tool_calls" in m for m in messages)


# --------------------------------------------------------------------------------------
# Qwen3 fast renderer (verified against jinja at load time)
# --------------------------------------------------------------------------------------


def render_qwen3(messages: Sequence[ChatDict], add_generation_prompt: bool, enable_thinking: bool) -> str:
    """The Qwen3 chat template (no ``tools``, no ``tool_calls``) in plain Python."""
    n = len(messages)
    parts: list[str] = []
    if n and messages[0]["role"] == "system":
        parts.append("<|im_start|>system\n" + messages[0]["content"] + "<|im_end|>\n")
    last_query = n - 1
    for i in range(n - 1, -1, -1):
        m = messages[i]
        c = m["content"]
        if m["role"] == "user" and not (c.startswith("<tool_response>") and c.endswith("</tool_response>")):
            last_query = i
            break
    for i, m in enumerate(messages):
        role = m["role"]
        content = m["content"]
        if role == "user" or (role == "system" and i != 0):
            parts.append("<|im_start|>" + role + "\n" + content + "<|im_end|>\n")
        elif role == "assistant":
            reasoning = m.get("reasoning_content")
            if not isinstance(reasoning, str):
                reasoning = ""
                if THINK_CLOSE in content:
                    reasoning = content.split(THINK_CLOSE)[0].rstrip("\n").split(THINK_OPEN)[-1].lstrip("\n")
                    content = content.split(THINK_CLOSE)[-1].lstrip("\n")
            if i > last_query and (i == n - 1 or reasoning):
                parts.append(
                    "<|im_start|>assistant\n<think>\n"
                    + reasoning.strip("\n")
                    + "\n</think>\n\n"
                    + content.lstrip("\n")
                )
            else:
                parts.append("<|im_start|>assistant\n" + content)
            parts.append("<|im_end|>\n")
        elif role == "tool":
            if i == 0 or messages[i - 1]["role"] != "tool":
                parts.append("<|im_start|>user")
            parts.append("\n<tool_response>\n" + content + "\n</tool_response>")
            if i == n - 1 or messages[i + 1]["role"] != "tool":
                parts.append("<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
        if enable_thinking is False:
            parts.append("<think>\n\n</think>\n\n")
    return "".join(parts)


def _probe_conversations() -> list[list[ChatDict]]:
    """Conversations that exercise every branch the fast renderer implements."""
    u, a, s, t = "user", "assistant", "system", "tool"
    return [
        [{"role": u, "content": "Hi"}],
        [{"role": s, "content": "Be brief."}, {"role": u, "content": "Hi"}, {"role": a, "content": "Hello"}],
        [{"role": u, "content": "Q"}, {"role": a, "content": "A", "reasoning_content": "\nthink\n"}],
        [{"role": u, "content": "Q"}, {"role": a, "content": "<think>\nr\n</think>\n\nA"}],
        [{"role": u, "content": "Q"}, {"role": a, "content": ""}],
        [{"role": u, "content": "Q"}, {"role": a, "content": "\n\nA"}, {"role": u, "content": "Q2"}],
        [
            {"role": s, "content": "S"},
            {"role": u, "content": "Q1"},
            {"role": a, "content": "A1", "reasoning_content": "r1"},
            {"role": u, "content": "Q2"},
            {"role": a, "content": "A2", "reasoning_content": "r2"},
        ],
        [
            {"role": u, "content": "Q"},
            {"role": a, "content": "call", "reasoning_content": "r"},
            {"role": t, "content": "res1"},
            {"role": t, "content": "res2"},
            {"role": a, "content": "done"},
        ],
        [{"role": u, "content": "Q"}, {"role": a, "content": "x"}, {"role": t, "content": "y"}],
        [{"role": u, "content": "<tool_response>x</tool_response>"}, {"role": a, "content": "A"}],
        [{"role": u, "content": "Q"}, {"role": s, "content": "late"}, {"role": "narrator", "content": "?"}],
        [{"role": a, "content": "first"}, {"role": u, "content": "Q"}],
        [{"role": u, "content": "Q"}, {"role": a, "content": "A1"}, {"role": a, "content": "A2"}],
    ]


def _fast_renderer_for(
    jinja_render: Callable[[Sequence[ChatDict], bool, bool], str],
) -> Callable[[Sequence[ChatDict], bool, bool], str] | None:
    """The Qwen3 fast renderer if it reproduces ``jinja_render`` on every probe, else None."""
    for conv in _probe_conversations():
        for add_gen in (False, True):
            for thinking in (True, False):
                try:
                    if render_qwen3(conv, add_gen, thinking) != jinja_render(conv, add_gen, thinking):
                        return None
                except Exception:
                    return None
    return render_qwen3


# --------------------------------------------------------------------------------------
# Jinja environment (HF-compatible)
# --------------------------------------------------------------------------------------


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def hf_template_env() -> ImmutableSandboxedEnvironment:
    """A jinja2 environment like the one ``transformers`` renders chat templates in
    (sandboxed, trim/lstrip blocks, loop controls, ``tojson`` and ``raise_exception``)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env


def compile_template(source: str) -> jinja2.Template:
    """Compile a chat template the way ``transformers`` does."""
    return hf_template_env().from_string(source)


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


# --------------------------------------------------------------------------------------
# Token accounting results
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TurnSpan:
    """One assistant turn in the rendered text: ``[start, end)`` characters that are supervised."""

    start: int
    end: int


@dataclass(frozen=True, slots=True)
class TokenAccount:
    """Token accounting of one conversation under the chat template.

    ``assistant_turns`` counts assistant turns found in the rendered text; ``scaffolding_turns``
    says, per assistant turn in order, whether it is scaffolding only; ``scaffolding_only`` is True
    when there is at least one assistant turn and every one of them is scaffolding only.
    """

    supervised_tokens: int
    prompt_tokens: int
    total_tokens: int
    assistant_turns: int
    scaffolding_turns: tuple[bool, ...]

    @property
    def scaffolding_only(self) -> bool:
        return bool(self.scaffolding_turns) and all(self.scaffolding_turns)


@dataclass(frozen=True, slots=True)
class _Rendered:
    text: str
    spans: tuple[TurnSpan, ...]
    last_header_start: int  # -1 when no assistant turn ends the conversation (the prompt is all of it)


# --------------------------------------------------------------------------------------
# ChatTemplate
# --------------------------------------------------------------------------------------


class ChatTemplate:
    """A tokenizer plus its chat template; renders conversations and counts supervised tokens."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        template_source: str,
        special_tokens: Mapping[str, str],
        name: str = "<template>",
    ) -> None:
        self.name = name
        self.tokenizer = tokenizer
        self.template_source = template_source
        self._special_tokens = dict(special_tokens)
        self._template = compile_template(template_source)
        self._fast = _fast_renderer_for(self._render_jinja)
        self.end_of_turn = special_tokens.get("eos_token") or DEFAULT_END_OF_TURN
        probe = [{"role": "user", "content": "x"}]
        with_prompt = self._render_jinja(probe, True, True)
        without = self._render_jinja(probe, False, True)
        if not with_prompt.startswith(without) or len(with_prompt) == len(without):
            raise ChatTemplateError(
                f"{name}: the chat template adds no generation prompt; cannot find the header"
            )
        self.assistant_header = with_prompt[len(without) :]
        self.header_tokens = len(tokenizer.encode(self.assistant_header, add_special_tokens=False))
        self._scaffold_ids = self._scaffolding_token_ids()
        self.turn_start = self._turn_start_marker()
        self._start_id = tokenizer.token_to_id(self.turn_start) if self.turn_start else None
        self._end_id = tokenizer.token_to_id(self.end_of_turn)
        self._ids_path = self._header_splits_cleanly()

    # ---------------------------------------------------------------- construction

    @classmethod
    def from_dir(cls, directory: str | Path) -> ChatTemplate:
        """Load ``tokenizer.json`` and ``tokenizer_config.json``'s ``chat_template`` from ``directory``."""
        return _load_cached(str(Path(directory).resolve()))

    def _scaffolding_token_ids(self) -> frozenset[int]:
        """Token ids that are template scaffolding: think tags, end-of-turn, whitespace-only tokens."""
        ids: set[int] = set()
        for marker in (THINK_OPEN, THINK_CLOSE, self.end_of_turn):
            tid = self.tokenizer.token_to_id(marker)
            if tid is not None:
                ids.add(tid)
        size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        decoded = self.tokenizer.decode_batch([[i] for i in range(size)], skip_special_tokens=False)
        ids.update(i for i, text in enumerate(decoded) if text and text.isspace())
        return frozenset(ids)

    def _turn_start_marker(self) -> str | None:
        """The added token the assistant header starts with (``<|im_start|>``), if any."""
        added = sorted(
            (t.content for t in self.tokenizer.get_added_tokens_decoder().values()), key=len, reverse=True
        )
        return next((t for t in added if self.assistant_header.startswith(t)), None)

    def _header_splits_cleanly(self) -> bool:
        """True when header tokens never merge with the answer's first token (so ids alone locate turns).

        Checked on answers starting with the usual character classes; answers starting with
        whitespace are routed to the offsets path per sample.
        """
        if self._start_id is None or self._end_id is None:
            return False
        enc = self.tokenizer.encode
        header = enc(self.assistant_header, add_special_tokens=False).ids
        for first in (
            "Hello",
            "1 2",
            "!?",
            "<think>\n",
            '"q"',
            "-x",
            "\u00e9t\u00e9",
            "\u4e2d\u6587",
            "(a)",
            "'s",
        ):
            whole = enc(self.assistant_header + first, add_special_tokens=False).ids
            if whole != header + enc(first, add_special_tokens=False).ids:
                return False
        return True

    @property
    def uses_fast_renderer(self) -> bool:
        """True when the template is the known Qwen3 one and renders through Python."""
        return self._fast is not None

    # ---------------------------------------------------------------- rendering

    def _render_jinja(
        self,
        messages: Sequence[ChatDict],
        add_generation_prompt: bool,
        enable_thinking: bool,
        tools: Sequence[Any] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        extra = {"tools": list(tools)} if tools else {}
        try:
            return self._template.render(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                enable_thinking=enable_thinking,
                **extra,
                **(template_kwargs or {}),
                **self._special_tokens,
            )
        except jinja2.exceptions.TemplateError as exc:
            raise ChatTemplateError(f"{self.name}: chat template failed: {exc}") from exc

    def render_dicts(
        self,
        messages: Sequence[ChatDict],
        add_generation_prompt: bool = False,
        enable_thinking: bool = True,
        use_jinja: bool = False,
        tools: Sequence[Any] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """Render plain message dicts (as made by ``to_template_dicts``), with the row's ``tools`` if any
        and further chat-template variables (``template_kwargs``, e.g. ``preserve_thinking``: the template
        itself then renders, as SGLang does with ``chat_template_kwargs``)."""
        fast_ok = not use_jinja and not template_kwargs and not _needs_jinja(messages, tools)
        if self._fast is not None and fast_ok:
            return self._fast(messages, add_generation_prompt, enable_thinking)
        return self._render_jinja(messages, add_generation_prompt, enable_thinking, tools, template_kwargs)

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The most characters one token can stand for (the longest vocabulary entry, byte-level
        entries counting one character per byte): ``chars / max_token_chars`` tokens at least."""
        return max(1, max(map(len, self.tokenizer.get_vocab(with_added_tokens=True)), default=1))

    @functools.cached_property
    def developer_role(self) -> str:
        """The role a ``developer`` turn is given: ``developer`` when the template renders that role, else
        ``system`` (OpenAI's meaning; templates without a developer branch would drop the turn)."""
        probe = "\ue010D"
        try:
            text = self._render_jinja(
                [{"role": DEVELOPER_ROLE, "content": probe}, {"role": "user", "content": "x"}], False, True
            )
        except ChatTemplateError:
            return "system"
        return DEVELOPER_ROLE if probe in text else "system"

    def render(
        self,
        messages: Conversation,
        add_generation_prompt: bool = False,
        enable_thinking: bool = True,
        use_jinja: bool = False,
    ) -> str:
        """Render a conversation (``Message``s or dicts) to the text the model sees."""
        return self.render_dicts(
            to_template_dicts(messages), add_generation_prompt, enable_thinking, use_jinja
        )

    def _render_with_spans(
        self, messages: Sequence[ChatDict], use_jinja: bool = False, tools: Sequence[Any] | None = None
    ) -> _Rendered:
        text = self.render_dicts(messages, False, True, use_jinja, tools)
        header, eot = self.assistant_header, self.end_of_turn
        spans: list[TurnSpan] = []
        last = -1
        pos = text.find(header)
        while pos >= 0:
            start = pos + len(header)
            end = text.find(eot, start)
            end = len(text) if end < 0 else end + len(eot)
            spans.append(TurnSpan(start, end))
            last = pos
            pos = text.find(header, end)
        if messages and messages[-1]["role"] != "assistant":
            last = (
                -1
            )  # a conversation ending with a user/tool turn is answered whole: no turn is the prompt's end
        return _Rendered(text, tuple(spans), last)

    # ---------------------------------------------------------------- accounting

    def _account_from_ids(self, rendered: _Rendered, enc: Encoding) -> TokenAccount | None:
        """Accounting from token ids alone (no offsets); None when this sample needs the offsets path."""
        ids = enc.ids
        n_tokens = len(ids)
        spans = rendered.spans
        if not spans:
            return TokenAccount(0, n_tokens + self.header_tokens, n_tokens, 0, ())
        text, marker, start_id, end_id = rendered.text, self.turn_start, self._start_id, self._end_id
        if text.count(marker) != ids.count(start_id):  # type: ignore[arg-type]
            return None
        header_len = len(self.assistant_header)
        supervised = 0
        scaffolding: list[bool] = []
        tok = -1  # token index of the last turn-start marker found
        seen = 0  # turn-start markers before it in the text
        for span in spans:
            if text[span.start : span.start + 1].isspace():
                return None
            k = text.count(marker, 0, span.start - header_len)
            while seen <= k:
                tok = ids.index(start_id, tok + 1)  # type: ignore[arg-type]
                seen += 1
            first = tok + self.header_tokens
            try:
                last = ids.index(end_id, first) + 1  # type: ignore[arg-type]
            except ValueError:
                last = n_tokens
            supervised += last - first
            scaffolding.append(self._scaffold_ids.issuperset(ids[first:last]))
        prompt = tok if rendered.last_header_start >= 0 else n_tokens
        return TokenAccount(supervised, prompt + self.header_tokens, n_tokens, len(spans), tuple(scaffolding))

    def _account(self, rendered: _Rendered, enc: Encoding) -> TokenAccount:
        n_tokens = len(enc)
        supervised = 0
        scaffolding: list[bool] = []
        ids = enc.ids if rendered.spans else []
        for span in rendered.spans:
            first, last = self._span_tokens(enc, span, n_tokens)
            supervised += last - first
            scaffolding.append(self._scaffold_ids.issuperset(ids[first:last]))
        if rendered.last_header_start >= 0:
            prefix = enc.char_to_token(rendered.last_header_start)
            prompt = (n_tokens if prefix is None else prefix) + self.header_tokens
        else:
            prompt = n_tokens + self.header_tokens
        return TokenAccount(supervised, prompt, n_tokens, len(rendered.spans), tuple(scaffolding))

    @staticmethod
    def _span_tokens(enc: Encoding, span: TurnSpan, n_tokens: int) -> tuple[int, int]:
        """Token index range ``[first, last)`` covering the characters of ``span``."""
        if span.end <= span.start:
            return 0, 0
        first = enc.char_to_token(span.start)
        last = enc.char_to_token(span.end - 1)
        if first is None or last is None:  # characters that map to no token (should not happen)
            return 0, 0
        return first, last + 1

    def render_batch(
        self,
        conversations: Sequence[Sequence[ChatDict]],
        tools: Sequence[Sequence[Any] | None] | None = None,
    ) -> list[_Rendered]:
        """Step 1 of batch accounting: render each conversation (with its tools), find its assistant turns."""
        if tools is None:
            return [self._render_with_spans(c) for c in conversations]
        return [self._render_with_spans(c, tools=t) for c, t in zip(conversations, tools, strict=True)]

    def encode_rendered(self, rendered: Sequence[_Rendered]) -> list[Encoding]:
        """Step 2: one batch encode (releases the GIL, so it can run in a worker thread)."""
        texts = [r.text for r in rendered]
        if self._ids_path:  # ids only, no offsets: faster
            return self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        return self.tokenizer.encode_batch(texts, add_special_tokens=False)

    def account_encoded(
        self, rendered: Sequence[_Rendered], encodings: Sequence[Encoding]
    ) -> list[TokenAccount]:
        """Step 3: token accounting from the encodings of ``encode_rendered``."""
        if not self._ids_path:
            return [self._account(r, e) for r, e in zip(rendered, encodings, strict=True)]
        out: list[TokenAccount] = []
        for r, e in zip(rendered, encodings, strict=True):
            acc = self._account_from_ids(r, e)
            if acc is None:  # the rare sample that needs offsets is encoded again
                acc = self._account(r, self.tokenizer.encode(r.text, add_special_tokens=False))
            out.append(acc)
        return out

    def account_batch_dicts(self, conversations: Sequence[Sequence[ChatDict]]) -> list[TokenAccount]:
        """Token accounting for many conversations with one batch encode."""
        rendered = self.render_batch(conversations)
        return self.account_encoded(rendered, self.encode_rendered(rendered))

    def account_batch_offsets(self, conversations: Sequence[Sequence[ChatDict]]) -> list[TokenAccount]:
        """``account_batch_dicts`` always through character offsets (the reference for the ids path)."""
        rendered = [self._render_with_spans(c) for c in conversations]
        encodings = self.tokenizer.encode_batch([r.text for r in rendered], add_special_tokens=False)
        return [self._account(r, e) for r, e in zip(rendered, encodings, strict=True)]

    def account_batch(self, conversations: Iterable[Conversation]) -> list[TokenAccount]:
        """``account_batch_dicts`` for ``Message`` sequences or dicts."""
        return self.account_batch_dicts([to_template_dicts(c) for c in conversations])

    def account(self, messages: Conversation) -> TokenAccount:
        """Token accounting of one conversation."""
        return self.account_batch([messages])[0]

    def supervised_spans(self, messages: Conversation) -> list[tuple[int, int]]:
        """Token index ranges ``[first, last)`` that a trainer's loss mask covers, one per assistant turn."""
        rendered = self._render_with_spans(to_template_dicts(messages))
        enc = self.tokenizer.encode(rendered.text, add_special_tokens=False)
        return [self._span_tokens(enc, s, len(enc)) for s in rendered.spans]

    def supervised_token_count(self, messages: Conversation) -> int:
        """Tokens a trainer's loss mask sums over (all assistant turns, thinking and end-of-turn included)."""
        return self.account(messages).supervised_tokens

    def supervised_token_counts(self, conversations: Iterable[Conversation]) -> list[int]:
        """Batch ``supervised_token_count``."""
        return [a.supervised_tokens for a in self.account_batch(conversations)]

    def is_scaffolding_only(self, messages: Conversation | Message | Mapping[str, Any]) -> bool:
        """True when every assistant turn's supervised tokens are only template scaffolding.

        Accepts a conversation, or a single assistant message (judged as the answer to a one-word prompt).
        A conversation without any assistant turn is not scaffolding only (there is no answer to judge).
        """
        return self.is_scaffolding_only_batch([messages])[0]

    def is_scaffolding_only_batch(
        self, items: Iterable[Conversation | Message | Mapping[str, Any]]
    ) -> list[bool]:
        """Batch ``is_scaffolding_only``."""
        convs: list[Conversation] = []
        for item in items:
            if isinstance(item, Message | Mapping):
                convs.append([{"role": "user", "content": "?"}, item])  # type: ignore[list-item]
            else:
                convs.append(item)
        return [a.scaffolding_only for a in self.account_batch(convs)]

    def prompt_messages(self, messages: Conversation) -> list[ChatDict]:
        """The prompt: the conversation before a final assistant turn (all of it when it ends otherwise)."""
        dicts = to_template_dicts(messages)
        return dicts[: prompt_end([d["role"] for d in dicts])]

    def prompt_token_count(self, messages: Conversation, enable_thinking: bool = True) -> int:
        """Tokens before the last assistant turn plus the generation prompt (rendered exactly)."""
        text = self.render_dicts(self.prompt_messages(messages), True, enable_thinking)
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_token_counts(
        self, conversations: Iterable[Conversation], enable_thinking: bool = True
    ) -> list[int]:
        """Batch ``prompt_token_count``."""
        texts = [self.render_dicts(self.prompt_messages(c), True, enable_thinking) for c in conversations]
        return [len(e) for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def encode_with_loss_mask(self, messages: Conversation) -> tuple[list[int], list[int]]:
        """Token ids of the rendered conversation and a 0/1 mask, 1 on assistant turns (thinking included)."""
        return self.encode_with_loss_mask_batch([messages])[0]

    def encode_with_loss_mask_batch(
        self, conversations: Iterable[Conversation]
    ) -> list[tuple[list[int], list[int]]]:
        """Batch ``encode_with_loss_mask``."""
        rendered = [self._render_with_spans(to_template_dicts(c)) for c in conversations]
        encodings = self.tokenizer.encode_batch([r.text for r in rendered], add_special_tokens=False)
        out: list[tuple[list[int], list[int]]] = []
        for r, enc in zip(rendered, encodings, strict=True):
            n = len(enc)
            mask = [0] * n
            for span in r.spans:
                first, last = self._span_tokens(enc, span, n)
                mask[first:last] = [1] * (last - first)
            out.append((enc.ids, mask))
        return out


@functools.lru_cache(maxsize=8)
def _load_cached(directory: str) -> ChatTemplate:
    path = Path(directory)
    tok_file, cfg_file = path / "tokenizer.json", path / "tokenizer_config.json"
    for f in (tok_file, cfg_file):
        if not f.is_file():
            raise ChatTemplateError(
                f"{directory}: missing {f.name} (need tokenizer.json and tokenizer_config.json)"
            )
    cfg = orjson.loads(cfg_file.read_bytes())
    source = cfg.get("chat_template")
    if isinstance(source, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, Mapping)}
        source = named.get("default")
    if not isinstance(source, str):
        template_file = path / "chat_template.jinja"
        if template_file.is_file():
            source = template_file.read_text()
        else:
            raise ChatTemplateError(
                f"{cfg_file}: field 'chat_template': missing (no chat_template.jinja either)"
            )
    specials = {
        key: text
        for key in ("bos_token", "eos_token", "pad_token", "unk_token")
        if (text := _token_text(cfg.get(key))) is not None
    }
    return ChatTemplate(Tokenizer.from_file(str(tok_file)), source, specials, name=directory)
