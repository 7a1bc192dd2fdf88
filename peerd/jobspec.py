"""The job spec (JOB.toml): identical on every peer, checked by fingerprint.

Parsed once, at the edge, into a frozen `JobSpec`; nothing below takes raw dicts.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from peerd.core.lr import DEFAULT_LAW, DEFAULT_MAX_SCALE, DEFAULT_RAMP_STEPS, LAWS
from peerd.errors import ConfigError
from peerd.tomlconf import Table, load_toml

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


@dataclass(frozen=True)
class OptimizerSpec:
    name: str = "sgd"  # a torch.optim class, by name in any case: sgd, adam, adamw, rmsprop, ...
    lr: float = 0.05
    schedule: str = "cosine"  # "constant", "cosine" or "linear" (both to 0 over the job's epochs)
    warmup_steps: int = 0  # linear warm-up from 0 over this many steps, then the schedule
    reference_batch: int = 0  # global batch `lr` is meant for; 0: no scaling with the peer count
    # How the LR follows the global batch k × reference_batch (docs/algorithms.md):
    # "linear" (k), "sqrt" (√k) or "none", capped to [1/max_scale, max_scale].
    scaling: str = DEFAULT_LAW
    max_scale: float = DEFAULT_MAX_SCALE
    ramp_steps: int = DEFAULT_RAMP_STEPS  # T: ramp over T·max(r, 1/r) steps, r the multiplier's ratio
    # The optimizer class's own keyword arguments (momentum, betas, weight_decay, ...),
    # sorted by name. SGD gets momentum 0.9 unless the job says otherwise.
    options: tuple[tuple[str, object], ...] = (("momentum", 0.9),)

    @property
    def kwargs(self) -> dict[str, object]:
        """The options as keyword arguments (TOML lists become tuples, e.g. betas)."""
        return {k: tuple(v) if isinstance(v, list) else v for k, v in self.options}


GOSSIP_MODES = ("crossover", "hierarchical", "whole")
WIRE_DTYPES = ("fp32", "fp16", "bf16")


@dataclass(frozen=True)
class GossipSpec:
    period_steps: int = 1  # local optimizer steps between gossip rounds
    # "crossover": flat, segment by segment (DESIGN §1.2); "hierarchical":
    # locality groups of ≤ group_size (§1.3); "whole": the whole model from one partner.
    mode: str = "crossover"
    group_size: int = 4
    wire: str = "fp32"  # segment values on the wire; averaging is fp32 whatever this is
    clip_factor: float = 0.0  # > 0: clip a partner's pull to k × the recent median (peerd.core.robust)
    segments: int = 8
    chunk_kib: int = 1024  # streamed chunk size; ~1 MiB is the fast spot for gRPC
    deadline_floor_s: float = 0.5
    deadline_ceiling_s: float = 10.0
    # Run each round's exchange while the next local steps compute, its effect
    # applied one round late (docs/algorithms.md, "Overlapped rounds").
    overlap: bool = False
    # Opt-ins beyond the parameters (float tensors only; integer counters are not averaged).
    average_buffers: bool = False  # e.g. BatchNorm running statistics
    average_optimizer_state: bool = False  # e.g. momentum, Adam's moments


@dataclass(frozen=True)
class TrainSpec:
    precision: str = "fp32"  # "bf16" or "fp16": autocast (fp16 with a GradScaler)
    grad_clip_norm: float = 0.0  # > 0: clip the gradient's global norm to this


@dataclass(frozen=True)
class DataSpec:
    """How this peer loads its data: each machine's own business, not in the fingerprint."""

    loader_workers: int = 0  # DataLoader worker processes; 0: load in the training thread
    pin_memory: bool = True  # page-locked batches for a GPU (ignored on the CPU)
    prefetch_factor: int = 2  # batches each loader worker prepares ahead
    # data_mode = "local": where this peer's data is (the job's make_datasets(ctx)
    # reads ctx.data_root); empty: the daemon's [data] root. Relative: to the job file.
    root: str = ""


@dataclass(frozen=True)
class CheckpointSpec:
    every_rounds: int = 0  # write one every this many rounds (0: not by rounds)
    every_s: float = 60.0  # ... and/or when this many seconds passed since the last (0: not by time)


