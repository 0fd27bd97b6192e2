"""Issue 47 item 6: a JSONL copy cut short mid-line (no line end, broken JSON) is lost input that the
unread-tail gate fails by default, naming file and byte offset; a valid last line without a line end is
read as any other."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import orjson
import pytest

from regen.ingest.audit import AuditConfig, AuditGateError, cli, run_audit
from regen.ingest.dataset import DatasetConfig, iter_samples
from regen.types import BadRow

ROWS = 400


def _jsonl(n: int = ROWS) -> bytes:
    rows = (
        {
            "id": f"r{i}",
            "messages": [{"role": "user", "content": f"q {i}?"}, {"role": "assistant", "content": "a"}],
        }
        for i in range(n)
    )
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def _cut(data: bytes) -> tuple[bytes, int]:
    """``data`` cut in the middle of its last line, and the byte where that line starts."""
    last_start = data.rindex(b"\n", 0, len(data) - 1) + 1
    return data[: last_start + (len(data) - last_start) // 2], last_start


def _audit(path: Path, out: Path, tokenizer: Path, **cfg: object) -> None:
    run_audit(
        path,
        out,
        AuditConfig.from_dict(dict(cfg)),
        tokenizer,
        DatasetConfig.from_dict({"path": str(path), "id_column": "id"}),
    )


def test_cut_last_line_fails_the_audit_naming_file_and_byte(tmp_path: Path, demo_tokenizer_dir: Path) -> None:
    cut, offset = _cut(_jsonl())
    path = tmp_path / "copy.jsonl"
    path.write_bytes(cut)
    with pytest.raises(AuditGateError) as err:
        _audit(path, tmp_path / "audit", demo_tokenizer_dir)
    message = str(err.value)
    assert "max_unread_tail_files" in message and str(path) in message
    assert f"row {ROWS - 1}" in message and f"byte {offset:,}" in message and "ends mid-line" in message
    summary = orjson.loads((tmp_path / "audit" / "summary.json").read_bytes())
    assert summary["gates"]["max_unread_tail_files"] == {"limit": 0, "value": 1.0, "passed": False}
    # an explicit allowance lets the 399 complete rows go on, the cut one excluded with its reason
    _audit(path, tmp_path / "ok", demo_tokenizer_dir, gates={"max_unread_tail_files": 1})
    excluded = [orjson.loads(x) for x in (tmp_path / "ok" / "excluded.jsonl").read_bytes().splitlines()]
    assert [(e["row"], e["reason"]) for e in excluded] == [(ROWS - 1, "bad_row")]


def test_cut_last_line_through_the_cli(tmp_path: Path, demo_tokenizer_dir: Path, capsys) -> None:
    cut, offset = _cut(_jsonl(20))
    path = tmp_path / "copy.jsonl"
    path.write_bytes(cut)
    code = cli(
        [str(path), "--tokenizer", str(demo_tokenizer_dir), "--out", str(tmp_path / "a"), "--id-column", "id"]
    )
    err = capsys.readouterr().err
    assert code != 0 and "max_unread_tail_files" in err and f"byte {offset:,}" in err and str(path) in err


def test_cut_last_line_in_gzip_names_the_decompressed_byte(tmp_path: Path) -> None:
    cut, offset = _cut(_jsonl(30))
    path = tmp_path / "copy.jsonl.gz"
    path.write_bytes(gzip.compress(cut, mtime=0))  # a whole gzip stream of a cut copy
    bad: list[BadRow] = []
    samples = list(iter_samples(path, "auto", "id", "skip", bad_rows=bad))
    assert len(samples) == 29 and len(bad) == 1 and bad[0].unread_tail
    assert f"byte {offset:,} of the decompressed data" in bad[0].problem


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"])
def test_valid_last_line_without_line_end_is_read(tmp_path: Path, ending: bytes) -> None:
    data = _jsonl(5).replace(b"\n", ending)
    path = tmp_path / "rows.jsonl"
    path.write_bytes(data[: -len(ending)])
    bad: list[BadRow] = []
    samples = list(iter_samples(path, "auto", "id", "skip", bad_rows=bad))
    assert bad == [] and [s.id for s in samples] == [f"r{i}" for i in range(5)]


def test_bad_row_with_line_end_stays_one_bad_row(tmp_path: Path) -> None:
    """Broken JSON on a line that ends (here the last one) is one unreadable row, not lost input."""
    path = tmp_path / "rows.jsonl"
    path.write_bytes(_jsonl(3) + b'{"id": "x", "messages": [\n')
    bad: list[BadRow] = []
    samples = list(iter_samples(path, "auto", "id", "skip", bad_rows=bad))
    assert len(samples) == 3 and [(b.row, b.unread_tail) for b in bad] == [(3, False)]


def test_cut_old_mac_line_is_lost_input(tmp_path: Path) -> None:
    cut, offset = _cut(_jsonl(4))
    cut = cut.replace(b"\n", b"\r")
    path = tmp_path / "mac.jsonl"
    path.write_bytes(cut)
    bad: list[BadRow] = []
    samples = list(iter_samples(path, "auto", "id", "skip", bad_rows=bad))
    assert len(samples) == 3 and [(b.row, b.unread_tail) for b in bad] == [(3, True)]
    assert f"byte {offset:,}" in bad[0].problem


def test_the_workflow_console_names_the_cut(tmp_path: Path) -> None:
    """Through Snakemake, as issue 47 ran it: a 400-row copy cut mid-line fails the audit, and what the
    user reads on the console names the file, the gate and the byte where the cut line starts."""
    from support.workflow import copy_workflow, snakemake

    wd = copy_workflow(tmp_path / "wf")
    cut, offset = _cut(_jsonl())
    (wd / "data" / "cut.jsonl").write_bytes(cut)
    (wd / "config" / "cut.yaml").write_text("dataset: {path: data/cut.jsonl}\n")
    run = snakemake(
        wd, "--cores", "2", "--configfile", "config/demo.yaml", "config/cut.yaml", "--until", "audit"
    )
    console = run.stdout + run.stderr
    assert run.returncode != 0
    for needle in ("max_unread_tail_files", "data/cut.jsonl: row 399", f"byte {offset:,}", "ends mid-line"):
        assert needle in console, (needle, console[-3000:])
    assert not (wd / "results" / "audit" / "summary.json").exists()
