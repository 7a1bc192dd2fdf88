"""`peerd check-config JOB.toml`: a job file checked as `peerctl join` checks
it, and the LR law (and outer step) it puts in force, in the words the worker's log, `peerctl
status` and the live page use (docs/operations.md, "Running the daemon").
No torch: the daemon's side of peerd never imports it."""

from __future__ import annotations

import math
from pathlib import Path

from peerd.core.lr import describe, scale_for
from peerd.core.outer import describe as describe_outer
from peerd.settings.jobspec import JobSpec, load_job

WORKERS = (1, 2, 4, 8, 16)  # the peer counts the factor is shown for


def job_lines(path: Path) -> list[str]:
    """What check-config prints for a job file; ConfigError when it is not valid."""
    spec, _ = load_job(path)
    what = f"script {spec.script}" if spec.script else f"module {spec.module or spec.model}"
    outer = describe_outer(spec.outer.every, spec.outer)
    return [f"{path}: valid: job {spec.name!r} ({what})", *lr_lines(spec),
            *([f"{outer}, after each round (docs/algorithms.md, \"The outer step\")"] if outer else [])]


def lr_lines(spec: JobSpec) -> list[str]:
    """The law, its ramp, and the factor it gives the job's global batches."""
    o = spec.optimizer
    law = describe(o.reference_batch, o.scaling, o.max_scale, "the script's" if spec.script else "the job's")
    if o.reference_batch == 0 or o.scaling == "none":
        return [f"LR: {law}"]
    ramp = (f"a change of the factor by r ramps over {o.ramp_steps}·max(r, 1/r) steps" if o.ramp_steps
            else "a change of the factor jumps at once")
    accumulating = "; a script that accumulates: times its micro-batches per step" if spec.script else ""
    if spec.global_batch:
        factors = (f"LR factor at the DBS target ([job] global_batch = {spec.global_batch}{accumulating}): "
                   + _factor(spec.global_batch, spec))
    else:
        source = "[job] local_batch, or the loader's batch_size" if spec.script else "[job] local_batch"
        factors = (f"LR factor by the workers that train, each at {spec.local_batch} samples a step "
                   f"({source}{accumulating}): "
                   + ", ".join(f"{n} → {_factor(n * spec.local_batch, spec)}" for n in WORKERS))
    return [f"LR: {law}; {ramp}", factors]


def _factor(batch: int, spec: JobSpec) -> str:
    """"1.414 (global batch 64)", ", capped" added where the cap binds."""
    o = spec.optimizer
    k = batch / o.reference_batch
    factor = scale_for(k, o.scaling, o.max_scale)
    capped = ", capped" if factor != scale_for(k, o.scaling, math.inf) else ""
    return f"{factor:.3f} (global batch {batch}{capped})"
