"""A script's loader that reads ahead (DataLoader workers, Lightning's
prefetch) hands out the job's last batches before the script trains on them:
the job is not done here until peer.step() has counted them."""

from __future__ import annotations

import textwrap

import torch
from torch import nn

from peerd.settings.jobspec import parse_job
from peerd.worker.state.trainstate import TrainState
from peerd.worker.train.data import PeerSampler, View
from peerd.worker.train.lrcontrol import LrControl
from peerd.worker.train.scriptsource import ScriptSource


def test_the_job_is_done_once_the_batches_read_ahead_are_trained_not_when_they_are_read():
    spec = parse_job(textwrap.dedent("""
        [job]
        name = "ahead"
        script = "train.py"
        epochs = 1
        epoch_chunks = 1
    """), "ahead.toml")
    model = nn.Linear(2, 1)
    source = ScriptSource(TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1)), spec, "a",
                          LrControl(spec.optimizer))
    source.sampler = PeerSampler(source.new_cursor(8), View(["a"]), lambda view: 4, 0)
    batches = list(source.sampler)  # read ahead to the job's end: the sampler has no batch left to come
    assert len(batches) == 2 and source.cursor.done and len(source.sampler) == 0
    assert not source.done
    source.record(None, None, 0.0)
    assert not source.done
    source.record(None, None, 0.0)
    assert source.done and source.progress == 1.0
