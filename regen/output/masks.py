"""The one loss-mask policy: which tokens of a regenerated conversation a drafter is trained on.

A drafter learns to predict what the target model generates, so the loss covers only tokens this
run's target model produced:

* **Regenerated turns only.** With ``regenerate: last`` one training row per record: the prompt
  ids the server rendered, then the completion ids it generated; the loss is on the completion.
  Earlier assistant turns are the old dataset's answers: context only, unless
  ``supervise_context_turns`` opts in (then they are supervised as the trainers would).
* **``regenerate: all``**: one row per regenerated assistant turn, each with exactly the context the
  model saw when it answered it (the server's prompt ids, in which the chat template kept what it
  keeps of earlier thinking), the loss on that turn's completion.
* **No false stop.** A truncated answer (``finish_reason == "length"``) has no end-of-turn token and
  gets none; truncated rows are left out unless ``include_truncated``.
* **End of turn.** A turn that stopped on the end-of-turn token is followed by the newline the chat
  template puts after it, supervised: the convention of SpecForge (``end_of_turn_token
  "<|im_end|>\\n"``, mask through it) and speculators (mask through the turn's rendered end), so a
  mask here equals theirs token for token.

Ids come from the server (SGLang ``return_token_ids``, journaled by ``regen.generate.client``), never from
re-tokenized text: a generated sequence need not be its text's canonical encoding. Rows without
server ids (a server that did not return them) fall back to the chat template's rendering and are
marked ``source="retokenized"``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from regen.chat import ChatTemplate, to_template_dicts
from regen.records import message_from_row
from regen.runconfig import section_schema

#: the ``export`` section's schema: the policy's defaults are the config's
_EXPORT = section_schema("export")["properties"]
SERVER_IDS = "server_ids"
RETOKENIZED = "retokenized"


@dataclass(frozen=True, slots=True)
class MaskPolicy:
    """The ``export`` settings that decide masks (defaults are the policy above)."""

    supervise_context_turns: bool = _EXPORT["supervise_context_turns"]["default"]
    include_truncated: bool = _EXPORT["include_truncated"]["default"]

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any]) -> MaskPolicy:
        """From the ``export`` section with the schema's defaults filled in (``regen.output.export``)."""
        return cls(
            supervise_context_turns=bool(cfg["supervise_context_turns"]),
            include_truncated=bool(cfg["include_truncated"]),
        )


@dataclass(frozen=True, slots=True)
class TrainingRow:
    """One tokenized training example."""

    id: str
    input_ids: list[int]
    loss_mask: list[int]
    source: str  # SERVER_IDS or RETOKENIZED

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "input_ids": self.input_ids, "loss_mask": self.loss_mask}


@dataclass(frozen=True, slots=True)
class Turn:
    """One regenerated assistant turn of a dataset row."""

    index: int  # position among the row's regenerated turns
    context: list[dict[str, Any]]  # the messages before it (template dicts)
    answer: dict[str, Any]  # the regenerated assistant message
    finish_reason: str
    prompt_ids: list[int] | None
    completion_ids: list[int] | None


