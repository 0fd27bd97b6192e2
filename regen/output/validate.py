"""Per-record validation of a generation shard: valid Parquet + quarantine JSONL.

Every line of ``results/generations/{shard}.jsonl.zst`` ends up in exactly one of
``results/valid/{shard}.parquet`` (Arrow schema ``regen.records.VALID_SCHEMA``) or
``results/quarantine/{shard}.jsonl.zst`` (``{"id", "reason", "detail", "record"}``).

The JSON Schema ``schemas/record.schema.json`` is the single source of truth for the record
shape. It is compiled once with ``fastjsonschema`` (fast path); when a record fails, the
reference implementation (``jsonschema``, Draft 2020-12) is run on it for a precise message
naming the field. The semantic checks the schema cannot express follow.
"""

from __future__ import annotations

import argparse
import copy
import functools
import os
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import fastjsonschema
import jsonschema
import orjson
import pyarrow.parquet as pq

from regen.io import atomic_lines_writer, atomic_path, gc_paused, open_lines, read_json
from regen.layout.names import is_shard_name
from regen.records import RECORD_SCHEMA_PATH, TOKEN_ID_MAX, VALID_SCHEMA, ValidColumns
from regen.runconfig import section_schema, validated

DEFAULT_SCHEMA_PATH = RECORD_SCHEMA_PATH
BATCH_ROWS = 10000
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
_ID_RE = re.compile(rb'"id"\s*:\s*"((?:[^"\\]|\\.)*)"')

# Quarantine reasons (stable strings: the report and reconcile count them).
UNPARSABLE = "unparsable_json"
SCHEMA = "schema"
DUPLICATE_ID = "duplicate_id"
SHARD_MISMATCH = "shard_mismatch"
TRUNCATED_IN_REASONING = "truncated_in_reasoning"
UNCLOSED_THINK = "unclosed_think"
THINK_TAG_IN_ANSWER = "think_tag_in_answer"
EMPTY_ANSWER_WITH_REASONING = "empty_answer_with_reasoning"
EMPTY_ANSWER = "empty_answer"
CONTENT_TOO_LONG = "content_too_long"
REASONING_TOO_LONG = "reasoning_too_long"


class ValidationCountError(RuntimeError):
    """records in != valid + quarantined: a bug, never a data problem."""


@dataclass(frozen=True, slots=True)
class ValidationStats:
    """Counts for one shard; ``records_in == valid + quarantined`` always holds."""

    shard: str
    records_in: int
    valid: int
    quarantined: int
    reasons: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "shard": self.shard,
            "records_in": self.records_in,
            "valid": self.valid,
            "quarantined": self.quarantined,
            "reasons": dict(sorted(self.reasons.items())),
        }


@dataclass(frozen=True, slots=True)
class Problem:
    """Why a record is quarantined."""

    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class ValidateConfig:
    """The ``validate`` config section, the checks' knobs (built by :meth:`from_dict`: the schema's
    defaults filled in and its rules applied)."""

    max_content_chars: int
    max_reasoning_chars: int
    quarantine_truncated: bool

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> ValidateConfig:
        """Validate ``raw`` against the schema's ``validate`` section, fill its defaults, and type it."""
        v = validated("validate", raw)
        return cls(
            max_content_chars=int(v["max_content_chars"]),
            max_reasoning_chars=int(v["max_reasoning_chars"]),
            quarantine_truncated=bool(v["quarantine_truncated"]),
        )


#: the items of a token id array (``$defs.token_ids``), checked in C by ``_token_ids_conform``
TOKEN_IDS_DEF = "token_ids"
TOKEN_ID_ITEM = {"type": "integer", "minimum": 0, "maximum": TOKEN_ID_MAX}


@dataclass(frozen=True, slots=True)
class TokenIdPaths:
    """Where a record holds token id arrays: top-level keys and keys of each ``turns`` item."""

    top: tuple[str, ...]
    per_turn: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RecordValidator:
    """The compiled schema (fast path) and the reference validator (messages on failure).

    Token id arrays (hundreds of integers a record) are the bulk of a record: ``fast`` is compiled
    from the schema with their items unconstrained and ``_token_ids_conform`` checks the items
    (integer, 0 to the int32 maximum of the Parquet column) in C; only when that says no does ``full``
    (the whole schema, compiled) decide.
    """

    fast: Callable[[Any], Any]
    full: Callable[[Any], Any]
    reference: jsonschema.Draft202012Validator
    token_ids: TokenIdPaths | None

    def schema_problem(self, rec: Any) -> Problem | None:
        """None when the record conforms; else the reference validator's best message."""
        try:
            self.fast(rec)
            if self.token_ids is None or _token_ids_conform(rec, self.token_ids):
                return None
            self.full(rec)  # ints as 1.0, say: the schema's own rule decides
            return None
        except fastjsonschema.JsonSchemaValueException as exc:
            fast_msg = exc.message
        err = jsonschema.exceptions.best_match(self.reference.iter_errors(rec))
        if err is None:  # the implementations disagree: keep the record out, say so
            return Problem(SCHEMA, f"fastjsonschema: {fast_msg} (jsonschema accepts it)")
        return Problem(SCHEMA, f"{err.json_path}: {_short(err.message)}")


