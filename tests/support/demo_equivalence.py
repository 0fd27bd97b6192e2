"""Proof that a refactor left the demo's results unchanged: digest the demo run of a revision, compare two.

    python tests/support/demo_equivalence.py digest REV --out DIGEST.json [--repo /work/main] [--keep]
    python tests/support/demo_equivalence.py compare BASELINE.json CANDIDATE.json
    python tests/support/demo_equivalence.py rescan KEPT_CLONE --out DIGEST.json

``digest`` clones ``--repo`` at ``REV`` into a temporary directory (``git clone --shared``, then a detached
checkout) and runs the demo there as the Makefile's ``demo`` target does, with the Python environment this
script runs under (its ``bin/``: snakemake, regen) and ``PYTHONPATH`` pointing at the clone::

    snakemake -n --cores 2 --configfile config/demo.yaml          (fresh directory: what the plan says)
    snakemake --cores 2 --configfile config/demo.yaml
    snakemake --cores 2 --configfile config/demo.yaml --report results/report.html
    regen reconcile --results results
    snakemake -n --cores 2 --configfile config/demo.yaml          (finished run: nothing to do)

It writes one JSON digest: per output file a canonical digest of its contents (tables: Parquet rows read with
pyarrow, JSON Lines rows, decompressed ``.jsonl.zst`` rows, all sorted by id; JSON documents; text pages),
with the fields that vary between two runs of one revision dropped or normalised (``VOLATILE`` below, each
with why), plus the normalised ``snakemake -n`` summaries (job counts per rule, the reasons, regen's plan
lines) and ``regen reconcile``'s output. Tables also keep a digest per row (by id) and per column, so
``compare`` can say which rows and fields changed. ``rescan`` digests a run kept by ``digest --keep`` again
without rerunning it.

``compare`` prints every difference and ends with exactly one line ``equivalence: files=N identical=I
differ=D`` (exit status 1 when D > 0). Entries marked informational (the dry run's per-job file lists, the
report's rule graph and rule inputs/outputs: a change that declares more inputs is expected to alter them) are
printed but not counted.

A test-support tool (not a bench, not product): run it under the repository's venv, e.g.
``.venv/bin/python tests/support/demo_equivalence.py digest HEAD --out /tmp/head.json``.
"""

from __future__ import annotations

import argparse
import base64
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT = "regen-demo-digest/1"
DEMO_CONFIG = "config/demo.yaml"
CORES = "2"

# What is digested: every file under results/, the verdict files under logs/ and the realized server plans the
# report reads. Left out, and why: logs/*.log and logs/*/*.log (timings, ports, pids, retry chatter);
# work/journal/ (per-attempt records with wall-clock times; their answers are in results/generations/);
# work/status/ (throughput, ETA and update times of the live progress line); work/servers/*.progress.json,
# *.lease, *.lock (runtime state of the simulated servers); .snakemake/ and benchmarks/ (Snakemake's own
# metadata and timings).
DIGESTED = ("results/**/*", "logs/*.verdict.json", "work/servers/*.realized.json")


@dataclass(frozen=True)
class Volatile:
    """A field that differs between two runs of the same revision, in the files ``glob`` matches: dropped, or
    (with ``pattern``) rewritten with ``repl``. ``key`` is a column or a JSON key at any depth; ``"*"`` drops
    the whole content (only the file's presence counts)."""

    glob: str
    key: str  # "server.id": that path from a row's (or document's) root; "timings": that key at any depth
    why: str
    pattern: str | None = None
    repl: str = ""


