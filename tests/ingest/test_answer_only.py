"""The audit's answer-only lengths (issue 52 item 4): per sample, the supervised tokens without the
reasoning, which plan a thinking-off variant's answers. Checked against what a thinking-off completion
costs (its answer and end-of-turn token after a prompt rendered with ``enable_thinking=False``), and
rows whose reasoning cannot be told from the answer are left out and counted, never guessed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from regen.chat import ChatTemplate, to_template_dicts
from regen.ingest.audit import AuditConfig, audit_records, cli
from regen.ingest.audit_summary import ANSWER_ONLY_HISTOGRAM
from regen.ingest.auditor import NOT_SPLIT_MASK, NOT_SPLIT_NOT_FOUND
from regen.types import Message, Sample
from tests.support.demo_assets import build_demo_dataset

CONFIG = AuditConfig.from_dict({"context_limit": 4096})

#: (user, assistant content, reasoning_content, the answer a thinking-off completion writes)
ROWS: list[tuple[str, str, str | None, str]] = [
    ("What is 2 + 2?", "The answer is 4.", "Two and two make four, as counting shows.", "The answer is 4."),
    ("Why?", "Because.", "\n\nlet me think\nabout it\n\n", "Because."),
    ("Indent it", "  indented answer", "spaces first", "  indented answer"),
    ("Tags?", "Use the <think> tag, then </think>.", "a think tag in the answer", None),
    ("Inline", "<think>\nhmm, inline reasoning\n</think>\n\nYes, inline.", None, "Yes, inline."),
    ("No reasoning", "Just an answer.", None, "Just an answer."),
    ("Empty reasoning", "An answer.", "", "An answer."),
    ("Quote <think>x</think> in the prompt", "Quoted.", "the prompt has tags", "Quoted."),
    ("Newlines", "\n\nAfter newlines.", "r", "After newlines."),
]


def _sample(i: int, user: str, content: str, reasoning: str | None) -> Sample:
    return Sample(f"s{i}", (Message("user", user), Message("assistant", content, reasoning)))


def _thinking_off_cost(chat: ChatTemplate, user: str, answer: str) -> int:
    """Tokens a thinking-off completion generates: the answer and the end-of-turn token, counted as the
    difference of the encodings with and without them after the thinking-off prompt."""
    prompt = chat.render_dicts(to_template_dicts([Message("user", user)]), True, False)
    encode = chat.tokenizer.encode
    return len(encode(prompt + answer + chat.end_of_turn, add_special_tokens=False)) - len(
        encode(prompt, add_special_tokens=False)
    )


def _answer_hist(summary: Any) -> dict[str, Any]:
    return dict(summary.histograms[ANSWER_ONLY_HISTOGRAM])


def test_answer_only_is_what_a_thinking_off_completion_costs(demo_tokenizer_dir: Path) -> None:
    chat = ChatTemplate.from_dir(demo_tokenizer_dir)
    for i, (user, content, reasoning, answer) in enumerate(ROWS):
        _, summary = audit_records([_sample(i, user, content, reasoning)], CONFIG, chat)
        hist, supervised = _answer_hist(summary), summary.histograms["supervised_tokens"]
        expected = _thinking_off_cost(chat, user, content if answer is None else answer)
        assert (hist["count"], hist["left_out"]) == (1, 0), (content, hist)
        assert hist["max"] == expected, (content, hist["max"], expected)
        assert hist["max"] < supervised["max"]  # the think block (empty or not) is supervised, not answer
    # the whole batch at once (the pipelined path): the same counts
    samples = [_sample(i, u, c, r) for i, (u, c, r, _) in enumerate(ROWS)]
    _, summary = audit_records(samples, CONFIG, chat)
    expected = [_thinking_off_cost(chat, u, c if a is None else a) for u, c, _, a in ROWS]
    hist = _answer_hist(summary)
    assert (hist["count"], hist["mean"] * hist["count"]) == (len(ROWS), pytest.approx(sum(expected)))


def test_rows_that_cannot_be_split_are_left_out_and_counted(demo_tokenizer_dir: Path) -> None:
    chat = ChatTemplate.from_dir(demo_tokenizer_dir)
    masked = Sample(
        "masked",
        (Message("user", "q"), Message("assistant", "a", "r")),
        source={"mask_supervised_tokens": 40},
    )
    _, summary = audit_records([masked, _sample(1, *ROWS[0][:3])], CONFIG, chat)
    hist = _answer_hist(summary)
    assert summary.histograms["supervised_tokens"]["count"] == 2
    assert (hist["count"], hist["left_out"], hist["left_out_reasons"]) == (1, 1, {NOT_SPLIT_MASK: 1})
    assert "1 sample(s) left out" in hist["in_words"]
    # a template that does not render the reasoning: the final answer's reasoning is nowhere to be found,
    # so that row is left out; a row without reasoning is all answer
    plain = ChatTemplate(
        chat.tokenizer,
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
        {"eos_token": "<|im_end|>"},
        name="plain",
    )
    rows = [_sample(0, *ROWS[0][:3]), _sample(1, *ROWS[5][:3])]
    _, summary = audit_records(rows, CONFIG, plain)
    hist = _answer_hist(summary)
    assert hist["left_out_reasons"] == {NOT_SPLIT_NOT_FOUND: 1}
    assert hist["count"] == 1 and hist["max"] == _thinking_off_cost(plain, ROWS[5][0], ROWS[5][1])


def test_regen_audit_on_the_demo_dataset_writes_shorter_answer_only_lengths(
    tmp_path: Path, demo_tokenizer_dir: Path
) -> None:
    """The real CLI on the demo data (reasoning in its answers): summary.json has answer_tokens beside
    supervised_tokens, over the same samples, with a smaller mean; the tokenized Parquet (its own loss
    masks) leaves every row out, counted."""
    files = build_demo_dataset(tmp_path / "data", demo_tokenizer_dir, n=120, n_tokenized=12, n_sharegpt=4)
    out = tmp_path / "audit"
    assert (
        cli([str(files.jsonl), "--tokenizer", str(demo_tokenizer_dir), "--override-gates", "--out", str(out)])
        == 0
    )
    hists = orjson.loads((out / "summary.json").read_bytes())["histograms"]
    full, answer = hists["supervised_tokens"], hists[ANSWER_ONLY_HISTOGRAM]
    assert answer["count"] + answer["left_out"] == full["count"] and answer["count"] > 100
    assert answer["mean"] < 0.8 * full["mean"], (answer["mean"], full["mean"])
    tok_out = tmp_path / "audit-tokenized"
    argv = [str(files.tokenized), "--tokenizer", str(demo_tokenizer_dir), "--override-gates", "--out"]
    assert cli([*argv, str(tok_out)]) == 0
    answer = orjson.loads((tok_out / "summary.json").read_bytes())["histograms"][ANSWER_ONLY_HISTOGRAM]
    assert (answer["count"], answer["mean"], answer["left_out_reasons"]) == (0, None, {NOT_SPLIT_MASK: 12})


def _reference_answer_only(chat: ChatTemplate, messages: list[Message]) -> int:
    """Supervised tokens less the think blocks' (through the newlines after ``</think>``), counted from a
    full encoding with character offsets: each supervised turn found in the rendered text by its header."""
    text = chat.render_dicts(to_template_dicts(messages))
    enc = chat.tokenizer.encode(text, add_special_tokens=False)
    header, eot = chat.assistant_header, chat.end_of_turn
    total = 0
    pos = text.find(header)
    while pos >= 0:
        start = pos + len(header)
        end = text.index(eot, start) + len(eot)
        cut = start
        if text.startswith("<think>", start):
            cut = text.index("</think>", start) + len("</think>")
            while text[cut] == "\n":
                cut += 1
        total += sum(1 for a, _ in enc.offsets if cut <= a < end)
        pos = text.find(header, end)
    return total


def test_every_supervised_turns_reasoning_is_left_out(demo_tokenizer_dir: Path) -> None:
    """Multi-turn rows: the template renders reasoning in the turns after the last user query (a tool
    chain) and drops it before; answer-only counts every supervised turn's answer, none's reasoning."""
    chat = ChatTemplate.from_dir(demo_tokenizer_dir)
    u, a, t = "user", "assistant", "tool"
    conversations = [
        [Message(u, "q1"), Message(a, "first answer", "first thoughts"), Message(u, "q2"),
         Message(a, "b", "r2")],
        [Message(u, "look it up"), Message(a, "calling", "need a tool"), Message(t, "result 42"),
         Message(a, "It is 42.", "the tool said 42")],
        [Message(u, "q"), Message(a, "<think>\ninline one\n</think>\n\nA1"), Message(t, "res"),
         Message(a, "A2", "second")],
    ]  # fmt: skip
    for i, messages in enumerate(conversations):
        _, summary = audit_records([Sample(f"c{i}", tuple(messages))], CONFIG, chat)
        hist = _answer_hist(summary)
        assert hist["count"] == 1 and hist["max"] == _reference_answer_only(chat, messages), i
        assert hist["max"] < summary.histograms["supervised_tokens"]["max"]