def _ids_conform(ids: list[Any]) -> bool:
    """Every item a (non-bool) int in [0, TOKEN_ID_MAX]; C loops only (``type`` of a bool is not ``int``)."""
    return not ids or (set(map(type, ids)) == {int} and min(ids) >= 0 and max(ids) <= TOKEN_ID_MAX)


def _token_ids_conform(rec: dict[str, Any], paths: TokenIdPaths) -> bool:
    """The token id arrays of a record that passed ``fast`` (so they are lists) meet ``TOKEN_ID_ITEM``."""
    for key in paths.top:
        ids = rec.get(key)
        if ids is not None and not _ids_conform(ids):
            return False
    if paths.per_turn:
        for turn in rec.get("turns") or ():
            for key in paths.per_turn:
                ids = turn.get(key)
                if ids is not None and not _ids_conform(ids):
                    return False
    return True


def _token_id_paths(schema: dict[str, Any]) -> TokenIdPaths | None:
    """Where the schema refers to ``$defs.token_ids``; None (no C check: the whole schema is compiled)
    when the definition is not exactly ``TOKEN_ID_ITEM`` items or is referred to anywhere else."""
    ref = f"#/$defs/{TOKEN_IDS_DEF}"
    defn = schema.get("$defs", {}).get(TOKEN_IDS_DEF)
    if defn is None or defn.get("items") != TOKEN_ID_ITEM or set(defn) - {"type", "items", "description"}:
        return None
    top = tuple(k for k, v in schema.get("properties", {}).items() if v.get("$ref") == ref)
    turns = schema.get("properties", {}).get("turns", {}).get("items", {}).get("properties", {})
    per_turn = tuple(k for k, v in turns.items() if v.get("$ref") == ref)
    found = len(top) + len(per_turn)
    if found == 0 or orjson.dumps(schema).count(orjson.dumps(ref)) != found:
        return None
    return TokenIdPaths(top, per_turn)


@functools.lru_cache(maxsize=4)
def load_validator(schema_path: str | os.PathLike[str] = DEFAULT_SCHEMA_PATH) -> RecordValidator:
    """Compile ``schema_path`` once per process (fast path without detailed messages: on a failure
    the reference validator explains)."""
    schema = read_json(schema_path)
    jsonschema.Draft202012Validator.check_schema(schema)
    paths = _token_id_paths(schema)  # before compiling: fastjsonschema rewrites the $refs it resolves
    reference = jsonschema.Draft202012Validator(copy.deepcopy(schema))
    fast = full = fastjsonschema.compile(inline_refs(schema), detailed_exceptions=False)
    if paths is not None:
        relaxed = copy.deepcopy(schema)
        del relaxed["$defs"][TOKEN_IDS_DEF]["items"]
        fast = fastjsonschema.compile(inline_refs(relaxed), detailed_exceptions=False)
    return RecordValidator(fast, full, reference, paths)


_LOCAL_DEF = "#/$defs/"


def inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with its local ``$ref``s replaced by the definitions they name (sibling keywords are
    annotations, kept) and ``$defs`` dropped: validation is the same, and fastjsonschema then checks
    each array item inline instead of calling a function per item with its error path formatted
    (``"...[{i}]".format(**locals())``, on the success path too: a message and a turn each)."""
    defs = schema.get("$defs", {})
    own = schema.get("$id", "")  # a ref may spell the schema's own id: "<$id>#/$defs/name"

    def resolve(node: Any, seen: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [resolve(item, seen) for item in node]
        if not isinstance(node, dict):
            return node
        out = {k: resolve(v, seen) for k, v in node.items() if k not in ("$ref", "$defs")}
        ref = node.get("$ref")
        if ref is None:
            return out
        if own and ref.startswith(own + "#"):
            ref = ref[len(own) :]
        if not ref.startswith(_LOCAL_DEF) or ref in seen:
            raise ValueError(f"record schema: $ref {ref!r} is not a local, non-recursive definition")
        return {**resolve(defs[ref[len(_LOCAL_DEF) :]], (*seen, ref)), **out}

    return resolve(schema, ())


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _has_unclosed_think(text: str) -> bool:
    """True when the last ``<think>`` has no ``</think>`` after it."""
    i = text.rfind(THINK_OPEN)
    return i >= 0 and text.find(THINK_CLOSE, i) < 0


def answer_problem(
    content: str,
    reasoning: str | None,
    finish_reason: str,
    limits: ValidateConfig,
    where: str = "",
    tool_calls: bool = False,
) -> Problem | None:
    """Semantic checks on one (reasoning, answer) pair; ``where`` prefixes the detail (e.g. 'turn 0: ').
    An answer that is a tool call (``tool_calls``) may have empty content, as in OpenAI's shape."""
    reasoning = reasoning or ""
    if len(content) > limits.max_content_chars:
        return Problem(
            CONTENT_TOO_LONG, f"{where}content has {len(content)} chars > {limits.max_content_chars}"
        )
    if len(reasoning) > limits.max_reasoning_chars:
        return Problem(
            REASONING_TOO_LONG, f"{where}reasoning has {len(reasoning)} chars > {limits.max_reasoning_chars}"
        )
    blank = not content.strip() and not tool_calls
    if finish_reason == "length" and blank and reasoning.strip():
        if limits.quarantine_truncated:
            return Problem(
                TRUNCATED_IN_REASONING, f"{where}finish_reason length with no answer after reasoning"
            )
        return None
    if (THINK_OPEN in content or THINK_OPEN in reasoning) and (
        _has_unclosed_think(content) or _has_unclosed_think(reasoning)
    ):
        part = "content" if _has_unclosed_think(content) else "reasoning_content"
        return Problem(UNCLOSED_THINK, f"{where}{part} has a <think> without </think>")
    if THINK_OPEN in content or THINK_CLOSE in content:
        return Problem(THINK_TAG_IN_ANSWER, f"{where}content contains a think tag")
    if blank and reasoning.strip():
        return Problem(EMPTY_ANSWER_WITH_REASONING, f"{where}empty content with non-empty reasoning")
    if blank:
        return Problem(EMPTY_ANSWER, f"{where}empty content and no reasoning")
    return None


def record_problem(rec: dict[str, Any], shard: str | None, limits: ValidateConfig) -> Problem | None:
    """Semantic checks on a schema-valid record (the top-level answer and every turn)."""
    if shard is not None and rec["shard"] != shard:
        return Problem(SHARD_MISMATCH, f"record shard {rec['shard']!r} in file of shard {shard!r}")
    p = answer_problem(
        rec["content"],
        rec["reasoning_content"],
        rec["finish_reason"],
        limits,
        tool_calls=bool(rec.get("tool_calls")),
    )
    if p is not None:
        return p
    for k, turn in enumerate(rec.get("turns") or ()):
        p = answer_problem(
            turn["content"],
            turn["reasoning_content"],
            turn["finish_reason"],
            limits,
            f"turn {k}: ",
            tool_calls=bool(turn.get("tool_calls")),
        )
        if p is not None:
            return p
    return None


def _shard_of(path: Path) -> str | None:
    stem = path.name.split(".")[0]
    return stem if is_shard_name(stem) else None


def _duplicate(rec_id: Any, lineno: int, first_line: dict[str, int]) -> Problem | None:
    """The first record with an id decides its fate; later copies are ``duplicate_id``."""
    if not isinstance(rec_id, str):
        return None
    seen = first_line.setdefault(rec_id, lineno)
    return None if seen == lineno else Problem(DUPLICATE_ID, f"id {rec_id!r} first seen on line {seen}")


def _quarantine(out: IO[bytes], rec_id: Any, problem: Problem, record: Any) -> None:
    out.write(
        orjson.dumps({"id": rec_id, "reason": problem.reason, "detail": problem.detail, "record": record})
    )
    out.write(b"\n")


def _recover_id(line: bytes) -> str | None:
    m = _ID_RE.search(line)
    if m is None:
        return None
    try:
        value = orjson.loads(b'"' + m.group(1) + b'"')
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, str) else None