# Found by running the demo of one revision twice and comparing (``digest --keep`` twice, then ``rescan`` and
# ``compare``). Row order is not compared either: generations, valid shards, the merged Parquet and the
# exports hold their rows in the order requests completed, which the two simulated servers decide; tables are
# sorted by id.
VOLATILE: tuple[Volatile, ...] = (
    Volatile(
        "results/generations/*", "timings", "wall-clock start (started_at) and latency_s of each request"
    ),
    Volatile("results/quarantine/*", "timings", "the quarantined record's wall-clock start and latency"),
    Volatile(
        "results/quarantine/*",
        "detail",
        "names the record's line in its generations file, which holds records in completion order",
        r": line \d+: ",
        ": line <n>: ",
    ),
    Volatile(
        "results/generations/*",
        "server.id",
        "which GPU's server answered a shard: a shard job takes the first free gpu{k}.lock, so two runs may "
        "swap shards between gpu0 and gpu1 (the answers do not depend on it)",
    ),
    Volatile("results/quarantine/*", "record.server.id", "the same, for quarantined records"),
    Volatile("results/valid/*", "server_id", "the same, in the valid shards"),
    Volatile("results/valid/*", "started_at", "wall-clock start of each request"),
    Volatile("results/valid/*", "latency_s", "the request's measured latency"),
    Volatile("results/dataset/_manifest.json", "created_at", "wall-clock time of the merge"),
    Volatile("results/dataset/_manifest.json", "merged_at", "wall-clock time of the merge (provenance)"),
    Volatile("results/dataset/_manifest.json", "generation_started_at", "wall-clock time (provenance)"),
    Volatile("results/dataset/_manifest.json", "generation_ended_at", "wall-clock time (provenance)"),
    Volatile(
        "results/dataset/_manifest.json",
        "sha256",
        "hash of the Parquet file's bytes, whose rows are in completion order (the rows are digested, by id, "
        "in results/dataset/part-*.parquet)",
    ),
    Volatile(
        "results/dataset/_manifest.json", "bytes", "size of that Parquet file (row order changes encoding)"
    ),
    Volatile(
        "results/READY.json", "manifest_sha256", "the same Parquet byte hashes as in the dataset manifest"
    ),
    Volatile(
        "work/servers/*.realized.json", "written_at", "wall-clock time the server's realized plan was written"
    ),
    Volatile(
        "results/report/throughput.svg",
        "*",
        "tokens per second over wall-clock time: the measured speed of this run (its inputs, records' start "
        "times and latencies, are volatile above)",
    ),
)

# Rewritten in every string (JSON values, text files, snakemake output), after the clone's own path (<ROOT>)
# and the venv's (<VENV>).
SUBSTITUTIONS: tuple[tuple[str, str, str], ...] = (
    (
        r"127\.0\.0\.1:\d+",
        "127.0.0.1:<port>",
        "a simulated server takes another free port when port_base + slot is held (another run on the host)",
    ),
)

# Matplotlib SVGs: a creation date, and clip-path/marker ids drawn from a per-process random salt (renamed in
# the order they first appear, so the drawing itself is still compared).
_SVG_DATE = re.compile(r"\s*<dc:date>[^<]*</dc:date>")
_SVG_ID = re.compile(r"\b[pm][0-9a-f]{10}\b")


def _svg(text: str) -> str:
    text = _SVG_DATE.sub("", text)
    names: dict[str, str] = {}
    return _SVG_ID.sub(lambda m: names.setdefault(m.group(0), f"{m.group(0)[0]}id{len(names)}"), text)


# Snakemake's report (results/report.html): what is compared is what it says, not how Snakemake renders a run.
# Checked: the landing page (the workflow description: the verdicts), the categories, and every result's name,
# labels, caption and MIME type. Left out: each result's embedded copy (data_uri: the files are digested on
# their own) and size, the job properties (a rule's params as Snakemake prints them), the run times and
# timeline (wall clock), the rules' code, the package list and licences; the rule graph and the rules'
# input/output lists are informational (a change that declares more inputs alters them).
_REPORT_SCRIPT = re.compile(r'<script id="([\w-]+)"[^>]*>\s*var \w+ = (.*?);?\s*</script>', re.S)
_REPORT_RESULT_KEYS = ("name", "filename", "labels", "caption", "mime_type")