class MaskBuilder:
    """Builds ``input_ids``/``loss_mask`` under a ``MaskPolicy`` with the target's chat template."""

    def __init__(self, template: ChatTemplate, policy: MaskPolicy | None = None) -> None:
        self.template = template
        self.policy = policy or MaskPolicy()
        tok = template.tokenizer
        self.end_of_turn_id = tok.token_to_id(template.end_of_turn)
        after = template.render_dicts([{"role": "user", "content": "x"}], False, True)
        end = after.rfind(template.end_of_turn)
        #: what the template writes after an end-of-turn token ("\n" for ChatML templates)
        self.after_end_of_turn = after[end + len(template.end_of_turn) :] if end >= 0 else ""
        self.after_ids = tok.encode(self.after_end_of_turn, add_special_tokens=False).ids

    # ------------------------------------------------------------------ rows

    def turns(self, row: Mapping[str, Any]) -> list[Turn]:
        """The regenerated turns of a dataset row (``regen.output.merge`` schema), in order."""
        messages = to_template_dicts([message_from_row(m) for m in row["messages"]])
        turns = row.get("turns")
        if not turns:
            return [
                Turn(
                    0,
                    messages[:-1],
                    messages[-1],
                    row["finish_reason"],
                    row.get("prompt_token_ids"),
                    row.get("completion_token_ids"),
                )
            ]
        # regenerate: all: the assistant messages of the row are exactly the regenerated turns
        positions = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        return [
            Turn(
                k,
                messages[:pos],
                messages[pos],
                t["finish_reason"],
                t.get("prompt_token_ids"),
                t.get("completion_token_ids"),
            )
            for k, (pos, t) in enumerate(zip(positions, turns, strict=True))
        ]

    def rows(self, row: Mapping[str, Any]) -> list[TrainingRow]:
        """The training rows of one dataset row under the policy (truncated turns left out by default)."""
        turns = self.turns(row)
        out: list[TrainingRow] = []
        for turn in turns:
            if turn.finish_reason == "length" and not self.policy.include_truncated:
                continue
            row_id = row["id"] if len(turns) == 1 else f"{row['id']}#{turn.index}"
            out.append(self.turn_row(row_id, turn))
        return out

    def turn_row(self, row_id: str, turn: Turn) -> TrainingRow:
        """One turn's row: context ids (mask 0) then its completion (mask 1), from the server's ids."""
        if turn.prompt_ids is None or turn.completion_ids is None:
            return self._retokenized_row(row_id, turn)
        prompt = list(turn.prompt_ids)
        completion = list(turn.completion_ids)
        mask = [0] * len(prompt)
        if self.policy.supervise_context_turns:
            mask = self._context_mask(turn.context, prompt)
        if completion and completion[-1] == self.end_of_turn_id:
            completion += self.after_ids
        return TrainingRow(row_id, prompt + completion, mask + [1] * len(completion), SERVER_IDS)

    # ------------------------------------------------------------------ helpers

    def _context_mask(self, context: Sequence[dict[str, Any]], prompt_ids: list[int]) -> list[int]:
        """Mask 1 on the earlier assistant turns of the prompt (opt-in), as the trainers mark them."""
        for thinking in (True, False):
            text = self.template.render_dicts(list(context), True, thinking)
            enc = self.template.tokenizer.encode(text, add_special_tokens=False)
            if enc.ids == prompt_ids:
                break
        mask = [0] * len(prompt_ids)
        if enc.ids != prompt_ids:
            return mask
        header, eot = self.template.assistant_header, self.template.end_of_turn + self.after_end_of_turn
        pos = text.find(header)
        while pos >= 0:
            start = pos + len(header)
            end = text.find(eot, start)
            end = len(text) if end < 0 else end + len(eot)
            if end > start and start < len(text):
                first = enc.char_to_token(start)
                last = enc.char_to_token(min(end, len(text)) - 1)
                if first is not None and last is not None:
                    mask[first : last + 1] = [1] * (last + 1 - first)
            pos = text.find(header, end)
        return mask

    def _retokenized_row(self, row_id: str, turn: Turn) -> TrainingRow:
        """No server ids: the template's rendering of context + answer, the loss on the answer."""
        tpl = self.template
        full = tpl.render_dicts([*turn.context, turn.answer], False, True)
        truncated = turn.finish_reason == "length"
        end = tpl.end_of_turn + self.after_end_of_turn
        if truncated and full.endswith(end):
            full = full[: -len(end)]  # no end-of-turn the model did not produce
        prompt = tpl.render_dicts(list(turn.context), True, True)
        if not full.startswith(prompt):  # thinking off: the prompt ends with an empty think block
            prompt = tpl.render_dicts(list(turn.context), True, False)
        enc = tpl.tokenizer.encode(full, add_special_tokens=False)
        first = enc.char_to_token(len(prompt)) if len(prompt) < len(full) else None
        n = len(enc.ids)
        start = n if first is None else first
        mask = [0] * start + [1] * (n - start)
        if self.policy.supervise_context_turns:
            ctx = self._context_mask(turn.context, enc.ids[:start])
            mask[:start] = ctx
        return TrainingRow(row_id, list(enc.ids), mask, RETOKENIZED)


def completion_retokenizes_differently(template: ChatTemplate, completion_ids: Sequence[int]) -> bool:
    """True when the completion's text does not tokenize back to the ids the model generated."""
    tok = template.tokenizer
    text = tok.decode(list(completion_ids), skip_special_tokens=False)
    return tok.encode(text, add_special_tokens=False).ids != list(completion_ids)
