"""The job spec (JOB.toml): identical on every peer, checked by fingerprint.

Parsed once, at the edge, into a frozen `JobSpec`; nothing below takes raw dicts.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from peerd.errors import ConfigError
from peerd.tomlconf import Table, load_toml

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_ENTRY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@dataclass(frozen=True)
class OptimizerSpec:
    name: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    nesterov: bool = False
    schedule: str = "cosine"  # "constant" or "cosine" (to 0 over the job's epochs)
    reference_batch: int = 0  # global batch `lr` is meant for; 0: no scaling with the peer count
    ramp_steps: int = 8  # T of Dynamic mini-batch SGD: ramp over T·max(k, 1/k) steps


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


@dataclass(frozen=True)
class CheckpointSpec:
    every_rounds: int = 0  # write one every this many rounds (0: not by rounds)
    every_s: float = 60.0  # ... and/or when this many seconds passed since the last (0: not by time)


@dataclass(frozen=True)
class JobSpec:
    name: str
    model: str  # "module:callable" returning a torch.nn.Module
    data: str  # "module:callable" returning (train, test) datasets
    seed: int = 0
    init: str = "shared"  # "shared": every peer starts from the same model; "per-peer": each from its own
    data_mode: str = "shared"
    local_batch: int = 32  # per peer, when global_batch is 0
    # Dynamic batch size (DBS): with global_batch > 0 each peer's batch follows its measured speed.
    global_batch: int = 0  # target Σ of the local batches; 0: every peer keeps local_batch
    min_local_batch: int = 1
    max_local_batch: int = 0  # largest batch in one forward pass, above it gradients accumulate; 0: no limit
    rebalance_rounds: int = 10  # re-evaluate the batches every this many rounds
    rebalance_threshold: float = 0.1  # ... and change them only if one moves by more than this (relative)
    epochs: float = 1.0
    # Each epoch's permutation is read in this many chunks, each split among the
    # members of the moment: a membership change takes effect at the next chunk.
    epoch_chunks: int = 8
    eval_every_rounds: int = 100
    optimizer: OptimizerSpec = OptimizerSpec()
    gossip: GossipSpec = GossipSpec()
    # Where this peer keeps the job secret (docs/operations.md). Only the path is
    # here, never the secret, and it is left out of the fingerprint: each machine
    # may keep the file in its own place.
    secret_file: str = ""
    checkpoint: CheckpointSpec = CheckpointSpec()

    @property
    def fingerprint(self) -> str:
        """sha256 of the canonical spec: two peers train together only if equal.
        The secret's path and the checkpoint settings are each peer's own business
        and are left out."""
        fields = asdict(self)
        del fields["secret_file"]
        del fields["checkpoint"]
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:32]

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


def parse_job(text: str, source: str) -> JobSpec:
    root = Table(load_toml(text, source), source, "")
    job = root.sub("job")
    opt = root.sub("optimizer")
    gossip = root.sub("gossip")
    ckpt = root.sub("checkpoint")
    positive = dict(check=lambda v: v > 0, expect="a number > 0")
    spec = JobSpec(
        name=job.get("name", str, check=_NAME.fullmatch, expect="a name of letters, digits, '_', '.', '-' (≤ 63)"),
        model=job.get("model", str, check=_ENTRY.fullmatch, expect="'module:callable'"),
        data=job.get("data", str, check=_ENTRY.fullmatch, expect="'module:callable'"),
        seed=job.get("seed", int, 0),
        init=job.get("init", str, "shared", check=lambda v: v in ("shared", "per-peer"),
                     expect="'shared' or 'per-peer'"),
        data_mode=job.get("data_mode", str, "shared", check=lambda v: v == "shared",
                          expect="'shared' (the only mode so far)"),
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
        epoch_chunks=job.get("epoch_chunks", int, 8, check=lambda v: 1 <= v <= 65536,
                             expect="an integer in 1..65536 (1: one split per epoch)"),
        eval_every_rounds=job.get("eval_every_rounds", int, 100, **positive),
        secret_file=job.get("secret_file", str, "", check=lambda v: 0 < len(v) <= 4096 and "\0" not in v,
                            expect="a path to a file holding the job secret"),
        optimizer=OptimizerSpec(
            name=opt.get("name", str, "sgd", check=lambda v: v == "sgd", expect="'sgd'"),
            lr=opt.get("lr", float, 0.05, **positive),
            momentum=opt.get("momentum", float, 0.9, check=lambda v: 0 <= v < 1, expect="a number in [0, 1)"),
            weight_decay=opt.get("weight_decay", float, 0.0, check=lambda v: v >= 0, expect="a number ≥ 0"),
            nesterov=opt.get("nesterov", bool, False),
            schedule=opt.get("schedule", str, "cosine", check=lambda v: v in ("constant", "cosine"),
                             expect="'constant' or 'cosine'"),
            reference_batch=opt.get("reference_batch", int, 0, check=lambda v: 0 <= v <= 1 << 24,
                                    expect="an integer ≥ 0 (0: no scaling)"),
            ramp_steps=opt.get("ramp_steps", int, 8, check=lambda v: 0 <= v <= 100_000, expect="an integer ≥ 0"),
        ),
        gossip=GossipSpec(
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
            chunk_kib=gossip.get("chunk_kib", int, 1024, check=lambda v: 4 <= v <= 16384, expect="an integer in 4..16384"),
            deadline_floor_s=gossip.get("deadline_floor_s", float, 0.5, **positive),
            deadline_ceiling_s=gossip.get("deadline_ceiling_s", float, 10.0, **positive),
        ),
        checkpoint=CheckpointSpec(
            every_rounds=ckpt.get("every_rounds", int, 0, check=lambda v: v >= 0, expect="an integer ≥ 0 (0: off)"),
            every_s=ckpt.get("every_s", float, 60.0, check=lambda v: v >= 0, expect="a number ≥ 0 (0: off)"),
        ),
    )
    for table in (job, opt, gossip, ckpt, root):
        table.finish()
    if spec.global_batch and spec.global_batch < spec.min_local_batch:
        raise ConfigError(f"{source}: job.global_batch must be at least job.min_local_batch")
    if spec.max_local_batch and spec.max_local_batch < spec.min_local_batch:
        raise ConfigError(f"{source}: job.max_local_batch must be 0 or at least job.min_local_batch")
    if spec.gossip.deadline_floor_s > spec.gossip.deadline_ceiling_s:
        raise ConfigError(f"{source}: gossip.deadline_floor_s must not exceed gossip.deadline_ceiling_s")
    return spec


def load_job(path: Path) -> tuple[JobSpec, str]:
    """The spec and its text (the text travels to the daemon as it is)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read job file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"job file {path} is not UTF-8 text") from None
    return parse_job(text, str(path)), text
