"""How the daemon started this worker: the job, its control address, where to
serve and to write (`Launch`), set by peerd.worker.main before a script job runs
and read by `peerd.attach`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from peerd.settings.jobspec import JobSpec
from peerd.security.handover import Security


@dataclass(frozen=True)
class Launch:
    """How the daemon started this worker (the arguments of python -m peerd.worker)."""

    spec: JobSpec
    spec_dir: str
    control: str
    peer_id: str
    host: str = "127.0.0.1"
    out_dir: Path = Path(".")
    device: str = "cpu"
    security: Security = field(default_factory=Security)
    slowdown: float = 1.0
    intrahost: object | None = None  # the daemon's intra-host group for this worker (peerd.worker.intrahost.group)
    data_root: str = ""  # data_mode = "local": where this peer's data is (ctx.data_root)
    slowdown_clock: str = "wall"  # the step time `slowdown` multiplies (peerd.core.slowdown)
    step_overhead_s: float = 0.0  # testing knob: a fixed sleep after every step (peerd.core.slowdown)
    tensorboard: str = ""  # this worker's TensorBoard run directory (peerd.worker.tblog); "": none


_launch: Launch | None = None  # set by peerd.worker.main before it runs a script job


def set_launch(launch: Launch | None) -> None:
    global _launch
    _launch = launch


def current_launch() -> Launch | None:
    """The launch peerd.worker.main set; None when a script runs outside peerd."""
    return _launch
