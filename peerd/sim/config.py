"""The settings of one simulated run, validated once."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from peerd.core.lr import DEFAULT_LAW, DEFAULT_MAX_SCALE, DEFAULT_RAMP_STEPS, check_law
from peerd.sim.algorithms import ALGORITHMS
from peerd.sim.network import NetworkSpec
from peerd.sim.schedule import Event
from peerd.sim.task import MODELS

TRAIN_SIZE = 4000  # the example task's training digits


@dataclass(frozen=True)
class SimConfig:
    peers: int = 16
    algorithm: str = "crossover"
    rounds: int = 0  # 0: as many as `epochs` passes over the data take
    epochs: float = 10.0
    global_batch: int = 512
    local_batch: int = 0  # > 0: every peer takes this many (peerd's way), the global batch follows the peers
    lr: float = 0.1
    momentum: float = 0.9
    warmup_rounds: int = 0
    ramp_steps: int = DEFAULT_RAMP_STEPS
    scaling: str = DEFAULT_LAW  # the LR scaling law with the global batch: linear, sqrt or none
    max_scale: float = DEFAULT_MAX_SCALE  # cap on the LR multiplier (1/cap its floor); inf: none
    segments: int = 8
    group_size: int = 8
    model: str = "logreg"
    hidden: int = 32
    weight_decay: float = 1e-4
    model_bytes: float = 0.0  # 0: the real model's float32 size; else time transfers as if this big
    seed: int = 0
    job: str = "sim"
    network: NetworkSpec = field(default_factory=NetworkSpec)
    sample_time: float = 2e-3
    step_overhead: float = 1e-3
    speed_spread: float = 0.0
    jitter_prob: float = 0.0
    jitter_factor: float = 3.0
    schedule: tuple[Event, ...] = ()
    detect_s: float = 5.0  # membership timeout: a crashed peer leaves the view this long after it was last heard
    deadline_floor_s: float = 0.05
    deadline_ceiling_s: float = 10.0
    gossip_only: bool = False  # no SGD steps: only averaging (to check that no mass is lost)
    eval_every: int = 0  # rounds between test evaluations of the average model; 0: only at the end
    eval_peers: int = 64  # at the end, test this many peers' own models (evenly spread)
    period: int = 1  # local steps between rounds, without an outer step ([gossip] period_steps)
    outer_every: int = 0  # H > 0: a round every H steps, then the outer step ([outer] every)
    outer_lr: float = 0.7
    outer_momentum: float = 0.5
    outer_nesterov: bool = True
    group_every: int = 0  # k > 0: between rounds, every k steps each group takes its exact mean (the inner tier)
    dbs_steps: bool = False  # slow peers take fewer of a round's steps, as peerd's DBS plans them
    weigh_changes: bool = False  # allreduce averages weighted by the samples trained since the last round

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {self.algorithm!r}; choose from {', '.join(ALGORITHMS)}")
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}; choose from {', '.join(MODELS)}")
        check_law(self.scaling, self.max_scale)
        checks = {
            "peers ≥ 1": self.peers >= 1,
            "rounds ≥ 0": self.rounds >= 0,
            "epochs > 0 when rounds is 0": self.rounds > 0 or self.epochs > 0,
            "global_batch ≥ peers": self.global_batch >= self.peers,
            "local_batch ≥ 0": self.local_batch >= 0,
            "lr > 0": self.lr > 0,
            "ramp_steps ≥ 0": self.ramp_steps >= 0,
            "0 ≤ momentum < 1": 0 <= self.momentum < 1,
            "segments ≥ 1": self.segments >= 1,
            "group_size ≥ 1": self.group_size >= 1,
            "model_bytes ≥ 0": self.model_bytes >= 0,
            "detect_s > 0": self.detect_s > 0,
            "eval_every ≥ 0 and eval_peers ≥ 1": self.eval_every >= 0 and self.eval_peers >= 1,
            "period ≥ 1 and outer_every ≥ 0": self.period >= 1 and self.outer_every >= 0,
            # as peerd refuses [gossip] period_steps with [outer] (docs/algorithms.md, "The outer step")
            "period 1 with outer_every": self.period == 1 or not self.outer_every,
            "group_every ≥ 0, with hierarchical":
                self.group_every == 0 or (self.group_every > 0 and self.algorithm == "hierarchical"),
            "allreduce with weigh_changes": self.algorithm == "allreduce" or not self.weigh_changes,
            "outer_lr > 0 and 0 ≤ outer_momentum < 1": self.outer_lr > 0 and 0 <= self.outer_momentum < 1,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError("invalid simulation settings: need " + "; ".join(bad))

    @property
    def total_rounds(self) -> int:
        if self.rounds:
            return self.rounds
        return max(1, math.ceil(self.epochs * TRAIN_SIZE / self.reference_batch))

    @property
    def round_every(self) -> int:
        """Local steps between rounds."""
        return self.outer_every or self.period

    @property
    def reference_batch(self) -> int:
        """The global batch the LR is given for: the one at the start."""
        return self.peers * self.local_batch if self.local_batch else self.global_batch

    @property
    def capacity(self) -> int:
        """Rows of the parameter matrix: the first peers and every joiner."""
        return self.peers + sum(e.who for e in self.schedule if e.kind == "join")
