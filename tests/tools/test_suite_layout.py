"""Rules for the test suite's own layout: shared helpers live in helper modules,
never in test modules, so that running or moving one test file cannot break
another."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _imported_modules(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def test_no_test_module_imports_another():
    found = [f"{path.relative_to(TESTS)} imports {name}"
             for path in sorted(TESTS.rglob("*.py"))
             for name in _imported_modules(path) if name.split(".")[0].startswith("test_")]
    assert not found, "move what they share into a helper module (not test_*.py):\n" + "\n".join(found)


def test_helper_modules_have_distinct_names():
    # Every test directory is on sys.path (pytest's "prepend" mode): two helpers of
    # one name would share one entry in sys.modules.
    names = Counter(path.name for path in TESTS.rglob("*.py") if not path.name.startswith("test_"))
    assert [name for name, n in names.items() if n > 1] == []
