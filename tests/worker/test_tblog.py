"""A worker's curves in TensorBoard (peerd.worker.tblog), read back with
TensorBoard's own reader: the tags, the round as the step, an evaluation written
once, the consensus at the end, and a worker that trains on without TensorBoard."""

from __future__ import annotations

import logging
import math
import sys

import pytest

from peerd.control.progress import empty_progress
from peerd.worker.tblog import INSTALL_HINT, TensorBoardLog

pytest.importorskip("tensorboard")  # the dev install has it (the `tensorboard` extra)
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

ROUND_TAGS = {"train/loss", "train/lr", "train/samples_per_s", "train/local_batch", "train/global_batch",
              "train/epochs", "time/round_s", "time/exchange_s", "gossip/disagreement"}


def progress(round_: int, training_s: float, metrics: dict[str, float] | None = None, **fields):
    p = empty_progress()
    values = dict(round=round_, step=round_, training_s=training_s, loss=1.0 / round_, lr=0.05, samples_per_s=300.0,
                  local_batch=32, global_batch=64, job_progress=round_ / 100, exchange_s=0.01, disagreement=0.1,
                  metric_name="accuracy")
    for key, value in {**values, **fields}.items():
        setattr(p, key, value)
    p.metrics.update(metrics or {})
    return p


def scalars(directory) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(directory))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_each_round_writes_the_training_scalars_by_round(tmp_path):
    log = TensorBoardLog(str(tmp_path / "job" / "peer-0"), min_interval_s=0.0)
    for r in range(1, 4):
        log.round(progress(r, training_s=0.5 * r), {})
    log.close()
    got = scalars(tmp_path / "job" / "peer-0")
    assert set(got) == ROUND_TAGS
    assert [s for s, _ in got["train/loss"]] == [1, 2, 3]
    assert got["train/loss"][2][1] == pytest.approx(1 / 3)
    assert [v for _, v in got["time/round_s"]] == pytest.approx([0.5, 0.5, 0.5])
    assert got["train/global_batch"] == [(1, 64.0), (2, 64.0), (3, 64.0)]


def test_the_metric_is_written_on_a_new_evaluation_only(tmp_path):
    log = TensorBoardLog(str(tmp_path), min_interval_s=0.0)
    first = {"accuracy": 0.5, "loss": 1.5}
    log.round(progress(1, 0.1), {})  # nothing evaluated yet
    log.round(progress(2, 0.2, first), first)
    log.round(progress(3, 0.3, first), first)  # the same evaluation, reported again
    again = dict(first)  # a new evaluation that happens to give the same values
    log.round(progress(4, 0.4, again), again)
    log.close()
    got = scalars(tmp_path)
    assert got["eval/accuracy"] == [(2, 0.5), (4, 0.5)]
    assert got["eval/loss"] == [(2, 1.5), (4, 1.5)]


def test_rounds_are_written_at_a_bounded_rate_but_evaluations_always(tmp_path):
    """Rounds 1/16 s apart, written at most every 1/4 s of training, and the
    last round at the end: the round time written is the mean over the rounds
    since the last write."""
    log = TensorBoardLog(str(tmp_path), min_interval_s=0.25)
    evaluation = {"accuracy": 0.9}
    for r in range(1, 13):
        log.round(progress(r, r / 16, evaluation), evaluation if r == 7 else {})
    log.close()
    got = scalars(tmp_path)
    assert [s for s, _ in got["train/loss"]] == [1, 5, 7, 11, 12]
    assert [v for _, v in got["time/round_s"]] == pytest.approx([1 / 16] * 5)
    assert got["eval/accuracy"] == [(7, pytest.approx(0.9))]


