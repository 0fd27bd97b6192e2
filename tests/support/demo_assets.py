"""Demo assets: a small Qwen3-style tokenizer and a demo dataset full of known faults.

Both are generated from fixed seeds with no downloads, so the same call gives
byte-identical files. ``python tests/support/demo_assets.py tokenizer [OUT_DIR]`` (default
``resources/demo-tokenizer``) and ``python tests/support/demo_assets.py dataset [OUT_DIR]`` (default
``data/demo``) write them: test support that builds the demo's committed assets, not a product command
(``tests/ingest/test_dataset.py`` checks that a rebuild matches what is shipped).
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from regen.io import atomic_open, atomic_path, write_json
from regen.types import Message

# --------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------

DEMO_VOCAB_SIZE = 4096
DEMO_MODEL_MAX_LENGTH = 32768
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

# (content, special): Qwen3 marks the chat markers special and the think tags as
# plain added tokens (atomic, but kept by decode(skip_special_tokens=True)).
DEMO_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    (ENDOFTEXT, True),
    (IM_START, True),
    (IM_END, True),
    (THINK_OPEN, False),
    (THINK_CLOSE, False),
)

# The pre-tokenizer split pattern used by Qwen2/Qwen3 tokenizers.
QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The Qwen3 chat template (Qwen/Qwen3-* tokenizer_config.json, the revision that
# tolerates non-string content), kept verbatim including its tool branches.
QWEN3_CHAT_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n\
You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments \
within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": \
<args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and \
not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = \
content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + \
'\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""

# --------------------------------------------------------------------------------------
# Word lists shared by the tokenizer corpus and the demo dataset
# --------------------------------------------------------------------------------------

TOPICS: tuple[str, ...] = (
    "photosynthesis",
    "binary search",
    "the water cycle",
    "compound interest",
    "plate tectonics",
    "recursion",
    "the French Revolution",
    "supply and demand",
    "vaccines",
    "black holes",
    "hash tables",
    "climate change",
    "the immune system",
    "prime numbers",
    "electric circuits",
    "the Roman Empire",
    "machine learning",
    "sorting algorithms",
    "volcanoes",
    "inflation",
    "DNA replication",
    "the theory of relativity",
    "sourdough bread",
    "garbage collection",
    "ocean currents",
    "the printing press",
    "gradient descent",
    "bird migration",
    "tides",
    "public key cryptography",
    "the stock market",
    "neural networks",
    "coral reefs",
    "gravity",
)
ASKS: tuple[str, ...] = (
    "Can you explain {t} in simple terms?",
    "What is the most important thing to know about {t}?",
    "How would you teach {t} to a curious twelve year old?",
    "Give me three surprising facts about {t}.",
    "Why does {t} matter in everyday life?",
    "Summarize {t} in a short paragraph.",
    "What are common misconceptions about {t}?",
    "Compare {t} with {u} and list the main differences.",
    "Write a short study plan for learning {t} in {n} days.",
    "I keep confusing {t} and {u}. Which one should I learn first, and why?",
)
FOLLOW_UPS: tuple[str, ...] = (
    "Thanks! Can you give a concrete example?",
    "Could you make that shorter?",
    "How does this relate to {u}?",
    "What would be a good exercise to practice this?",
    "Is there a simple formula or rule of thumb?",
)
SYSTEMS: tuple[str, ...] = (
    "You are a helpful assistant.",
    "You are a patient teacher who explains ideas step by step.",
    "You are a concise expert. Answer in as few words as needed.",
    "You are a friendly tutor. Use examples and check understanding.",
)
ADJECTIVES: tuple[str, ...] = (
    "simple",
    "important",
    "careful",
    "practical",
    "clear",
    "useful",
    "surprising",
    "common",
    "basic",
    "central",
    "gradual",
    "precise",
    "rough",
    "typical",
    "general",
    "small",
    "large",
)
VERBS: tuple[str, ...] = (
    "explains",
    "describes",
    "connects",
    "changes",
    "controls",
    "shows",
    "predicts",
    "limits",
    "affects",
    "measures",
    "supports",
    "balances",
    "drives",
    "reduces",
    "increases",
    "shapes",
)
NOUNS: tuple[str, ...] = (
    "energy",
    "structure",
    "process",
    "pattern",
    "system",
    "model",
    "example",
    "rule",
    "idea",
    "result",
    "balance",
    "signal",
    "cycle",
    "method",
    "step",
    "value",
    "reason",
    "effect",
)
CONNECTIVES: tuple[str, ...] = (
    "First",
    "Next",
    "Then",
    "Also",
    "However",
    "In short",
    "For example",
    "Finally",
    "Because of this",
)
THOUGHTS: tuple[str, ...] = (
    "The user wants to understand {t}. Let me start from the basic idea.",
    "I should explain {t} without jargon and then give an example.",
    "Let me think about what a beginner usually gets wrong about {t}.",
    "Okay, the question is about {t}. I will outline the key points first.",
    "Hmm, {t} connects to {u}; mentioning that could help.",
)


def _sentence(rng: random.Random, topic: str) -> str:
    return (
        f"{rng.choice(CONNECTIVES)}, {topic} {rng.choice(VERBS)} the {rng.choice(ADJECTIVES)} "
        f"{rng.choice(NOUNS)} of the {rng.choice(NOUNS)}."
    )


def _paragraph(rng: random.Random, topic: str, n_sentences: int) -> str:
    return " ".join(_sentence(rng, topic) for _ in range(n_sentences))


def _pick_other(rng: random.Random, topic: str) -> str:
    other = rng.choice(TOPICS)
    return other if other != topic else TOPICS[(TOPICS.index(topic) + 1) % len(TOPICS)]


def _question(rng: random.Random, topic: str) -> str:
    return rng.choice(ASKS).format(t=topic, u=_pick_other(rng, topic), n=rng.randint(3, 30))


def _reasoning(rng: random.Random, topic: str) -> str:
    first = rng.choice(THOUGHTS).format(t=topic, u=_pick_other(rng, topic))
    return first + "\n" + _paragraph(rng, topic, rng.randint(1, 3))


def _answer(rng: random.Random, topic: str) -> str:
    parts = [_paragraph(rng, topic, rng.randint(2, 4))]
    if rng.random() < 0.4:
        parts.append("\n".join(f"{i}. {_sentence(rng, topic)}" for i in range(1, rng.randint(3, 5))))
    return "\n\n".join(parts)


_ONSETS = (*"bcdfghlmnprstvw", "st", "tr", "pl", "ch", "sh")
_VOWELS = ("a", "e", "i", "o", "u", "ea", "ou", "io", "ai")
_CODAS = ("", "", "n", "r", "s", "t", "l", "nd", "st", "ng", "ck", "m")
_SUFFIXES = ("", "", "", "tion", "ing", "ed", "ly", "er", "ness", "ment", "able", "ous")


def _pseudo_words(rng: random.Random, n: int) -> list[str]:
    """English-looking made-up words, so the tokenizer learns sub-word merges."""
    words: set[str] = set()
    while len(words) < n:
        syllables = "".join(
            rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(rng.randint(1, 3))
        )
        words.add(syllables + rng.choice(_SUFFIXES))
    return sorted(words)


def _tokenizer_corpus(seed: int, n_docs: int) -> Iterator[str]:
    """Synthetic English-ish text in the shape of chat transcripts."""
    rng = random.Random(seed)
    lexicon = _pseudo_words(rng, 6000)
    weights = [1.0 / (rank + 1) for rank in range(len(lexicon))]  # Zipf-like frequencies
    for _ in range(n_docs):
        words = rng.choices(lexicon, weights=weights, k=rng.randint(40, 120))
        text = " ".join(words)
        yield text[:1].upper() + text[1:] + ". " + " ".join(rng.choices(lexicon, k=20)).capitalize() + "."
        topic = rng.choice(TOPICS)
        yield (
            f"{IM_START}system\n{rng.choice(SYSTEMS)}{IM_END}\n"
            f"{IM_START}user\n{_question(rng, topic)}{IM_END}\n"
            f"{IM_START}assistant\n{THINK_OPEN}\n{_reasoning(rng, topic)}\n{THINK_CLOSE}\n\n"
            f"{_answer(rng, topic)}{IM_END}\n"
        )
        # a little code, numbers and punctuation so they do not fall back to single bytes
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        yield f"def f_{a}(x):\n    return x * {b} + {a}  # {rng.choice(NOUNS)}\n\nprint(f_{a}({b}))\n"
        yield f'{{"id": {a}, "value": {b / 7:.3f}, "name": "{rng.choice(NOUNS)}"}}; {a}+{b}={a + b}!?'


def build_demo_tokenizer(out_dir: str | Path, vocab_size: int = DEMO_VOCAB_SIZE, seed: int = 0) -> Path:
    """Train a small byte-level BPE tokenizer with Qwen3's markers and chat template.

    Writes ``tokenizer.json`` and ``tokenizer_config.json`` into ``out_dir`` and returns it.
    Deterministic: the corpus comes from ``seed`` and BPE training is deterministic.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    out = Path(out_dir)
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    added = [AddedToken(t, special=s, normalized=False, single_word=False) for t, s in DEMO_ADDED_TOKENS]
    special = [a for a in added if a.special]
    plain = [a for a in added if not a.special]
    # the trainer registers its special_tokens as special; the think tags are added after
    # training as plain added tokens (as in Qwen3), which keeps the total at vocab_size
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(plain),
        min_frequency=2,
        show_progress=False,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_tokenizer_corpus(seed, 6000), trainer=trainer)
    tok.add_tokens(plain)

    with atomic_path(out / "tokenizer.json") as tmp:
        tok.save(str(tmp), pretty=True)
    write_json(out / "tokenizer_config.json", _tokenizer_config(tok))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).chmod(0o644)  # shipped files: readable like any checked-in file
    return out


