"""What of a sample its requests send (``regen.generate.client`` sends it, ``regen.fingerprint`` hashes
it): the
prompt of ``regenerate: last``, the turns before each answer of ``regenerate: all``, and the tools.

Ground level: the shard writer digests each sample's request content once (``request_digests``), so
the dry-run preview fingerprints a sample from two Parquet columns instead of rebuilding its prompt.
"""

from __future__ import annotations

from typing import Any

from regen.fingerprint import content_digest, request_fingerprint
from regen.types import Message, Sample, prompt_end

#: the ``generate.regenerate`` modes, each with its own request content
REGENERATE_MODES = ("last", "all")


def wire(m: Message) -> dict[str, Any]:
    """A turn as SGLang's chat API takes it (tool calls and tool-call ids included when set)."""
    out = m.to_json()
    out.pop("reasoning_content", None)
    return out


def prompt_for_last(messages: tuple[Message, ...]) -> list[dict[str, Any]]:
    """The prompt: every turn before a final assistant turn; all of them when the conversation ends
    with a user or tool turn (that turn is what gets answered)."""
    return [wire(m) for m in messages[: prompt_end([m.role for m in messages])]]


def turn_prefixes(messages: tuple[Message, ...]) -> list[tuple[Message, ...]]:
    """For ``regenerate: all``: the non-assistant turns that precede each answer.

    Segment k holds the turns between assistant turn k-1 and assistant turn k; turns after the
    last assistant turn form a last segment, answered too (as with ``last``). With no assistant
    turn, one segment holds every turn.
    """
    segments: list[tuple[Message, ...]] = []
    current: list[Message] = []
    for m in messages:
        if m.role == "assistant":
            segments.append(tuple(current))
            current = []
        else:
            current.append(m)
    if current or not segments:
        segments.append(tuple(current))
    return segments


def request_content(sample: Sample, regenerate: str) -> dict[str, Any]:
    """Everything of a sample the requests send, nothing else (its fingerprint hashes this).

    ``last``: the prompt (``prompt_for_last``). ``all``: the non-assistant turns of each segment
    (``turn_prefixes``); the old assistant turns are regenerated, so their text decides nothing.
    Plus the tool definitions. An old answer's text or reasoning never decides the new one.
    """
    if regenerate == "last":
        messages: list[Any] = prompt_for_last(sample.messages)
    else:
        messages = [[wire(m) for m in segment] for segment in turn_prefixes(sample.messages)]
    return {"messages": messages, "tools": list(sample.tools) if sample.tools else None}


def request_digests(sample: Sample) -> dict[str, str]:
    """The digest of the sample's request content under each ``regenerate`` mode."""
    return {mode: content_digest(request_content(sample, mode)) for mode in REGENERATE_MODES}


def sample_request_fingerprint(settings_fingerprint: str, sample: Sample, regenerate: str) -> str:
    """The sample's request fingerprint under the settings of ``settings_fingerprint``."""
    digest = content_digest(request_content(sample, regenerate))
    return request_fingerprint(settings_fingerprint, sample.id, digest)
