"""The engine is the only writer of its worker's round, stage, phase and
metrics, and of the address the view lists it at (docs/architecture.md, "One
writer for a worker's state"): `Join` and `JobEnd` return what they decided
and the engine applies it; `Peer` calls the engine's methods."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "peerd"
OWNER = PACKAGE / "worker" / "engine.py"
# `e` and `engine` are how the package names an engine held elsewhere (self.engine, self._engine).
WRITES = re.compile(r"(^|\.)(e|engine|_engine)\.(round|stage|phase|metrics|waiting_for)$"
                    r"|(^|\.)link\.(address|progress\.model_source)$")


def _chain(node: ast.expr) -> str:
    """`a.b.c` for an attribute chain over a name; "" for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) and parts else ""


def engine_writes(text: str, where: str) -> list[str]:
    """The assignments in one module's source to what only the engine writes."""
    found = []
    for node in ast.walk(ast.parse(text, where)):
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for target in targets:
            for part in ast.walk(target):
                if WRITES.search(_chain(part)):
                    found.append(f"{where}:{part.lineno} {_chain(part)}")
    return found


def test_only_the_engine_writes_its_workers_round_stage_phase_and_view_address():
    sources = [p for p in sorted(PACKAGE.rglob("*.py")) if p != OWNER]
    assert len(sources) > 100
    found = [line for path in sources
             for line in engine_writes(path.read_text(), str(path.relative_to(PACKAGE.parent)))]
    assert not found, "return it to the engine (or call its method) instead:\n" + "\n".join(found)


def test_the_check_sees_such_writes():
    sample = ("e.round = 3\nself._engine.phase = 'x'\ne.link.address = ''\nself.engine.metrics = {}\n"
              "e.link.progress.model_source = 's'\na, e.stage = 1, 2\nlink.address = 'a'\n")
    assert [line.split(" ")[1] for line in engine_writes(sample, "s.py")] == [
        "e.round", "self._engine.phase", "e.link.address", "self.engine.metrics", "e.link.progress.model_source",
        "e.stage", "link.address"]
    assert engine_writes("self.round = 1\nmeta.round = 2\nx = e.round\nself.address = ''\n", "ok.py") == []