def _tokenizer_config(tok: Any) -> dict[str, Any]:
    decoder: dict[str, Any] = {}
    for content, special in DEMO_ADDED_TOKENS:
        tid = tok.token_to_id(content)
        decoder[str(tid)] = {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        "chat_template": QWEN3_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": DEMO_MODEL_MAX_LENGTH,
        "pad_token": ENDOFTEXT,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


# --------------------------------------------------------------------------------------
# Demo dataset
# --------------------------------------------------------------------------------------

DEMO_CONTEXT_LIMIT = 4096
# share of rows per kind; the rest are good conversations (a fifth of them multi-turn)
DEMO_FAULT_SHARES: dict[str, float] = {
    "scaffolding_only": 0.15,
    "duplicate_prompt": 0.03,
    "over_length": 0.02,
    "no_user": 0.01,
    "bad_order": 0.01,
    "empty_user": 0.01,
    "non_text": 0.01,
    "unknown_role": 0.01,
    "unreadable": 0.02,
}
UNREADABLE_LINES: tuple[str, ...] = (
    '{"id": "{id}", "messages": [{"role": "user", "content": "truncated',
    '{"id": "{id}", "messages": "Tell me about tides."}',
    '{"id": "{id}", "messages": [{"role": 7, "content": "Why is the sky blue?"}]}',
    "not json at all",
    '{"id": "../{id}", "messages": [{"role": "user", "content": "An id that escapes its folder."}]}',
    '["a", "list", "instead", "of", "an", "object"]',
)


# A made-up benchmark the demo keeps out of its training data (config/demo.yaml
# audit.decontamination); three of its prompts are planted after the demo rows, plus a near miss.
DEMO_BENCHMARK_PROMPTS: tuple[str, ...] = (
    'def running_maximum(numbers: list[int]) -> list[int]:\n    """Return a list whose i-th element is the '
    "largest of numbers[0], ..., numbers[i].\n    >>> running_maximum([1, 3, 2, 5, 4])\n    [1, 3, 3, 5, 5]\n"
    '    """\n',
    "A baker fills 14 trays with 12 rolls each in the morning and sells all but 23 of them before noon. "
    "In the afternoon she bakes 5 more trays and sells 41 rolls. How many rolls are left at closing time?",
    "Write a function that takes a sentence and returns the words sorted by their number of vowels, "
    "keeping the original order for words with the same count, and ignoring punctuation marks.",
    "A train leaves the station at a quarter past nine and travels 180 kilometres at 72 kilometres per "
    "hour, then waits 25 minutes and returns at 90 kilometres per hour. At what time does it arrive back?",
)


def _planted_lines(first_row: int, seed: int) -> list[bytes]:
    """Rows carrying benchmark prompts: verbatim, re-cased and re-spaced, inside a longer turn, near miss."""
    rng = random.Random(seed + 3)
    bench = DEMO_BENCHMARK_PROMPTS
    user_turns = (
        bench[0],
        "CAN YOU SOLVE THIS?   " + "  ".join(bench[1].upper().split()),
        "Here is an exercise from my course; please explain how to approach it.\n\n" + bench[2],
        " ".join(bench[3].split()[:12]) + " ... I forgot the rest, can you guess the question?",
    )
    lines = []
    for i, user in enumerate(user_turns):
        topic = rng.choice(TOPICS)
        msgs = [_turn("user", user), _turn("assistant", _answer(rng, topic), _reasoning(rng, topic))]
        lines.append(orjson.dumps({"id": f"demo-{first_row + i:04d}", "messages": msgs}))
    return lines


@dataclass(frozen=True, slots=True)
class DemoFiles:
    """Paths written by :func:`build_demo_dataset`."""

    jsonl: Path
    tokenized: Path
    sharegpt: Path
    benchmark: Path


def _turn(role: str, content: Any, reasoning: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"role": role, "content": content}
    if reasoning is not None:
        out["reasoning_content"] = reasoning
    return out


def _good_conversation(rng: random.Random, multi_turn: bool) -> list[dict[str, Any]]:
    topic = rng.choice(TOPICS)
    msgs = [_turn("system", rng.choice(SYSTEMS))] if rng.random() < 0.8 else []
    msgs.append(_turn("user", _question(rng, topic)))
    msgs.append(_turn("assistant", _answer(rng, topic), _reasoning(rng, topic)))
    if multi_turn:
        for _ in range(rng.randint(1, 2)):
            msgs.append(_turn("user", rng.choice(FOLLOW_UPS).format(u=_pick_other(rng, topic))))
            msgs.append(_turn("assistant", _answer(rng, topic), _reasoning(rng, topic)))
    return msgs


def _long_prompt(rng: random.Random, min_words: int) -> str:
    topic = rng.choice(TOPICS)
    paragraphs: list[str] = []
    words = 0
    while words < min_words:
        para = _paragraph(rng, topic, 8)
        paragraphs.append(para)
        words += len(para.split())
    return "Please proofread this long document.\n\n" + "\n\n".join(paragraphs)


def _faulty_conversation(kind: str, rng: random.Random, earlier: list[list[dict[str, Any]]]) -> Any:
    """One conversation with the fault ``kind`` (unreadable rows are raw strings)."""
    good = _good_conversation(rng, multi_turn=rng.random() < 0.2)
    topic = rng.choice(TOPICS)
    if kind == "scaffolding_only":
        # one exchange whose answer renders as just <think>\n\n</think>\n\n<|im_end|>: every
        # supervised token is scaffolding (the fault this product exists for)
        first_answer = next(i for i, m in enumerate(good) if m["role"] == "assistant")
        return [*good[:first_answer], _turn("assistant", "")]
    if kind == "duplicate_prompt":
        source = rng.choice(earlier)
        prompt = [m for m in source if m["role"] != "assistant"][:2]
        return [*prompt, _turn("assistant", _answer(rng, topic), _reasoning(rng, topic))]
    if kind == "over_length":
        return [_turn("user", _long_prompt(rng, 4000)), _turn("assistant", _answer(rng, topic))]
    if kind == "no_user":
        return [_turn("system", rng.choice(SYSTEMS)), _turn("assistant", _answer(rng, topic))]
    if kind == "bad_order":
        return [_turn("assistant", _answer(rng, topic)), _turn("user", _question(rng, topic))]
    if kind == "empty_user":
        return [_turn("user", rng.choice(("", "   "))), _turn("assistant", _answer(rng, topic))]
    if kind == "non_text":
        content = rng.choice(
            (
                [{"type": "text", "text": _question(rng, topic)}, {"type": "image_url", "url": "x.png"}],
                {"text": _question(rng, topic)},
                42,
            )
        )
        return [_turn("user", content), _turn("assistant", _answer(rng, topic))]
    if kind == "unknown_role":
        return [
            _turn("narrator", "The scene opens in a library."),
            _turn("user", _question(rng, topic)),
            _turn("assistant", _answer(rng, topic), _reasoning(rng, topic)),
        ]
    raise ValueError(f"unknown demo fault kind {kind!r}")


def _demo_kinds(n: int, rng: random.Random) -> list[str]:
    kinds: list[str] = []
    for kind, share in DEMO_FAULT_SHARES.items():
        kinds += [kind] * max(1, round(n * share))
    if len(kinds) > n:
        raise ValueError(f"n={n} is too small for the demo's fault mix ({len(kinds)} faulty rows)")
    kinds += ["good_multi" if i % 5 == 0 else "good" for i in range(n - len(kinds))]
    rng.shuffle(kinds)
    # duplicates copy an earlier good row: make sure one comes first
    first_good = kinds.index("good")
    kinds[0], kinds[first_good] = kinds[first_good], kinds[0]
    return kinds


def _demo_lines(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    lines: list[bytes] = []
    earlier: list[list[dict[str, Any]]] = []
    unreadable = iter(UNREADABLE_LINES * (n // len(UNREADABLE_LINES) + 1))
    for i, kind in enumerate(_demo_kinds(n, rng)):
        row_id = f"demo-{i:04d}"
        if kind == "unreadable":
            lines.append(next(unreadable).replace("{id}", row_id).encode())
            continue
        if kind in ("good", "good_multi"):
            msgs = _good_conversation(rng, multi_turn=kind == "good_multi")
            earlier.append(msgs)
        else:
            msgs = _faulty_conversation(kind, rng, earlier)
        lines.append(orjson.dumps({"id": row_id, "messages": msgs}))
    return lines


def _tokenized_rows(n: int, seed: int, tokenizer_dir: Path) -> dict[str, list[Any]]:
    from regen.chat import ChatTemplate

    chat = ChatTemplate.from_dir(tokenizer_dir)
    rng = random.Random(seed + 1)
    cols: dict[str, list[Any]] = {"id": [], "input_ids": [], "loss_mask": []}
    for i in range(n):
        scaffolding_only = i % 3 == 0
        msgs = _good_conversation(rng, multi_turn=i % 4 == 1 and not scaffolding_only)
        if scaffolding_only:  # the mask covers <think>\n\n</think>\n\n<|im_end|> and nothing else
            msgs[-1] = _turn("assistant", "")
        ids, mask = chat.encode_with_loss_mask([Message(**m) for m in msgs])
        cols["id"].append(f"tok-{i:04d}")
        cols["input_ids"].append(ids)
        cols["loss_mask"].append(mask)
    return cols


def _sharegpt_rows(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed + 2)
    rows: list[dict[str, Any]] = []
    for i in range(n):
        topic = rng.choice(TOPICS)
        convo = [{"from": "human", "value": _question(rng, topic)}]
        answer = "" if i % 5 == 4 else _answer(rng, topic)
        convo.append({"from": "gpt", "value": answer})
        if i % 4 == 1:
            convo.append({"from": "human", "value": rng.choice(FOLLOW_UPS).format(u=_pick_other(rng, topic))})
            convo.append({"from": "gpt", "value": _answer(rng, topic)})
        row: dict[str, Any] = {"id": f"sg-{i:04d}"}
        if i % 2 == 0:
            row["system"] = rng.choice(SYSTEMS)
        row["conversations"] = convo
        rows.append(row)
    return rows


def build_demo_dataset(
    out_dir: str | Path,
    tokenizer_dir: str | Path,
    n: int = 300,
    seed: int = 0,
    n_tokenized: int = 50,
    n_sharegpt: int = 20,
) -> DemoFiles:
    """Write the demo datasets (messages JSONL, tokenized Parquet, ShareGPT JSON) into ``out_dir``.

    The JSONL mixes ``n`` good conversations with every fault the audit detects (see
    ``DEMO_FAULT_SHARES``) and a few unreadable lines, then four rows with benchmark prompts from
    ``benchmark.jsonl`` (also written). Same arguments → byte-identical files.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    files = DemoFiles(
        out / "dataset.jsonl", out / "tokenized.parquet", out / "sharegpt.json", out / "benchmark.jsonl"
    )
    with atomic_open(files.jsonl, "wb") as fh:
        for line in [*_demo_lines(n, seed), *_planted_lines(n, seed)]:
            fh.write(line + b"\n")
    with atomic_open(files.benchmark, "wb") as fh:
        for i, prompt in enumerate(DEMO_BENCHMARK_PROMPTS):
            fh.write(orjson.dumps({"task_id": f"demo-bench/{i}", "prompt": prompt}) + b"\n")
    cols = _tokenized_rows(n_tokenized, seed, Path(tokenizer_dir))
    schema = pa.schema(
        [("id", pa.string()), ("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8()))]
    )
    table = pa.Table.from_pydict(cols, schema=schema)
    with atomic_path(files.tokenized) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    with atomic_open(files.sharegpt, "wb") as fh:
        fh.write(orjson.dumps(_sharegpt_rows(n_sharegpt, seed), option=orjson.OPT_INDENT_2) + b"\n")
    for path in (files.jsonl, files.tokenized, files.sharegpt, files.benchmark):
        path.chmod(0o644)
    return files


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tests/support/demo_assets.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p_tok = sub.add_parser("tokenizer", help="build the demo tokenizer")
    p_tok.add_argument("out_dir", nargs="?", default="resources/demo-tokenizer", help="where to write it")
    p_tok.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p_data = sub.add_parser("dataset", help="build the demo datasets (needs the demo tokenizer)")
    p_data.add_argument("out_dir", nargs="?", default="data/demo", help="where to write it")
    p_data.add_argument("--tokenizer", default="resources/demo-tokenizer", help="tokenizer directory")
    p_data.add_argument("--n", type=int, default=300, help="rows in dataset.jsonl")
    p_data.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args(argv)
    if args.what == "tokenizer":
        out = build_demo_tokenizer(args.out_dir, seed=args.seed)
        print(f"wrote {out}/tokenizer.json and {out}/tokenizer_config.json")
    else:
        files = build_demo_dataset(args.out_dir, args.tokenizer, n=args.n, seed=args.seed)
        print(f"wrote {files.jsonl}, {files.tokenized}, {files.sharegpt} and {files.benchmark}")
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
