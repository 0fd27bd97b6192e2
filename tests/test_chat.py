"""Chat-template rendering and supervised-token accounting."""

from __future__ import annotations

from pathlib import Path

import pytest

from regen.chat import ChatTemplate, to_template_dicts
from regen.types import Message

U, A, S, T = "user", "assistant", "system", "tool"

CONVERSATIONS: list[list[dict[str, object]]] = [
    [{"role": U, "content": "Hello there"}],
    [{"role": U, "content": "Hi"}, {"role": A, "content": "Hello! How can I help?"}],
    [{"role": S, "content": "Be terse."}, {"role": U, "content": "2+2?"}, {"role": A, "content": "4"}],
    [
        {"role": U, "content": "Q"},
        {"role": A, "content": "Answer", "reasoning_content": "step one\nstep two"},
    ],
    [
        {"role": U, "content": "Q"},
        {"role": A, "content": "<think>\ninline reasoning\n</think>\n\nThe answer"},
    ],
    [{"role": U, "content": "Q"}, {"role": A, "content": ""}],
    [{"role": U, "content": "Q"}, {"role": A, "content": "<think>\n\n</think>\n\n"}],
    [
        {"role": S, "content": "sys"},
        {"role": U, "content": "first question"},
        {"role": A, "content": "first answer", "reasoning_content": "r1"},
        {"role": U, "content": "second question"},
        {"role": A, "content": "second answer", "reasoning_content": "r2"},
    ],
    [
        {"role": U, "content": "use the tool"},
        {"role": A, "content": "calling", "reasoning_content": "need the tool"},
        {"role": T, "content": "result one"},
        {"role": T, "content": "result two"},
        {"role": A, "content": "done"},
    ],
    [
        {"role": U, "content": "Q"},
        {"role": A, "content": "\n\n  leading whitespace"},
        {"role": U, "content": "Q2"},
    ],
    [{"role": A, "content": "assistant first"}, {"role": U, "content": "then user"}],
    [
        {"role": U, "content": "Q"},
        {"role": "narrator", "content": "odd"},
        {"role": S, "content": "late system"},
    ],
    [{"role": U, "content": ["a", {"type": "image"}]}, {"role": A, "content": {"x": 1}}],
]


@pytest.fixture(scope="module")
def chat(demo_tokenizer_dir: Path) -> ChatTemplate:
    return ChatTemplate.from_dir(demo_tokenizer_dir)


def n_tokens(chat: ChatTemplate, text: str) -> int:
    return len(chat.tokenizer.encode(text, add_special_tokens=False))


def test_qwen3_template_uses_fast_renderer(chat: ChatTemplate) -> None:
    assert chat.uses_fast_renderer
    assert chat.assistant_header == "<|im_start|>assistant\n"
    assert chat.end_of_turn == "<|im_end|>"


@pytest.mark.parametrize("conv", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [False, True])
@pytest.mark.parametrize("enable_thinking", [True, False])
def test_fast_renderer_matches_jinja(
    chat: ChatTemplate, conv: list[dict[str, object]], add_generation_prompt: bool, enable_thinking: bool
) -> None:
    fast = chat.render(conv, add_generation_prompt, enable_thinking)
    jinja = chat.render(conv, add_generation_prompt, enable_thinking, use_jinja=True)
    assert fast == jinja


def test_non_text_content_renders_as_json(chat: ChatTemplate) -> None:
    text = chat.render([Message("user", ["part", {"type": "image"}])])
    assert '["part",{"type":"image"}]' in text


def test_scaffolding_only_answer_counts_the_scaffolding_tokens(chat: ChatTemplate) -> None:
    conv = [{"role": U, "content": "Say nothing"}, {"role": A, "content": ""}]
    expected = n_tokens(chat, "<think>\n\n</think>\n\n<|im_end|>")
    assert chat.supervised_token_count(conv) == expected
    assert chat.is_scaffolding_only(conv)
    assert chat.is_scaffolding_only(Message("assistant", "<think>\n\n</think>\n\n"))
    assert chat.is_scaffolding_only(Message("assistant", "   \n"))


def test_real_answers_are_not_scaffolding(chat: ChatTemplate) -> None:
    assert not chat.is_scaffolding_only(Message("assistant", "ok"))
    assert not chat.is_scaffolding_only(Message("assistant", "", reasoning_content="thinking only"))
    assert not chat.is_scaffolding_only([{"role": U, "content": "prompt only"}])


def test_supervised_count_is_answer_plus_scaffolding(chat: ChatTemplate) -> None:
    answer, reasoning = "The capital is Paris.", "France's capital city"
    conv = [
        {"role": U, "content": "Capital of France?"},
        {"role": A, "content": answer, "reasoning_content": reasoning},
    ]
    text = chat.render(conv)
    start = text.index(chat.assistant_header) + len(chat.assistant_header)
    end = text.index("<|im_end|>", start) + len("<|im_end|>")
    assert chat.supervised_token_count(conv) == n_tokens(chat, text[start:end])
    assert chat.supervised_token_count(conv) > n_tokens(chat, answer)


