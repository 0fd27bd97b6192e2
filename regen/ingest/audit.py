"""The pre-generation audit: per-sample flags, dataset-level summary, gates.

Flags (a sample may carry several):

* ``bad_row``: the row could not be read at all (``regen.ingest.dataset`` collected a BadRow);
* ``structure_error``: the conversation breaks the role rules below, has empty or
  non-text content, an unknown role, or repeats an earlier sample's id;
* ``over_length``: the prompt (conversation up to the last assistant turn, plus the
  generation prompt) has more tokens than ``context_limit``;
* ``duplicate_prompt``: the prompt messages equal an earlier sample's (first one kept);
* ``contaminated``: a prompt turn shares an n-gram with a benchmark prompt named in
  ``audit.decontamination`` (``regen.ingest.decontam``); the detail names the benchmark and item;
* ``whitespace_duplicate_prompt``: the prompt equals an earlier sample's except for whitespace
  (compared with all whitespace left out); kept by default, excluded when listed in ``exclude``;
* ``empty_response``: every assistant turn is template scaffolding only (an empty think
  block and end-of-turn, or nothing); for tokenized rows also when the row's own loss
  mask sums to at most ``scaffolding_max_tokens``. Samples without any assistant turn
  (prompt-only rows) have no old answer and are not flagged.

Empty old answers are also counted one by one, by fate under ``generate.regenerate``
(``EmptyAnswers``): in turns this run regenerates (replaced, so reported and never blocking), in
turns kept as context (with ``last``, every assistant turn but a final one; with ``all``, none), and
in excluded samples. The gate ``max_empty_response_fraction`` judges only what stays: the fraction of
samples that keep an empty old answer as context.

Every input row gets exactly one verdict: unreadable rows under a placeholder id
(``row/<n>:<file>``; real ids cannot contain ``/``), the rest under their id. A file whose tail
cannot be read (truncated compression, I/O error, broken structure) fails the gate
``max_unread_tail_files`` (0 by default) with how much was unread, and a dataset with no sample
left for generation fails whatever the gates say: both before any server starts.

Content that is a list with non-text parts is a ``non_text_content`` fault naming the part types;
an over-long row (more characters than ``context_limit`` tokens could hold under the tokenizer's
longest token) is flagged ``over_length`` without being tokenized, so one huge line costs memory in
proportion to its size, not to its token count.

Role rules: ``system`` (or ``developer``, for templates that render it) only at index 0; after
it the conversation starts with ``user``; ``user`` and ``assistant`` alternate (two users or two
assistants in a row are a fault);
``tool`` turns may follow an assistant turn or another tool turn, and the turn after
tool results is ``assistant`` or ``tool``. ``user``/``tool`` content must be non-empty text;
system content may be empty; assistant content may be empty (that is ``empty_response``).

The same code audits any stream of ``Sample``s (``Auditor`` / ``audit_records``), so the
merged output can be re-audited without a file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from regen.ingest.audit_config import AuditConfig, regenerate_setting
from regen.ingest.audit_run import FlagsWriter, run_audit
from regen.ingest.audit_summary import (
    GATE_MEANING,
    AuditGateError,
    AuditSummary,
    EmptyAnswers,
    GateResult,
    NothingToGenerateError,
    format_summary,
    gate_failure_message,
    summary_from_file,
)
from regen.ingest.auditor import Auditor, audit_records, iter_audits
from regen.ingest.dataset import DatasetConfig
from regen.ingest.decontam import BenchmarkSpec
from regen.ingest.flags import CONTAMINATED, EMPTY_RESPONSE, FLAG_NAMES, SampleAudit, structure_faults
from regen.layout.beside import AuditFiles
from regen.runconfig import section_schema
from regen.types import BadInputError

# the names other code imports from here (the audit's public face)
__all__ = [
    "CONTAMINATED",
    "EMPTY_RESPONSE",
    "FLAG_NAMES",
    "GATE_MEANING",
    "AuditConfig",
    "AuditGateError",
    "AuditSummary",
    "Auditor",
    "EmptyAnswers",
    "FlagsWriter",
    "GateResult",
    "NothingToGenerateError",
    "SampleAudit",
    "audit_records",
    "cli",
    "format_summary",
    "iter_audits",
    "run_audit",
    "structure_faults",
]


def _parser() -> argparse.ArgumentParser:
    """``regen audit``'s options; an option's default and choices are its config key's, from the schema."""
    dataset_keys = section_schema("dataset")["properties"]
    audit_keys = section_schema("audit")["properties"]
    ngram = audit_keys["decontamination"]["properties"]["ngram"]
    parser = argparse.ArgumentParser(
        prog="regen audit", description="Audit a chat dataset before regeneration."
    )
    parser.add_argument(
        "input",
        help="dataset file (.jsonl, .json, .parquet, .csv, .arrow) or folder (a datasets save_to_disk "
        "folder, or Parquet shards as the Hub stores them)",
    )
    parser.add_argument(
        "--format",
        choices=dataset_keys["format"]["enum"],
        dest="fmt",
        help=f"row format of INPUT (default: {dataset_keys['format']['default']}, detected per row)",
    )
    parser.add_argument(
        "--tokenizer",
        default=section_schema("tokenizer")["default"],
        help="tokenizer directory (default: %(default)s)",
    )
    parser.add_argument(
        "--context-limit",
        type=int,
        help="longer prompts (tokens) are flagged over_length "
        f"(default {audit_keys['context_limit']['default']})",
    )
    parser.add_argument(
        "--scaffolding-max-tokens",
        type=int,
        help="an old answer with at most this many supervised tokens beyond the template scaffolding "
        f"is flagged empty_response (default {audit_keys['scaffolding_max_tokens']['default']})",
    )
    parser.add_argument("--id-column", help="column with a stable sample id (default: hash the content)")
    parser.add_argument(
        "--on-bad-row",
        choices=dataset_keys["on_bad_row"]["enum"],
        help="skip: record unreadable rows and go on; stop: fail at the first "
        f"(default {dataset_keys['on_bad_row']['default']})",
    )
    parser.add_argument(
        "--regenerate",
        choices=regenerate_setting()["enum"],
        default=None,
        help="the run's generate.regenerate: which old answers are replaced, so which empty ones the gate "
        "max_empty_response_fraction judges (only those kept as context); default: "
        f"{regenerate_setting()['default']}, assumed and said so",
    )
    parser.add_argument("--override-gates", action="store_true", help="report failed gates as warnings")
    parser.add_argument(
        "--benchmark",
        action="append",
        default=[],
        metavar="NAME=PATH[:FIELD]",
        help="flag samples sharing an n-gram with this benchmark's prompts (.jsonl, .jsonl.gz, .json, "
        ".parquet; FIELD defaults to 'prompt'); repeatable",
    )
    parser.add_argument(
        "--ngram",
        type=int,
        help=f"words per n-gram for --benchmark matching (default {ngram['default']})",
    )
    parser.add_argument("--out", required=True, help="output directory")
    return parser


