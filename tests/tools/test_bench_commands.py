"""Every bench command the docs and the scripts' docstrings give still parses:
each `bench/NAME.py ARGS` in docs/, README.md and bench/*.py goes through that
script's parse_args (nothing runs)."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

COMMAND = re.compile(r"bench/([a-z_]+)\.py([^`#|\n]*)")
# Prose that names a flag, not a command to run.
MENTIONS = {("dbs", "--overheads")}


def commands() -> list[tuple[str, str, list[str]]]:
    """(where, script, argv) of every bench command written down."""
    found = []
    for path in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", *sorted((ROOT / "bench").glob("*.py"))]:
        text = re.sub(r"\\\n\s*", " ", path.read_text())  # a command continued on the next line
        for m in COMMAND.finditer(text):
            script, rest = m.group(1), m.group(2)
            if script.startswith("_") or not (ROOT / "bench" / f"{script}.py").exists():
                continue
            argv = _arguments(rest) if rest.strip().startswith("-") else []
            if (script, " ".join(argv)) not in MENTIONS:
                found.append((f"{path.relative_to(ROOT)}: bench/{script}.py {' '.join(argv)}", script, argv))
    return found


def _arguments(rest: str) -> list[str]:
    """The words after the script's name up to the first that is prose, not an argument."""
    argv = []
    for word in rest.split():
        m = re.match(r"[\w./,:@=+~-]+", word)
        if m:
            argv.append(m.group())
        if not m or m.end() < len(word):  # a closing quote or bracket ends it
            break
    return argv


def test_the_docs_name_bench_commands():
    assert len(commands()) > 50
    assert {script for _, script, _ in commands()} >= {p.stem for p in (ROOT / "bench").glob("[a-z]*.py")}


@pytest.mark.parametrize("where, script, argv", commands(), ids=lambda v: v if isinstance(v, str) else None)
def test_a_written_command_parses(where, script, argv):
    parse_args = importlib.import_module(script).parse_args
    if "--help" in argv:
        with pytest.raises(SystemExit) as exited:
            parse_args(argv)
        assert exited.value.code == 0, where
        return
    parse_args(argv)