def _report(html: str, norm: Normaliser) -> tuple[dict[str, Any], dict[str, Any]]:
    scripts = {
        m.group(1): json.loads(m.group(2)) for m in _REPORT_SCRIPT.finditer(html) if m.group(1) != "logo"
    }
    results = {
        key: {k: r.get(k) for k in _REPORT_RESULT_KEYS} | {"rule": r.get("job_properties", {}).get("rule")}
        for key, r in scripts["results"].items()
    }
    checked = {
        "landing": scripts["workflow-desc"],
        "categories": {c: {s: sorted(v) for s, v in sub.items()} for c, sub in scripts["categories"].items()},
        "results": results,
    }
    rules = {r: {k: v.get(k) for k in ("input", "output")} for r, v in scripts["rules"].items()}
    info = {"rulegraph": scripts["rulegraph"], "rules": rules}
    return norm.value(checked), norm.value(info)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _canon(value: Any) -> bytes:
    """Canonical bytes of a JSON-like value: sorted keys, exact float repr, bytes as base64."""

    def default(obj: Any) -> Any:
        if isinstance(obj, bytes | bytearray):
            return {"__bytes__": base64.b64encode(bytes(obj)).decode()}
        if hasattr(obj, "isoformat"):
            return {"__time__": obj.isoformat()}
        raise TypeError(f"demo_equivalence: cannot digest {type(obj).__name__}: {obj!r}")

    return json.dumps(
        value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=default
    ).encode()


class Normaliser:
    """Drops the volatile fields of one file and rewrites run-specific strings (the clone's path, ports)."""

    def __init__(self, rel: str, root: Path, venv: Path) -> None:
        self.rel = rel
        mine = [v for v in VOLATILE if fnmatch.fnmatch(rel, v.glob)]
        self.drop = {v.key for v in mine if v.pattern is None}
        self.rewrite = {v.key: (re.compile(v.pattern), v.repl) for v in mine if v.pattern is not None}
        self.subs = [
            (re.compile(re.escape(str(root))), "<ROOT>"),
            (re.compile(re.escape(str(venv))), "<VENV>"),
        ]
        self.subs += [(re.compile(pattern), repl) for pattern, repl, _why in SUBSTITUTIONS]

    @property
    def whole_file_volatile(self) -> bool:
        return "*" in self.drop

    def text(self, s: str) -> str:
        for pattern, repl in self.subs:
            s = pattern.sub(repl, s)
        return s

    def dropped(self, key: str, at: str) -> bool:
        """A bare key is dropped at any depth, a dotted one (``server.id``) at that path from a row's root."""
        return key in self.drop or f"{at}{key}" in self.drop

    def value(self, v: Any, at: str = "") -> Any:
        if isinstance(v, dict):
            return {k: self._field(k, x, at) for k, x in v.items() if not self.dropped(k, at)}
        if isinstance(v, list | tuple):
            return [self.value(x, at) for x in v]
        if isinstance(v, str):
            return self.text(v)
        return v

    def _field(self, key: str, v: Any, at: str) -> Any:
        if key in self.rewrite and isinstance(v, str):
            pattern, repl = self.rewrite[key]
            v = pattern.sub(repl, v)
        return self.value(v, f"{at}{key}.")


def _rows_entry(rows: list[dict[str, Any]], norm: Normaliser, schema: list[str] | None) -> dict[str, Any]:
    """A table: rows sorted by id; digests of the whole, of each row (by id) and of each column."""
    clean = [norm.value(r) for r in rows]
    clean.sort(key=lambda r: (str(r.get("id")), _canon(r)))
    seen: Counter[str] = Counter()
    row_digests: dict[str, str] = {}
    for r in clean:
        rid = str(r.get("id"))
        seen[rid] += 1
        row_digests[rid if seen[rid] == 1 else f"{rid}#{seen[rid]}"] = _sha(_canon(r))[:16]
    columns = sorted({k for r in clean for k in r})
    col_digests = {c: _sha(_canon([r.get(c) for r in clean]))[:16] for c in columns}
    entry: dict[str, Any] = {
        "kind": "table",
        "rows": len(clean),
        "columns": col_digests,
        "row_digests": row_digests,
    }
    if schema is not None:
        entry["schema"] = schema
    entry["digest"] = _sha(_canon({k: entry[k] for k in ("rows", "columns", "schema") if k in entry}))
    return entry


def _json_lines(data: bytes, rel: str) -> list[dict[str, Any]]:
    rows = []
    for n, line in enumerate(data.splitlines(), 1):
        if line.strip():
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError(f"{rel}: line {n}: a JSON Lines row that is not an object")
            rows.append(row)
    return rows