def validate_shard(
    records_path: str | os.PathLike[str],
    valid_path: str | os.PathLike[str],
    quarantine_path: str | os.PathLike[str],
    config: ValidateConfig,
    schema_path: str | os.PathLike[str] = DEFAULT_SCHEMA_PATH,
) -> ValidationStats:
    """Split one generation shard into valid Parquet and quarantine JSONL (both atomic).

    Blank lines are ignored (not records). Raises ``ValidationCountError`` if the counts
    do not reconcile.
    """
    src = Path(records_path)
    shard = _shard_of(src)
    validator = load_validator(str(schema_path))
    reasons: Counter[str] = Counter()
    cols = ValidColumns()
    with gc_paused():  # records are acyclic; a cyclic GC pass would only re-scan the live batch
        stats = _validate_lines(src, shard, valid_path, quarantine_path, validator, config, reasons, cols)
    return stats


def _validate_lines(
    src: Path,
    shard: str | None,
    valid_path: str | os.PathLike[str],
    quarantine_path: str | os.PathLike[str],
    validator: RecordValidator,
    limits: ValidateConfig,
    reasons: Counter[str],
    cols: ValidColumns,
) -> ValidationStats:
    first_line: dict[str, int] = {}
    n_in = n_valid = n_bad = 0
    with (
        open_lines(src) as fh,
        atomic_path(valid_path) as valid_tmp,
        atomic_lines_writer(quarantine_path) as qfh,
        pq.ParquetWriter(valid_tmp, VALID_SCHEMA, compression="lz4") as writer,
    ):
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            n_in += 1
            where = f"{src}: line {lineno}"
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                text = line.decode("utf-8", errors="replace").rstrip("\n")
                rec_id = _recover_id(line)
                problem = _duplicate(rec_id, lineno, first_line) or Problem(UNPARSABLE, str(exc))
                _quarantine(qfh, rec_id, Problem(problem.reason, f"{where}: {problem.detail}"), text)
                reasons[problem.reason] += 1
                n_bad += 1
                continue
            rec_id = rec.get("id") if isinstance(rec, dict) else None
            problem = _duplicate(rec_id, lineno, first_line)
            if problem is None:
                problem = validator.schema_problem(rec)
            if problem is None:
                problem = record_problem(rec, shard, limits)
            if problem is not None:
                _quarantine(qfh, rec_id, Problem(problem.reason, f"{where}: {problem.detail}"), rec)
                reasons[problem.reason] += 1
                n_bad += 1
                continue
            cols.append(rec)
            n_valid += 1
            if len(cols) >= BATCH_ROWS:
                writer.write_batch(cols.to_batch())
        if len(cols):
            writer.write_batch(cols.to_batch())
        if n_in != n_valid + n_bad or sum(reasons.values()) != n_bad:
            raise ValidationCountError(f"{src}: {n_in} records in but {n_valid} valid + {n_bad} quarantined")
    return ValidationStats(
        shard=shard or src.name, records_in=n_in, valid=n_valid, quarantined=n_bad, reasons=dict(reasons)
    )


def cli(argv: list[str]) -> int:
    """``regen validate RECORDS VALID QUARANTINE``: validate one shard and print its stats."""
    ap = argparse.ArgumentParser(prog="regen validate", description=__doc__.splitlines()[0])
    ap.add_argument("records", help="generation shard JSONL")
    ap.add_argument("valid", help="output Parquet of valid records")
    ap.add_argument("quarantine", help="output JSONL of quarantined records")
    defaults = {k: p.get("default") for k, p in section_schema("validate")["properties"].items()}
    ap.add_argument(
        "--max-content-chars",
        type=int,
        help=f"longer answers are quarantined (default {defaults['max_content_chars']})",
    )
    ap.add_argument(
        "--max-reasoning-chars",
        type=int,
        help=f"longer reasoning is quarantined (default {defaults['max_reasoning_chars']})",
    )
    ap.add_argument("--keep-truncated", action="store_true", help="do not quarantine truncated reasoning")
    ap.add_argument(
        "--schema", default=str(DEFAULT_SCHEMA_PATH), help="record JSON schema (default: the bundled one)"
    )
    args = ap.parse_args(argv)
    given = {"max_content_chars": args.max_content_chars, "max_reasoning_chars": args.max_reasoning_chars}
    config = ValidateConfig.from_dict(
        {
            **{k: v for k, v in given.items() if v is not None},  # the rest: the schema's defaults
            "quarantine_truncated": not args.keep_truncated,
        }
    )
    stats = validate_shard(args.records, args.valid, args.quarantine, config, schema_path=args.schema)
    print(orjson.dumps(stats.to_json()).decode())
    return 0
