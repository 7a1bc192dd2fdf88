"""The package's size limits: a module ≤ 450 lines, a function ≤ 60 lines and
≤ 8 parameters (self and cls not counted). Generated gRPC stubs are exempt."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "peerd"
MODULE_LINES, FUNCTION_LINES, PARAMETERS = 450, 60, 8


def _sources() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if "proto" not in p.relative_to(PACKAGE).parts]


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = node.args
    named = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if a.arg not in ("self", "cls")]
    return len(named) + (args.vararg is not None) + (args.kwarg is not None)


def oversized(text: str, where: str) -> list[str]:
    """What in one module's source is past the limits."""
    found = [f"{where}: {len(text.splitlines())} lines"] if len(text.splitlines()) > MODULE_LINES else []
    for node in ast.walk(ast.parse(text, where)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > FUNCTION_LINES:
                found.append(f"{where}:{node.lineno} {node.name}: {lines} lines")
            if _parameters(node) > PARAMETERS:
                found.append(f"{where}:{node.lineno} {node.name}: {_parameters(node)} parameters")
    return found


def test_modules_and_functions_stay_within_the_limits():
    sources = _sources()
    assert len(sources) > 100
    found = [line for path in sources for line in oversized(path.read_text(), str(path.relative_to(PACKAGE.parent)))]
    assert not found, "split what grew past the limits:\n" + "\n".join(found)


def test_the_check_sees_what_is_past_the_limits():
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    found = oversized(f"def long(self, a, b, c, d, e, f, g, h, i):\n{body}\n", "sample.py")
    assert found == ["sample.py:1 long: 61 lines", "sample.py:1 long: 9 parameters"]
    assert oversized("x = 1\n" * (MODULE_LINES + 1), "big.py") == [f"big.py: {MODULE_LINES + 1} lines"]
    assert oversized(f"def short(self, a, b, c, d, e, f, g, h):\n{body[:-len(body.splitlines()[-1]) - 1]}\n",
                     "ok.py") == []
