"""One simulated training run: rounds of real SGD and real averaging on a virtual clock."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from peerd.core.deadline import DeadlineEstimator
from peerd.core.lr import ScaleRamp, cosine
from peerd.core.membership import Membership, PeerRecord
from peerd.core.segments import split_even
from peerd.settings.jobspec import OuterSpec
from peerd.sim.algorithms import Comm, Segments, State, View, contiguous, run_round
from peerd.sim.compute import SpeedModel
from peerd.sim.config import TRAIN_SIZE, SimConfig
from peerd.sim.data import Reader
from peerd.sim.dbs import round_steps
from peerd.sim.network import Fabric
from peerd.sim.task import Task
from peerd.sim.tiers import group_average, slow_bytes
from peerd.sim.timing import play


def peer_name(slot: int) -> str:
    return f"p{slot:05d}"  # zero-padded: sorted names are in slot order


@dataclass
class Result:
    config: SimConfig
    rounds: list[dict] = field(default_factory=list)  # one row per round
    peers: list[dict] = field(default_factory=list)  # one row per peer that ever ran
    summary: dict = field(default_factory=dict)


class Simulation:
    def __init__(self, config: SimConfig, task: Task | None = None) -> None:
        self.cfg = c = config
        self.task = task or Task(c.model, c.hidden, c.weight_decay)
        d = self.task.size
        self.state = State(np.zeros((c.capacity, d), np.float32), np.ones(c.capacity))
        self.state.x[: c.peers] = self.task.init(c.seed)
        self.velocity = np.zeros_like(self.state.x)
        self.outer = self._outer_state() if c.outer_every else None
        self.trained = np.zeros(c.capacity)  # samples each peer trained since its last round
        self.planned: dict[int, int] = {}  # with --dbs-steps: each peer's steps in this round
        per_param = c.model_bytes / d if c.model_bytes else 4.0
        self.segs = Segments(tuple(split_even(d, min(c.segments, d))), per_param)
        self.fabric = Fabric(c.network)
        self.speed = SpeedModel(c.sample_time, c.step_overhead, c.speed_spread, c.jitter_prob, c.jitter_factor, c.seed)
        self.membership = Membership(me="simulator", timeout_s=c.detect_s)
        self.reader = Reader(TRAIN_SIZE, c.job)
        self.ramp = ScaleRamp(c.reference_batch, c.ramp_steps, c.scaling, c.max_scale)
        self.live: set[int] = set(range(c.peers))
        self.crashed: set[int] = set()
        self.free_at = {s: 0.0 for s in self.live}  # when each peer starts its next step
        self.joining: list[tuple[int, float, int]] = []  # (slot, model fetched at, donor)
        self.next_slot = c.peers
        self.events = list(c.schedule)
        self.deadlines: dict[int, DeadlineEstimator] = {}
        self.totals: dict[int, dict[str, float]] = {}
        self.result = Result(c)

    def _outer_state(self):
        from peerd.sim.outer import OuterState  # imports torch: only runs with the outer step pay for it

        c = self.cfg
        return OuterState(OuterSpec(c.outer_every, c.outer_lr, c.outer_momentum, c.outer_nesterov), self.state.x)

    # ------------------------------------------------------------ membership

    def _apply_events(self, now: float) -> None:
        while self.events and self.events[0].time <= now:
            e = self.events.pop(0)
            if e.kind == "speed":
                self.speed.set_factor(e.who, e.value)
            elif e.kind in ("fail", "leave") and e.who in self.live:
                self.live.discard(e.who)
                if e.kind == "fail":
                    self.crashed.add(e.who)
                else:
                    self.membership.forget(peer_name(e.who))
            elif e.kind == "join":
                for _ in range(e.who):
                    self._start_join(e.time)
        for slot, done, donor in [j for j in self.joining if j[1] <= now]:
            self.joining.remove((slot, done, donor))
            self.state.x[slot] = self.state.models(np.array([donor]))[0]
            if self.outer:
                self.outer.join(slot, donor)
            self.trained[slot] = self.trained[donor]
            self.live.add(slot)
            self.free_at[slot] = now

    def _start_join(self, at: float) -> None:
        slot, self.next_slot = self.next_slot, self.next_slot + 1
        ordered = sorted(self.live)
        if not ordered:
            raise ValueError(f"a peer joins at t = {at} s but no peer is left to give it the model")
        donor = ordered[slot % len(ordered)]  # spread newcomers over donors
        done = self.fabric.send(donor, slot, self.segs.model_bytes, at)
        self.joining.append((slot, done, donor))

    def _view(self, round_: int, now: float) -> View:
        for slot in self.live:
            self.membership.observe(PeerRecord(peer_name(slot), "", last_seen=now))
        self.membership.expire(now)
        names = tuple(p.peer_id for p in self.membership.peers())
        slots = np.array([int(n[1:]) for n in names], dtype=np.int64)
        dead = np.array([s in self.crashed for s in slots], dtype=bool)
        locs = {n: self.cfg.network.locality(int(s)) for n, s in zip(names, slots)}
        return View(self.cfg.job, round_, names, slots, dead, locs)

    # ------------------------------------------------------------ one round

    def _local_step(self, round_: int, live: np.ndarray, names: list[str]) -> tuple[np.ndarray, float, float]:
        """Batch sizes, mean train loss and the LR of this round's SGD step."""
        c, n = self.cfg, len(live)
        if c.local_batch:
            sizes = np.full(n, c.local_batch)
        else:
            sizes = np.full(n, c.global_batch // n)
            sizes[: c.global_batch % n] += 1
        self.ramp.set_batch(int(sizes.sum()), round_)
        warm = min(1.0, (round_ + 1) / c.warmup_rounds) if c.warmup_rounds else 1.0
        lr = c.lr * cosine(round_ / c.total_rounds) * self.ramp.scale(round_) * warm
        if c.dbs_steps:  # after the ramp, which follows the planned global batch
            if round_ % c.round_every == 0:
                self.planned = round_steps(self.speed, live, names, int(sizes.min()), c.round_every)
            sizes = sizes * np.array([round_ % c.round_every < self.planned.get(int(s), c.round_every) for s in live])
        if c.gossip_only:
            return sizes, float("nan"), lr
        idx, mask = self.reader.batches(names, sizes.tolist())
        x, y = self.task.train_x[idx], self.task.train_y[idx]
        grad, loss = self.task.grads(self.state.models(live), x, y, mask)
        rows = contiguous(live)
        self.trained[rows] += sizes
        v = self.velocity[rows]
        if not c.dbs_steps or sizes.all():  # (without DBS a peer with no samples still steps, by its momentum)
            v *= c.momentum
            v += grad
            self.velocity[rows] = v
            self.state.x[rows] -= lr * v
            return sizes, float(loss.mean()), lr
        rest = (sizes == 0)[:, None]  # peers done with their steps this round stay as they are
        v = np.where(rest, v, c.momentum * v + grad)
        self.velocity[rows] = v
        self.state.x[rows] -= lr * np.where(rest, np.float32(0), v)
        return sizes, float(loss[sizes > 0].mean()), lr

    def _deadline(self, slot: int) -> DeadlineEstimator:
        if slot not in self.deadlines:
            self.deadlines[slot] = DeadlineEstimator(self.cfg.deadline_floor_s, self.cfg.deadline_ceiling_s)
        return self.deadlines[slot]

    def _time(self, view: View, comm: Comm, ready: dict[int, float]) -> tuple[dict[int, float], dict[int, float]]:
        """When each live peer is done with the round, and the bytes each sent."""
        live = [int(s) for s in view.live]
        if comm.transfers or not comm.collective_bytes:
            return play(
                comm.transfers, ready, self.crashed, self.fabric,
                lambda s: self._deadline(s).deadline(), lambda s, sec: self._deadline(s).observe(sec),
            )
        start = max(ready[s] for s in live)
        if view.dead.any():  # the collective hangs on the crashed peer until the deadline
            start += max(self._deadline(s).deadline() for s in live)
        n = len(live)
        link = self.fabric.slowest(live)
        took = 2 * (n - 1) * (link.latency + self.segs.model_bytes / n / link.bandwidth)
        for s in live:
            self._deadline(s).observe(took)
        return {s: start + took for s in live}, {s: comm.collective_bytes for s in live}

    def round(self, round_: int) -> None:
        now = min(self.free_at[s] for s in self.live)
        self._apply_events(now)
        if not self.live:
            raise ValueError(f"no peer is left at round {round_} (t = {now:.3f} s): check the schedule")
        view = self._view(round_ // self.cfg.round_every, now)  # the cores' seeds count rounds, not steps
        live = view.live
        names = [peer_name(int(s)) for s in live]
        sizes, loss, lr = self._local_step(round_, live, names)
        steps = self.speed.step_times(live, sizes)
        if self.cfg.dbs_steps:
            steps = steps * (sizes > 0)  # a peer done with its steps for this round waits for the round
        ready = {int(s): self.free_at[int(s)] + t for s, t in zip(live, steps)}
        comm = Comm()  # between rounds a peer goes on with its next step at once
        inner = 0.0
        if (round_ + 1) % self.cfg.round_every == 0:
            weights = self.trained[live] if self.cfg.weigh_changes and self.trained[live].any() else None
            comm = run_round(self.cfg.algorithm, self.state, view, self.segs, self.cfg.group_size, weights)
            self.trained[live] = 0
            if self.outer:
                self.outer.step(self.state, live)
        elif self.cfg.group_every and (round_ + 1) % self.cfg.group_every == 0:
            inner = self._group_step(view, ready)
        end, sent = self._time(view, comm, ready)
        idle = []
        for s, step in zip(live, steps):
            s = int(s)
            done = max(ready[s], end.get(s, ready[s]))
            t = self.totals.setdefault(s, {"compute_s": 0.0, "idle_s": 0.0, "bytes_sent": 0.0, "rounds": 0})
            t["compute_s"] += step
            t["idle_s"] += done - ready[s]
            t["bytes_sent"] += sent.get(s, 0.0)
            t["rounds"] += 1
            idle.append(done - ready[s])
            self.free_at[s] = done
        self._record(round_, view, sizes, loss, lr, idle, [sent.get(int(s), 0.0) for s in live])
        n = len(live)
        self.result.rounds[-1].update(slow_bytes_per_peer=slow_bytes(comm, [int(s) for s in live], self.cfg.network) / n,
                                      group_bytes_per_peer=inner / n)

    def _group_step(self, view: View, ready: dict[int, float]) -> float:
        """The inner tier: each group's exact mean, timed as a ring all-reduce on
        the group's slowest link once its last member is ready; the bytes sent."""
        total, model = 0.0, self.segs.model_bytes
        for slots in group_average(self.state, view, self.cfg.group_size):
            g = len(slots)
            if g < 2:
                continue
            link = self.fabric.slowest(slots)
            done = max(ready[s] for s in slots) + 2 * (g - 1) * (link.latency + model / g / link.bandwidth)
            for s in slots:
                ready[s] = done
            total += 2 * (g - 1) * model  # each member sends 2(g − 1)/g models
        return total

    def _record(self, round_, view, sizes, loss, lr, idle, sent) -> None:
        models = self.state.models(view.live)
        mean = models.mean(axis=0)
        row = {
            "round": round_,
            "sim_time_s": float(max(self.free_at[int(s)] for s in view.live)),
            "peers": len(view.live),
            "in_view": len(view.names),
            "global_batch": int(sizes.sum()),
            "lr": lr,
            "train_loss": loss,
            "consensus_distance": float(np.linalg.norm(models - mean, axis=1).mean()),
            "bytes_per_peer": float(np.mean(sent)),
            "max_bytes_per_peer": float(np.max(sent)),
            "idle_mean_s": float(np.mean(idle)),
            "mean_abs_param": float(np.abs(mean).mean()),
            "test_accuracy_of_mean": float("nan"),
        }
        c = self.cfg
        if c.eval_every and (round_ + 1) % c.eval_every == 0:
            row["test_accuracy_of_mean"] = float(self.task.accuracy(mean[None])[0])
        self.result.rounds.append(row)

    # ------------------------------------------------------------ the run

    def run(self, progress: Callable[[int, int, float], None] | None = None) -> Result:
        started, cpu = time.perf_counter(), time.process_time()
        total = self.cfg.total_rounds
        for r in range(total):
            self.round(r)
            if progress:
                progress(r + 1, total, self.result.rounds[-1]["sim_time_s"])
        self._finish(time.perf_counter() - started, time.process_time() - cpu)
        return self.result

    def _finish(self, real_s: float, cpu_s: float) -> None:
        live = np.array(sorted(self.live))
        models = self.state.models(live)
        pick = np.unique(np.linspace(0, len(live) - 1, min(self.cfg.eval_peers, len(live))).round().astype(int))
        acc = self.task.accuracy(models[pick])
        mean_acc = float(self.task.accuracy(models.mean(axis=0)[None])[0])
        self.result.peers = [
            {"peer": peer_name(s), "slot": s, "live": s in self.live, "crashed": s in self.crashed,
             "locality": "/".join(self.cfg.network.locality(s)), **t}
            for s, t in sorted(self.totals.items())
        ]
        last = self.result.rounds[-1]
        rounds = len(self.result.rounds)
        self.result.summary = {
            "algorithm": self.cfg.algorithm,
            "peers_start": self.cfg.peers,
            "peers_end": len(live),
            "scaling": self.cfg.scaling,
            "max_scale": self.cfg.max_scale,
            "ramp_steps": self.cfg.ramp_steps,
            "rounds": rounds,
            "params": int(self.state.x.shape[1]),
            "model_bytes": self.segs.model_bytes,
            "test_accuracy_mean_peer": float(acc.mean()),
            "test_accuracy_min_peer": float(acc.min()),
            "test_accuracy_of_mean_model": mean_acc,
            "final_consensus_distance": last["consensus_distance"],
            "mean_consensus_distance": float(np.mean([r["consensus_distance"] for r in self.result.rounds])),
            "final_train_loss": float(np.nanmean([r["train_loss"] for r in self.result.rounds[-5:]]))
            if not self.cfg.gossip_only else float("nan"),
            "bytes_per_peer_per_round": float(np.mean([r["bytes_per_peer"] for r in self.result.rounds])),
            "averaging_rounds": rounds // self.cfg.round_every,
            # all the bytes every peer sent over all the samples trained: rounds' cost per unit of work
            "bytes_per_sample": float(sum(r["bytes_per_peer"] * r["peers"] for r in self.result.rounds)
                                      / sum(r["global_batch"] for r in self.result.rounds)),
            # of those, the bytes that leave a host; and apart from them the inner tier's (--group-every)
            "slow_bytes_per_sample": self._per_sample("slow_bytes_per_peer"),
            "group_bytes_per_sample": self._per_sample("group_bytes_per_peer"),
            "sim_time_s": last["sim_time_s"],
            "idle_fraction": float(
                sum(t["idle_s"] for t in self.totals.values())
                / max(1e-12, sum(t["idle_s"] + t["compute_s"] for t in self.totals.values()))
            ),
            "real_time_s": real_s,
            "rounds_per_s": rounds / real_s if real_s > 0 else float("inf"),
            "cpu_time_s": cpu_s,  # on a shared machine, the fairer measure of cost
            "rounds_per_cpu_s": rounds / cpu_s if cpu_s > 0 else float("inf"),
        }

    def _per_sample(self, key: str) -> float:
        rounds = self.result.rounds
        return float(sum(r[key] * r["peers"] for r in rounds) / sum(r["global_batch"] for r in rounds))


def simulate(config: SimConfig, progress: Callable[[int, int, float], None] | None = None) -> Result:
    return Simulation(config).run(progress)
