"""Every record shape that crosses a stage boundary, one owner each: the Arrow schemas of the Parquet
files and the typed generation record (its JSON shape is pinned by ``schemas/record.schema.json``).

* ``FLAGS_SCHEMA``: ``results/audit/flags.parquet`` (written by ``regen.ingest.audit``), one row per input
sample;
* ``SHARD_SCHEMA``: ``results/shards/{shard}.parquet`` (``regen.ingest.shards``), the prompts;
* :class:`GenerationRecord`: one line of ``results/generations/{shard}.jsonl.zst`` (and of the journal,
  with ``"kind": "record"``), built by the client (``regen.generate.sample_record``);
* :class:`FailureEntry`: a sample's terminal failure, a ``"kind": "failed"`` journal line (the client);
* :class:`ShardStatus`: ``work/status/{shard}.json``, written by the client every few seconds and read by
  ``regen status``;
* ``VALID_SCHEMA``: ``results/valid/{shard}.parquet`` (``regen.output.validate``), a flat copy of every
  generation record field the later stages use, filled by :class:`ValidColumns`;
* ``dataset_schema(include_token_ids)``: the training-ready rows of ``results/dataset/``
(``regen.output.merge``).

``MESSAGE_TYPE`` (one chat turn) is shared by the shards, the valid shards and the dataset.

Tool use travels as JSON text, because OpenAI tool calls are free-form (arguments as a string or an
object, extra keys): a message's ``tool_calls_json`` (with ``tool_call_id`` and ``name``), a row's
``tools_json`` (the tool definitions sent with the request) and ``tool_calls_json`` (the regenerated
turn's calls as the server's tool-call parser returned them; the dataset puts them on its final
assistant message). :func:`message_row` and :func:`message_from_row` convert both ways.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from regen.journal_lines import FAILED, RECORD
from regen.layout.names import RECORD_SCHEMA
from regen.prompts import request_digests
from regen.runconfig import DEFAULT_VARIANT
from regen.types import Message, Sample

#: the JSON schema of a generation record (``regen.output.validate`` checks every record against it)
RECORD_SCHEMA_PATH = RECORD_SCHEMA

MESSAGE_TYPE = pa.struct(
    [
        pa.field("role", pa.string(), nullable=False),
        pa.field("content", pa.string()),
        pa.field("reasoning_content", pa.string()),
        pa.field("tool_calls_json", pa.string()),
        pa.field("tool_call_id", pa.string()),
        pa.field("name", pa.string()),
    ]
)
MESSAGES_TYPE = pa.list_(pa.field("item", MESSAGE_TYPE, nullable=False))
#: token ids as the server reported them (SGLang ``return_token_ids``); null when it sent none
TOKEN_IDS_TYPE = pa.list_(pa.field("item", pa.int32(), nullable=False))
#: the largest id TOKEN_IDS_TYPE holds (no vocabulary comes near it); the record schema's maximum
TOKEN_ID_MAX = 2**31 - 1
TURN_TYPE = pa.struct(
    [
        pa.field("reasoning_content", pa.string()),
        pa.field("content", pa.string()),
        pa.field("finish_reason", pa.string()),
        pa.field("prompt_tokens", pa.int64()),
        pa.field("completion_tokens", pa.int64()),
        pa.field("reasoning_tokens", pa.int64()),
        pa.field("prompt_token_ids", TOKEN_IDS_TYPE),
        pa.field("completion_token_ids", TOKEN_IDS_TYPE),
        pa.field("tool_calls_json", pa.string()),
    ]
)
TURNS_TYPE = pa.list_(pa.field("item", TURN_TYPE, nullable=False))

VALID_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("shard", pa.string(), nullable=False),
        # the prompt's sample id, the sampling variant's name and the completion's index among its n
        # (``id`` is unique: the sample id with one variant of n 1, else ``{sample_id}/{variant}/{k}``)
        pa.field("sample_id", pa.string(), nullable=False),
        pa.field("variant", pa.string(), nullable=False),
        pa.field("k", pa.int64(), nullable=False),
        pa.field("messages", MESSAGES_TYPE, nullable=False),
        pa.field("reasoning_content", pa.string()),
        pa.field("content", pa.string(), nullable=False),
        pa.field("finish_reason", pa.string(), nullable=False),
        pa.field("truncated", pa.bool_(), nullable=False),
        pa.field("thinking", pa.bool_(), nullable=False),
        pa.field("prompt_tokens", pa.int64(), nullable=False),
        pa.field("completion_tokens", pa.int64(), nullable=False),
        pa.field("reasoning_tokens", pa.int64()),
        pa.field("temperature", pa.float64(), nullable=False),
        pa.field("top_p", pa.float64(), nullable=False),
        pa.field("top_k", pa.int64(), nullable=False),
        pa.field("max_tokens", pa.int64(), nullable=False),
        pa.field("reasoning_effort", pa.string()),
        pa.field("seed", pa.int64(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("server_id", pa.string(), nullable=False),
        pa.field("server_url", pa.string()),
        pa.field("server_version", pa.string()),
        pa.field("attempts", pa.int64(), nullable=False),
        pa.field("started_at", pa.float64(), nullable=False),
        pa.field("latency_s", pa.float64(), nullable=False),
        pa.field("turns", TURNS_TYPE),
        pa.field("prompt_token_ids", TOKEN_IDS_TYPE),
        pa.field("completion_token_ids", TOKEN_IDS_TYPE),
        pa.field("tools_json", pa.string()),
        pa.field("tool_calls_json", pa.string()),
        # regenerate all: the row ends early at a turn whose tool calls differ from the calls the dataset's
        # next (tool) turns answer; the mismatch kind (regen.toolcalls), null when the row is whole
        pa.field("tool_call_mismatch", pa.string()),
        # regen.fingerprint: what decided the answer (request level, settings level, the settings as JSON)
        pa.field("fingerprint", pa.string(), nullable=False),
        pa.field("settings_fingerprint", pa.string(), nullable=False),
        pa.field("settings", pa.string(), nullable=False),
    ],
    metadata={b"regen.schema": b"valid/1"},
)

# Columns copied unchanged from the valid shards into the dataset, in output order.
DATASET_PASSTHROUGH = (
    "sample_id",
    "variant",
    "k",
    "model",
    "finish_reason",
    "truncated",
    "thinking",
    "prompt_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "reasoning_effort",
    "seed",
    "shard",
    "prompt_token_ids",
    "completion_token_ids",
    "turns",
    "tools_json",
    "tool_call_mismatch",
    "fingerprint",
    "settings_fingerprint",
)

SHARD_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("messages", MESSAGES_TYPE, nullable=False),
        pa.field("source_file", pa.string()),
        pa.field("source_row", pa.int64()),
        pa.field("source_format", pa.string()),
        pa.field("tools_json", pa.string()),  # the sample's tool definitions, null when none
        # regen.prompts.request_digests: what the requests send under each regenerate mode, digested once
        # here so the dry run fingerprints a sample without rebuilding its prompt
        pa.field("request_digest_last", pa.string()),
        pa.field("request_digest_all", pa.string()),
    ]
)

FLAGS_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("file", pa.string()),
        pa.field("row", pa.int64()),
        pa.field("format", pa.string()),
        pa.field("flags", pa.list_(pa.string()), nullable=False),
        pa.field("supervised_tokens", pa.int64()),
        pa.field("prompt_tokens", pa.int64()),
        pa.field("excluded", pa.bool_(), nullable=False),
        pa.field("exclude_reason", pa.string()),
        pa.field("detail", pa.string()),
        # the id as the input wrote it (JSON: 1 or "1"); null for content-hash ids and unreadable rows
        pa.field("id_json", pa.string()),
    ]
)


def dataset_schema(include_token_ids: bool) -> pa.Schema:
    """The explicit Arrow schema of the training-ready rows."""
    fields = [
        pa.field("id", pa.string(), nullable=False),
        pa.field("messages", MESSAGES_TYPE, nullable=False),
    ]
    fields += [VALID_SCHEMA.field(name) for name in DATASET_PASSTHROUGH]
    # the id of an earlier completion of the same prompt identical to this one (reasoning, answer and
    # tool calls), null when none: regen.output.merge flags them, export.drop_duplicate_completions drops
    fields.append(pa.field("duplicate_of", pa.string()))
    if include_token_ids:
        fields += [
            pa.field("input_ids", pa.list_(pa.field("item", pa.int32(), nullable=False)), nullable=False),
            pa.field("loss_mask", pa.list_(pa.field("item", pa.int8(), nullable=False)), nullable=False),
        ]
    return pa.schema(fields, metadata={b"regen.schema": b"dataset/1"})


class ValidColumns:
    """Column lists for a batch of valid records, appended one record at a time."""

    __slots__ = ("cols",)

    def __init__(self) -> None:
        self.cols: dict[str, list[Any]] = {name: [] for name in VALID_SCHEMA.names}

    def __len__(self) -> int:
        return len(self.cols["id"])

    def append(self, rec: dict[str, Any]) -> None:
        """Append one schema-valid record (ints that arrived as 1.0 are coerced)."""
        c = self.cols
        usage = rec["usage"]
        sampling = rec["sampling"]
        server = rec["server"]
        timings = rec["timings"]
        c["id"].append(rec["id"])
        c["shard"].append(rec["shard"])
        # records written before variants lack these: the sample id, the one implicit variant, k 0
        c["sample_id"].append(rec.get("sample_id", rec["id"]))
        c["variant"].append(rec.get("variant", DEFAULT_VARIANT))
        c["k"].append(int(rec.get("k", 0)))
        c["messages"].append([message_row(m) for m in rec["messages"]])
        c["reasoning_content"].append(rec["reasoning_content"])
        c["content"].append(rec["content"])
        c["finish_reason"].append(rec["finish_reason"])
        c["truncated"].append(rec["truncated"])
        c["thinking"].append(rec["thinking"])
        c["prompt_tokens"].append(int(usage["prompt_tokens"]))
        c["completion_tokens"].append(int(usage["completion_tokens"]))
        rt = usage.get("reasoning_tokens")
        c["reasoning_tokens"].append(None if rt is None else int(rt))
        c["temperature"].append(float(sampling["temperature"]))
        c["top_p"].append(float(sampling["top_p"]))
        c["top_k"].append(int(sampling["top_k"]))
        c["max_tokens"].append(int(sampling["max_tokens"]))
        c["reasoning_effort"].append(sampling.get("reasoning_effort"))
        c["seed"].append(int(rec["seed"]))
        c["model"].append(rec["model"])
        c["server_id"].append(server["id"])
        c["server_url"].append(server.get("url"))
        c["server_version"].append(server.get("version"))
        c["attempts"].append(int(rec["attempts"]))
        c["started_at"].append(float(timings["started_at"]))
        c["latency_s"].append(float(timings["latency_s"]))
        turns = rec.get("turns")
        c["turns"].append(None if turns is None else [_turn_row(t) for t in turns])
        c["prompt_token_ids"].append(rec.get("prompt_token_ids"))
        c["completion_token_ids"].append(rec.get("completion_token_ids"))
        c["tools_json"].append(json_text(rec.get("tools")))
        c["tool_calls_json"].append(json_text(rec.get("tool_calls")))
        c["tool_call_mismatch"].append((rec.get("tool_call_mismatch") or {}).get("kind"))
        c["fingerprint"].append(rec["fingerprint"])
        c["settings_fingerprint"].append(rec["settings_fingerprint"])
        c["settings"].append(orjson.dumps(rec["settings"], option=orjson.OPT_SORT_KEYS).decode())

    def to_batch(self) -> pa.RecordBatch:
        """Build one Arrow batch with ``VALID_SCHEMA`` and clear the lists."""
        arrays = [
            token_ids_array(self.cols[f.name])
            if f.type == TOKEN_IDS_TYPE
            else pa.array(self.cols[f.name], type=f.type)
            for f in VALID_SCHEMA
        ]
        batch = pa.RecordBatch.from_arrays(arrays, schema=VALID_SCHEMA)
        for lst in self.cols.values():
            lst.clear()
        return batch


def token_ids_array(rows: list[list[int] | None]) -> pa.Array:
    """A ``TOKEN_IDS_TYPE`` column from per-row id lists (None: null), flattened through numpy: what
    ``pa.array`` gives, an order of magnitude faster (it converts nested ints one by one). An id
    beyond int32 raises ``ArrowInvalid`` as ``pa.array`` does."""
    n = len(rows)
    lengths = np.fromiter((0 if r is None else len(r) for r in rows), np.int64, n)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 2**31:
        return pa.array(rows, type=TOKEN_IDS_TYPE)
    flat = np.fromiter(itertools.chain.from_iterable(r for r in rows if r is not None), np.int64, offsets[-1])
    values = pa.array(flat).cast(pa.int32())  # safe cast
    mask = pa.array([r is None for r in rows], pa.bool_()) if None in rows else None
    return pa.ListArray.from_arrays(
        pa.array(offsets.astype(np.int32)), values, type=TOKEN_IDS_TYPE, mask=mask
    )


def _turn_row(turn: dict[str, Any]) -> dict[str, Any]:
    usage = turn["usage"]
    rt = usage.get("reasoning_tokens")
    return {
        "reasoning_content": turn["reasoning_content"],
        "content": turn["content"],
        "finish_reason": turn["finish_reason"],
        "prompt_tokens": int(usage["prompt_tokens"]),
        "completion_tokens": int(usage["completion_tokens"]),
        "reasoning_tokens": None if rt is None else int(rt),
        "prompt_token_ids": turn.get("prompt_token_ids"),
        "completion_token_ids": turn.get("completion_token_ids"),
        "tool_calls_json": json_text(turn.get("tool_calls")),
    }


def json_text(value: Any) -> str | None:
    """Free-form JSON (tool calls, tool definitions) as the text a ``*_json`` column holds."""
    return None if value is None else orjson.dumps(list(value)).decode()


def message_row(m: Message | dict[str, Any]) -> dict[str, Any]:
    """One chat turn (a Message, or a record's message object) as a ``MESSAGE_TYPE`` row."""
    d = m.to_json() if isinstance(m, Message) else m
    content = d.get("content")
    return {
        "role": d["role"],
        # a shard keeps content as read; anything not text is audited out before it gets here
        "content": content if content is None or isinstance(content, str) else _sorted_json(content),
        "reasoning_content": d.get("reasoning_content"),
        "tool_calls_json": json_text(d.get("tool_calls")),
        "tool_call_id": d.get("tool_call_id"),
        "name": d.get("name"),
    }


def _sorted_json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def message_from_row(row: dict[str, Any]) -> Message:
    """A ``MESSAGE_TYPE`` row as a Message (tool calls decoded)."""
    calls = row.get("tool_calls_json")
    return Message(
        row["role"],
        row["content"],
        row["reasoning_content"],
        tuple(orjson.loads(calls)) if calls else None,
        row.get("tool_call_id"),
        row.get("name"),
    )


# ---------------------------------------------------------------------------------------------
# The generation record (JSON): one line of results/generations/{shard}.jsonl.zst
# ---------------------------------------------------------------------------------------------


def record_id(sample_id: str, variant: str, k: int, *, plain: bool) -> str:
    """A record's id: the sample id when the run has one variant of one completion (``plain``: every
    id then is what it was before variants), else ``{sample_id}/{variant}/{k}``."""
    return sample_id if plain else f"{sample_id}/{variant}/{k}"


@dataclass(frozen=True, slots=True)
class RecordSampling:
    """The sampling a record was generated with (``max_tokens`` as last sent, after any retry raise)."""

    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    #: the config block these came from: ``sampling``, or its ``thinking`` / ``non_thinking`` override, or
    #: ``variant`` when the record's variant sets temperature, top_p or top_k itself
    block: str | None = None
    #: the variant's ``reasoning_effort`` (sent in chat_template_kwargs); None: not sent
    reasoning_effort: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "max_tokens": self.max_tokens,
        }
        if self.block is not None:
            out["block"] = self.block
        if self.reasoning_effort is not None:
            out["reasoning_effort"] = self.reasoning_effort
        return out


