"""A worker's curves in TensorBoard ([log] tensorboard, docs/operations.md,
"Watching training in TensorBoard"): the scalars of the Progress the engine
reports each round, written with torch.utils.tensorboard's SummaryWriter into
this worker's run directory (DIR/JOB/MEMBER: one series per peer).

The x axis is the round, the job's common clock (peers under DBS take
different numbers of steps per round).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

from peerd.proto.v1 import control_pb2

log = logging.getLogger("peerd.worker")

# A round's scalars are written at most this often (on the training's wall clock):
# a round can take milliseconds, and a dozen scalars cost about 1.5 ms on a busy
# 2-core machine. Evaluations and the end are always written.
MIN_INTERVAL_S = 0.2
FLUSH_S = 5.0  # the SummaryWriter's own thread flushes its buffer this often, and on close
MAX_QUEUE = 64  # events it buffers before a write waits for its thread: more than one round's
INSTALL_HINT = "pip install peerd[tensorboard]"


class TensorBoardLog:
    """Writes each round's Progress to `directory`; does nothing when it is
    empty, or when the tensorboard package is missing (said once)."""

    def __init__(self, directory: str, min_interval_s: float = MIN_INTERVAL_S) -> None:
        self.directory = directory
        self.min_interval_s = min_interval_s
        self._writer_class = _summary_writer(directory) if directory else None
        self._writer = None
        self._evaluation: Mapping[str, float] | None = None  # the last evaluation written
        self._written_s = 0.0  # Progress.training_s of the last round written
        self._rounds = 0  # rounds since then
        self._pending: control_pb2.Progress | None = None  # the last round, when the rate left it out
        self._closed = False

    @property
    def active(self) -> bool:
        return self._writer_class is not None and not self._closed

    def round(self, p: control_pb2.Progress, evaluation: Mapping[str, float]) -> None:
        """A round is done. `evaluation`: the mapping the last evaluation
        returned; each evaluation makes a new one, so a new mapping is a new
        evaluation (equal values twice in a row are two points)."""
        if not self.active:
            return
        self._rounds += 1
        evaluated = evaluation is not self._evaluation and bool(evaluation)
        due = self._writer is None or p.training_s - self._written_s >= self.min_interval_s
        self._pending = None if evaluated or due else p
        if evaluated or due:
            self._write_round(p)
        if evaluated and self._writer is not None:
            self._evaluation = evaluation
            for name, value in p.metrics.items():
                _scalar(self._writer, f"eval/{name}", value, p.round)

    def _write_round(self, p: control_pb2.Progress) -> None:
        writer = self._open(p.round)
        if writer is None:
            return
        step = p.round
        round_s = (p.training_s - self._written_s) / self._rounds
        self._written_s, self._rounds = p.training_s, 0
        for tag, value in (("train/loss", p.loss), ("train/lr", p.lr), ("train/samples_per_s", p.samples_per_s),
                           ("train/local_batch", p.local_batch or math.nan),
                           ("train/global_batch", p.global_batch or math.nan),
                           ("train/epochs", p.job_progress), ("time/round_s", round_s),
                           ("time/exchange_s", p.exchange_s), ("gossip/disagreement", p.disagreement)):
            _scalar(writer, tag, value, step)

    def finished(self, p: control_pb2.Progress) -> None:
        """The job's end: the own model's last evaluation and the saved model's
        (consensus_<name> in Progress.metrics, written as consensus/<name>)."""
        if not self.active:
            return
        self._write_pending()
        writer = self._open(p.round)
        if writer is None:
            return
        for name, value in p.metrics.items():
            tag = f"consensus/{name.removeprefix('consensus_')}" if name.startswith("consensus_") else f"eval/{name}"
            _scalar(writer, tag, value, p.round)
        writer.flush()

    def close(self) -> None:
        """At the worker's end or leave: what is buffered goes to disk. Idempotent."""
        if self.active:
            self._write_pending()
        self._closed = True
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except OSError as exc:
                log.warning("TensorBoard logs in %s: %s", self.directory, exc)

    def _write_pending(self) -> None:
        """The last round, left out by the rate: every curve ends where the training did."""
        if self._pending is not None:
            self._write_round(self._pending)
            self._pending = None

    def _open(self, round_: int):
        """The writer, made at the first write. purge_step: a worker that
        restarted from an older checkpoint hides its own earlier run's
        events from this round on, so its curves do not fold back."""
        if self._writer is None:
            try:
                self._writer = self._writer_class(self.directory, purge_step=round_, max_queue=MAX_QUEUE,
                                                  flush_secs=FLUSH_S)
            except OSError as exc:
                log.warning("TensorBoard logs: cannot write to %s: %s; training on without them",
                            self.directory, exc)
                self._closed = True
                return None
            log.info("TensorBoard logs in %s", self.directory)
        return self._writer


def _scalar(writer, tag: str, value: float, step: int) -> None:
    if math.isfinite(value):  # NaN: not known yet (alone: no exchange, no disagreement)
        writer.add_scalar(tag, value, step)


def _summary_writer(directory: str):
    """torch's SummaryWriter; None, with one warning, without the tensorboard package."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        log.warning("TensorBoard logs for %s are asked for ([log] tensorboard), but the tensorboard package "
                    "cannot be loaded here (%s): %s; training on without them", directory, exc, INSTALL_HINT)
        return None
    return SummaryWriter
