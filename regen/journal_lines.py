"""The journal's line format at ground level: the two entry kinds and the one torn-line rule.

``regen.generate.journal`` (the per-shard journal), ``regen.storage`` (its S3 batches) and ``regen.records``
(the entries' shapes) all read or write these lines; this module is their one home, so ground-level
code never imports the journal itself.
"""

from __future__ import annotations

import orjson

#: ``"kind"`` of a journal line: a completed record, or a terminal failure
RECORD = "record"
FAILED = "failed"

_WHITESPACE = b" \t\n\r\x0b\x0c"  # what bytes.strip() strips


def _is_entry_like(raw: bytes) -> bool:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    return isinstance(obj, dict) and isinstance(obj.get("id"), str)


def complete_lines(data: bytes) -> tuple[list[tuple[int, int, bytes]], int]:
    """The journal's complete lines as ``(line number, byte offset, line without its newline)`` (blank
    lines skipped), and the byte offset where they end.

    The one torn-line rule (every reader of a journal uses it): a kill can tear only the last line,
    so the bytes after the last newline are torn, and so is a final line that is not a JSON object
    with a string ``id`` (a complete-looking but unreadable write). Linear in the size of ``data``.
    """
    lines: list[tuple[int, int, bytes]] = []
    content_end = len(data)  # a line ending at or after this is the last one (no copy of ``data``)
    while content_end and data[content_end - 1] in _WHITESPACE:
        content_end -= 1
    good_end = pos = lineno = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        lineno += 1
        if nl == -1:  # torn: no newline after the last line
            break
        raw = data[pos:nl]
        if raw and not raw.isspace():
            last = nl + 1 >= content_end
            if last and not _is_entry_like(raw):  # a complete-looking but unreadable final line: torn too
                break
            lines.append((lineno, pos, raw))
        pos = nl + 1
        good_end = pos
    return lines, good_end
