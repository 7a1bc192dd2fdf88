"""Prometheus metrics of the daemon and its workers, served over HTTP.

Nothing is mirrored: on every scrape the collector reads the daemon's
membership and the last Progress each worker sent in its heartbeat. Worker
counters count since that worker process started; a restarted worker starts
them at 0 again, which Prometheus treats as a counter reset.

The endpoint is a small HTTP/1.0 server on the daemon's event loop, bound to
`[metrics] host:port` (loopback by default): `GET /metrics`, and the routes the
daemon adds beside it (its page, peerd.daemon.web).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)

from peerd import __version__
from peerd.core.names import join_host_port
from peerd.errors import ConfigError
from peerd.control.progress import EXCHANGE_BUCKETS_S
from peerd.proto.v1 import control_pb2

if TYPE_CHECKING:
    from peerd.daemon.app import Daemon

log = logging.getLogger("peerd.metrics")
_HAS_REJECTED = "rejected" in control_pb2.Progress.DESCRIPTOR.fields_by_name
READ_TIMEOUT_S = 5.0
MAX_REQUEST_BYTES = 8192
# A route: the query's parameters in, the body and its content type out.
Route = Callable[[Mapping[str, str]], tuple[bytes, str]]
# Nothing served here is worth caching, no browser should guess a type, and the
# page runs only its own files, in no other site's frame.
HEADERS = ("Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
           "Content-Security-Policy: default-src 'self'; frame-ancestors 'none'\r\n")

# name (without _total), help, Progress field
_COUNTERS = (
    ("peerd_rounds", "Gossip rounds the job's worker completed.", "rounds_done"),
    ("peerd_bytes_sent", "Payload bytes (segments and state) the worker served to partners.", "bytes_sent"),
    ("peerd_bytes_received", "Payload bytes (segments and state) the worker fetched from partners.",
     "bytes_received"),
    ("peerd_segment_failures", "Segments that kept the worker's own values: the fetch failed, missed the "
     "deadline, was refused or brought non-finite values.", "segment_misses"),
    # The same count under its old name, kept for existing dashboards (docs/operations.md, "Metrics").
    ("peerd_deadline_misses", "Deprecated: peerd_segment_failures under its old name (it counts every failure, "
     "not only deadline misses).", "segment_misses"),
    ("peerd_samples", "Training samples processed.", "samples"),
    ("peerd_steps", "Optimizer steps taken (the job's step count).", "step"),
    ("peerd_checkpoints_written", "Checkpoints the worker wrote.", "checkpoints_written"),
    ("peerd_compute_seconds", "Seconds the worker spent in training steps.", "compute_s"),
    ("peerd_training_seconds", "Wall seconds since the worker started training (compute / this = busy).",
     "training_s"),
)
_GAUGES = (
    ("peerd_round", "The round the worker is in.", "round"),
    ("peerd_epoch", "Epochs done.", "epoch"),
    ("peerd_local_batch", "Samples per optimizer step on this peer.", "local_batch"),
    ("peerd_global_batch", "Global batch the learning rate is scaled for.", "global_batch"),
    ("peerd_learning_rate", "Learning rate of the last step.", "lr"),
    ("peerd_lr_scale", "The LR law's factor on the job's LR in force (1 without a law).", "lr_scale"),
    ("peerd_loss", "Training loss (EMA).", "loss"),
    ("peerd_samples_per_second", "Training throughput (EMA, compute time only).", "samples_per_s"),
    ("peerd_step_fixed_seconds", "DBS step model: seconds of a step no batch changes (EMA; NaN if not timed).",
     "fixed_s"),
    ("peerd_step_seconds_per_sample", "DBS step model: seconds per sample of the rest of a step (EMA).",
     "per_sample_s"),
    ("peerd_metric", "The job's metric (job.metric, e.g. test accuracy) at the last evaluation.", "metric"),
    ("peerd_disagreement", "Relative distance to partners' segments in the last round.", "disagreement"),
    ("peerd_checkpoint_round", "Round of the last checkpoint written or resumed from.", "checkpoint_round"),
    ("peerd_collapsed", "1 once the worker's training collapsed (a non-finite or risen loss, the metric back "
     "at chance: docs/algorithms.md), and from then on; else 0.", "collapsed"),
)


class DaemonCollector:
    def __init__(self, daemon: Daemon) -> None:
        self._daemon = daemon

    def collect(self) -> Iterator[Metric]:
        d = self._daemon
        info = InfoMetricFamily("peerd_build", "This daemon.")
        info.add_metric([], {"version": __version__, "peer_id": d.peer_id, "realm": d.config.realm})
        yield info
        yield GaugeMetricFamily("peerd_uptime_seconds", "Seconds since the daemon started.",
                                value=time.monotonic() - d.started)
        states = d.peer_states()
        yield GaugeMetricFamily("peerd_peers_known", "Peers in this daemon's view.", value=len(states))
        yield GaugeMetricFamily("peerd_peers_suspected", "Known peers that missed recent Hellos.",
                                value=sum(1 for s in states.values() if s == "suspected"))
        yield CounterMetricFamily("peerd_hellos_sent", "Hellos this daemon's rounds sent (every peer in a "
                                  "full mesh, [discovery] fanout when relaying).", value=d.hello.round_hellos)
        yield CounterMetricFamily("peerd_hellos_received", "Hellos this daemon answered.",
                                  value=d.peer_servicer.hellos)
        yield GaugeMetricFamily("peerd_relaying", "1 while the realm is larger than [discovery] full_mesh_max.",
                                value=int(d.hello.relaying))
        yield GaugeMetricFamily("peerd_training", "1 while this machine may train; 0 while its owner paused it, "
                                "uses it, or it is outside its windows.", value=int(d.availability.training))
        jobs = list(d.jobs.items())
        yield from self._jobs(jobs)

    def _jobs(self, jobs) -> Iterator[Metric]:
        d = self._daemon
        # A daemon with several workers per job labels their series by worker (member id) too.
        several = len(d.devices) > 1
        labels = ["job", "worker"] if several else ["job"]
        state = GaugeMetricFamily("peerd_job_state", "1 for the job's current state on this peer.",
                                  labels=["job", "state"])
        members = GaugeMetricFamily("peerd_membership_size", "Workers of the job this daemon knows, its own included.",
                                    labels=["job"])
        restarts = CounterMetricFamily("peerd_worker_restarts", "Times the job's worker was restarted.",
                                       labels=labels)
        counters = {name: CounterMetricFamily(name, text, labels=labels) for name, text, _ in _COUNTERS}
        gauges = {name: GaugeMetricFamily(name, text, labels=labels) for name, text, _ in _GAUGES}
        exchange = HistogramMetricFamily("peerd_exchange_seconds", "Wall time of a gossip round's exchange.",
                                         labels=labels)
        rejected = CounterMetricFamily("peerd_rejected_messages", "Data-plane messages refused, by reason.",
                                       labels=[*labels, "reason"])
        waited = CounterMetricFamily("peerd_waited_seconds", "Seconds the training waited between its steps, by "
                                     "cause (round, evaluate, checkpoint).", labels=[*labels, "cause"])
        for name, job in jobs:
            state.add_metric([name, job.state], 1)
            members.add_metric([name], len(d.membership.job_view(name, job.spec.fingerprint)) + len(job.workers))
            for worker in job.workers:
                p, key = worker.progress, [name, worker.member] if several else [name]
                restarts.add_metric(key, worker.restarts)
                for metric, _, field in _COUNTERS:
                    counters[metric].add_metric(key, getattr(p, field))
                for metric, _, field in _GAUGES:
                    gauges[metric].add_metric(key, float(getattr(p, field)))
                exchange.add_metric(key, _buckets(p), sum_value=p.exchange_sum_s)
                if _HAS_REJECTED:
                    for reason, count in sorted(p.rejected.items()):
                        rejected.add_metric([*key, reason], count)
                for cause, seconds in sorted(p.waited_s.items()):
                    waited.add_metric([*key, cause], seconds)
        yield state
        yield members
        yield restarts
        yield from counters.values()
        yield from gauges.values()
        yield exchange
        yield waited
        if _HAS_REJECTED:
            yield rejected


def _buckets(p: control_pb2.Progress) -> list[tuple[str, float]]:
    counts = list(p.exchange_buckets)
    if len(counts) != len(EXCHANGE_BUCKETS_S):  # not reported yet (or an older worker)
        counts = [0] * len(EXCHANGE_BUCKETS_S)
    return [(_bound(b), c) for b, c in zip(EXCHANGE_BUCKETS_S, counts)] + [("+Inf", p.exchange_count)]


def _bound(value: float) -> str:
    return "+Inf" if math.isinf(value) else repr(float(value))


def make_registry(daemon: Daemon) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DaemonCollector(daemon))
    ProcessCollector(registry=registry)  # process_* (CPU, memory, open files) of the daemon
    return registry


def metrics_route(registry: CollectorRegistry) -> Route:
    return lambda query: (generate_latest(registry), CONTENT_TYPE_LATEST)


class MetricsServer:
    """GET on host:port, served from the event loop: `routes` by path."""

    def __init__(self, routes: Mapping[str, Route], host: str, port: int) -> None:
        self._routes = dict(routes)
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None
        self.address = ""

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(self._handle, self._host, self._port)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {self._host}:{self._port}: {exc.strerror}") from None
        sock = self._server.sockets[0].getsockname()
        self.address = join_host_port(sock[0], sock[1])

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def _answer(self, method: str, target: str) -> tuple[str, bytes, str]:
        path, _, query = target.partition("?")
        route = self._routes.get(path)
        if method != "GET":
            return "405 Method Not Allowed", b"only GET\n", "text/plain"
        if route is None:
            return "404 Not Found", b"see /metrics or /\n", "text/plain"
        try:
            body, kind = route(dict(parse_qsl(query)))
        except Exception:  # a bug in one route: say so, and keep serving the others
            log.exception("GET %s failed", path)
            return "500 Internal Server Error", b"see the daemon's log\n", "text/plain"
        return "200 OK", body, kind

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
            if len(head) > MAX_REQUEST_BYTES:
                raise ValueError("request too large")
            method, target, *_ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            status, body, kind = self._answer(method, target)
            writer.write(f"HTTP/1.0 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
                         f"{HEADERS}Connection: close\r\n\r\n".encode() + body)
            await writer.drain()
        except (TimeoutError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ConnectionError):
            pass  # a scraper that went away or spoke something else
        except Exception:  # never let a request take the loop down
            log.exception("metrics request failed")
        finally:
            writer.close()
