"""Soak harness for heterogeneous peerd clusters (`peerd soak`, `python -m peerd.soak`).

Modules: `netns` (namespaces, bridge, veth, tc), `schedule` (churn events),
`peers` (one daemon per peer), `runner` (the run), `events` (one churn event
carried out), `checks` (verdicts, pure), `report` (report.md and plots), `cli`
(the command line).
"""

from peerd.soak.cli import add_arguments, main, run

__all__ = ["add_arguments", "main", "run"]