def digest_file(path: Path, rel: str, norm: Normaliser) -> dict[str, Any]:
    """The canonical digest of one output file, by what it holds."""
    if norm.whole_file_volatile:
        return {"kind": "present", "digest": "present"}
    name = path.name
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        keep = [c for c in table.column_names if c not in norm.drop]
        schema = [f"{f.name}: {f.type}" for f in table.schema if f.name in keep]
        meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
        entry = _rows_entry(
            table.select(keep).to_pylist(), norm, schema + [f"metadata {k}={v}" for k, v in meta.items()]
        )
        return entry
    data = path.read_bytes()
    if name.endswith(".zst"):
        import zstandard

        with zstandard.ZstdDecompressor().stream_reader(path.open("rb")) as reader:
            data = reader.read()
        name = name[: -len(".zst")]
    if name.endswith(".jsonl"):
        return _rows_entry(_json_lines(data, rel), norm, None)
    if name.endswith(".json"):
        value = norm.value(json.loads(data))
        return {"kind": "json", "digest": _sha(_canon(value)), "value": value}
    if not data:
        return {"kind": "empty", "digest": _sha(b"")}
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return {"kind": "bytes", "digest": _sha(data)}
    if name == "report.html":
        checked, info = _report(text, norm)
        return {"kind": "json", "digest": _sha(_canon(checked)), "value": checked, "informational": info}
    text = norm.text(text)
    if name.endswith(".svg"):
        text = _svg(text)
    return {"kind": "text", "digest": _sha(text.encode()), "lines": text.splitlines()}


def _collect(run_dir: Path) -> list[str]:
    rels = set()
    for pattern in DIGESTED:
        for p in run_dir.glob(pattern):
            if p.is_file():
                rels.add(p.relative_to(run_dir).as_posix())
    return sorted(rels)


# --- snakemake -n -------------------------------------------------------------------------------------------

_JOB_HEAD = re.compile(r"^(\s*)(?:localrule|rule) (\S+):$")  # indented inside a group job
_GROUP_HEAD = re.compile(r"\] Group job (\S+) ")
_STATS_ROW = re.compile(r"^(\S+)\s+(\d+)$")
_JOB_FILE_KEYS = ("input", "output", "log", "benchmark")


def _split_files(s: str) -> list[str]:
    return sorted(x.strip() for x in s.split(",") if x.strip())


def _job(lines: list[str], i: int, rule: str, indent: int, group: str | None) -> tuple[dict, dict, int]:
    """The job block whose head is line ``i - 1``: (checked, informational, index after the block)."""
    job: dict[str, Any] = {"rule": rule, "group": group}
    io: dict[str, Any] = {"rule": rule}
    while i < len(lines) and lines[i].startswith(" " * (indent + 4)):
        key, _, val = lines[i].strip().partition(": ")
        if key == "reason":
            parts = sorted(
                (kind.strip(), _split_files(rest))
                for kind, _, rest in (r.partition(":") for r in val.split("; "))
            )
            job["reason"] = [kind for kind, _ in parts]
            io["reason"] = parts
        elif key == "wildcards":
            job["wildcards"] = io["wildcards"] = val
        elif key == "resources":  # tmpdir is the host's
            job["resources"] = sorted(r for r in _split_files(val) if not r.startswith("tmpdir="))
        elif key in _JOB_FILE_KEYS:
            io[key] = _split_files(val)
        i += 1
    return job, io, i


