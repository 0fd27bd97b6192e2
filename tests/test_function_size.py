"""The founders' limit on product code: no function under ``regen/`` over 100 lines or 9 parameters
(``self`` and ``cls`` not counted). An AST walk over the package, in well under a second."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 100
MAX_PARAMS = 9


def oversized(source: str, rel: str) -> list[str]:
    """``rel:line name (...)`` for each function of ``source`` over :data:`MAX_LINES` lines or
    :data:`MAX_PARAMS` parameters."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        a = node.args
        params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
        count = len([p for p in params if p.arg not in ("self", "cls")])
        lines = (node.end_lineno or node.lineno) - node.lineno + 1
        if lines > MAX_LINES or count > MAX_PARAMS:
            found.append(f"{rel}:{node.lineno} {node.name} ({lines} lines, {count} parameters)")
    return found


def test_no_product_function_is_over_the_limits() -> None:
    found = []
    for path in sorted((ROOT / "regen").rglob("*.py")):
        found += oversized(path.read_text(), str(path.relative_to(ROOT)))
    assert found == [], "\n".join(found)


def test_the_walk_finds_a_long_function_and_a_wide_one() -> None:
    long = "def f():\n" + "    x = 1\n" * MAX_LINES
    wide = f"def g(self, {', '.join(f'a{i}' for i in range(MAX_PARAMS))}, *rest):\n    pass\n"
    assert oversized(long + wide, "m.py") == [
        f"m.py:1 f ({MAX_LINES + 1} lines, 0 parameters)",
        f"m.py:{MAX_LINES + 2} g (2 lines, {MAX_PARAMS + 1} parameters)",
    ]
    assert oversized("def h(self, a, b):\n    pass\n", "m.py") == []
