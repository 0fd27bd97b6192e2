"""Small frozen types that cross module boundaries.

Every stage passes one of these; each has one JSON shape (``to_json``) and,
where it is stored as Parquet, one Arrow schema in the module that writes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]
KNOWN_ROLES: frozenset[str] = frozenset({"system", "user", "assistant", "tool"})
DatasetFormat = Literal["messages", "sharegpt", "prompt", "tokenized"]
FORMATS: tuple[str, ...] = ("messages", "sharegpt", "prompt", "tokenized")


@dataclass(frozen=True, slots=True)
class Message:
    """One chat turn. ``content`` is kept as read (it may be non-text in bad input)."""

    role: str
    content: Any
    reasoning_content: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.reasoning_content is not None:
            out["reasoning_content"] = self.reasoning_content
        return out


@dataclass(frozen=True, slots=True)
class Sample:
    """One conversation read from the input dataset.

    ``source`` records where it came from: ``{"file": path, "row": int, "format": fmt}``
    (row is 0-based over the file's records, blank JSONL lines included).
    """

    id: str
    messages: tuple[Message, ...]
    source: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "messages": [m.to_json() for m in self.messages],
            "source": dict(self.source),
        }


@dataclass(frozen=True, slots=True)
class BadRow:
    """A row that could not be read: the message names file, row and field."""

    file: str
    row: int
    field: str
    problem: str

    def __str__(self) -> str:
        return f"{self.file}: row {self.row}: field {self.field!r}: {self.problem}"

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "row": self.row, "field": self.field, "problem": self.problem}


class BadInputError(ValueError):
    """Raised when the bad-row policy is ``stop``; carries the offending row."""

    def __init__(self, bad: BadRow) -> None:
        super().__init__(str(bad))
        self.bad = bad


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A running server, as ``regen.sglang.server.acquire_server`` hands it over to the client."""

    url: str
    server_id: str
    max_running_requests: int | None = None
    version: str | None = None
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)