@dataclass(frozen=True)
class JobSpec:
    name: str
    # The job module: make_model, make_datasets, loss, evaluate, ... by name
    # (docs/operations.md, "Job modules"). `model` and `data` override one callable each.
    module: str = ""
    # Or the user's own training script, which calls peerd.attach (docs/operations.md,
    # "Script jobs"): a path next to the job file, and its command-line arguments.
    script: str = ""
    args: tuple[str, ...] = ()
    model: str = ""  # "module:callable" returning a torch.nn.Module
    data: str = ""  # "module:callable" returning (train, test) datasets
    metric: str = "accuracy"  # the key of evaluate()'s result that progress shows
    metric_mode: str = "max"  # "max": higher is better; "min": lower (losses)
    seed: int = 0
    init: str = "shared"  # "shared": every peer starts from the same model; "per-peer": each from its own
    # "shared": every peer can read the whole data set and peerd splits it; "local":
    # each peer trains on its own data only (its data root), which never leaves it.
    data_mode: str = "shared"
    # local mode: "samples" (every sample of the union counts once) or "uniform"
    # (every peer's data counts equally); peerd.core.weighting, docs/algorithms.md.
    weighting: str = "samples"
    local_batch: int = 32  # per peer, when global_batch is 0
    # Dynamic batch size (DBS): with global_batch > 0 each peer's batch follows its measured speed.
    global_batch: int = 0  # target Σ of the local batches; 0: every peer keeps local_batch
    min_local_batch: int = 1
    max_local_batch: int = 0  # largest batch in one forward pass, above it gradients accumulate; 0: no limit
    rebalance_rounds: int = 10  # re-evaluate the batches every this many rounds
    rebalance_threshold: float = 0.1  # ... and change them only if one moves by more than this (relative)
    epochs: float = 1.0
    drop_last: bool = False  # skip an epoch's last batch when it is short (BatchNorm cannot train on 1 sample)
    # Each epoch's permutation is read in this many chunks, each split among the
    # members of the moment: a membership change takes effect at the next chunk.
    epoch_chunks: int = 8
    eval_every_rounds: int = 100
    optimizer: OptimizerSpec = OptimizerSpec()
    gossip: GossipSpec = GossipSpec()
    train: TrainSpec = TrainSpec()
    data_loading: DataSpec = DataSpec()
    # Where this peer keeps the job secret (docs/operations.md). Only the path is
    # here, never the secret, and it is left out of the fingerprint: each machine
    # may keep the file in its own place.
    secret_file: str = ""
    checkpoint: CheckpointSpec = CheckpointSpec()

    @property
    def fingerprint(self) -> str:
        """sha256 of the canonical spec: two peers train together only if equal.
        The secret's path, the checkpoint settings and data loading are each
        peer's own business and are left out."""
        fields = asdict(self)
        del fields["secret_file"]
        del fields["checkpoint"]
        del fields["data_loading"]
        if self.data_mode == "shared":  # fingerprints of shared-data jobs as before local mode
            del fields["weighting"]
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:32]

    def script_path(self, spec_dir: str) -> Path:
        """The script, a relative path taken from the job file's directory."""
        path = Path(self.script).expanduser()
        return path if path.is_absolute() or not spec_dir else Path(spec_dir) / path

    def secret_path(self, spec_dir: str) -> Path | None:
        """The secret file, a relative path taken from the job file's directory."""
        if not self.secret_file:
            return None
        path = Path(self.secret_file).expanduser()
        if path.is_absolute():
            return path
        if not spec_dir:
            raise ConfigError(
                f"job {self.name!r}: secret_file {self.secret_file!r} is relative, and this job came "
                "without a job file to resolve it from; join with the job file, or use an absolute path")
        return Path(spec_dir) / path

    def data_root(self, spec_dir: str, daemon_root: str) -> str:
        """local mode: this peer's data root, the job's own (relative to the job
        file) or else the daemon's; "" when neither names one."""
        if not self.data_loading.root:
            return daemon_root
        path = Path(self.data_loading.root).expanduser()
        if path.is_absolute() or not spec_dir:
            return str(path)
        return str(Path(spec_dir) / path)


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


