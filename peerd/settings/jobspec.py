"""The job spec (JOB.toml): identical on every peer, checked by fingerprint.

Parsed once, at the edge, into a frozen `JobSpec`; nothing below takes raw dicts.
Each table's keys are read and checked in peerd.settings.jobtables; the rules that span
keys are here.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import tomli_w

from peerd.settings import jobtables
from peerd.core.lr import DEFAULT_LAW, DEFAULT_MAX_SCALE, DEFAULT_RAMP_STEPS
from peerd.errors import ConfigError
from peerd.settings.tomlconf import Table, load_toml


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


@dataclass(frozen=True)
class GossipSpec:
    period_steps: int = 1  # local optimizer steps between gossip rounds
    # "crossover": flat, segment by segment (docs/algorithms.md §1.2); "hierarchical":
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
class OuterSpec:
    """An outer optimizer over the rounds (DiLoCo-style local SGD;
    docs/algorithms.md, "The outer step"): every `every` local steps a round
    averages, then SGD with momentum steps the shared anchor by the averaged change."""

    every: int = 0  # H, local steps between outer steps; 0: no outer step (a round every period_steps)
    lr: float = 0.7
    momentum: float = 0.5  # DiLoCo uses 0.9 over hundreds of steps; over a few it overshoots (docs/algorithms.md)
    nesterov: bool = True

    @property
    def enabled(self) -> bool:
        return self.every > 0


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
class LogSpec:
    """What this peer logs of the job: its own business, not in the fingerprint."""

    # TensorBoard event files in DIR/JOB/MEMBER, instead of the daemon's [log]
    # tensorboard; relative: to the job file. Empty: the daemon's.
    tensorboard: str = ""


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
    # The metric of a model that learned nothing (0.1: accuracy over 10 classes);
    # None: unknown. The collapse watch's metric rule (peerd.core.health) needs it.
    chance: float | None = None
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
    rebalance_threshold: float = 0.1  # ... and change them only if the round gets faster by more than this (relative)
    # DBS's step model: "affine", t_i(b) = a_i + c_i·b with each peer's fixed cost
    # a_i; "proportional", t_i(b) = b / v_i (the plan before fixed costs were measured).
    step_model: str = "affine"
    epochs: float = 1.0
    # Batches run on across epoch ends, so only the job's last batch may be short:
    # skip it when it is (one of a single sample is always skipped: BatchNorm cannot train on it).
    drop_last: bool = False
    # Each epoch's permutation is read in this many chunks, each split among the
    # members of the moment: a membership change takes effect at the next chunk.
    epoch_chunks: int = 8
    eval_every_rounds: int = 100
    # A job starts together: the first workers hold the initial state and take
    # no step until this many members are in the job (peerd.core.startgate); a
    # peer coming later joins the running job. Each peer's own business: left
    # out of the fingerprint, like the checkpoint settings.
    min_peers: int = 1
    start_timeout_s: float = 600.0  # ... and give up (the worker fails, saying so) after this long
    # A script that has not called peer.step() this long after attach() is told so
    # in its log (its first step may just be slow: a compile, a large data load).
    first_step_warning_s: float = 120.0
    optimizer: OptimizerSpec = OptimizerSpec()
    gossip: GossipSpec = GossipSpec()
    outer: OuterSpec = OuterSpec()
    train: TrainSpec = TrainSpec()
    data_loading: DataSpec = DataSpec()
    # Where this peer keeps the job secret (docs/operations.md). Only the path is
    # here, never the secret, and it is left out of the fingerprint: each machine
    # may keep the file in its own place.
    secret_file: str = ""
    checkpoint: CheckpointSpec = CheckpointSpec()
    log: LogSpec = LogSpec()
    # What travels with the job besides its script or module: paths relative to
    # the job file's directory (files, or directories taken whole).
    files: tuple[str, ...] = ()
    # The sha256 of the job's code bundle (docs/operations.md, "A job's code
    # travels"), written into the job by the daemon that joins with a job file.
    code: str = ""

    @property
    def fingerprint(self) -> str:
        """sha256 of the canonical spec: two peers train together only if equal.
        The secret's path, the checkpoint settings, data loading and logging are
        each peer's own business and are left out, and so is the chance level."""
        fields = asdict(self)
        del fields["secret_file"]
        del fields["checkpoint"]
        del fields["data_loading"]
        del fields["log"]
        del fields["min_peers"]
        del fields["start_timeout_s"]
        del fields["first_step_warning_s"]
        del fields["chance"]  # what is watched, not what is trained
        if self.data_mode == "shared":  # fingerprints of shared-data jobs as before local mode
            del fields["weighting"]
        if self.step_model == "affine":  # ... and of jobs as before the step model was a choice
            del fields["step_model"]
        if not self.outer.enabled:  # ... and of jobs without an outer step
            del fields["outer"]
        for key in ("files", "code"):  # ... and of jobs whose code does not travel
            if not fields[key]:
                del fields[key]
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

    def secret_here(self, spec_dir: str, default: Path | None, by_name: bool = False) -> Path | None:
        """The job secret file this machine uses: the job's secret_file, else
        `default` (the daemon's [auth] job_secret_file). Joined by name the job file
        is a peer's, so its secret_file may not be here: then the daemon's stands
        in (docs/operations.md, "A job's code travels")."""
        if by_name and default is not None:
            try:
                own = self.secret_path(spec_dir)
            except ConfigError:  # relative, and no --dir to take it from
                return default
            return own if own is not None and own.exists() else default
        return self.secret_path(spec_dir) or default

    def tensorboard_dir(self, spec_dir: str) -> Path | None:
        """The job's own [log] tensorboard, a relative path taken from the job
        file's directory; None when the job names none."""
        if not self.log.tensorboard:
            return None
        path = Path(self.log.tensorboard).expanduser()
        if path.is_absolute():
            return path
        if not spec_dir:
            raise ConfigError(
                f"job {self.name!r}: log.tensorboard {self.log.tensorboard!r} is relative, and this job came "
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


def parse_job(text: str, source: str) -> JobSpec:
    root = Table(load_toml(text, source), source, "")
    names = ("job", "optimizer", "gossip", "outer", "train", "data", "checkpoint", "log")
    tables = {name: root.sub(name) for name in names}
    spec = JobSpec(
        **jobtables.job_table(tables["job"]),
        optimizer=OptimizerSpec(**jobtables.optimizer_table(tables["optimizer"])),
        gossip=GossipSpec(**jobtables.gossip_table(tables["gossip"])),
        outer=OuterSpec(**jobtables.outer_table(tables["outer"])),
        train=TrainSpec(**jobtables.train_table(tables["train"])),
        data_loading=DataSpec(**jobtables.data_table(tables["data"])),
        checkpoint=CheckpointSpec(**jobtables.checkpoint_table(tables["checkpoint"])),
        log=LogSpec(**jobtables.log_table(tables["log"])),
    )
    for table in (*tables.values(), root):
        table.finish()
    _check_together(spec, source)
    return _with_outer(spec, tables["gossip"].given("period_steps"), source)


def _with_outer(spec: JobSpec, period_given: bool, source: str) -> JobSpec:
    """The outer step's `every` is the rounds' period: a round every H local
    steps (docs/algorithms.md, "The outer step"); a period set as well is
    refused rather than one of the two silently winning."""
    if not spec.outer.enabled:
        return spec
    if period_given:
        raise ConfigError(f"{source}: [outer] every = {spec.outer.every} with gossip.period_steps: "
                          "outer.every sets the local steps between rounds; drop period_steps")
    return replace(spec, gossip=replace(spec.gossip, period_steps=spec.outer.every))


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


def with_code(text: str, code: str) -> str:
    """The job file's text with [job] code set: the daemon names the bundle it made."""
    data = load_toml(text, "job spec")
    data.setdefault("job", {})["code"] = code
    return tomli_w.dumps(data)


def load_job(path: Path) -> tuple[JobSpec, str]:
    """The spec and its text (the text travels to the daemon as it is)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read job file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"job file {path} is not UTF-8 text") from None
    return parse_job(text, str(path)), text