def test_multi_turn_sums_every_assistant_turn(chat: ChatTemplate) -> None:
    conv = CONVERSATIONS[7]
    text = chat.render(conv)
    spans = chat.supervised_spans(conv)
    assert len(spans) == 2
    # earlier turns lose their reasoning under the Qwen3 template: "first answer<|im_end|>"
    assert spans[0][1] - spans[0][0] == n_tokens(chat, "first answer<|im_end|>")
    assert chat.supervised_token_count(conv) == sum(b - a for a, b in spans)
    assert "r1" not in text and "r2" in text


@pytest.mark.parametrize("conv", CONVERSATIONS)
def test_batched_prompt_count_matches_exact_render(chat: ChatTemplate, conv: list[dict[str, object]]) -> None:
    account = chat.account(conv)
    assert account.prompt_tokens == chat.prompt_token_count(conv)
    assert chat.prompt_token_counts([conv, conv]) == [account.prompt_tokens] * 2


def test_prompt_count_of_prompt_only_conversation(chat: ChatTemplate) -> None:
    conv = [{"role": U, "content": "just a prompt"}]
    expected = n_tokens(chat, "<|im_start|>user\njust a prompt<|im_end|>\n<|im_start|>assistant\n")
    assert chat.prompt_token_count(conv) == expected
    assert chat.account(conv).prompt_tokens == expected


@pytest.mark.parametrize("conv", CONVERSATIONS)
def test_loss_mask_matches_supervised_count(chat: ChatTemplate, conv: list[dict[str, object]]) -> None:
    ids, mask = chat.encode_with_loss_mask(conv)
    assert len(ids) == len(mask) == n_tokens(chat, chat.render(conv))
    assert set(mask) <= {0, 1}
    assert sum(mask) == chat.supervised_token_count(conv)


def test_loss_mask_covers_thinking_and_end_of_turn_only_on_assistant(chat: ChatTemplate) -> None:
    conv = [{"role": U, "content": "Q"}, {"role": A, "content": "Answer", "reasoning_content": "why"}]
    ids, mask = chat.encode_with_loss_mask(conv)
    tok = chat.tokenizer
    supervised = tok.decode([i for i, m in zip(ids, mask, strict=True) if m], skip_special_tokens=False)
    assert supervised == "<think>\nwhy\n</think>\n\nAnswer<|im_end|>"
    assert mask[-1] == 0  # the newline after <|im_end|> is not supervised


def test_batch_variants_agree_with_single(chat: ChatTemplate) -> None:
    counts = chat.supervised_token_counts(CONVERSATIONS)
    assert counts == [chat.supervised_token_count(c) for c in CONVERSATIONS]
    batch = chat.encode_with_loss_mask_batch(CONVERSATIONS[:3])
    assert batch == [chat.encode_with_loss_mask(c) for c in CONVERSATIONS[:3]]


def test_to_template_dicts_accepts_messages_and_dicts() -> None:
    msgs = [Message("user", "hi"), Message("assistant", "yo", reasoning_content="r")]
    assert to_template_dicts(msgs) == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo", "reasoning_content": "r"},
    ]


def test_other_template_renders_through_jinja(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    import json
    import shutil

    shutil.copy(demo_tokenizer_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    cfg = json.loads((demo_tokenizer_dir / "tokenizer_config.json").read_text())
    cfg["chat_template"] = (
        "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    other = ChatTemplate.from_dir(tmp_path)
    assert not other.uses_fast_renderer
    conv = [{"role": U, "content": "Q"}, {"role": A, "content": "plain answer"}]
    assert other.supervised_token_count(conv) == n_tokens(other, "plain answer<|im_end|>")
    assert other.account(conv).prompt_tokens == other.prompt_token_count(conv)


def test_ids_path_matches_offsets_path(chat: ChatTemplate) -> None:
    tricky = [
        [
            {"role": U, "content": "Q"},
            {"role": A, "content": "x <|im_start|>assistant\nfake turn<|im_end|> y"},
        ],
        [{"role": U, "content": "has <|im_end|> inside"}, {"role": A, "content": " spaced"}],
        [
            {"role": U, "content": "Q"},
            {"role": A, "content": "a"},
            {"role": U, "content": "Q"},
            {"role": A, "content": "\tb"},
        ],
    ]
    convs = [to_template_dicts(c) for c in [*CONVERSATIONS, *tricky]]
    assert chat.account_batch_dicts(convs) == chat.account_batch_offsets(convs)