def test_the_end_writes_the_last_evaluation_and_the_saved_models_metric(tmp_path):
    log = TensorBoardLog(str(tmp_path), min_interval_s=0.0)
    log.round(progress(5, 1.0), {})
    end = {"accuracy": 0.95, "consensus_accuracy": 0.97, "consensus_peers": 2.0}
    log.finished(progress(5, 1.2, end, finished=True))
    log.close()
    got = scalars(tmp_path)
    assert got["eval/accuracy"] == [(5, pytest.approx(0.95))]
    assert got["consensus/accuracy"] == [(5, pytest.approx(0.97))]
    assert got["consensus/peers"] == [(5, 2.0)]


def test_values_not_known_yet_are_left_out(tmp_path):
    log = TensorBoardLog(str(tmp_path), min_interval_s=0.0)
    log.round(progress(1, 0.1, exchange_s=math.nan, disagreement=math.nan, global_batch=0), {})
    log.close()
    assert set(scalars(tmp_path)) == ROUND_TAGS - {"time/exchange_s", "gossip/disagreement", "train/global_batch"}


def test_after_close_nothing_is_written_and_closing_again_is_harmless(tmp_path):
    log = TensorBoardLog(str(tmp_path), min_interval_s=0.0)
    log.round(progress(1, 0.1), {})
    log.close()
    log.round(progress(2, 0.2), {})
    log.finished(progress(2, 0.3, {"accuracy": 1.0}))
    log.close()
    assert [s for s, _ in scalars(tmp_path)["train/loss"]] == [1]


def test_a_worker_restarted_from_an_older_round_hides_its_earlier_runs_later_rounds(tmp_path):
    """A restart from a checkpoint behind the last round written: TensorBoard shows
    the new run's rounds from there, not both runs folded over each other."""
    before = TensorBoardLog(str(tmp_path), min_interval_s=0.0)
    for r in range(1, 6):
        before.round(progress(r, 0.1 * r), {})
    before.close()
    after = TensorBoardLog(str(tmp_path), min_interval_s=0.0)
    for r in range(3, 5):
        after.round(progress(r, 0.1 * r, loss=9.0), {})
    after.close()
    assert scalars(tmp_path)["train/loss"] == [(1, 1.0), (2, 0.5), (3, 9.0), (4, 9.0)]


def test_off_without_a_directory(tmp_path):
    log = TensorBoardLog("")
    assert not log.active
    log.round(progress(1, 0.1), {})
    log.finished(progress(1, 0.1))
    log.close()


def test_without_the_package_one_warning_and_training_goes_on(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as when not installed
    with caplog.at_level(logging.WARNING, logger="peerd.worker"):
        log = TensorBoardLog(str(tmp_path / "tb"))
        for r in range(1, 4):
            log.round(progress(r, 0.1 * r), {})
        log.finished(progress(3, 0.4))
        log.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and INSTALL_HINT in warnings[0] and str(tmp_path / "tb") in warnings[0]
    assert not (tmp_path / "tb").exists()


def test_a_directory_it_cannot_write_is_said_once_and_training_goes_on(tmp_path, caplog):
    (tmp_path / "file").write_text("not a directory")
    with caplog.at_level(logging.WARNING, logger="peerd.worker"):
        log = TensorBoardLog(str(tmp_path / "file" / "run"), min_interval_s=0.0)
        for r in range(1, 4):
            log.round(progress(r, 0.1 * r), {})
        log.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "cannot write" in warnings[0]


def test_the_daemon_hands_each_worker_its_run_directory(tmp_path):
    from peerd.daemon.jobs import WorkerLaunch
    from peerd.worker.main import parse_args

    def launch(**extra) -> WorkerLaunch:
        return WorkerLaunch("unix:/x.sock", "p.1", "127.0.0.1", 1, tmp_path / "job.toml", "", tmp_path / "w.log",
                            **extra)

    run = str(tmp_path / "tb" / "job" / "p.1")
    assert parse_args(launch(tensorboard=run).argv()[3:]).tensorboard == run
    assert "--tensorboard" not in launch().argv() and parse_args(launch().argv()[3:]).tensorboard == ""
