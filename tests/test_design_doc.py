"""docs/design.md names only what exists: every module path, dotted module name and ``module.name`` it
cites in backticks resolves (the file is there; the module imports; the name is an attribute of it)."""

from __future__ import annotations

import importlib
import re
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml


def _repo_root() -> Path:
    """The folder holding pyproject.toml, walking up from this file (wherever the tests are laid out)."""
    for folder in Path(__file__).resolve().parents:
        if (folder / "pyproject.toml").is_file():
            return folder
    raise RuntimeError(f"no pyproject.toml above {__file__}")


ROOT = _repo_root()
DESIGN = ROOT / "docs" / "design.md"
#: top-level folders of the repository whose files the doc may cite by path
REPO_DIRS = ("regen", "tests", "scripts", "schemas", "bench", "rules", "docs")
#: a dotted word ending in one of these is a file name (``summary.json``), not a module's attribute
FILE_EXTENSIONS = {
    "json",
    "jsonl",
    "parquet",
    "py",
    "yaml",
    "svg",
    "html",
    "zst",
    "lock",
    "tsv",
    "rst",
    "md",
    "txt",
}

_SPAN = re.compile(r"`([^`\n]+)`")
_DOTTED = re.compile(r"(?<![\w./])((?:regen|bench)(?:\.[A-Za-z_]\w*)+)")
_RELATIVE = re.compile(r"^([a-z_]\w*)((?:\.[A-Za-z_]\w*)+)(?![\w.])")
_PATH = re.compile(rf"^(?:{'|'.join(REPO_DIRS)})/[\w./-]*$")


@cache
def _config_sections() -> frozenset[str]:
    """Top-level config keys: ``server.mode`` or ``generate.regenerate`` in backticks is a config key."""
    schema = yaml.safe_load((ROOT / "schemas" / "config.schema.yaml").read_text())
    return frozenset(schema["properties"])


@cache
def _modules_named(stem: str) -> tuple[str, ...]:
    """Every regen module or package named ``stem`` (``lifecycle``: regen.serving.lifecycle)."""
    found = [
        *ROOT.glob(f"regen/**/{stem}.py"),
        *(p.parent for p in ROOT.glob(f"regen/**/{stem}/__init__.py")),
    ]
    return tuple(sorted(".".join(p.relative_to(ROOT).with_suffix("").parts) for p in found))


def _resolves(dotted: str) -> bool:
    """The longest importable module prefix of ``dotted`` holds the rest as attributes."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def _cited(text: str) -> tuple[set[str], set[str], set[str]]:
    """File paths, dotted names and ``module.name`` names (relative to a regen module) the text cites."""
    paths, dotted, relative = set(), set(), set()
    for span in (m.group(1).strip() for m in _SPAN.finditer(text)):
        if _PATH.match(span) and not any(c in span for c in "*{<…"):
            paths.add(span)
            continue
        dotted.update(m.group(1) for m in _DOTTED.finditer(span))
        rel = _RELATIVE.match(span)
        if rel and not span.startswith(("regen.", "bench.")):
            first, rest = rel.group(1), rel.group(2)
            if rest.rsplit(".", 1)[-1] in FILE_EXTENSIONS or first in _config_sections():
                continue
            if _modules_named(first):
                relative.add(first + rest)
    return paths, dotted, relative


def problems(text: str) -> list[str]:
    """What the text cites that does not exist, one line each."""
    paths, dotted, relative = _cited(text)
    out = [f"no file {p}" for p in sorted(paths) if not (ROOT / p).exists()]
    out += [f"no module or name {d}" for d in sorted(dotted) if not _resolves(d)]
    for name in sorted(relative):
        first, rest = name.split(".", 1)
        if not any(_resolves(f"{module}.{rest}") for module in _modules_named(first)):
            out.append(f"no name {name} in any of {', '.join(_modules_named(first))}")
    return out


def test_design_doc_cites_only_what_exists() -> None:
    text = DESIGN.read_text()
    paths, dotted, relative = _cited(text)
    assert len(paths) > 10 and len(dotted) > 50 and len(relative) >= 3  # the doc is read, not skipped
    assert problems(text) == []


@pytest.mark.parametrize(
    "sample, expected",
    [
        ("`regen.ingest.dataset.iter_samples(path, fmt)`", []),
        ("`regen/serving/lifecycle.py`, `regen/sglang/pools/`", []),
        ("`lifecycle.acquire_server` with `server.mode` and `summary.json`", []),
        (
            "`regen.ingest.dataset.no_such_function`",
            ["no module or name regen.ingest.dataset.no_such_function"],
        ),
        ("`regen.sglang.server.acquire_server`", ["no module or name regen.sglang.server.acquire_server"]),
        (
            "`regen.generate.journal.Journal.no_such_method`",
            ["no module or name regen.generate.journal.Journal.no_such_method"],
        ),
        ("`regen/sglang/simulated.py`", ["no file regen/sglang/simulated.py"]),
        ("`lifecycle.no_such_thing`", ["no name lifecycle.no_such_thing in any of regen.serving.lifecycle"]),
    ],
)
def test_a_made_up_name_fails(sample: str, expected: list[str]) -> None:
    assert problems(sample) == expected