@dataclass(slots=True)
class GenerationRecord:
    """One regenerated sample, as ``schemas/record.schema.json`` pins it (``docs/design.md``).

    ``messages`` is the prompt the server saw for the last regenerated turn; ``turns`` is present
    only with ``regenerate: all`` (one ``{reasoning_content, content, finish_reason, usage}`` per
    regenerated turn).

    Not frozen, for speed: the client builds one per request, and a frozen dataclass's ``__init__``
    sets each of these 23 fields through ``object.__setattr__`` (about 4 µs a record more). Nothing
    changes a record once built.
    """

    #: the record id, unique in the dataset (:func:`record_id`)
    id: str
    shard: str
    messages: list[dict[str, Any]]
    reasoning_content: str | None
    content: str
    finish_reason: str
    truncated: bool
    thinking: bool
    usage: dict[str, Any]
    sampling: RecordSampling
    seed: int
    model: str | None
    server: dict[str, Any]
    attempts: int
    started_at: float
    latency_s: float
    turns: list[dict[str, Any]] | None = None
    #: the server's own token ids (``return_token_ids``): the rendered prompt and the raw completion;
    #: both or neither (absent when the server sent none)
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    #: the sample's tool definitions as sent, and the regenerated turn's parsed tool calls (absent when none)
    tools: list[Any] | None = None
    tool_calls: list[Any] | None = None
    #: regenerate all: ``{"turn", "kind"}`` when the row ended early at that turn because its tool calls
    #: differ from those the dataset's following tool turns answer (``regen.toolcalls``); absent otherwise
    tool_call_mismatch: dict[str, Any] | None = None
    #: the prompt's sample id, the sampling variant's name, the completion's 0-based index among its n
    sample_id: str = ""
    variant: str = "default"
    k: int = 0

    def to_json(self) -> dict[str, Any]:
        """The record's JSON object (key order as written to the generations file)."""
        out = self.journal_entry()
        del out["kind"]
        return out

    def journal_entry(self) -> dict[str, Any]:
        """The record as a journal line: ``{"kind": "record", ...record}`` (built here, not copied from
        ``to_json``: the client writes one per request)."""
        out: dict[str, Any] = {
            "kind": RECORD,
            "id": self.id,
            "sample_id": self.sample_id or self.id,
            "variant": self.variant,
            "k": self.k,
            "shard": self.shard,
            "messages": self.messages,
            "reasoning_content": self.reasoning_content,
            "content": self.content,
            "finish_reason": self.finish_reason,
            "truncated": self.truncated,
            "thinking": self.thinking,
            "usage": self.usage,
            "sampling": self.sampling.to_json(),
            "seed": self.seed,
            "model": self.model,
            "server": self.server,
            "attempts": self.attempts,
            "timings": {"started_at": self.started_at, "latency_s": self.latency_s},
        }
        if self.prompt_token_ids is not None and self.completion_token_ids is not None:
            out["prompt_token_ids"] = self.prompt_token_ids
            out["completion_token_ids"] = self.completion_token_ids
        if self.turns is not None:
            out["turns"] = self.turns
        if self.tools:
            out["tools"] = self.tools
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        if self.tool_call_mismatch is not None:
            out["tool_call_mismatch"] = self.tool_call_mismatch
        return out


