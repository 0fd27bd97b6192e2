"""Imports point one way, as docs/design.md's package table says: each package (and ``regen/check.py``)
imports from regen only what its row's last column names (the packages named, ``ground`` for the ground
modules), a ground module never imports a stage, and the top-level units of ``regen/`` import one another
without a circle. Read from the code (every ``import regen.…`` / ``from regen.… import``, lazy ones
included) and from the table, so a new arrow fails here until the page says it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REGEN = ROOT / "regen"
DESIGN = ROOT / "docs" / "design.md"


def _unit(path: Path) -> str:
    """The top-level unit of ``regen/`` a file belongs to: its package, or the module itself."""
    rel = path.relative_to(REGEN).parts
    return rel[0] if len(rel) > 1 else rel[0].removesuffix(".py")


def _imports() -> dict[str, set[str]]:
    """unit -> the other units of ``regen`` it imports."""
    out: dict[str, set[str]] = {}
    for path in REGEN.rglob("*.py"):
        unit = _unit(path)
        seen = out.setdefault(unit, set())
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                parts = name.split(".")
                if parts[0] == "regen" and len(parts) > 1 and parts[1] != unit:
                    seen.add(parts[1])
    return out


def _table() -> tuple[dict[str, set[str]], set[str], dict[str, set[str]]]:
    """(unit -> what its row allows it to import, the ground units, a ground unit -> the stages its row
    lets it import: "never a stage but for `runlog` (`serving`: ...)") from the design page's table."""
    rows: dict[str, set[str]] = {}
    ground: set[str] = set()
    excepted: dict[str, set[str]] = {}
    for line in DESIGN.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("| ") else []
        if len(cells) != 3:
            continue
        first, last = cells[0], cells[2]
        if first.startswith("ground:"):
            ground = set(re.findall(r"`([a-z_]+)`", first))
            for unit, stage in re.findall(r"`([a-z_]+)` \(`([a-z_]+)`", last):
                excepted.setdefault(unit, set()).add(stage)
            continue
        m = re.fullmatch(r"`regen/([a-z_]+)(?:/|\.py)`", first)
        if m:
            rows[m.group(1)] = set(re.findall(r"`([a-z_]+)`", last))
            if "ground" in last:
                rows[m.group(1)].add("ground")
    return rows, ground, excepted


def test_every_import_is_one_its_row_names() -> None:
    rows, ground, excepted = _table()
    assert {
        "output",
        "observe",
        "tune",
        "check",
        "generate",
        "ingest",
        "serving",
        "simulated",
        "sglang",
        "run_hooks",
    } <= set(rows)
    imports = _imports()
    wrong = []
    for unit, allowed in rows.items():
        if unit == "cli":
            continue  # dispatches to every stage, lazily
        may = (allowed - {"ground"}) | (ground if "ground" in allowed else set())
        wrong += [f"regen.{unit} imports regen.{other}" for other in sorted(imports.get(unit, set()) - may)]
    for unit in sorted(ground):
        wrong += [
            f"ground regen.{unit} imports stage regen.{o}"
            for o in sorted(imports.get(unit, set()) - ground - excepted.get(unit, set()))
        ]
    assert not wrong, "imports docs/design.md's package table does not name:\n" + "\n".join(wrong)


def test_no_circle_between_units() -> None:
    imports = _imports()
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(unit: str) -> list[str] | None:
        state[unit] = 1
        path.append(unit)
        for other in sorted(imports.get(unit, ())):
            if state.get(other) == 1:
                return [*path[path.index(other) :], other]
            if other not in state and (found := visit(other)):
                return found
        path.pop()
        state[unit] = 2
        return None

    for unit in sorted(imports):
        if unit not in state:
            circle = visit(unit)
            assert circle is None, " -> ".join(circle)


#: where code imports regen
IMPORTERS = ("regen", "rules", "scripts", "tests", "bench", "Snakefile")


def test_the_layout_package_re_exports_nothing_and_callers_import_its_modules() -> None:
    """``regen/layout/`` is the one owner of the run's file layout, in modules named for what they hold; its
    ``__init__`` binds no name, so every caller says which module a name comes from."""
    init = ast.parse((REGEN / "layout" / "__init__.py").read_text())
    assert all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in init.body)
    modules = {p.stem for p in (REGEN / "layout").glob("*.py")} - {"__init__"}
    assert modules == {"names", "beside", "slots", "run"}
    found = []
    for top in IMPORTERS:
        root = ROOT / top
        paths = [root] if root.is_file() else [*root.rglob("*.py"), *root.rglob("*.smk")]
        for path in paths:
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if re.match(
                    r"\s*(from regen\.layout import|from regen import layout\b|import regen\.layout\s*$)",
                    line,
                ):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == [], "\n".join(found)