def parse_dry_run(text: str, norm: Normaliser) -> tuple[dict[str, Any], dict[str, Any]]:
    """(checked, informational) summaries of ``snakemake -n`` output.

    Checked: the job count per rule, every job's rule, group, wildcards, resources and reasons (their
    kinds), the closing "Reasons:" table (kind -> rules), regen's own lines (fingerprint, how many samples
    are replayed or generated, and the indented lines under them that say why) and the closing sentence.
    Informational: every job's input/output/log/benchmark files and the files its reasons name (a change
    that declares more inputs alters them). Left out: Snakemake's header (date, host, user, paths, workflow
    id) and timestamps."""
    lines = norm.text(text).splitlines()
    counts: dict[str, int] = {}
    jobs: list[dict[str, Any]] = []
    files: list[dict[str, Any]] = []
    regen_lines: list[str] = []
    reasons_table: dict[str, list[str]] = {}
    closing: list[str] = []
    group: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if head := _JOB_HEAD.match(line):
            indent = len(head.group(1))
            job, io, i = _job(lines, i + 1, head.group(2), indent, group if indent else None)
            jobs.append(job)
            files.append(io)
            continue
        if g := _GROUP_HEAD.search(line):
            group = g.group(1)
        elif line.startswith("Job stats:"):
            i += 3  # the header and the rule of dashes
            while i < len(lines) and (m := _STATS_ROW.match(lines[i])):
                counts[m.group(1)] = int(m.group(2))
                i += 1
            continue
        elif line.startswith("Reasons:"):
            i += 1
            kind = None
            while i < len(lines) and lines[i].startswith("    "):
                if lines[i].startswith("        "):
                    if kind is None:
                        raise ValueError(f"snakemake -n: rules before a reason: {lines[i]!r}")
                    reasons_table[kind] = _split_files(lines[i])
                elif not lines[i].strip().startswith("("):
                    kind = lines[i].strip().rstrip(":")
                i += 1
            continue
        elif line.startswith("regen"):
            regen_lines.append(line)
            i += 1
            while i < len(lines) and lines[i].startswith("  ") and not _JOB_HEAD.match(lines[i]):
                regen_lines.append(lines[i])  # regen's reasons under its line ("  298 new (never generated)")
                i += 1
            continue
        elif line.startswith(("Nothing to be done", "This was a dry-run")):
            closing.append(line)
        i += 1
    checked = {
        "job_counts": counts,
        "jobs": sorted(jobs, key=_canon),
        "reasons": reasons_table,
        "regen": regen_lines,
        "closing": closing,
    }
    return checked, {"job_files": sorted(files, key=_canon)}


# --- running the demo ---------------------------------------------------------------------------------------


def _run(argv: list[str], cwd: Path, env: dict[str, str], log: Path) -> str:
    proc = subprocess.run(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False
    )
    out = proc.stdout.decode(errors="replace")
    log.write_text(out)
    if proc.returncode != 0:
        raise SystemExit(f"demo_equivalence: {' '.join(argv)} failed ({proc.returncode}) in {cwd}; see {log}")
    return out


def clone_at(repo: Path, rev: str, dest: Path) -> str:
    """``dest`` holds ``repo`` at ``rev`` (detached); returns the full commit id."""
    sha = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    subprocess.run(["git", "clone", "-q", "--shared", "--no-checkout", str(repo), str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "checkout", "-q", "--detach", sha], check=True)
    return sha