@dataclass(frozen=True, slots=True)
class FailureEntry:
    """A sample that failed terminally (``reason``: ``truncated``, ``client_error: <message>``, or a
    server-level category such as ``server_error``), after ``attempts`` requests."""

    id: str
    reason: str
    attempts: int
    error: str
    #: the record's sample id, variant and completion index (as on :class:`GenerationRecord`)
    sample_id: str = ""
    variant: str = DEFAULT_VARIANT
    k: int = 0

    def journal_entry(self) -> dict[str, Any]:
        """The failure as a journal line: ``{"kind": "failed", "id", "sample_id", "variant", "k", "reason",
        "attempts", "error"}``."""
        return {
            "kind": FAILED,
            "id": self.id,
            "sample_id": self.sample_id or self.id,
            "variant": self.variant,
            "k": self.k,
            "reason": self.reason,
            "attempts": self.attempts,
            "error": self.error,
        }


# ---------------------------------------------------------------------------------------------
# A shard's progress (JSON): work/status/{shard}.json
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShardStatus:
    """One ``work/status/{shard}.json``: a running (or finished) shard's progress, as its client saw it."""

    shard: str
    server_id: str | None
    server_url: str | None
    done: int
    total: int | None
    failed: int
    truncated: int
    req_s: float
    out_tok_s: float
    eta_s: float | None
    updated_at: float
    finished: bool
    in_flight: int = 0
    retrying: int = 0
    retried_requests: int = 0
    oldest_in_flight_at: float | None = None
    #: records a sample makes (its variants' completions, ``GenerateConfig.completions_per_prompt``):
    #: ``done``, ``total``, ``failed`` and ``req_s`` count records
    completions_per_sample: int = 1

    def to_json(self) -> dict[str, Any]:
        """The file's JSON object (``finished`` only once the shard is finished)."""
        out: dict[str, Any] = {
            "shard": self.shard,
            "server": {"id": self.server_id, "url": self.server_url},
            "done": self.done,
            "total": self.total,
            "failed": self.failed,
            "truncated": self.truncated,
            "req_s": self.req_s,
            "out_tok_s": self.out_tok_s,
            "eta_s": self.eta_s,
            "updated_at": self.updated_at,
            "in_flight": self.in_flight,
            "retrying": self.retrying,
            "retried_requests": self.retried_requests,
            "oldest_in_flight_at": self.oldest_in_flight_at,
            "completions_per_sample": self.completions_per_sample,
        }
        if self.finished:
            out["finished"] = True
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any], path: Path) -> ShardStatus:
        """Read one status file's object (files of older clients lack the later fields: defaults)."""
        server = obj.get("server") or {}
        try:
            return cls(
                shard=str(obj.get("shard") or path.stem),
                server_id=server.get("id"),
                server_url=server.get("url"),
                done=int(obj.get("done") or 0),
                total=_opt(int, obj.get("total")),
                failed=int(obj.get("failed") or 0),
                truncated=int(obj.get("truncated") or 0),
                req_s=float(obj.get("req_s") or 0.0),
                out_tok_s=float(obj.get("out_tok_s") or 0.0),
                eta_s=_opt(float, obj.get("eta_s")),
                updated_at=float(obj.get("updated_at") or 0.0),
                finished=bool(obj.get("finished", False)),
                in_flight=int(obj.get("in_flight") or 0),
                retrying=int(obj.get("retrying") or 0),
                retried_requests=int(obj.get("retried_requests") or 0),
                oldest_in_flight_at=_opt(float, obj.get("oldest_in_flight_at")),
                completions_per_sample=int(obj.get("completions_per_sample") or 1),
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: bad status field: {exc}") from exc


def _opt(kind: type[int] | type[float], value: Any) -> Any:
    return None if value is None else kind(value)


# ---------------------------------------------------------------------------------------------
# Sample rows (SHARD_SCHEMA): the shards and the audit's kept samples
# ---------------------------------------------------------------------------------------------
SAMPLE_ROWS_PER_BATCH = 4096


class SampleRows:
    """``SHARD_SCHEMA`` column buffers for one file (a shard, the audit's kept samples), flushed every
    ``SAMPLE_ROWS_PER_BATCH`` rows."""

    def __init__(self, writer: pq.ParquetWriter) -> None:
        self.writer = writer
        self.cols: dict[str, list[Any]] = {name: [] for name in SHARD_SCHEMA.names}
        self.rows = 0

    def add(self, sample: Sample) -> None:
        c = self.cols
        c["id"].append(sample.id)
        c["messages"].append([message_row(m) for m in sample.messages])
        c["source_file"].append(sample.source.get("file"))
        c["source_row"].append(sample.source.get("row"))
        c["source_format"].append(sample.source.get("format"))
        c["tools_json"].append(json_text(sample.tools))
        digests = request_digests(sample)
        c["request_digest_last"].append(digests["last"])
        c["request_digest_all"].append(digests["all"])
        self.rows += 1
        if len(c["id"]) >= SAMPLE_ROWS_PER_BATCH:
            self.flush()

    def flush(self) -> None:
        if self.cols["id"]:
            self.writer.write_table(pa.table(self.cols, schema=SHARD_SCHEMA))
            for col in self.cols.values():
                col.clear()
