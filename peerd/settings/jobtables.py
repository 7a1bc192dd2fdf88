"""The tables of a job file (JOB.toml), read key by key: each function takes one
[table] and returns the checked keyword arguments of its spec in peerd.settings.jobspec
(a wrong type or value is a ConfigError naming the key and what it expects).
"""

from __future__ import annotations

import math
import re

from peerd.core.bundle import MAX_BUNDLE_FILES, BundleRefused, check_name, valid_hash
from peerd.core.lr import DEFAULT_LAW, DEFAULT_MAX_SCALE, DEFAULT_RAMP_STEPS, LAWS
from peerd.errors import ConfigError
from peerd.settings.tomlconf import Table

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_ENTRY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_METRIC = re.compile(r"^[A-Za-z_][\w.-]{0,62}$")
_OPTIMIZER_NAME = re.compile(r"^[A-Za-z_]\w{0,62}$")
_OPTION_NAME = re.compile(r"^[a-z_]\w{0,62}$")


SCHEDULES = ("constant", "cosine", "linear")
PRECISIONS = ("fp32", "bf16", "fp16")
METRIC_MODES = ("max", "min")
DATA_MODES = ("shared", "local")
WEIGHTINGS = ("samples", "uniform")  # peerd.core.weighting
STEP_MODELS = ("affine", "proportional")  # DBS: peerd.core.shares
# Checks for the keyword arguments torch.optim's classes share, so that a typo'd
# value is refused by peerctl, on a machine without torch. Any other keyword is
# checked by the worker against the optimizer class itself.
_OPTION_CHECKS: dict[str, tuple[type | tuple[type, ...], object, str]] = {
    "momentum": (float, lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "dampening": (float, lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    "weight_decay": (float, lambda v: v >= 0, "a number ≥ 0"),
    "eps": (float, lambda v: v > 0, "a number > 0"),
    "alpha": (float, lambda v: v >= 0, "a number ≥ 0"),
    "betas": (list, lambda v: len(v) == 2 and all(isinstance(b, (int, float)) and 0 <= b < 1 for b in v),
              "a list of two numbers in [0, 1)"),
    "nesterov": (bool, None, "true or false"),
    "amsgrad": (bool, None, "true or false"),
    "maximize": (bool, None, "true or false"),
    "foreach": (bool, None, "true or false"),
    "fused": (bool, None, "true or false"),
}

GOSSIP_MODES = ("crossover", "hierarchical", "whole")
WIRE_DTYPES = ("fp32", "fp16", "bf16", "int8")


def _module_name(value: str) -> bool:
    return bool(_MODULE.fullmatch(value))


def _metric_mode(metric: str) -> str:
    """Lower is better for a loss, an error or a perplexity; higher for anything else."""
    return "min" if re.search(r"(loss|error|perplexity|ppl)$", metric) else "max"


def _optimizer_options(table: Table, name: str) -> tuple[tuple[str, object], ...]:
    """The optimizer's own keyword arguments: the keys peerd does not use itself."""
    options = table.rest()
    for key, value in options.items():
        where = f"{table.where(key)} = {value!r}"
        if not _OPTION_NAME.fullmatch(key) or isinstance(value, dict):
            raise ConfigError(f"{where}: not a keyword argument of an optimizer (a misspelt table?)")
        if key in _OPTION_CHECKS:
            kind, check, expect = _OPTION_CHECKS[key]
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = options[key] = float(value)
            if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind) or (check and not check(value)):
                raise ConfigError(f"{where}: expected {expect}")
        elif not isinstance(value, (bool, int, float, str, list)) or (
                isinstance(value, list) and not all(isinstance(v, (int, float)) for v in value)):
            raise ConfigError(f"{where}: expected a number, true/false, a string or a list of numbers")
    if name == "sgd":
        options.setdefault("momentum", 0.9)
    return tuple(sorted(options.items()))


def optimizer_table(opt: Table) -> dict[str, object]:
    positive = dict(check=lambda v: v > 0, expect="a number > 0")
    name = opt.get("name", str, "sgd", check=_OPTIMIZER_NAME.fullmatch,
                   expect="the name of a torch.optim class, e.g. 'sgd', 'adamw'").lower()
    return dict(
        name=name,
        lr=opt.get("lr", float, 0.05, **positive),
        schedule=opt.get("schedule", str, "cosine", check=lambda v: v in SCHEDULES,
                         expect=" or ".join(repr(v) for v in SCHEDULES)),
        warmup_steps=opt.get("warmup_steps", int, 0, check=lambda v: 0 <= v <= 10_000_000, expect="an integer ≥ 0"),
        reference_batch=opt.get("reference_batch", int, 0, check=lambda v: 0 <= v <= 1 << 24,
                                expect="an integer ≥ 0 (0: no scaling)"),
        scaling=opt.get("scaling", str, DEFAULT_LAW, check=lambda v: v in LAWS,
                        expect=" or ".join(repr(v) for v in LAWS)),
        max_scale=opt.get("max_scale", float, DEFAULT_MAX_SCALE, check=lambda v: v >= 1,
                          expect="a number ≥ 1 (inf: no cap)"),
        ramp_steps=opt.get("ramp_steps", int, DEFAULT_RAMP_STEPS, check=lambda v: 0 <= v <= 100_000,
                           expect="an integer ≥ 0"),
        options=_optimizer_options(opt, name),
    )


def gossip_table(gossip: Table) -> dict[str, object]:
    positive = dict(check=lambda v: v > 0, expect="a number > 0")
    return dict(
        period_steps=gossip.get("period_steps", int, 1, **positive),
        mode=gossip.get("mode", str, "crossover", check=lambda v: v in GOSSIP_MODES,
                        expect=" or ".join(repr(m) for m in GOSSIP_MODES)),
        group_size=gossip.get("group_size", int, 4, check=lambda v: 1 <= v <= 1024,
                              expect="an integer in 1..1024"),
        wire=gossip.get("wire", str, "fp32", check=lambda v: v in WIRE_DTYPES,
                        expect=" or ".join(repr(w) for w in WIRE_DTYPES)),
        clip_factor=gossip.get("clip_factor", float, 0.0, check=lambda v: v == 0 or 1 <= v <= 1e6,
                               expect="0 (off) or a number in 1..1e6"),
        segments=gossip.get("segments", int, 8, check=lambda v: 1 <= v <= 4096, expect="an integer in 1..4096"),
        chunk_kib=gossip.get("chunk_kib", int, 1024, check=lambda v: 4 <= v <= 16384,
                             expect="an integer in 4..16384"),
        deadline_floor_s=gossip.get("deadline_floor_s", float, 0.5, **positive),
        deadline_ceiling_s=gossip.get("deadline_ceiling_s", float, 10.0, **positive),
        overlap=gossip.get("overlap", bool, False),
        average_buffers=gossip.get("average_buffers", bool, False),
        average_optimizer_state=gossip.get("average_optimizer_state", bool, False),
    )


def outer_table(outer: Table) -> dict[str, object]:
    """[outer]: the outer step (docs/algorithms.md, "The outer step"); every = 0 leaves it off."""
    every = outer.get("every", int, 0, check=lambda v: 0 <= v <= 1_000_000,
                      expect="an integer ≥ 1: local steps between outer steps (0: no outer step)")
    settings = dict(
        every=every,
        lr=outer.get("lr", float, 0.7, check=lambda v: 0 < v < math.inf, expect="a number > 0"),
        momentum=outer.get("momentum", float, 0.5, check=lambda v: 0 <= v < 1, expect="a number in [0, 1)"),
        nesterov=outer.get("nesterov", bool, True),
    )
    if not every and any(outer.given(key) for key in ("lr", "momentum", "nesterov")):
        raise ConfigError(f"{outer.where('every')} ≥ 1 is required with the other [outer] keys "
                          "(the local steps between outer steps, ≥ 1)")
    return settings


def train_table(train: Table) -> dict[str, object]:
    return dict(
        precision=train.get("precision", str, "fp32", check=lambda v: v in PRECISIONS,
                            expect=" or ".join(repr(p) for p in PRECISIONS)),
        grad_clip_norm=train.get("grad_clip_norm", float, 0.0, check=lambda v: v >= 0,
                                 expect="a number ≥ 0 (0: no clipping)"),
    )


def data_table(data: Table) -> dict[str, object]:
    return dict(
        loader_workers=data.get("loader_workers", int, 0, check=lambda v: 0 <= v <= 256,
                                expect="an integer in 0..256 (0: load in the training thread)"),
        pin_memory=data.get("pin_memory", bool, True),
        prefetch_factor=data.get("prefetch_factor", int, 2, check=lambda v: 1 <= v <= 64,
                                 expect="an integer in 1..64"),
        root=data.get("root", str, "", check=lambda v: 0 < len(v) <= 4096 and "\0" not in v,
                      expect="a directory holding this peer's data"),
    )


def job_table(job: Table) -> dict[str, object]:
    positive = dict(check=lambda v: v > 0, expect="a number > 0")
    entry = dict(check=_ENTRY.fullmatch, expect="'module:callable'")
    metric = job.get("metric", str, "accuracy", check=_METRIC.fullmatch,
                     expect="the name of a key evaluate() returns, e.g. 'accuracy', 'val_loss'")
    return dict(
        name=job.get("name", str, check=_NAME.fullmatch, expect="a name of letters, digits, '_', '.', '-' (≤ 63)"),
        module=job.get("module", str, "", check=_module_name, expect="a module name, e.g. 'mylab.jobs.resnet'"),
        script=job.get("script", str, "", check=lambda v: 0 < len(v) <= 4096 and "\0" not in v and v.endswith(".py"),
                       expect="the path of a Python script (.py), relative to the job file"),
        args=tuple(job.get("args", list, [], check=lambda v: all(isinstance(a, str) for a in v),
                           expect="a list of strings")),
        model=job.get("model", str, "", **entry),
        data=job.get("data", str, "", **entry),
        metric=metric,
        metric_mode=job.get("metric_mode", str, _metric_mode(metric), check=lambda v: v in METRIC_MODES,
                            expect="'max' (higher is better) or 'min' (lower is better)"),
        chance=job.get("chance", float, None, check=lambda v: math.isfinite(v) and v != 0,
                       expect="a finite number other than 0: the metric of a model that learned nothing"),
        seed=job.get("seed", int, 0),
        init=job.get("init", str, "shared", check=lambda v: v in ("shared", "per-peer"),
                     expect="'shared' or 'per-peer'"),
        data_mode=job.get("data_mode", str, "shared", check=lambda v: v in DATA_MODES,
                          expect="'shared' (every peer reads the whole data set) or 'local' (each its own)"),
        weighting=job.get("weighting", str, "samples", check=lambda v: v in WEIGHTINGS,
                          expect="'samples' (every sample counts once) or 'uniform' (every peer's data equally)"),
        local_batch=job.get("local_batch", int, 32, check=lambda v: 1 <= v <= 65536, expect="an integer in 1..65536"),
        global_batch=job.get("global_batch", int, 0, check=lambda v: 0 <= v <= 1 << 24,
                             expect="an integer ≥ 0 (0: fixed local_batch)"),
        min_local_batch=job.get("min_local_batch", int, 1, check=lambda v: 1 <= v <= 65536,
                                expect="an integer in 1..65536"),
        max_local_batch=job.get("max_local_batch", int, 0, check=lambda v: 0 <= v <= 65536,
                                expect="an integer in 0..65536 (0: no limit)"),
        rebalance_rounds=job.get("rebalance_rounds", int, 10, **positive),
        rebalance_threshold=job.get("rebalance_threshold", float, 0.1, check=lambda v: 0 <= v <= 10,
                                    expect="a number in [0, 10]"),
        step_model=job.get("step_model", str, "affine", check=lambda v: v in STEP_MODELS,
                           expect=" or ".join(repr(m) for m in STEP_MODELS)),
        epochs=job.get("epochs", float, 1.0, **positive),
        drop_last=job.get("drop_last", bool, False),
        epoch_chunks=job.get("epoch_chunks", int, 8, check=lambda v: 1 <= v <= 65536,
                             expect="an integer in 1..65536 (1: one split per epoch)"),
        eval_every_rounds=job.get("eval_every_rounds", int, 100, **positive),
        min_peers=job.get("min_peers", int, 1, check=lambda v: 1 <= v <= 4096,
                          expect="an integer in 1..4096 (1: the first peer starts at once)"),
        start_timeout_s=job.get("start_timeout_s", float, 600.0, check=lambda v: 0 < v <= 7 * 86400,
                                expect="seconds in (0, 604800]"),
        first_step_warning_s=job.get("first_step_warning_s", float, 120.0, check=lambda v: 0 < v <= 86400,
                                     expect="seconds in (0, 86400]"),
        secret_file=job.get("secret_file", str, "", check=lambda v: 0 < len(v) <= 4096 and "\0" not in v,
                            expect="a path to a file holding the job secret"),
        files=tuple(job.get("files", list, [], check=lambda v: len(v) <= MAX_BUNDLE_FILES and all(map(_file_name, v)),
                            expect="a list of paths relative to the job file, inside its directory")),
        code=job.get("code", str, "", check=valid_hash,
                     expect="the sha256 of the job's code bundle, 64 hex digits (set by the daemon)"),
    )


def _file_name(value: object) -> bool:
    try:
        return isinstance(value, str) and bool(check_name(value.rstrip("/")))
    except BundleRefused:
        return False


def log_table(log: Table) -> dict[str, object]:
    return dict(
        tensorboard=log.get("tensorboard", str, "", check=lambda v: 0 < len(v) <= 4096 and "\0" not in v,
                            expect="a directory for TensorBoard's event files"),
    )


def checkpoint_table(ckpt: Table) -> dict[str, object]:
    return dict(
        every_rounds=ckpt.get("every_rounds", int, 0, check=lambda v: v >= 0, expect="an integer ≥ 0 (0: off)"),
        every_s=ckpt.get("every_s", float, 60.0, check=lambda v: v >= 0, expect="a number ≥ 0 (0: off)"),
    )
