"""Small frozen types that cross module boundaries.

Every stage passes one of these; each has one JSON shape (``to_json``) and,
where it is stored as Parquet, one Arrow schema in the module that writes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]
KNOWN_ROLES: frozenset[str] = frozenset({"system", "user", "assistant", "tool"})
#: OpenAI's newer name for the system turn; the reader maps it to what the target chat template renders
DEVELOPER_ROLE = "developer"
DatasetFormat = Literal["messages", "sharegpt", "prompt", "tokenized", "alpaca"]
FORMATS: tuple[str, ...] = ("messages", "sharegpt", "prompt", "tokenized", "alpaca")


@dataclass(frozen=True, slots=True)
class Message:
    """One chat turn. ``content`` is kept as read (it may be non-text in bad input).

    ``tool_calls`` (an assistant turn's OpenAI tool calls, as read), ``tool_call_id`` and ``name``
    (a tool turn's) go to the chat template and the server unchanged.
    """

    role: str
    content: Any
    reasoning_content: str | None = None
    tool_calls: tuple[Any, ...] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.reasoning_content is not None:
            out["reasoning_content"] = self.reasoning_content
        if self.tool_calls is not None:
            out["tool_calls"] = list(self.tool_calls)
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


def prompt_end(roles: Sequence[str]) -> int:
    """How many leading turns form the prompt: everything before a final assistant turn, else all.

    A conversation that ends with an assistant turn has that turn regenerated; one that ends with a
    user (or tool) turn is answered as it stands, so its last turn is never dropped.
    """
    n = len(roles)
    return n - 1 if n and roles[-1] == "assistant" else n


@dataclass(frozen=True, slots=True)
class Sample:
    """One conversation read from the input dataset.

    ``source`` records where it came from: ``{"file": path, "row": int, "format": fmt}``
    (row is 0-based over the file's records, blank JSONL lines included).
    """

    id: str
    messages: tuple[Message, ...]
    source: dict[str, Any] = field(default_factory=dict)
    #: the row's OpenAI tool definitions (``tools``), passed to the chat template and the server
    tools: tuple[Any, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "id": self.id,
            "messages": [m.to_json() for m in self.messages],
            "source": dict(self.source),
        }
        if self.tools is not None:
            out["tools"] = list(self.tools)
        return out


@dataclass(frozen=True, slots=True)
class BadRow:
    """A row that could not be read: the message names file, row and field."""

    file: str
    row: int
    field: str
    problem: str
    #: the file is unreadable from this row on: everything after it is lost input, not one bad row
    unread_tail: bool = False

    def __str__(self) -> str:
        return f"{self.file}: row {self.row}: field {self.field!r}: {self.problem}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "file": self.file,
            "row": self.row,
            "field": self.field,
            "problem": self.problem,
        }
        if self.unread_tail:
            out["unread_tail"] = True
        return out


class BadInputError(ValueError):
    """Raised when the bad-row policy is ``stop``; carries the offending row."""

    def __init__(self, bad: BadRow) -> None:
        super().__init__(str(bad))
        self.bad = bad


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A running server, as ``regen.serving.lifecycle.acquire_server`` hands it over to the client."""

    url: str
    server_id: str
    max_running_requests: int | None = None
    version: str | None = None
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)
    #: ``regen.fingerprint.server_numerics`` of its ``/server_info``; None: not asked yet
    numerics: dict[str, Any] | None = None
    #: the GPU slot of this node whose server it is (server id ``gpu{slot}``); None: an external server
    slot: int | None = None
    #: the server's own running cap (SGLang's ``max_running_requests``), which ``max_running_requests`` (the
    #: client's planned count) may be below; None: not known
    server_running_cap: int | None = None
    #: whether the server keeps SGLang's radix cache (False: launched with ``--disable-radix-cache``, so a
    #: prompt's copies gain nothing from prefilling it first); None: not known, SGLang's default (on) assumed
    radix_cache: bool | None = None
