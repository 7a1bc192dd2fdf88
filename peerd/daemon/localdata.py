"""What a daemon checks before it joins a job whose data stays on each peer.

A job with data_mode = "local" trains on this machine's own data, which never
leaves it; the model it gossips carries information about those samples, so
only peers holding the job secret may see it. The daemon imports no job code:
it checks what it can without it (a secret, a data root that is a readable
directory) and refuses the join with a message
that says what to fix. The worker then builds the data sets, and a job module
that finds no data there fails the join the same way (a config error: not
restarted, nothing else disturbed).
"""

from __future__ import annotations

import os
from pathlib import Path

from peerd.errors import ConfigError
from peerd.settings.jobspec import JobSpec


def check_local_job(spec: JobSpec, spec_dir: str, secret_file: Path | None, daemon_root: Path | None) -> str:
    """The data root of a local-data job on this machine ("" for a shared-data
    job); ConfigError when this peer cannot take part."""
    if spec.data_mode != "local":
        return ""
    if secret_file is None:
        raise ConfigError(
            f"job {spec.name!r} keeps its data on each peer (data_mode = 'local'), and the model it shares "
            "carries information about those samples: it needs a job secret. Make one with "
            "`peerctl secret FILE` and copy it to every peer, then set [job] secret_file or [auth] job_secret_file")
    root = spec.data_root(spec_dir, str(daemon_root) if daemon_root else "")
    if not root:
        raise ConfigError(
            f"job {spec.name!r} trains on each peer's own data (data_mode = 'local'), and this peer names no "
            "data root: set [data] root in peerd.toml (or PEERD_DATA_ROOT), or root in the job's [data] table")
    path = Path(root)
    if not path.is_dir():
        raise ConfigError(f"job {spec.name!r}: this peer's data root {root} is not a directory; "
                          "this peer holds no data for the job")
    if not os.access(path, os.R_OK | os.X_OK):
        raise ConfigError(f"job {spec.name!r}: this peer's data root {root} is not readable by peerd")
    return str(path)
