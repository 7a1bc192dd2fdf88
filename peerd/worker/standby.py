"""The worker's side of a standby process (peerd.daemon.standby)."""

from __future__ import annotations

import json
import sys


def wait_for_launch() -> list[str] | None:
    """Import what every worker needs, then wait for the daemon's command line
    (one JSON list on stdin). None: the daemon dismissed this standby."""
    import torch._dynamo  # noqa: F401  (torch.optim imports it on the first optimizer: ~1.6 s)

    import peerd.worker.main  # noqa: F401  (torch, grpc, numpy, uvloop and peerd)

    line = sys.stdin.readline()
    if not line.strip():
        return None
    argv = json.loads(line)
    if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
        raise SystemExit(f"peerd worker: expected a JSON list of arguments on stdin, got {line[:200]!r}")
    return argv