def run_demo(clone: Path, venv: Path) -> dict[str, str]:
    """Runs the demo in ``clone``; returns the outputs of the commands whose text is digested."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(clone)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    logs = clone / "equivalence-logs"
    logs.mkdir()
    where = _run(
        [str(venv / "bin" / "python"), "-c", "import regen; print(regen.__file__)"],
        clone,
        env,
        logs / "which",
    )
    if not Path(where.strip()).resolve().is_relative_to(clone.resolve()):
        raise SystemExit(f"demo_equivalence: regen imports from {where.strip()}, not from the clone {clone}")
    snakemake = [str(venv / "bin" / "snakemake"), "--cores", CORES, "--configfile", DEMO_CONFIG]
    out = {"dryrun/fresh": _run([*snakemake, "-n"], clone, env, logs / "dryrun-fresh.txt")}
    _run(snakemake, clone, env, logs / "run.txt")
    _run([*snakemake, "--report", "results/report.html"], clone, env, logs / "report.txt")
    out["cli/reconcile"] = _run(
        [str(venv / "bin" / "regen"), "reconcile", "--results", "results"], clone, env, logs / "reconcile.txt"
    )
    out["dryrun/finished"] = _run([*snakemake, "-n"], clone, env, logs / "dryrun-finished.txt")
    return out


def digest_run(clone: Path, venv: Path, outputs: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    entries: dict[str, Any] = {}
    informational: dict[str, Any] = {}
    for rel in _collect(clone):
        entries[rel] = digest_file(clone / rel, rel, Normaliser(rel, clone, venv))
        if "informational" in entries[rel]:
            info = entries[rel].pop("informational")
            informational[rel] = {"kind": "json", "digest": _sha(_canon(info)), "value": info}
    for name, text in outputs.items():
        norm = Normaliser(name, clone, venv)
        if name.startswith("dryrun/"):
            checked, info = parse_dry_run(text, norm)
            entries[name] = {"kind": "dryrun", "digest": _sha(_canon(checked)), "value": checked}
            informational[f"{name}/job_files"] = {"kind": "json", "digest": _sha(_canon(info)), "value": info}
        else:
            lines = norm.text(text).splitlines()
            entries[name] = {"kind": "text", "digest": _sha(_canon(lines)), "lines": lines}
    return entries, informational


def cmd_digest(args: argparse.Namespace) -> int:
    venv = Path(sys.prefix)
    work = Path(tempfile.mkdtemp(prefix="demo-equivalence-", dir=args.tmp))
    clone = work / "regen"
    done = False
    try:
        sha = clone_at(args.repo.resolve(), args.rev, clone)
        print(f"demo_equivalence: {args.rev} = {sha}, running the demo in {clone}", file=sys.stderr)
        entries, informational = digest_run(clone, venv, run_demo(clone, venv))
        done = True
    finally:
        if args.keep or not done:  # a failed run stays, with its logs, for reading
            print(f"demo_equivalence: kept {clone}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return write_digest(args.out, sha, entries, informational)


def cmd_rescan(args: argparse.Namespace) -> int:
    """Digests a run kept by ``digest --keep`` again (after a change to ``VOLATILE``) without rerunning it."""
    clone = args.clone.resolve()
    sha = subprocess.run(
        ["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    )
    logs = clone / "equivalence-logs"
    outputs = {
        "dryrun/fresh": (logs / "dryrun-fresh.txt").read_text(),
        "cli/reconcile": (logs / "reconcile.txt").read_text(),
        "dryrun/finished": (logs / "dryrun-finished.txt").read_text(),
    }
    entries, informational = digest_run(clone, Path(sys.prefix), outputs)
    return write_digest(args.out, sha.stdout.strip(), entries, informational)


def write_digest(out: Path, sha: str, entries: dict[str, Any], informational: dict[str, Any]) -> int:
    digest = {
        "format": FORMAT,
        "revision": sha,
        "commands": "snakemake -n; snakemake; snakemake --report; regen reconcile; snakemake -n",
        "volatile": [f"{v.glob} {v.key}: {v.why}" for v in VOLATILE],
        "substitutions": [f"{p} -> {r}: {why}" for p, r, why in SUBSTITUTIONS],
        "entries": entries,
        "informational": informational,
    }
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(digest, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    tmp.replace(out)
    print(f"demo_equivalence: {len(entries)} entries -> {out}", file=sys.stderr)
    return 0


# --- comparing ----------------------------------------------------------------------------------------------


def _json_diff(a: Any, b: Any, at: str = "") -> Iterable[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            here = f"{at}.{k}" if at else str(k)
            if k not in a:
                yield f"{here}: added {json.dumps(b[k])[:200]}"
            elif k not in b:
                yield f"{here}: removed (was {json.dumps(a[k])[:200]})"
            else:
                yield from _json_diff(a[k], b[k], here)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for n, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from _json_diff(x, y, f"{at}[{n}]")
    elif isinstance(a, str) and isinstance(b, str) and a != b:
        yield f"{at or '<value>'}: {_string_diff(a, b)}"
    elif a != b:
        yield f"{at or '<value>'}: {json.dumps(a)[:200]} -> {json.dumps(b)[:200]}"


def _string_diff(a: str, b: str, context: int = 60) -> str:
    """Where two strings part: the common prefix's tail, then each side's next characters."""
    start = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    lead = f"...{a[max(0, start - context) : start]!r} then" if start else "starts"
    return f"{lead} {a[start : start + context]!r} -> {b[start : start + context]!r} (at character {start})"


def _lines_diff(a: list[str], b: list[str]) -> Iterable[str]:
    import difflib

    for line in difflib.unified_diff(a, b, "baseline", "candidate", lineterm="", n=1):
        yield line[:300]


def _table_diff(a: dict[str, Any], b: dict[str, Any]) -> Iterable[str]:
    if a["rows"] != b["rows"]:
        yield f"rows: {a['rows']} -> {b['rows']}"
    if a.get("schema") != b.get("schema"):
        yield from (f"schema {d}" for d in _json_diff(a.get("schema"), b.get("schema")))
    for col in sorted(set(a["columns"]) | set(b["columns"])):
        if a["columns"].get(col) != b["columns"].get(col):
            state = (
                "added" if col not in a["columns"] else "removed" if col not in b["columns"] else "differs"
            )
            yield f"column {col}: {state}"
    ra, rb = a["row_digests"], b["row_digests"]
    only_a, only_b = sorted(set(ra) - set(rb)), sorted(set(rb) - set(ra))
    changed = sorted(k for k in set(ra) & set(rb) if ra[k] != rb[k])
    for what, ids in (("only in baseline", only_a), ("only in candidate", only_b), ("changed", changed)):
        if ids:
            yield f"{len(ids)} rows {what}: {', '.join(ids[:10])}{' ...' if len(ids) > 10 else ''}"


def entry_diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    if a["kind"] != b["kind"]:
        return [f"kind {a['kind']} -> {b['kind']}"]
    if a["digest"] == b["digest"]:
        return []
    kind = a["kind"]
    if kind == "table":
        out = list(_table_diff(a, b))
    elif kind in ("json", "dryrun"):
        out = list(_json_diff(a["value"], b["value"]))
    elif kind == "text":
        out = list(_lines_diff(a["lines"], b["lines"]))
    else:
        out = []
    return out or ["contents differ"]


def _compare_section(
    a: dict[str, Any], b: dict[str, Any], say: Callable[[str], None]
) -> tuple[int, int, int]:
    names = sorted(set(a) | set(b))
    identical = 0
    for name in names:
        if name not in a:
            say(f"+ {name}: only in candidate ({b[name]['kind']})")
            continue
        if name not in b:
            say(f"- {name}: only in baseline ({a[name]['kind']})")
            continue
        diffs = entry_diff(a[name], b[name])
        if not diffs:
            identical += 1
            continue
        say(f"! {name}:")
        for d in diffs[:40]:
            say(f"    {d}")
        if len(diffs) > 40:
            say(f"    ... {len(diffs) - 40} more")
    return len(names), identical, len(names) - identical


def compare(a: dict[str, Any], b: dict[str, Any], say: Callable[[str], None] = print) -> int:
    """Prints the differences; returns how many checked entries differ (or are missing on one side)."""
    for d in (a, b):
        if d.get("format") != FORMAT:
            raise SystemExit(f"demo_equivalence: not a {FORMAT} digest (format {d.get('format')!r})")
    say(f"baseline  {a['revision']}")
    say(f"candidate {b['revision']}")
    if a["volatile"] != b["volatile"] or a["substitutions"] != b["substitutions"]:
        say("note: the two digests were made with different volatile-field lists")
    info_a, info_b = a.get("informational", {}), b.get("informational", {})
    if info_a != info_b:
        say("informational (not counted):")
        _compare_section(info_a, info_b, lambda s: say(f"  {s}"))
    files, identical, differ = _compare_section(a["entries"], b["entries"], say)
    say(f"equivalence: files={files} identical={identical} differ={differ}")
    return differ


def cmd_compare(args: argparse.Namespace) -> int:
    a = json.loads(args.baseline.read_text())
    b = json.loads(args.candidate.read_text())
    return 1 if compare(a, b) else 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("digest", help="run the demo at a revision and write its digest")
    d.add_argument("rev", help="a git revision of --repo")
    d.add_argument("--out", type=Path, required=True, help="where the digest JSON goes")
    d.add_argument(
        "--repo", type=Path, default=Path(__file__).resolve().parents[2], help="the repository to clone"
    )
    d.add_argument("--tmp", type=Path, default=None, help="where the temporary clone goes (default: $TMPDIR)")
    d.add_argument("--keep", action="store_true", help="keep the clone and its run (its path is printed)")
    d.set_defaults(fn=cmd_digest)
    r = sub.add_parser("rescan", help="digest a run kept by digest --keep again, without rerunning it")
    r.add_argument("clone", type=Path, help="the kept clone (digest --keep prints it)")
    r.add_argument("--out", type=Path, required=True)
    r.set_defaults(fn=cmd_rescan)
    c = sub.add_parser("compare", help="print the differences between two digests")
    c.add_argument("baseline", type=Path)
    c.add_argument("candidate", type=Path)
    c.set_defaults(fn=cmd_compare)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