def _parse_optimizer(opt: Table) -> OptimizerSpec:
    positive = dict(check=lambda v: v > 0, expect="a number > 0")
    name = opt.get("name", str, "sgd", check=_OPTIMIZER_NAME.fullmatch,
                   expect="the name of a torch.optim class, e.g. 'sgd', 'adamw'").lower()
    return OptimizerSpec(
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


def _parse_gossip(gossip: Table) -> GossipSpec:
    positive = dict(check=lambda v: v > 0, expect="a number > 0")
    return GossipSpec(
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


def _parse_train(train: Table) -> TrainSpec:
    return TrainSpec(
        precision=train.get("precision", str, "fp32", check=lambda v: v in PRECISIONS,
                            expect=" or ".join(repr(p) for p in PRECISIONS)),
        grad_clip_norm=train.get("grad_clip_norm", float, 0.0, check=lambda v: v >= 0,
                                 expect="a number ≥ 0 (0: no clipping)"),
    )


def _parse_data(data: Table) -> DataSpec:
    return DataSpec(
        loader_workers=data.get("loader_workers", int, 0, check=lambda v: 0 <= v <= 256,
                                expect="an integer in 0..256 (0: load in the training thread)"),
        pin_memory=data.get("pin_memory", bool, True),
        prefetch_factor=data.get("prefetch_factor", int, 2, check=lambda v: 1 <= v <= 64,
                                 expect="an integer in 1..64"),
        root=data.get("root", str, "", check=lambda v: 0 < len(v) <= 4096 and "\0" not in v,
                      expect="a directory holding this peer's data"),
    )


def _parse_job_table(job: Table) -> dict[str, object]:
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
        epochs=job.get("epochs", float, 1.0, **positive),
        drop_last=job.get("drop_last", bool, False),
        epoch_chunks=job.get("epoch_chunks", int, 8, check=lambda v: 1 <= v <= 65536,
                             expect="an integer in 1..65536 (1: one split per epoch)"),
        eval_every_rounds=job.get("eval_every_rounds", int, 100, **positive),
        secret_file=job.get("secret_file", str, "", check=lambda v: 0 < len(v) <= 4096 and "\0" not in v,
                            expect="a path to a file holding the job secret"),
    )


def parse_job(text: str, source: str) -> JobSpec:
    root = Table(load_toml(text, source), source, "")
    tables = {name: root.sub(name) for name in ("job", "optimizer", "gossip", "train", "data", "checkpoint")}
    ckpt = tables["checkpoint"]
    spec = JobSpec(
        **_parse_job_table(tables["job"]),
        optimizer=_parse_optimizer(tables["optimizer"]),
        gossip=_parse_gossip(tables["gossip"]),
        train=_parse_train(tables["train"]),
        data_loading=_parse_data(tables["data"]),
        checkpoint=CheckpointSpec(
            every_rounds=ckpt.get("every_rounds", int, 0, check=lambda v: v >= 0, expect="an integer ≥ 0 (0: off)"),
            every_s=ckpt.get("every_s", float, 60.0, check=lambda v: v >= 0, expect="a number ≥ 0 (0: off)"),
        ),
    )
    for table in (*tables.values(), root):
        table.finish()
    _check_together(spec, source)
    return spec


def _check_together(spec: JobSpec, source: str) -> None:
    """Rules that span keys."""
    if spec.script:
        if spec.module or spec.model or spec.data:
            raise ConfigError(f"{source}: job.script runs the script's own loop; "
                              "drop job.module, job.model and job.data")
        return _check_batches(spec, source)
    if spec.args:
        raise ConfigError(f"{source}: job.args are a script's arguments; set job.script too")
    if not spec.module and not spec.model:
        raise ConfigError(f"{source}: [job] needs module = 'package.module' (the job module), "
                          "model = 'module:callable', or script = 'train.py'")
    if not spec.module and not spec.data:
        raise ConfigError(f"{source}: job.data = 'module:callable' is required without a job module")
    _check_batches(spec, source)


def _check_batches(spec: JobSpec, source: str) -> None:
    if spec.global_batch and spec.global_batch < spec.min_local_batch:
        raise ConfigError(f"{source}: job.global_batch must be at least job.min_local_batch")
    if spec.max_local_batch and spec.max_local_batch < spec.min_local_batch:
        raise ConfigError(f"{source}: job.max_local_batch must be 0 or at least job.min_local_batch")
    if spec.data_mode == "shared" and spec.weighting != "samples":
        raise ConfigError(f"{source}: job.weighting applies to data_mode = 'local' only "
                          "(shared data is one data set: every sample counts once)")
    if spec.data_mode == "shared" and spec.data_loading.root:
        raise ConfigError(f"{source}: data.root applies to data_mode = 'local' only")
    if spec.gossip.deadline_floor_s > spec.gossip.deadline_ceiling_s:
        raise ConfigError(f"{source}: gossip.deadline_floor_s must not exceed gossip.deadline_ceiling_s")


def load_job(path: Path) -> tuple[JobSpec, str]:
    """The spec and its text (the text travels to the daemon as it is)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read job file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"job file {path} is not UTF-8 text") from None
    return parse_job(text, str(path)), text