def cli(argv: list[str]) -> int:
    """``regen audit INPUT --out DIR``: audit a dataset, print a summary table, write DIR/summary.json.

    An option not given takes the schema's default for its config key (``dataset``, ``audit``)."""
    args = _parser().parse_args(argv)

    def given(**options: Any) -> dict[str, Any]:
        return {k: v for k, v in options.items() if v is not None}  # the rest: the schema's defaults

    try:
        benchmarks = [BenchmarkSpec.parse(b).to_json() for b in args.benchmark]
        config = AuditConfig.from_dict(
            given(
                context_limit=args.context_limit,
                scaffolding_max_tokens=args.scaffolding_max_tokens,
                override_gates=args.override_gates,
                decontamination=given(benchmarks=benchmarks, ngram=args.ngram),
            ),
            args.regenerate,
        )
        dataset = DatasetConfig.from_dict(
            given(path=args.input, format=args.fmt, id_column=args.id_column, on_bad_row=args.on_bad_row)
        )
        summary = run_audit(args.input, args.out, config, args.tokenizer, dataset)
    except (BadInputError, OSError, ValueError) as exc:  # bad input, missing file, directory, bad template
        print(f"regen audit: {exc}", file=sys.stderr)
        return 2
    except AuditGateError as exc:
        summary_path = AuditFiles(Path(args.out)).summary
        if summary_path.is_file():
            print(format_summary(summary_from_file(summary_path)))
        print(f"\n{exc}", file=sys.stderr)
        return 1
    print(format_summary(summary))
    if not summary.passed:
        print("\n" + gate_failure_message(summary), file=sys.stderr)
        print("(gates overridden: continuing)", file=sys.stderr)
    print(f"\nwrote {AuditFiles(Path(args.out)).summary}")
    return 0
