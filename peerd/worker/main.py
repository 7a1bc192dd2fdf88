"""Worker process: `python -m peerd.worker ...`, started by the daemon.

Trains one job: local steps in a thread, a gossip round every
`gossip.period_steps` steps, progress and view through the daemon's socket.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from peerd.auth import Authenticator, load_secret
from peerd.core.deadline import DeadlineEstimator
from peerd.core.groups import plan_hierarchical
from peerd.core.robust import PullClipper
from peerd.core.segments import split_even
from peerd.core.shares import BatchPlan, Rebalancer
from peerd.core.suspicion import Suspicion
from peerd.core.topology import plan_round
from peerd.errors import ConfigError, PeerdError
from peerd.jobspec import JobSpec, parse_job
from peerd.logs import setup_logging
from peerd.proto.v1 import control_pb2
from peerd.rejections import Rejections
from peerd.tls import TlsMaterial, TlsSettings, load_tls
from peerd.worker.checkpoint import CheckpointDir
from peerd.worker.gossip import RoundResult, gossip_round
from peerd.worker.hierarchy import hierarchical_round
from peerd.worker.link import SupervisorLink
from peerd.worker.snapshots import WIRE_DTYPES, Identity, SegmentServer, SnapshotStore, StageStore
from peerd.worker.training import Trainer
from peerd.worker.state import StateBoard, StateMeta, StateServer, pull_state
from peerd.worker.traffic import (
    CountingSegmentServer,
    CountingStateServer,
    CountingTransport,
    ExchangeTimes,
    Traffic,
)
from peerd.worker.transport import GrpcTransport, start_exchange_server

log = logging.getLogger("peerd.worker")

HEARTBEAT_S = 0.5
# Exit codes the daemon acts on (peerd.daemon.jobs): only a crash is restarted.
EXIT_FINISHED = 0  # trained every epoch of the job
EXIT_LEFT = 3  # left on the operator's request (drain)
EXIT_STOPPED = 143  # stopped by a signal
EXIT_CONFIG = 2  # the job cannot load here: restarting would not help
CATCH_UP_ROUNDS = 10  # a partner further ahead than this is logged when this worker steps up to it
GROUP_LOG_ROUNDS = 100
SETTLE_WAIT_S = 30.0  # longest wait for a freshly started daemon to hear from its peers


@dataclass(frozen=True)
class Security:
    """The job secret and the TLS material: both absent means an open data plane."""

    auth: Authenticator | None = None
    tls: TlsMaterial | None = None


class Worker:
    def __init__(
        self, spec: JobSpec, trainer: Trainer, link: SupervisorLink, host: str, out_dir: Path,
        security: Security = Security(),
    ) -> None:
        self.spec = spec
        self.out_dir = out_dir
        self.trainer = trainer
        self.link = link
        self.host = host
        self.me = trainer.peer_id
        self.identity = Identity(spec.name, trainer.state.fingerprint(spec.fingerprint), self.me)
        numel = trainer.state.gossiped
        segments = 1 if spec.gossip.mode == "whole" else min(spec.gossip.segments, numel)
        self.layout = split_even(numel, segments)
        self.store = SnapshotStore(numel)
        self.stages = StageStore()
        self.board = StateBoard(trainer.state.numel, numel)
        self.recv = torch.empty(numel, dtype=torch.float32)
        # Averaging runs on the CPU, where the network buffers are: a model on a GPU
        # is copied here for the round and back after it (two copies per round).
        # None: the model is on the CPU and the round works on its vector directly.
        device = trainer.flat.vector.device.type
        self.work = None if device == "cpu" else torch.empty(numel, dtype=torch.float32, pin_memory=device == "cuda")
        self.security = security
        self.rejections = Rejections(log)
        self.traffic = Traffic()
        wire_bytes = 4 if spec.gossip.wire == "fp32" else 2
        self.transport = CountingTransport(
            GrpcTransport(self.identity, security.auth, security.tls, self.rejections, wire=spec.gossip.wire),
            self.traffic, wire_bytes)
        self.checkpoints = CheckpointDir(out_dir / "checkpoints", spec.name, self.identity.fingerprint, trainer.state.numel)
        self._checkpoint_at = (0, time.monotonic())  # round and time of the last checkpoint
        self.checkpoint_round = 0
        self.checkpoints_written = 0
        self.exchange_times = ExchangeTimes()  # one per gossip round this process completed
        self.stop_signal = False  # SIGTERM/SIGINT: finish the round, checkpoint, exit
        self.deadline = DeadlineEstimator(spec.gossip.deadline_floor_s, spec.gossip.deadline_ceiling_s)
        self.suspicion = Suspicion()
        self.clipper = PullClipper(spec.gossip.clip_factor)
        self.clipped = 0
        self.phase = "joining"
        self.round = 0
        self.misses = 0
        self._group_logged: tuple[tuple[str, ...], frozenset[str], int] = ((), frozenset(), 0)
        self.metrics: dict[str, float] = {}  # the last evaluation
        self.rebalancer = Rebalancer(spec.global_batch, spec.min_local_batch, spec.rebalance_rounds,
                                     spec.rebalance_threshold) if spec.global_batch else None

    async def run(self) -> None:
        chunk_elems = self.spec.gossip.chunk_kib * 1024 // 4
        server = CountingSegmentServer(
            SegmentServer(self.identity, self.store, len(self.layout), chunk_elems, self.stages, self.spec.gossip.wire),
            self.traffic)
        state = CountingStateServer(StateServer(self.identity, self.board, self.store, chunk_elems), self.traffic)
        grpc_server, address = await start_exchange_server(
            server, state, self.host, auth=self.security.auth, tls=self.security.tls, rejections=self.rejections)
        g = self.spec.gossip
        log.info("serving exchange on %s; %d parameters in %d segments; %s gossip%s, %s on the wire",
                 address, self.trainer.flat.numel, len(self.layout), g.mode,
                 f" in groups of ≤ {g.group_size}" if g.mode == "hierarchical" else "", g.wire)
        # The first beat, without our address, shows the view without putting us
        # in it: partners do not wait for a worker that is still taking the state.
        self._report(None)  # ... and what the others need of it from the start (local data: its n_i)
        await self.link.beat()
        # A daemon that just (re)started has not heard from its peers yet: an empty
        # view then would start the job over from scratch beside the running one.
        settle_by = time.monotonic() + SETTLE_WAIT_S
        while not self.link.settled and not self.link.view.keys() - {self.me} and time.monotonic() < settle_by:
            await asyncio.sleep(HEARTBEAT_S)
            await self.link.beat()
        await self._resume()
        self.phase = "training"
        log.info("training from round %d, step %d", self.round, self.trainer.step_count)
        await self.store.publish(self.round, self.trainer.flat.vector)
        self.link.address = address
        await self.link.beat()  # the view now decides the split of the first chunk
        beats = asyncio.create_task(self.link.run(HEARTBEAT_S))
        try:
            await self._train()
        finally:
            await self.store.finish()
            await self.stages.finish()
            await self.board.finish()
            self._report(None, finished=self.trainer.done)
            beats.cancel()
            await asyncio.gather(beats, return_exceptions=True)
            await self.link.beat()
            await grpc_server.stop(grace=1.0)
            await self.transport.aclose()
            await self.link.aclose()

    async def _resume(self) -> None:
        """Continue the job: from the running peers if there are any (their state
        is the job's), else from this peer's newest valid checkpoint, else from
        scratch. A checkpoint further along than the peers' state wins."""
        checkpoint = await asyncio.to_thread(self.checkpoints.load_newest)
        donors = {p: a for p, a in self.link.view.items() if p != self.me}
        if donors and await self._take_state(donors, "joining"):
            ours = (self.round, self.trainer.step_count)
            if checkpoint is None or (checkpoint.meta.round, checkpoint.meta.step) <= ours:
                return
            log.info("the checkpoint of round %d is ahead of the peers' state: using it", checkpoint.meta.round)
        if checkpoint is not None:
            meta = checkpoint.meta
            self.trainer.adopt_state(checkpoint.vector, meta.extra, meta.step, meta.progress)
            self.round = self.checkpoint_round = meta.round
            self._checkpoint_at = (meta.round, time.monotonic())
            log.info("resumed from checkpoint %s: round %d, step %d, epoch %.2f",
                     checkpoint.path.name, meta.round, meta.step, meta.progress)

    def request_stop(self) -> bool:
        """A signal asked the worker to stop. True: it will stop after its round
        (and checkpoint); False: it holds no training state worth keeping yet."""
        self.stop_signal = True
        return self.phase == "training"

    async def checkpoint(self, why: str) -> None:
        meta = self._meta()
        # A copy on the CPU (the model may live on a GPU): training goes on meanwhile.
        vector = self.trainer.state.vector()
        path = await asyncio.to_thread(self.checkpoints.save, meta, vector)
        self._checkpoint_at = (self.round, time.monotonic())
        self.checkpoint_round = self.round
        self.checkpoints_written += 1
        log.info("checkpoint of round %d written (%s): %s", self.round, why, path.name)

    def _checkpoint_due(self) -> bool:
        every = self.spec.checkpoint
        last_round, last_time = self._checkpoint_at
        return ((every.every_rounds > 0 and self.round - last_round >= every.every_rounds)
                or (every.every_s > 0 and time.monotonic() - last_time >= every.every_s))

    async def _train(self) -> None:
        while not self.trainer.done:
            if self.link.stop or self.stop_signal:
                self.phase = "draining"
                why = "the operator asked" if self.link.stop else "stopped by signal"
                log.info("leaving at round %d: %s", self.round, why)
                await self._announce_leave()
                await self.checkpoint(why)
                return
            if self.link.orphaned:
                raise PeerdError("lost the daemon: no heartbeat answer; stopping")
            view = dict(self.link.view)
            view[self.me] = self.link.address
            # Split the data among every member, also those still starting: they
            # will read their shares once they serve.
            members = sorted({*self.link.members, *view})
            plan = self._plan(members)
            self.trainer.set_data_sizes({p: self.link.data_sizes.get(p, 0) for p in view})
            for _ in range(self.spec.gossip.period_steps):
                await asyncio.to_thread(self.trainer.step, members, len(view), plan)
            self.round += 1
            into = await self._publish()
            if self.board.wanted:  # a newcomer asked for our state: copy it between steps
                await self.board.capture(self.trainer.state.parts(), self._meta())
            result = await self._round(view, into)
            if self._checkpoint_due():
                await self.checkpoint("periodic")
            if self.round % self.spec.eval_every_rounds == 0:
                self.metrics = await asyncio.to_thread(self.trainer.evaluate)
            self._report(result)
        self.metrics = await asyncio.to_thread(self.trainer.evaluate)
        path = self.out_dir / "model.pt"
        await asyncio.to_thread(
            self.trainer.save, path, round=self.round, metrics=self.metrics, fingerprint=self.identity.fingerprint)
        log.info("finished: %d steps, %d rounds, %s %.4f; model saved to %s", self.trainer.step_count,
                 self.round, self.spec.metric, self.metrics.get(self.spec.metric, math.nan), path)

    def _meta(self) -> StateMeta:
        """Where this worker stands, with the state that is not the vector."""
        t = self.trainer
        return StateMeta(self.round, t.step_count, t.progress, t.state.extra())

    def _log_group(self, group: tuple[str, ...], groups: int, view: frozenset[str]) -> None:
        """Hierarchical mode: say which group this worker is in when the view
        changes (a group re-cut every round is logged every 100 rounds)."""
        last, last_view, last_round = self._group_logged
        if view != last_view or (group != last and self.round - last_round >= GROUP_LOG_ROUNDS):
            self._group_logged = (group, view, self.round)
            log.info("round %d: in group %s of %d (%d in view)", self.round, ", ".join(group), groups, len(view))

    def _plan(self, members: list[str]) -> BatchPlan | None:
        """DBS: the batch plan for this round from the members' published speeds
        (this worker's own is fresher here than the one its daemon relays)."""
        if self.rebalancer is None:
            return None
        speeds = {**self.link.speeds, self.me: self.trainer.speed_ema}
        if self.rebalancer.update(self.round, members, speeds):
            log.info("round %d: batches %s (global %d)", self.round,
                     " ".join(f"{p}={b}" for p, b in self.rebalancer.plan.batches), self.rebalancer.plan.total)
        return self.rebalancer.plan

    async def _announce_leave(self) -> None:
        """Leave after this round: partners asking for a later one are told at
        once (not after their deadline), and the daemon's next Hello, sent at once,
        no longer lists this worker, so the others plan the next round without it."""
        await self.store.finish()
        await self.stages.finish()
        self.link.address = ""
        await self.link.beat()

    async def _publish(self) -> torch.Tensor | None:
        """Publish the model as this round's snapshot. On the CPU its vector itself
        becomes the snapshot, without a copy, and the round writes the new model
        into the buffer returned; on a GPU it is copied (None)."""
        if self.work is not None:
            await self.store.publish(self.round, self.trainer.flat.vector)
            return None
        return await self.store.hand_over(self.round, self.trainer.flat.vector)

    async def _round(self, view: dict[str, str], into: torch.Tensor | None) -> RoundResult | None:
        """This round's exchange; with `into`, the model moves there after it."""
        if into is None:
            return await self._gossip(view)
        snapshot = self.trainer.flat.vector
        result = None
        try:
            result = await self._gossip(view, into)
        finally:
            if result is None:  # nobody to gossip with (or a failure): the model as it was
                into.copy_(snapshot)
            self.trainer.flat.rebind(into)
        return result

    async def _gossip(self, view: dict[str, str], into: torch.Tensor | None = None) -> RoundResult | None:
        now = time.monotonic()
        peers = self.suspicion.keep(view, now)
        if len(peers) < 2:
            return None
        deadline = self.deadline.deadline()
        vector = self.work if self.work is not None else self.trainer.flat.vector
        if vector is not self.trainer.flat.vector:
            vector.copy_(self.trainer.flat.vector)
        if self.spec.gossip.mode == "hierarchical":
            # Paths are outermost first (label, host, daemon): a daemon's workers group first.
            localities = {p: (self.link.localities.get(p, ""), _host(view[p]), self.link.daemons.get(p, p))
                          for p in peers}
            plan = plan_hierarchical(self.spec.name, self.round, localities, self.me, len(self.layout),
                                     self.spec.gossip.group_size)
            self._log_group(plan.group, len(plan.groups), frozenset(peers))
            # Three transfers one after another: the floor holds for each of them.
            deadline = max(deadline, 3 * self.spec.gossip.deadline_floor_s)
            result = await hierarchical_round(plan, self.me, view, vector, self.recv, self.layout,
                                              self.transport, self.stages, deadline, self.clipper,
                                              WIRE_DTYPES[self.spec.gossip.wire], out=into)
        else:
            plan = plan_round(self.spec.name, self.round, peers, self.me, len(self.layout))
            result = await gossip_round(plan, view, vector, self.recv, self.layout, self.transport, deadline,
                                        self.clipper, out=into)
        if vector is not self.trainer.flat.vector:
            self.trainer.flat.vector.copy_(vector, non_blocking=True)
        self.misses += result.misses
        self.exchange_times.observe(result.seconds)
        if result.clipped:
            self.clipped += result.clipped
            log.warning("round %d: clipped %d oversized pull(s) (%d so far; gossip.clip_factor = %g)",
                        self.round, result.clipped, self.clipped, self.spec.gossip.clip_factor)
        if result.misses == 0:
            self.deadline.observe(result.seconds)
        elif result.errors:
            log.debug("round %d: %d segment(s) missed: %s", self.round, result.misses,
                      "; ".join(f"{p}: {e}" for p, e in sorted(result.errors.items())))
        for partner in result.planned:
            if self.suspicion.record(partner, partner not in result.unreachable, now):
                log.info("round %d: suspecting %s (no answer in %d rounds): %s", self.round, partner,
                         self.suspicion.threshold, result.errors.get(partner, ""))
        if result.ahead_round > self.round:
            await self._catch_up(result, view)
        return result

    async def _catch_up(self, result: RoundResult, view: dict[str, str]) -> None:
        """A partner is rounds ahead: step up to its round, keeping this model.

        Never by taking its state: being ahead in rounds says nothing about being
        right. A peer cut off by a partition races ahead in rounds (nobody to wait
        for) on a model that diverged; taking "the state of whoever is ahead"
        after the heal spread that model, pieced with others, to every peer and
        sent the job to chance accuracy (found by peerd soak). Gossip merges the
        models from here on, as it merges any two."""
        if result.ahead_round - self.round > CATCH_UP_ROUNDS:
            log.info("round %d: %s is in round %d; stepping up to it", self.round, result.ahead_peer,
                     result.ahead_round)
        self.round = max(self.round, result.ahead_round - 1)

    async def _take_state(self, donors: dict[str, str], why: str) -> bool:
        """Pull the training state from `donors` in parallel and continue from it."""
        started, phase = time.monotonic(), self.phase
        self.phase = "syncing"
        try:
            vector, meta, used = await pull_state(
                self.transport, donors, self.board.numel, self.spec.gossip.deadline_ceiling_s)
            self.trainer.adopt_state(vector, meta.extra, meta.step, meta.progress)
        except (PeerdError, ValueError) as exc:
            log.warning("%s: could not take the state from %s: %s", why, ", ".join(sorted(donors)), exc)
            return False
        finally:
            self.phase = phase
        self.round = meta.round
        if self.deadline.measured == 0:
            # The state is two model sizes, a round moves about one: a first deadline
            # from this transfer, not the ceiling, so a partner that died while this
            # peer joined costs a short wait (found with peerd.sim, docs/simulation.md).
            self.deadline.observe((time.monotonic() - started) / 2)
        log.info("%s: took the state of round %d (step %d, epoch %.2f) from %s in %.2fs",
                 why, meta.round, meta.step, meta.progress, ", ".join(used), time.monotonic() - started)
        return True

    def _report(self, result: RoundResult | None, finished: bool = False) -> None:
        t = self.trainer
        p = control_pb2.Progress(
            step=t.step_count, round=self.round, epoch=t.epoch, loss=t.loss_ema,
            samples_per_s=t.speed_ema, metric=self.metrics.get(self.spec.metric, math.nan), samples=t.samples,
            metric_name=self.spec.metric, metric_higher_better=self.spec.metric_mode == "max",
            metrics=self.metrics, skipped_steps=t.skipped_steps,
            data_samples=t.data_samples, data_mode=self.spec.data_mode,
            segment_misses=self.misses, finished=finished, disagreement=math.nan, exchange_s=math.nan, lr=t.lr,
            phase="finished" if finished else self.phase, global_batch=t.ramp.batch,
            rejected=dict(self.rejections.counts),
            local_batch=t.local_batch, share=t.share, compute_s=t.compute_s,
            rounds_done=self.exchange_times.count, bytes_sent=self.traffic.sent,
            bytes_received=self.traffic.received, exchange_buckets=self.exchange_times.buckets,
            exchange_sum_s=self.exchange_times.sum_s, exchange_count=self.exchange_times.count,
            checkpoint_round=self.checkpoint_round, checkpoints_written=self.checkpoints_written,
        )
        if result is not None:
            p.partners_reached = len(result.reached)
            p.partners_planned = len(result.planned)
            p.disagreement = result.disagreement
            p.exchange_s = result.seconds
        elif self.link.progress.partners_planned:
            old = self.link.progress
            p.partners_reached, p.partners_planned = old.partners_reached, old.partners_planned
            p.disagreement, p.exchange_s = old.disagreement, old.exchange_s
        self.link.progress = p


def _host(address: str) -> str:
    """The host part of "host:port" or "[v6]:port": workers on one host group first."""
    return address.rpartition(":")[0].strip("[]")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m peerd.worker", description="peerd training worker (started by the daemon)")
    parser.add_argument("--control", required=True, help="daemon control address, e.g. unix:/run/peerd/control.sock")
    parser.add_argument("--spec", required=True, type=Path, help="the job file")
    parser.add_argument("--spec-dir", default="", help="directory to import the job's model/data code from")
    parser.add_argument("--peer-id", required=True)
    parser.add_argument("--host", default="127.0.0.1", help="address to serve the exchange on")
    parser.add_argument("--out-dir", type=Path, default=Path("."), help="where the trained model is written")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--device", default="cpu", help='torch device to train on: "auto", "cpu", "cuda", "cuda:N", "mps"')
    parser.add_argument("--secret-file", type=Path, default=None,
                        help="the job secret: every exchange request and reply carries proof of it")
    parser.add_argument("--data-root", default="",
                        help='data_mode = "local": the directory holding this peer\'s data (the job reads ctx.data_root)')
    parser.add_argument("--tls-cert", type=Path, help="this peer's certificate (PEM), for mutual TLS")
    parser.add_argument("--tls-key", type=Path, help="its private key (PEM)")
    parser.add_argument("--tls-ca", type=Path, help="the CA that signed every peer's certificate (PEM)")
    parser.add_argument("--tls-server-name", default="", help="name to check peer certificates against")
    parser.add_argument("--slowdown", type=float, default=1.0,
                        help="testing knob: after each step sleep (SLOWDOWN − 1) × its compute time (default 1: none)")
    parser.add_argument("--log-format", default="text", choices=["text", "json"], help="log record format")
    return parser.parse_args(argv)


def load_security(args: argparse.Namespace) -> Security:
    auth = Authenticator(load_secret(args.secret_file)) if args.secret_file else None
    tls_files = (args.tls_cert, args.tls_key, args.tls_ca)
    if any(tls_files) and not all(tls_files):
        raise ConfigError("--tls-cert, --tls-key and --tls-ca go together")
    tls = load_tls(TlsSettings(*tls_files, args.tls_server_name)) if all(tls_files) else None
    return Security(auth, tls)


async def amain(args: argparse.Namespace) -> int:
    spec = parse_job(args.spec.read_text(), str(args.spec))
    setup_logging("INFO", args.log_format, job=spec.name, peer=args.peer_id)
    log.info("loading job %s on %s", spec.name, args.device)
    if spec.data_mode == "local" and not args.secret_file:
        raise ConfigError(f"job {spec.name!r} keeps its data on each peer (data_mode = 'local'): "
                          "its workers run only with a job secret (--secret-file)")
    security = load_security(args)
    torch.set_num_threads(args.threads)
    trainer = Trainer(spec, args.peer_id, args.spec_dir, args.slowdown, args.device, args.data_root)
    link = SupervisorLink(args.control, spec.name, trainer.state.fingerprint(spec.fingerprint), member=args.peer_id)
    worker = Worker(spec, trainer, link, args.host, args.out_dir, security)
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()

    def on_signal() -> None:
        # The first signal stops after the current round, with a checkpoint;
        # a second one (or one before training began) stops at once.
        if worker.stop_signal or not worker.request_stop():
            task.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    try:
        await worker.run()
    except asyncio.CancelledError:
        log.info("stopped by signal at round %d", worker.round)
        return EXIT_STOPPED
    finally:
        trainer.close()
    if worker.stop_signal and not trainer.done:
        log.info("stopped by signal at round %d", worker.round)
        return EXIT_STOPPED
    return EXIT_FINISHED if trainer.done else EXIT_LEFT


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging("INFO", args.log_format, peer=args.peer_id)
    if sys.byteorder != "little":
        print("peerd: big-endian hosts are not supported (segments travel as little-endian fp32)", file=sys.stderr)
        return 2
    try:
        import uvloop

        return uvloop.run(amain(args))
    except ConfigError as exc:
        log.error("%s", exc)
        return EXIT_CONFIG
    except PeerdError as exc:
        log.error("%s", exc)
        return 1
