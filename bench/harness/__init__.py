"""The one harness under every bench script: what each would otherwise repeat.

  script    arguments, the run folder, timing, the __main__ wrapper
  cluster   local daemons (peerd.cli.localcluster.LocalCluster): waits, joins, status, worker logs
  ranks     spawned rank processes: start, collect, reap, timed repeats; gloo groups
  exchange  one worker's exchange pieces, wired as the engine wires them
  output    tables, CSV, JSON, figures, quantiles
  training  the data-parallel baselines' step and test accuracy

Importing it puts the repository root on sys.path, so `python bench/x.py`
finds peerd without installing it.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
